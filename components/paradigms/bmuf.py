"""Blockwise model-update filtering (BMUF, Chen & Huo 2016).

Each worker runs plain local SGD for a block of ``sync-period`` steps. At the end of a block the
workers' models are averaged (one all-reduce); the block's update ``G = mean(w_i) - w_start`` is
filtered with block momentum ``eta`` and block learning rate ``zeta``::

    delta = eta * delta + zeta * G
    w_global = w_global + delta
    w_start = w_global + eta * delta   (Nesterov look-ahead)   or   w_global   (classic)

and every worker continues from ``w_start``. The defaults follow the paper: ``eta = 1 - 1/N``
for N workers, ``zeta = 1``, Nesterov on. With ``eta = 0`` and ``zeta = 1`` BMUF is exactly
periodic model averaging.
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
class BmufConfig(PeriodicConfig):
    block_lr: float  # zeta
    nesterov: bool
    block_momentum: float | None  # eta; None: 1 - 1/N for N workers


class BlockMomentumSGD(PeriodicAveraging):
    name = "bmuf"
    Config: ClassVar[type[ParadigmConfig]] = BmufConfig
    config: BmufConfig

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 config: ParadigmConfig | Mapping[str, Any],
                 replicas: Replicas | None = None) -> None:
        super().__init__(model, optimizer, config, replicas)
        self.zeta = self.config.block_lr
        self.nesterov = self.config.nesterov
        start = flat_parameters(model)
        self.global_model = start.clone()
        self.block_start = start
        self.delta = torch.zeros_like(start)

    @property
    def eta(self) -> float:
        """The block momentum: as configured, or the paper's 1 - 1/N over the job's workers.
        Read when used: under per-step recovery the replica groups are attached after the
        paradigm is made, and N read then was the node's own processes (1: no momentum)."""
        return auto_or(self.config.block_momentum, 1.0 - 1.0 / self.workers)

    def synchronize(self) -> None:
        average = flat_parameters(self.model)
        self.average_(average)
        block_update = average - self.block_start
        self.delta.mul_(self.eta).add_(block_update, alpha=self.zeta)
        self.global_model.add_(self.delta)
        self.block_start = self.global_model + self.eta * self.delta if self.nesterov \
            else self.global_model.clone()
        load_flat_parameters(self.model, self.block_start)

    def consensus(self) -> torch.Tensor:
        return self.global_model

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "global_model": self.global_model,
                "block_start": self.block_start, "delta": self.delta}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        # Checkpoints load onto the CPU; the next round's collective needs the model's device.
        device = self.device
        self.global_model = state["global_model"].to(device)
        self.block_start = state["block_start"].to(device)
        self.delta = state["delta"].to(device)
