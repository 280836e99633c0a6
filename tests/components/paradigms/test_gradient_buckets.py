"""Per-step sync's gradient buckets (``paradigms.gradient_buckets``): gradients as views of one
flat buffer, all-reduced in buckets from gradient hooks, in the same order on every group,
checked against exact oracles (a plain backward pass, and a peer group whose gradient is known)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from sublimate.components.paradigms.gradient_buckets import GradientBuckets


class PeerOfConstantGradient:
    """Replicas of two groups, the other of which holds ``peer`` in every gradient: the mean is
    (g + peer) / 2, applied when the work is waited for, as a real all-reduce completes."""

    workers = 2
    group_world = 1

    def __init__(self, peer: float) -> None:
        self.peer = peer
        self.sent: list[tuple[int, int]] = []  # (data_ptr, numel) of each bucket, in order

    def start_average(self, tensor: torch.Tensor, node_first: bool = False) -> Any:
        self.sent.append((tensor.data_ptr(), tensor.numel()))

        class Work:
            def wait(inner) -> None:
                tensor.add_(self.peer).div_(2)
        return Work()

    def finish_averages(self, works: list[Any]) -> None:
        for work in works:
            work.wait()

    def average(self, tensor: torch.Tensor) -> None:
        tensor.add_(self.peer).div_(2)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(),
                         nn.Linear(32, 10))


def _plain_gradients(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    model = _model()
    nn.functional.cross_entropy(model(x), y).backward()
    return [parameter.grad.clone() for parameter in model.parameters()]


def test_the_gradients_are_views_of_one_buffer_and_come_out_averaged_exactly() -> None:
    x, y = torch.randn(16, 40), torch.randint(0, 10, (16,))
    expected = [(gradient + 0.5) / 2 for gradient in _plain_gradients(x, y)]
    model = _model()
    replicas = PeerOfConstantGradient(0.5)
    # small buckets: several of them, sent during the backward pass
    buckets = GradientBuckets(list(model.parameters()), replicas, first_bucket_bytes=1024,
                              bucket_bytes=4096)
    (buffer,) = buckets.buffers
    for parameter in model.parameters():
        assert parameter.grad.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
    nn.functional.cross_entropy(model(x), y).backward()
    assert len(replicas.sent) == len(buckets.buckets) > 2  # every bucket left in the backward
    buckets.wait()
    for parameter, gradient in zip(model.parameters(), expected, strict=True):
        assert torch.equal(parameter.grad, gradient)
    # sent in bucket order, the last layers first (the order their gradients are produced)
    assert replicas.sent == [(bucket.flat.data_ptr(), bucket.flat.numel())
                             for bucket in buckets.buckets]
    assert buckets.buckets[0].parameters[0] is list(model.parameters())[-1]
    buckets.zero()
    assert not buffer.any() and all(parameter.grad is not None
                                    for parameter in model.parameters())


def test_buckets_leave_in_order_whatever_order_their_gradients_arrive() -> None:
    # Collectives must match between processes: a bucket ready before an earlier one waits.
    model = _model()
    replicas = PeerOfConstantGradient(0.0)
    buckets = GradientBuckets(list(model.parameters()), replicas, first_bucket_bytes=1,
                              bucket_bytes=1)  # a bucket per parameter
    first = next(iter(model.parameters()))  # its bucket is the last: reverse order
    buckets._gradient_ready(first)
    assert replicas.sent == []  # the buckets before it are not ready
    for parameter in list(model.parameters())[1:]:
        buckets._gradient_ready(parameter)
    assert [numel for _, numel in replicas.sent] == \
        [bucket.flat.numel() for bucket in buckets.buckets]


def test_only_the_last_micro_batch_sends_and_an_unused_parameter_counts_as_zero() -> None:
    x, y = torch.randn(16, 40), torch.randint(0, 10, (16,))
    model = _model()
    unused = nn.Parameter(torch.ones(3))
    model.register_parameter("unused", unused)
    replicas = PeerOfConstantGradient(0.0)
    buckets = GradientBuckets(list(model.parameters()), replicas, first_bucket_bytes=1024,
                              bucket_bytes=4096)
    with buckets.accumulating():
        (nn.functional.cross_entropy(model(x[:8]), y[:8]) / 2).backward()
    assert replicas.sent == []
    (nn.functional.cross_entropy(model(x[8:]), y[8:]) / 2).backward()
    # the model's own parameter comes first, so its bucket is the last: every other bucket
    # left in the backward pass, and that one, its gradient never produced, waits for wait()
    assert unused in buckets.buckets[-1].parameters
    assert len(replicas.sent) == len(buckets.buckets) - 1
    buckets.wait()
    assert len(replicas.sent) == len(buckets.buckets)
    assert torch.equal(unused.grad, torch.zeros(3))
    expected = [gradient / 2 for gradient in _plain_gradients(x, y)]
    for parameter, gradient in zip(list(model.parameters())[1:], expected, strict=True):
        torch.testing.assert_close(parameter.grad, gradient, rtol=1e-6, atol=1e-7)


def test_parameters_of_two_dtypes_get_a_buffer_each() -> None:
    model = _model()
    model[0].to(torch.float64)
    buckets = GradientBuckets(list(model.parameters()), PeerOfConstantGradient(0.0))
    assert sorted(str(buffer.dtype) for buffer in buckets.buffers) == ["torch.float32",
                                                                        "torch.float64"]
    for parameter in model.parameters():
        assert parameter.grad.dtype == parameter.dtype


def test_bad_arguments_are_refused_on_entry() -> None:
    with pytest.raises(ValueError, match="no parameter"):
        GradientBuckets([], PeerOfConstantGradient(0.0))
    with pytest.raises(ValueError, match="bucket sizes"):
        GradientBuckets(list(_model().parameters()), PeerOfConstantGradient(0.0),
                        bucket_bytes=0)
