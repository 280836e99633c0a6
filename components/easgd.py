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

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from sublimate.components.paradigm import Paradigm, flat_parameters, load_flat_parameters


class ElasticAveragingSGD(Paradigm):
    name = "easgd"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 hyperparameters: dict[str, Any]) -> None:
        super().__init__(model, optimizer, hyperparameters)
        world = dist.get_world_size()
        self.period = int(hyperparameters.get("sync_period", 8))
        rate = hyperparameters.get("moving_rate")
        self.alpha = 0.9 / world if rate in (None, "auto", -1) else float(rate)
        start = flat_parameters(model)
        dist.broadcast(start, src=0)
        load_flat_parameters(model, start)
        self.center = start.clone()

    def after_step(self, step: int) -> None:
        if step % self.period:
            return
        local = flat_parameters(self.model)
        elastic = self.alpha * (local - self.center)
        pulled_total = elastic.clone()
        dist.all_reduce(pulled_total)
        self.communication_ops += 1
        load_flat_parameters(self.model, local - elastic)
        self.center += pulled_total

    def result_model(self) -> nn.Module:
        result = copy.deepcopy(self.model)  # the local model keeps training
        load_flat_parameters(result, self.center)
        return result

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "center": self.center}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.center = state["center"]
