"""Elastic averaging SGD (EASGD, Zhang, Choromanska & LeCun 2015), synchronous form.

Workers explore with local SGD and are pulled toward a center variable ``x~`` every
``sync-period`` steps (one all-reduce), with moving rate ``alpha``::

    d_i = alpha * (x_i - x~)
    x_i = x_i - d_i
    x~  = x~ + sum_i d_i

Every worker holds an identical copy of the center (updated from the same all-reduced sum), so
no parameter server is needed. The default ``alpha = 0.9 / N`` is the paper's ``beta / p`` with
``beta = 0.9``. The run's result is the center variable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from .base import (
    ParadigmConfig,
    PeriodicAveraging,
    PeriodicConfig,
    Replicas,
    auto_or,
    flat_parameters,
    load_flat_parameters,
)


@dataclass(frozen=True, kw_only=True)
class EasgdConfig(PeriodicConfig):
    moving_rate: float | None  # alpha; None: 0.9 / N for N workers


class ElasticAveragingSGD(PeriodicAveraging):
    name = "easgd"
    Config: ClassVar[type[ParadigmConfig]] = EasgdConfig
    config: EasgdConfig

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 config: ParadigmConfig | Mapping[str, Any],
                 replicas: Replicas | None = None) -> None:
        super().__init__(model, optimizer, config, replicas)
        self.center = flat_parameters(model)

    @property
    def alpha(self) -> float:
        """The moving rate: as configured, or the paper's 0.9 / N over the job's workers. Read
        when used: under per-step recovery the replica groups are attached after the paradigm
        is made, and N read then was the node's own processes (1: alpha 0.9, and the center
        moved 0.9 x N times the workers' mean distance per round: it diverged)."""
        return auto_or(self.config.moving_rate, 0.9 / self.workers)

    def synchronize(self) -> None:
        local = flat_parameters(self.model)
        elastic = self.alpha * (local - self.center)
        pulled_total = elastic.clone()
        self.sum_(pulled_total)
        load_flat_parameters(self.model, local - elastic)
        self.center += pulled_total

    def consensus(self) -> torch.Tensor:
        return self.center

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "center": self.center}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        # Checkpoints load onto the CPU; the next round's collective needs the model's device.
        self.center = state["center"].to(self.device)
