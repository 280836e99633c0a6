"""Asynchronous SGD's parameter server (Downpour-style, Dean et al. 2012): the global model,
to which trainers push gradients and from which they pull parameters, without waiting for each
other.

:class:`ParameterServer` applies every pushed gradient exactly once, in arrival order, and records
its staleness (how many other updates landed since the trainer pulled). With ``staleness_bound`` > 0
it is stale-synchronous parallel SGD: a trainer that is that many pushes ahead of the slowest
running trainer waits before its push is applied. The processes that host it and the trainers (over
``torch.distributed.rpc``) are :mod:`sublimate.components.processes.async_sgd`.

Buffers (BatchNorm's running statistics) are not trained by gradients: each trainer sends its own
with every push, and the server's model holds their mean over the trainers (integer buffers such
as ``num_batches_tracked``: the largest) whenever it is read (:meth:`ParameterServer.snapshot`,
checkpoints, the final model).
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import torch
from torch import nn

from sublimate.components.monitoring.traffic import Traffic, tensor_bytes

from .base import Paradigm


class AsyncSGD(Paradigm):
    """Registered so ``algorithm=async`` is known; the work happens in the two roles below."""

    name = "async"


class ParameterServer:
    """The global model; applies pushed gradients one at a time under a lock."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, num_trainers: int,
                 staleness_bound: int = 0) -> None:
        self.model, self.optimizer = model, optimizer
        self.num_trainers, self.staleness_bound = num_trainers, staleness_bound
        self.version = 0
        self.clocks = [0] * num_trainers
        self.finished: set[int] = set()
        self.staleness_total = 0
        self.staleness_max = 0
        self.staleness_histogram: dict[int, int] = {}
        self.waits = 0
        self.first_update_at: float | None = None  # wall clock, for the start-up report
        self.condition = threading.Condition()
        # each trainer's last per-epoch report (loss, time split), for the live line
        self.trainer_reports: dict[int, dict[str, float]] = {}
        # each trainer's buffers as of its last push, merged into the model when it is read
        self.trainer_buffers: dict[int, list[torch.Tensor]] = {}
        # The RPC's two directions, counted as the server handles each push and its reply:
        # what the trainers sent (gradients and buffers) and what the server sent back.
        self.pushed, self.replied = Traffic(), Traffic()

    def parameters(self) -> list[torch.Tensor]:
        return [parameter.detach().clone() for parameter in self.model.parameters()]

    def start(self, trainer: int) -> tuple[list[torch.Tensor], int, int]:
        """Parameters, version and the trainer's own step count (non-zero after a resume)."""
        with self.condition:
            return self.parameters(), self.version, self.clocks[trainer]

    def _too_far_ahead(self, trainer: int) -> bool:
        running = [clock for index, clock in enumerate(self.clocks) if index not in self.finished]
        return bool(self.staleness_bound) and self.clocks[trainer] - min(running) \
            >= self.staleness_bound

    def push_pull(self, trainer: int, gradients: list[torch.Tensor], version_seen: int,
                  learning_rate: float, buffers: list[torch.Tensor] | None = None,
                  ) -> tuple[list[torch.Tensor], int]:
        with self.condition:
            self.pushed.send(sum(tensor_bytes(t) for t in [*gradients, *(buffers or [])]))
            if buffers:
                self.trainer_buffers[trainer] = buffers
            if self._too_far_ahead(trainer):
                self.waits += 1
                self.condition.wait_for(lambda: not self._too_far_ahead(trainer))
            staleness = self.version - version_seen
            self.staleness_total += staleness
            self.staleness_max = max(self.staleness_max, staleness)
            self.staleness_histogram[staleness] = self.staleness_histogram.get(staleness, 0) + 1
            for parameter, gradient in zip(self.model.parameters(), gradients, strict=True):
                parameter.grad = gradient
            for group in self.optimizer.param_groups:
                group["lr"] = learning_rate
            self.optimizer.step()
            if self.first_update_at is None:
                self.first_update_at = time.time()
            self.version += 1
            self.clocks[trainer] += 1
            self.condition.notify_all()
            parameters = self.parameters()
            self.replied.send(sum(tensor_bytes(parameter) for parameter in parameters))
            return parameters, self.version

    def report(self, trainer: int, figures: dict[str, float]) -> None:
        with self.condition:
            self.trainer_reports[trainer] = figures

    def trainer_means(self) -> dict[str, float]:
        """Mean over trainers of their latest epoch report (they may be an epoch apart)."""
        with self.condition:
            reports = list(self.trainer_reports.values())
        if not reports:
            return {}
        return {key: sum(r[key] for r in reports) / len(reports) for key in reports[0]}

    def finish(self, trainer: int) -> None:
        with self.condition:
            self.finished.add(trainer)
            self.condition.notify_all()

    def statistics(self) -> dict[str, Any]:
        return {
            "updates_applied": self.version,
            "pushes_per_trainer": list(self.clocks),
            "staleness_mean": round(self.staleness_total / max(self.version, 1), 3),
            "staleness_max": self.staleness_max,
            "staleness_histogram": {str(k): v for k, v in sorted(self.staleness_histogram.items())},
            "bound_waits": self.waits,
            # per trainer, comparable with the collective paradigms' (this launch's pushes)
            "sent_payload_bytes_per_worker": self.pushed.payload_bytes // self.num_trainers,
            "sent_wire_bytes_per_worker": round(self.pushed.wire_bytes / self.num_trainers),
            "ps_sent_bytes": self.replied.payload_bytes,
        }

    def _merge_buffers(self) -> None:
        """The model's buffers := the trainers' (call under the lock)."""
        reported = list(self.trainer_buffers.values())
        if not reported:
            return
        with torch.no_grad():
            for index, buffer in enumerate(self.model.buffers()):
                values = torch.stack([buffers[index] for buffers in reported])
                buffer.copy_(values.mean(0) if buffer.is_floating_point() else values.amax(0))

    def snapshot(self) -> dict[str, torch.Tensor]:
        """A copy of the model's state (the trainers' buffers merged in), taken under the lock:
        pushes applied after it do not change it."""
        with self.condition:
            self._merge_buffers()
            return {name: value.detach().clone()
                    for name, value in self.model.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        """The whole server, copied under the lock so that weights, optimizer state, version
        and clocks belong to one moment; the caller saves it outside the lock while trainers
        go on pushing."""
        with self.condition:
            self._merge_buffers()
            return copy.deepcopy({
                "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "version": self.version, "clocks": list(self.clocks),
                "staleness": [self.staleness_total, self.staleness_max,
                              dict(self.staleness_histogram), self.waits],
                "trainer_buffers": dict(self.trainer_buffers)})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version, self.clocks = state["version"], list(state["clocks"])
        self.staleness_total, self.staleness_max, histogram, self.waits = state["staleness"]
        self.staleness_histogram = dict(histogram)
        self.trainer_buffers = dict(state.get("trainer_buffers", {}))
