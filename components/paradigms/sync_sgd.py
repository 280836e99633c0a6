"""Synchronous SGD: every step all-reduces gradients across workers (PyTorch DDP).

With N workers of per-worker batch b this is exactly SGD with batch N*b, so it converges like a
single large-batch run; its cost is one all-reduce per step (DDP buckets the gradients and
overlaps the all-reduce with the backward pass). For large global batches use the rules of Goyal
et al. (2017), applied by the worker for any paradigm: ``lr-scaling=linear`` (learning rate
proportional to the global batch) with ``warmup-epochs`` of gradual warmup, and
``accumulation-steps`` to reach a global batch larger than memory allows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from .base import Paradigm
from .gradient_buckets import GradientBuckets


class SyncSGD(Paradigm):
    name = "sync"

    def training_model(self) -> nn.Module:
        if self.replicas is not None:  # per-step recovery: the gradient buckets do DDP's part
            self._buckets()
            return self.model
        if not hasattr(self, "_ddp"):
            # Imported here: DDP's module pulls in torch._dynamo (a second or more of CPU),
            # which per-step recovery, averaging without DDP, never needs.
            from torch.nn.parallel import DistributedDataParallel

            on_gpu = next(self.model.parameters()).is_cuda
            self._ddp = DistributedDataParallel(
                self.model, device_ids=[torch.cuda.current_device()] if on_gpu else None)
        return self._ddp

    def _buckets(self) -> GradientBuckets:
        """Per-step recovery's gradient buckets, made (and their hooks registered) once."""
        if not hasattr(self, "_gradient_buckets"):
            self._gradient_buckets = GradientBuckets(self.averaged_parameters(), self.replicas)
        return self._gradient_buckets

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        if self.replicas is not None:  # gradients accumulate locally until averaged
            with self._buckets().accumulating():
                yield
            return
        with self.training_model().no_sync():  # type: ignore[operator]
            yield

    def zero_grad(self) -> None:
        if self.replicas is not None:
            self._buckets().zero()  # the gradients stay views of the buckets' buffers
            return
        super().zero_grad()

    def averaged_parameters(self) -> list[nn.Parameter]:
        """The parameters whose gradients :meth:`average_gradients` all-reduces: the
        trainable ones."""
        return [parameter for parameter in self.model.parameters() if parameter.requires_grad]

    def average_gradients(self) -> None:
        """Per-step recovery: every gradient replaced by its mean over the whole global batch
        (the buckets, sent during the backward pass: :mod:`.gradient_buckets`); the slices of
        groups not in the step count as zero, so the update is the participants' mean gradient
        times their share of the job's workers. Parameters without a gradient count as zero.

        Why not the participants' mean alone (torchft's DDP): the learning rate was scaled for
        the global batch (``lr_schedule``), and with a quarter of the nodes left the step
        averages a quarter of it. Scaling the update by the share keeps the linear scaling rule
        for the batch that took part; without it a node left alone stepped at four times the
        rate its batch allows and its model collapsed (mnist1d, 4 nodes, loss to ln 10)."""
        buckets = self._buckets()
        buckets.wait()
        assert self.replicas is not None  # per-step recovery only
        share = self.replicas.participating_workers() / self.replicas.workers
        if share < 1:
            buckets.scale(share)

    def after_step(self, step: int) -> None:
        self.communication_ops += 1  # DDP's bucketed gradient all-reduce for this step
