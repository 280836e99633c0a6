"""DiLoCo (Douillard et al. 2023, arXiv 2311.08105) and Streaming DiLoCo (arXiv 2501.18512), on
torchft's implementation (``torchft.local_sgd.DiLoCo``).

Every worker takes ``sync-period`` (H) inner steps with its own optimizer; then the workers
average their *pseudo-gradient*, the global weights of the last outer step minus their local
weights, and every worker applies the same outer step to the global weights::

    delta  = mean_i(theta_global - theta_i)          (an all-reduce, in outer-gradient-dtype)
    m      = mu * m + delta                          (outer SGD with Nesterov momentum mu)
    theta_global = theta_global - lr_outer * (delta + mu * m)
    theta_i = theta_global                           (every worker starts the next round there)

with the paper's defaults ``lr_outer = 0.7``, ``mu = 0.9``. With ``fragments`` F > 1
(Streaming DiLoCo) the model is cut into F fragments of consecutive top-level modules, and one
fragment is synced every H / F steps, in turn, so that each is synced every H steps and the
traffic is spread out instead of arriving as one burst.

What torchft contributes is the algorithm itself: the backup of the global weights, the
pseudo-gradient, the outer step, the fragments. What it would also do, hook the inner
optimizer's ``step()`` to form quorums and commit on its own, is left out: sublimate's per-step
loop (:mod:`sublimate.components.processes.per_step_loop`) forms each round's quorum at its round
boundaries, so a round once started is carried through to its commit on every group, and a
replacement heals at a round (as for BMUF and EASGD). The fragments talk to
:class:`_RoundChannel` instead of a torchft Manager: it averages through
:meth:`Paradigm.average_` (torchft's Manager through :class:`Replicas` under per-step recovery,
the job's process group otherwise, as in users' own loops) and commits through
:meth:`Replicas.commit`.

A discarded round (a group lost mid-round) leaves everything as it was before it: the local
weights, the BatchNorm buffers, the global weights and the outer optimizers' state (torchft's
DiLoCo would instead reset the local weights to the global ones, dropping H steps of work).

``fragment-delay`` D (torchft's ``fragment_sync_delay``, Streaming DiLoCo's overlap) splits a
round in two: :meth:`DiLoCo.begin_round`, D steps before its end, forms nothing itself (the loop
forms the quorum) but computes the pseudo-gradient and *starts* its average (the channel's
``allreduce`` returns the collective in flight); :meth:`DiLoCo.end_round` waits for it, commits,
steps and mixes the fragment's local weights in by ``fragment-update-alpha`` (torchft's
``_merge_parameters``). A round discarded at its end keeps the local weights of the D steps
taken meanwhile and goes back to the paradigm's state from before it began; while a round is in
flight, :meth:`DiLoCo.state_dict` is that state from before it.

The pseudo-gradient travels as ``outer-codec`` says (:mod:`.outer_codecs`): float32 or
bfloat16 all-reduced, or int8 or top-k encoded and all-gathered, with error feedback: each
worker's residual (what its codec dropped) is added to its next round's pseudo-gradient of the
same fragment, and is part of :meth:`DiLoCo.state_dict`, so that a checkpoint, a replacement's
healing and a discarded round's rollback all carry it. torchft's quantised all-reduce
(``should_quantize``) needs Triton on a GPU, and on a CPU quietly sends full precision; it is
not used: the groups between replicas are gloo on every device, and it was not tested here.
``outer-gradient-dtype=bfloat16`` is ``outer-codec=bf16``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from .base import ParadigmConfig, PeriodicAveraging, PeriodicConfig, Replicas
from .outer_codecs import SummedCodec, encode_with_feedback, make_codec


def outer_codec_name(codec: str, gradient_dtype: str) -> str:
    """The codec ``outer-codec`` and the older ``outer-gradient-dtype`` ask for together:
    ``outer-gradient-dtype=bfloat16`` is ``outer-codec=bf16``; with int8 or topk it is a
    contradiction (settings.check refuses it before any worker starts)."""
    if gradient_dtype == "bfloat16" and codec in ("none", "bf16"):
        return "bf16"
    if gradient_dtype == "bfloat16":
        raise ValueError(f"outer-gradient-dtype bfloat16 contradicts outer-codec {codec}: "
                         "drop outer-gradient-dtype (outer-codec bf16 is bfloat16)")
    return codec


class _OuterAverage:
    """The pseudo-gradient's average in flight, as torchft's fragment waits for it: a Work
    whose ``wait`` finishes the average (the division, or the codec's decoding) and then
    completes its future, which torchft's bucketing chained the copy back into its
    per-parameter tensors to."""

    def __init__(self, tensor: torch.Tensor, finish: Callable[[], None]) -> None:
        self._tensor, self._finish = tensor, finish
        self._future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        return self._future

    def wait(self, timeout: Any = None) -> bool:
        if not self._future.done():
            self._finish()
            self._future.set_result([self._tensor])
        return True


class _RoundChannel:
    """What torchft's DiLoCo fragments ask of a torchft Manager, answered by the paradigm: an
    average (started at once, finished when the fragment waits for it: the quorum is the
    loop's), the round's commit, the round count."""

    # torchft's DiLoCo refuses an asynchronous quorum; the loop forms each round's quorum first.
    _use_async_quorum = False

    def __init__(self, paradigm: DiLoCo) -> None:
        self.paradigm = paradigm

    def allreduce(self, tensor: torch.Tensor, should_quantize: bool = False) -> _OuterAverage:
        return _OuterAverage(tensor, self.paradigm.start_outer_average(tensor))

    def should_commit(self) -> bool:
        replicas = self.paradigm.replicas
        return True if replicas is None else replicas.commit()

    def current_step(self) -> int:
        return self.paradigm.rounds

    def register_state_dict_fn(self, key: str, load: Any, save: Any) -> None:
        """Not needed: the paradigm's :meth:`DiLoCo.state_dict` holds the global weights and
        the outer optimizers' state, for checkpoints and for a replacement's healing alike."""


def model_fragments(model: nn.Module, count: int) -> list[nn.Module]:
    """The model cut into ``count`` fragments of consecutive top-level modules (about equally
    many each), as Streaming DiLoCo cuts a transformer into groups of blocks."""
    if count == 1:
        return [model]
    parts = [child for child in model.children() if any(True for _ in child.parameters())]
    if any(True for _ in model.parameters(recurse=False)) or len(parts) < count:
        raise ValueError(f"fragments {count}: the model has {len(parts)} top-level module(s) "
                         "with parameters (and must have no parameters of its own) to cut into "
                         f"{count} fragments; use fewer fragments")
    groups: list[list[nn.Module]] = [[] for _ in range(count)]
    for index, part in enumerate(parts):
        groups[index * count // len(parts)].append(part)
    return [nn.ModuleList(group) for group in groups]


@dataclass(frozen=True, kw_only=True)
class DilocoConfig(PeriodicConfig):
    outer_lr: float
    outer_momentum: float  # Nesterov
    fragments: int  # Streaming DiLoCo's; 1: the whole model each round
    outer_gradient_dtype: str  # the pseudo-gradients' type on the wire (float32, bfloat16)
    outer_codec: str  # none, bf16, int8, topk (outer_codecs.py)
    outer_codec_topk: float  # topk's fraction of the values sent
    fragment_delay: int  # inner steps a round's average travels while the workers compute
    fragment_update_alpha: float  # the share of those steps' local weights kept at its end


@dataclass(frozen=True, slots=True)
class _RoundInFlight:
    """A round begun and not yet ended (``fragment-delay`` steps apart)."""

    step: int  # the local step whose weights its pseudo-gradient is of
    fragment: Any  # torchft's fragment whose turn it is, its average in flight
    before: dict[str, Any]  # the paradigm's state before the round, to go back to


class DiLoCo(PeriodicAveraging):
    name = "diloco"
    Config: ClassVar[type[ParadigmConfig]] = DilocoConfig
    config: DilocoConfig

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 config: ParadigmConfig | Mapping[str, Any],
                 replicas: Replicas | None = None) -> None:
        from torchft.local_sgd import DiLoCo as TorchftDiLoCo

        super().__init__(model, optimizer, config, replicas)  # every worker at rank 0's model
        config = self.config
        fragments = model_fragments(model, config.fragments)
        momentum = config.outer_momentum
        self.outer_optimizers = [
            torch.optim.SGD(fragment.parameters(), lr=config.outer_lr, momentum=momentum,
                            nesterov=momentum > 0)  # torch refuses Nesterov without momentum
            for fragment in fragments]
        self.codec = make_codec(outer_codec_name(config.outer_codec,
                                                 config.outer_gradient_dtype),
                                config.outer_codec_topk)
        # each fragment's error-feedback residual (what the codec dropped of its last rounds)
        self.residuals = [
            torch.zeros(sum(p.numel() for p in fragment.parameters()), device=self.device)
            for fragment in fragments] if self.codec.error_feedback else []
        self.rounds = 0  # rounds committed: round r syncs fragment r % F
        # torchft checks the schedule (sync-period a multiple of fragments, ...) and backs up
        # the global weights; settings.check refused a bad schedule before any worker started.
        self._diloco = TorchftDiLoCo(
            _RoundChannel(self), fragments, optimizer, self.outer_optimizers,
            sync_every=config.sync_period, backup_device=self.device, pin_memory=False,
            use_bucketization=True, bucket_cap_mb=1 << 16,  # one all-reduce per round
            fragment_sync_delay=config.fragment_delay,
            fragment_update_alpha=config.fragment_update_alpha)
        self.period = config.sync_period // config.fragments  # steps between rounds
        # a round begins (its average sent) this many steps before it ends (the outer step)
        self.delay = config.fragment_delay
        self.in_flight: _RoundInFlight | None = None
        # each parameter's global copy (torchft's backup), in the model's parameter order
        by_parameter = {id(parameter): fragment.original_parameters[name]
                        for fragment, module in zip(self._diloco._fragments, fragments,
                                                    strict=True)
                        for name, parameter in module.named_parameters()}
        self.global_parameters = [by_parameter[id(parameter)] for parameter in model.parameters()]

    def start_outer_average(self, tensor: torch.Tensor) -> Callable[[], None]:
        """Start the round's average of the pseudo-gradient (torchft's flat bucket of the
        fragment whose turn it is), through the outer codec; the function returned waits for
        it and leaves the mean in ``tensor``."""
        codec = self.codec
        if isinstance(codec, SummedCodec):  # an all-reduce, in the codec's type on the wire
            if tensor.dtype == codec.dtype:
                return self.start_average_(tensor)
            wire = tensor.to(codec.dtype)
            finish_wire = self.start_average_(wire)

            def finish() -> None:
                finish_wire()
                tensor.copy_(wire)
            return finish
        fragment = self.rounds % len(self.outer_optimizers)
        residual = self.residuals[fragment] if codec.error_feedback else None
        payload = encode_with_feedback(codec, tensor, residual)
        numel = tensor.numel()
        return self.start_average_encoded_(payload, lambda sent: codec.decode(sent, numel),
                                           tensor)

    def after_step(self, step: int) -> None:
        """The restart mode's rounds (users' own loops): every ``period`` steps, begun
        ``fragment-delay`` steps before they end."""
        phase = step % self.period
        if self.delay and phase == self.period - self.delay:
            self.begin_round(step)
        elif phase == 0:
            self.end_round(step)

    def sync_round(self, step: int) -> bool:
        """A whole round at ``step``, its quorum included under per-step recovery."""
        if self.replicas is not None:
            self.replicas.start_step()
        return self.round_in_quorum(step)

    def round_in_quorum(self, step: int) -> bool:
        """A whole round at ``step`` once its quorum is formed: begun and ended at once."""
        self.begin_round(step)
        return self.end_round(step)

    def begin_round(self, step: int) -> None:
        """Begin the round of the fragment whose turn it is (its quorum, under per-step
        recovery, formed by the caller): its pseudo-gradient, from the weights of ``step``,
        is sent, and its average travels while the workers take their next inner steps."""
        if self.in_flight is not None:
            raise RuntimeError(f"diloco: a round begun at step {self.in_flight.step} has not "
                               f"ended; a second cannot begin at step {step}")
        fragment = self._diloco._fragments[self.rounds % len(self._diloco._fragments)]
        # taken before the pseudo-gradient: a codec's residual changes as it encodes
        self.in_flight = _RoundInFlight(step, fragment, copy.deepcopy(self.state_dict()))
        fragment.prepare_sync()  # the pseudo-gradient, its average started

    def end_round(self, step: int) -> bool:
        """End the round in flight at ``step``: wait for its average, average the buffers,
        commit (or not), then the outer step, and the local weights of the fragment become the
        new global ones (mixed with the local ones by ``fragment-update-alpha``). A round the
        groups did not all complete leaves everything as it was before this call: the local
        weights with the steps taken meanwhile, the buffers, and the paradigm's state as it was
        before the round began. Returns whether it was applied. With no round in flight (a
        loop of your own resumed between a round's beginning and its end) the round is taken
        whole, here."""
        flight = self.in_flight
        if flight is None:
            return self.sync_round(step)
        self.in_flight = None
        parameters = [parameter.detach().clone() for parameter in self.model.parameters()]
        buffers = [buffer.detach().clone() for buffer in self.model.buffers()]
        self.synchronize_buffers()
        if not flight.fragment.perform_sync():  # waits, commits (or not), the outer step
            with torch.no_grad():
                for parameter, saved in zip(self.model.parameters(), parameters, strict=True):
                    parameter.copy_(saved)
                for buffer, saved in zip(self.model.buffers(), buffers, strict=True):
                    buffer.copy_(saved)
            self.load_state_dict(flight.before)
            return False
        self.rounds += 1
        self.synced_step = flight.step
        self.communication_ops += 1
        return True

    def finish(self, step: int) -> None:
        # The steps since the last round join the result (the global weights, which only the
        # rounds move): one more round per fragment, as a plain average of the workers' models
        # (an outer step of lr 1 without momentum). The outer Nesterov step on a partial round
        # overshoots: its momentum term is a full round's; measured on mnist1d, it cost the
        # final model 1.4 to 1.8 points against the last full round's.
        if self.in_flight is not None:  # its average is on its way: it ends first
            self.end_round(step)
        if step == self.synced_step:
            return
        settings = [dict(group) for outer in self.outer_optimizers
                    for group in outer.param_groups]
        for outer in self.outer_optimizers:
            for group in outer.param_groups:
                group.update(lr=1.0, momentum=0.0, nesterov=False)
        try:
            for _ in range(len(self.outer_optimizers)):
                self.sync_round(step)
        finally:
            groups = [group for outer in self.outer_optimizers for group in outer.param_groups]
            for group, saved in zip(groups, settings, strict=True):
                group.update(lr=saved["lr"], momentum=saved["momentum"],
                             nesterov=saved["nesterov"])

    def consensus(self) -> torch.Tensor:
        return torch.cat([weights.reshape(-1) for weights in self.global_parameters])

    def state_dict(self) -> dict[str, Any]:
        if self.in_flight is not None:
            # what a round not yet ended would be discarded to (its residual before encoding)
            return copy.deepcopy(self.in_flight.before)
        return {**super().state_dict(), "rounds": self.rounds,
                "global_parameters": [weights.clone() for weights in self.global_parameters],
                "outer_optimizers": [outer.state_dict() for outer in self.outer_optimizers],
                "outer_residuals": [residual.clone() for residual in self.residuals]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.rounds = int(state["rounds"])
        with torch.no_grad():
            for weights, saved in zip(self.global_parameters, state["global_parameters"],
                                      strict=True):
                weights.copy_(saved)
        for outer, saved in zip(self.outer_optimizers, state["outer_optimizers"], strict=True):
            outer.load_state_dict(saved)
        # a checkpoint of an earlier release, or of a codec without error feedback, has none:
        # nothing dropped yet
        residuals = state.get("outer_residuals") or []
        if self.residuals and len(residuals) not in (0, len(self.residuals)):
            raise ValueError(f"the checkpoint holds {len(residuals)} outer residual(s), this "
                             f"run's codec keeps {len(self.residuals)} (one per fragment)")
        with torch.no_grad():
            for index, residual in enumerate(self.residuals):
                if residuals:
                    residual.copy_(residuals[index])
                else:
                    residual.zero_()

