"""Synchronous SGD's gradient all-reduce between replica groups under per-step recovery, overlapped
with the backward pass the way DDP's reducer does it.

torchft's ``DistributedDataParallel`` would give the same overlap, but in torchft 0.2.0 its comm
hook asserts (``assert fut._fut``) in the survivors when a peer dies mid-step, ending the very
processes that should go on (checked on this machine, torch 2.13 and gloo). This is DDP's
reducer done over :class:`~sublimate.components.paradigms.base.Replicas` instead:

* **Gradients are views of one flat buffer per dtype** (DDP's ``gradient_as_bucket_view``): the
  all-reduce works on the buffer itself, with no concatenation before it and no copy back after.
* **Buckets fire from gradient hooks.** The parameters are cut into buckets in reverse order (the
  order the backward pass produces their gradients), the first of ``FIRST_BUCKET_BYTES`` and the
  rest of ``BUCKET_BYTES`` (DDP's defaults). A bucket is all-reduced once its last gradient is
  accumulated, while the backward pass goes on with the earlier layers.
* **Every group sends the buckets in the same order**, however its gradients became ready: bucket
  i goes only after buckets 0..i-1 (collectives must match between processes). A bucket whose
  parameters got no gradient this step goes at :meth:`GradientBuckets.wait`, as zeros.
* **Only the last micro-batch sends** (:meth:`GradientBuckets.accumulating`, the paradigm's
  ``no_sync``).

With several processes per node the gradient is first averaged within the node, which this
class does at :meth:`GradientBuckets.wait`, after the backward pass (no hooks then): the two
all-reduces of one bucket must run one after the other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

# DDP's defaults (torch.nn.parallel.DistributedDataParallel: bucket_cap_mb=25, and a first
# bucket of 1 MiB, dist._DEFAULT_FIRST_BUCKET_BYTES, so that the first all-reduce starts early).
FIRST_BUCKET_BYTES = 1024 * 1024
BUCKET_BYTES = 25 * 1024 * 1024


@dataclass
class _Bucket:
    flat: torch.Tensor  # a slice of its dtype's flat buffer
    parameters: list[nn.Parameter]
    pending: int = 0  # gradients not yet accumulated this step
    work: Any = None  # the all-reduce in flight (buckets before _next have one)


@dataclass
class GradientBuckets:
    """The gradients of ``parameters`` as views of flat buffers, all-reduced between the replica
    groups in buckets during the backward pass (see the module's docstring).

    Per step: the backward pass (hooks send the buckets), then :meth:`wait` (send what is left,
    wait for every all-reduce; afterwards each gradient is its mean over the groups that took
    part), then the optimizer step, then :meth:`zero`."""

    parameters: list[nn.Parameter]
    replicas: Any  # paradigms.base.Replicas
    first_bucket_bytes: int = FIRST_BUCKET_BYTES
    bucket_bytes: int = BUCKET_BYTES
    buffers: list[torch.Tensor] = field(init=False, default_factory=list)
    buckets: list[_Bucket] = field(init=False, default_factory=list)
    _bucket_of: dict[int, _Bucket] = field(init=False, default_factory=dict)
    _next: int = field(init=False, default=0)  # the next bucket to send, in order
    _armed: bool = field(init=False, default=True)

    def __post_init__(self) -> None:
        if not self.parameters:
            raise ValueError("GradientBuckets: no parameter to average")
        if self.first_bucket_bytes <= 0 or self.bucket_bytes <= 0:
            raise ValueError("GradientBuckets: bucket sizes must be above 0 bytes")
        by_kind: dict[tuple[torch.dtype, torch.device], list[nn.Parameter]] = {}
        for parameter in self.parameters:
            by_kind.setdefault((parameter.dtype, parameter.device), []).append(parameter)
        for (dtype, device), group in by_kind.items():
            buffer = torch.zeros(sum(p.numel() for p in group), dtype=dtype, device=device)
            self.buffers.append(buffer)
            offset, members, start, cap = 0, [], 0, self.first_bucket_bytes
            # reverse order: the backward pass produces the last layers' gradients first
            for parameter in reversed(group):
                parameter.grad = buffer[offset:offset + parameter.numel()].view_as(parameter)
                offset += parameter.numel()
                members.append(parameter)
                if (offset - start) * buffer.element_size() >= cap:
                    self.buckets.append(_Bucket(buffer[start:offset], members))
                    members, start, cap = [], offset, self.bucket_bytes
            if members:
                self.buckets.append(_Bucket(buffer[start:offset], members))
        for bucket in self.buckets:
            for parameter in bucket.parameters:
                self._bucket_of[id(parameter)] = bucket
        self._hooks = self.replicas.group_world == 1
        if self._hooks:
            for parameter in self.parameters:
                parameter.register_post_accumulate_grad_hook(self._gradient_ready)
        self._new_step()

    def _new_step(self) -> None:
        self._next = 0
        for bucket in self.buckets:
            bucket.pending, bucket.work = len(bucket.parameters), None

    @contextlib.contextmanager
    def accumulating(self) -> Iterator[None]:
        """Backward passes inside accumulate the gradient and send nothing (the micro-batches
        of gradient accumulation before the last)."""
        self._armed = False
        try:
            yield
        finally:
            self._armed = True

    def _gradient_ready(self, parameter: torch.Tensor) -> None:
        if not self._armed:
            return
        bucket = self._bucket_of[id(parameter)]
        bucket.pending -= 1
        while self._next < len(self.buckets) and self.buckets[self._next].pending <= 0:
            self._send(self.buckets[self._next])

    def _send(self, bucket: _Bucket) -> None:
        bucket.work = self.replicas.start_average(bucket.flat)
        self._next += 1

    def wait(self) -> None:
        """Send the buckets not sent yet (their gradients did not all arrive: zeros count), in
        order, and wait for every all-reduce of the step."""
        if not self._hooks:  # several processes per node: within the node first, then between
            for buffer in self.buffers:
                self.replicas.average(buffer)
            self._new_step()
            return
        while self._next < len(self.buckets):
            self._send(self.buckets[self._next])
        self.replicas.finish_averages([bucket.work for bucket in self.buckets])
        self._new_step()

    def scale(self, factor: float) -> None:
        for buffer in self.buffers:
            buffer.mul_(factor)

    def zero(self) -> None:
        """Zero the gradients for the next step, keeping them views of the buffers (an
        optimizer's ``zero_grad(set_to_none=True)`` would drop the views)."""
        for buffer in self.buffers:
            buffer.zero_()
