"""Synchronous SGD: every step all-reduces gradients across workers (PyTorch DDP).

With N workers of per-worker batch b this is exactly SGD with batch N*b, so it converges like a
single large-batch run; its cost is one all-reduce per step.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from sublimate.components.paradigm import Paradigm


class SyncSGD(Paradigm):
    name = "sync"

    def training_model(self) -> nn.Module:
        if not hasattr(self, "_ddp"):
            device_ids = [torch.cuda.current_device()] if next(
                self.model.parameters()).is_cuda else None
            self._ddp = DistributedDataParallel(self.model, device_ids=device_ids)
        return self._ddp
