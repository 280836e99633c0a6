"""The interface every training paradigm implements (:class:`Paradigm`), and the base of the
periodic-averaging ones (:class:`PeriodicAveraging`: BMUF, EASGD).

A paradigm decides how workers cooperate: how the model is wrapped for the backward pass, what
happens after each local optimizer step (nothing for synchronous SGD, a block update for BMUF, an
elastic pull toward the center for EASGD), which model is the result, and what extra state a
checkpoint must hold. The step loop in :mod:`sublimate.components.processes.worker` is shared, so a
new paradigm is one new module in this package that subclasses :class:`Paradigm` and is named in the
one list of the paradigms, :data:`sublimate.components.base.settings.PARADIGMS`. The
parameter-server paradigm (``async``) has no collective step loop: its processes are launched as
their own TorchX app (:mod:`sublimate.components.processes.async_sgd`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from sublimate.components.base.settings import checked_values
from sublimate.components.monitoring.traffic import Traffic, tensor_bytes

if TYPE_CHECKING:  # torch is imported by the workers, not by the code that renders pipelines
    import torch
    from torch import nn


class Replicas(Protocol):
    """Averaging between the replica groups of a job with per-step recovery, a step (or round)
    at a time: :class:`sublimate.components.training.fault_tolerance.FaultTolerance`. A paradigm
    given one averages through it, and commits or discards each round through it, instead of
    using the job's process group (which then holds one node only)."""

    workers: int  # every worker process of the job, alive or not
    group_world: int  # the processes of one group (one node)

    def start_step(self) -> int: ...

    def average(self, tensor: torch.Tensor) -> None: ...

    def start_average(self, tensor: torch.Tensor, node_first: bool = False) -> Any: ...

    def finish_averages(self, works: list[Any]) -> None: ...

    def participating_workers(self) -> int: ...

    def start_average_encoded(self, payload: torch.Tensor) -> Any: ...

    def finish_average_encoded(self, pending: Any,
                               decode: Callable[[torch.Tensor], torch.Tensor],
                               out: torch.Tensor) -> None: ...

    def commit(self) -> bool: ...


@dataclass(frozen=True)
class ParadigmConfig:
    """The settings a paradigm applies, typed: none for sync; each paradigm with settings of its
    own declares a subclass with one field per setting (named as the setting's attribute, e.g.
    ``BmufConfig.sync_period``) and names it as its ``Config``."""


@dataclass(frozen=True, kw_only=True)
class PeriodicConfig(ParadigmConfig):
    """What every periodic paradigm applies: the steps between its rounds."""

    sync_period: int


class Paradigm:
    """Base class: a paradigm sees the model, the optimizer and the process group (or, under
    per-step recovery, the replica groups: ``replicas``)."""

    name: ClassVar[str]
    Config: ClassVar[type[ParadigmConfig]] = ParadigmConfig

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 config: ParadigmConfig | Mapping[str, Any],
                 replicas: Replicas | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.replicas = replicas
        # Typed and checked against the settings' declaration: `config.sync_period` is an int
        # of at least 1, `config.nesterov` a bool, whatever the caller passed.
        if not isinstance(config, ParadigmConfig):
            self.config = self.configure(config)
        elif isinstance(config, self.Config):
            self.config = config
        else:
            raise TypeError(f"{self.name} takes a {self.Config.__name__}, not a "
                            f"{type(config).__name__}")
        # collective operations issued by this worker, for the benchmark's ops-per-epoch figure
        self.communication_ops = 0
        # the bytes they sent, counted where each is issued (here, DDP's comm hook for sync,
        # FaultTolerance.average under per-step recovery)
        self.traffic = Traffic()

    @classmethod
    def configure(cls, values: Mapping[str, Any]) -> ParadigmConfig:
        """This paradigm's typed config from settings by attribute (others are ignored);
        each is checked against its declaration, a missing one takes its default."""
        return cls.Config(**checked_values([f.name for f in fields(cls.Config)], values))

    def training_model(self) -> nn.Module:
        """The module to run forward/backward on (e.g. a DDP wrapper around ``self.model``)."""
        return self.model

    @property
    def workers(self) -> int:
        """The job's worker processes (the N of a paradigm's defaults, such as 1 - 1/N)."""
        if self.replicas is not None:
            return self.replicas.workers
        import torch.distributed as dist

        return dist.get_world_size()

    def average_(self, tensor: torch.Tensor) -> None:
        """Replace ``tensor`` by its mean over the workers (of the participating replica groups,
        under per-step recovery)."""
        if self.replicas is not None:
            self.replicas.average(tensor)
            return
        import torch.distributed as dist

        dist.all_reduce(tensor)
        self.traffic.all_reduce(tensor_bytes(tensor), dist.get_world_size())
        tensor /= dist.get_world_size()

    def start_average_(self, tensor: torch.Tensor) -> Callable[[], None]:
        """:meth:`average_`, started: the all-reduce is in flight when this returns, and the
        function returned waits for it and leaves the mean in ``tensor`` (a paradigm computes
        meanwhile: Streaming DiLoCo's ``fragment-delay``). Under per-step recovery a failure
        is not raised: ``tensor`` is then not the mean, and the round does not commit."""
        if self.replicas is not None:
            replicas = self.replicas
            work = replicas.start_average(tensor, node_first=True)
            return lambda: replicas.finish_averages([work])
        import torch.distributed as dist

        world = dist.get_world_size()
        work = dist.all_reduce(tensor, async_op=True)
        self.traffic.all_reduce(tensor_bytes(tensor), world)

        def finish() -> None:
            work.wait()
            tensor.div_(world)
        return finish

    def average_encoded_(self, payload: torch.Tensor,
                         decode: Callable[[torch.Tensor], torch.Tensor],
                         out: torch.Tensor) -> None:
        """Set ``out`` to the mean over the workers of ``decode(payload)``: the payloads
        (encoded bytes, the same size on every worker, that a sum cannot combine: int8 values of
        different scales, top-k values at different indices) all-gathered, then decoded and
        summed in rank order, so that every worker holds the same bits. Under per-step
        recovery, over the participating groups; a failure there leaves ``out`` as it was and
        the round uncommitted."""
        self.start_average_encoded_(payload, decode, out)()

    def start_average_encoded_(self, payload: torch.Tensor,
                               decode: Callable[[torch.Tensor], torch.Tensor],
                               out: torch.Tensor) -> Callable[[], None]:
        """:meth:`average_encoded_`, started (as :meth:`start_average_`): the all-gather is
        in flight; the function returned waits for it, decodes and sets ``out``."""
        if self.replicas is not None:
            replicas = self.replicas
            pending = replicas.start_average_encoded(payload)
            return lambda: replicas.finish_average_encoded(pending, decode, out)
        import torch
        import torch.distributed as dist

        world = dist.get_world_size()
        gathered = [torch.empty_like(payload) for _ in range(world)]
        work = dist.all_gather(gathered, payload, async_op=True)
        self.traffic.all_gather(tensor_bytes(payload), world)

        def finish() -> None:
            work.wait()
            total = decode(gathered[0])
            for other in gathered[1:]:
                total += decode(other)
            out.copy_((total / world).view_as(out))
        return finish

    def sum_(self, tensor: torch.Tensor) -> None:
        """Replace ``tensor`` by its sum over the workers (as :meth:`average_`)."""
        if self.replicas is not None:
            self.replicas.average(tensor)
            tensor *= self.replicas.participating_workers()
            return
        import torch.distributed as dist

        dist.all_reduce(tensor)
        self.traffic.all_reduce(tensor_bytes(tensor), dist.get_world_size())

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Context for the micro-batches of gradient accumulation that must not communicate."""
        yield

    def zero_grad(self) -> None:
        """Clear the gradients for the next step (per-step recovery's loop)."""
        self.optimizer.zero_grad(set_to_none=True)

    def after_step(self, step: int) -> None:
        """Called after every local optimizer step with the 1-based global step count."""

    def finish(self, step: int) -> None:
        """Called once after the last step (``step``), before the last checkpoint: a paradigm
        that communicates periodically syncs the steps taken since its last round here. A
        collective: every rank calls it."""

    @property
    def device(self) -> torch.device:
        """Where the model lives: every tensor of the paradigm's state is kept there."""
        import torch

        first = next(self.model.parameters(), None)
        return first.device if first is not None else torch.device("cpu")

    def result_model(self) -> nn.Module:
        """The model this run produces (the center variable for EASGD, ...)."""
        return self.model

    def state_dict(self) -> dict[str, Any]:
        """Paradigm state beyond model and optimizer, saved in every checkpoint."""
        return {"communication_ops": self.communication_ops,
                "traffic": self.traffic.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.communication_ops = state.get("communication_ops", 0)
        self.traffic.load_state_dict(state.get("traffic"))


def auto_or(value: Any, default: float) -> float:
    """A hyper-parameter left to the paper's default when it is ``None``, ``"auto"`` or -1."""
    return default if value in (None, "auto", -1) else float(value)


class PeriodicAveraging(Paradigm):
    """Local SGD with one collective model update every ``sync_period`` steps (BMUF, EASGD).

    Every worker starts from rank 0's model (parameters and buffers). A subclass implements
    :meth:`synchronize` (the collective update of the parameters) and :meth:`consensus` (the
    parameter vector the run produces). At every round the base class also averages the
    floating-point buffers (BatchNorm's running statistics, which describe the data each worker
    saw) and takes rank 0's integer ones (``num_batches_tracked``); the result model carries
    the buffers of the last round. The steps after the last full period are synced by
    :meth:`finish`, so no worker's last local steps are lost.
    """

    Config: ClassVar[type[ParadigmConfig]] = PeriodicConfig
    config: PeriodicConfig

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 config: ParadigmConfig | Mapping[str, Any],
                 replicas: Replicas | None = None) -> None:
        import torch.distributed as dist

        super().__init__(model, optimizer, config, replicas)
        self.period = self.config.sync_period
        self._result: nn.Module | None = None
        start = flat_parameters(model)
        dist.broadcast(start, src=0)
        load_flat_parameters(model, start)
        floating, counters = buffer_groups(model)
        for buffers in (floating, counters):
            if buffers:
                flat = flat_tensors(buffers)
                dist.broadcast(flat, src=0)
                load_flat_tensors(buffers, flat)
        self.synced_buffers = [buffer.detach().clone() for buffer in model.buffers()]
        self.synced_step = 0  # the last step a round was taken at

    def after_step(self, step: int) -> None:
        if step % self.period == 0:
            self.sync_round(step)

    def finish(self, step: int) -> None:
        # The steps since the last round (steps % sync-period of them) join the result; a run
        # resumed after it finished has synced_step == step and takes no second round.
        if step != self.synced_step:
            self.sync_round(step)

    def sync_round(self, step: int) -> bool:
        """One round at ``step``: the paradigm's parameter update, then the buffers. Under
        per-step recovery the round is a transaction of the groups alive: asked for with a
        quorum, and discarded, leaving every tensor as it was, unless all of them completed it.
        Returns whether it was applied."""
        if self.replicas is None:
            self.synchronize()
            self.synchronize_buffers()
            self.synced_step = step
            self.communication_ops += 1
            return True
        self.replicas.start_step()
        return self.round_in_quorum(step)

    def round_in_quorum(self, step: int) -> bool:
        """The round's transaction once the quorum is formed (:meth:`sync_round`; a caller that
        forms the quorum itself, to take a healed step count first, calls this)."""
        import torch

        assert self.replicas is not None
        before = (flat_parameters(self.model), copy.deepcopy(self.state_dict()),
                  [buffer.detach().clone() for buffer in self.model.buffers()])
        self.synchronize()
        self.synchronize_buffers()
        if not self.replicas.commit():
            parameters, state, buffers = before
            load_flat_parameters(self.model, parameters)
            self.load_state_dict(state)
            with torch.no_grad():
                for buffer, saved in zip(self.model.buffers(), buffers, strict=True):
                    buffer.copy_(saved)
            return False
        self.synced_step = step
        self.communication_ops += 1
        return True

    def synchronize_buffers(self) -> None:
        """Average the floating buffers across workers and take rank 0's integer ones (one
        collective each, none for a model without buffers)."""
        import torch.distributed as dist

        floating, counters = buffer_groups(self.model)
        if floating:
            flat = flat_tensors(floating)
            self.average_(flat)
            load_flat_tensors(floating, flat)
        if counters:
            flat = flat_tensors(counters)
            if self.replicas is None:
                dist.broadcast(flat, src=0)
                self.traffic.broadcast(tensor_bytes(flat), dist.get_world_size())
            else:  # every group counts alike: their mean (a group healing sends none) is it
                import torch

                flat = flat.to(torch.float64)
                self.average_(flat)
                flat.round_()
            load_flat_tensors(counters, flat)
        self.synced_buffers = [buffer.detach().clone() for buffer in self.model.buffers()]

    def synchronize(self) -> None:
        raise NotImplementedError

    def consensus(self) -> torch.Tensor:
        raise NotImplementedError

    def result_model(self) -> nn.Module:
        # A separate module, since the local model keeps training; made once and refilled, as
        # evaluation asks for it after every epoch.
        if self._result is None:
            self._result = copy.deepcopy(self.model)
        load_flat_parameters(self._result, self.consensus())
        import torch

        with torch.no_grad():
            for buffer, synced in zip(self._result.buffers(), self.synced_buffers, strict=True):
                buffer.copy_(synced)
        return self._result

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "synced_buffers": self.synced_buffers,
                "synced_step": self.synced_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        device = self.device
        if "synced_buffers" in state:  # checkpoints of earlier releases lack them
            self.synced_buffers = [buffer.to(device) for buffer in state["synced_buffers"]]
        self.synced_step = state.get("synced_step", 0)


def buffer_groups(module: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The module's buffers: (floating point ones, the others such as counters)."""
    floating: list[torch.Tensor] = []
    counters: list[torch.Tensor] = []
    for buffer in module.buffers():
        (floating if buffer.is_floating_point() else counters).append(buffer)
    return floating, counters


def flat_tensors(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The tensors as one detached vector (of their common dtype), for one collective."""
    import torch

    if not tensors:
        return torch.zeros(0)
    return torch.cat([tensor.detach().reshape(-1) for tensor in tensors])


def load_flat_tensors(tensors: list[torch.Tensor], vector: torch.Tensor) -> None:
    """Copy ``vector`` back into ``tensors`` in place (see :func:`flat_tensors`)."""
    import torch

    offset = 0
    with torch.no_grad():
        for tensor in tensors:
            size = tensor.numel()
            tensor.copy_(vector[offset:offset + size].view_as(tensor))
            offset += size


def flat_parameters(module: nn.Module) -> torch.Tensor:
    """A detached copy of the module's parameters as one vector (one collective per sync)."""
    from torch.nn.utils import parameters_to_vector

    return parameters_to_vector(module.parameters()).detach().clone()


def load_flat_parameters(module: nn.Module, vector: torch.Tensor) -> None:
    """Copy ``vector`` into the parameters in place.

    Unlike ``torch.nn.utils.vector_to_parameters``, which makes the parameters views of the
    vector, this keeps them independent: the vector (a center variable, a block start) must not
    change when the local optimizer steps.
    """
    import torch

    offset = 0
    with torch.no_grad():
        for parameter in module.parameters():
            size = parameter.numel()
            parameter.copy_(vector[offset:offset + size].view_as(parameter))
            offset += size
