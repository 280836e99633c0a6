"""Per-step recovery at the paradigms: a BMUF or EASGD round is a transaction (a round that the
groups do not all complete leaves every tensor as it was), a committed round is exactly the
restart mode's, and sync SGD's flat gradient average is exactly DDP's. Real gloo groups of two
processes; the replica groups are stood in for by :class:`VetoingReplicas`, which averages over
the gloo group and refuses the rounds it is told to (torchft's Manager is tested end to end in
tests/components/training/test_fault_tolerance.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from sublimate.components.base.ports import free_port
from sublimate.components.paradigms import flat_parameters
from sublimate.components.paradigms.bmuf import BlockMomentumSGD
from sublimate.components.paradigms.easgd import ElasticAveragingSGD
from sublimate.components.paradigms.sync_sgd import SyncSGD
from tests.ranks import run_ranks

WORLD = 2
PERIOD = 3


class VetoingReplicas:
    """The :class:`~sublimate.components.paradigms.Replicas` protocol over a plain gloo group:
    every worker participates; the rounds numbered in ``vetoed`` (1-based) do not commit."""

    def __init__(self, vetoed: set[int]) -> None:
        self.workers = dist.get_world_size()
        self.vetoed, self.rounds = vetoed, 0

    def start_step(self) -> int:
        self.rounds += 1
        return self.rounds - 1

    group_world = 1  # a process per group: sync's gradient buckets send from hooks

    def average(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor)
        tensor /= self.workers

    def start_average(self, tensor: torch.Tensor, node_first: bool = False) -> Any:
        return dist.all_reduce(tensor, async_op=True), tensor

    def finish_averages(self, works: list[Any]) -> None:
        for work, tensor in works:  # the participants' mean, as torchft's
            work.wait()
            tensor /= dist.get_world_size()

    def participating_workers(self) -> int:
        return self.workers

    def start_average_encoded(self, payload: torch.Tensor) -> Any:
        gathered = [torch.empty_like(payload) for _ in range(self.workers)]
        return dist.all_gather(gathered, payload, async_op=True), gathered

    def finish_average_encoded(self, pending: Any,
                               decode: Callable[[torch.Tensor], torch.Tensor],
                               out: torch.Tensor) -> None:
        work, gathered = pending
        work.wait()
        total = decode(gathered[0])
        for other in gathered[1:]:
            total += decode(other)
        out.copy_((total / self.workers).view_as(out))

    def commit(self) -> bool:
        return self.rounds not in self.vetoed


class ShrunkReplicas(VetoingReplicas):
    """A job of twice the gloo group's workers, of which only the gloo group takes part."""

    def __init__(self) -> None:
        super().__init__(set())
        self.workers = 2 * dist.get_world_size()

    def average(self, tensor: torch.Tensor) -> None:  # the participants' mean, as torchft's
        dist.all_reduce(tensor)
        tensor /= dist.get_world_size()

    def participating_workers(self) -> int:
        return dist.get_world_size()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, 3))


def _local_step(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, step: int) -> None:
    generator = torch.Generator().manual_seed(100 * rank + step)
    x = torch.randn(8, 4, generator=generator) * (1 + rank)
    y = torch.randint(0, 3, (8,), generator=generator)
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def _snapshot(model: nn.Module, paradigm: Any) -> dict[str, Any]:
    state = paradigm.state_dict()
    tensors = {key: value.clone() for key, value in state.items()
               if isinstance(value, torch.Tensor)}
    return {"parameters": flat_parameters(model), "buffers": [b.clone() for b in model.buffers()],
            "tensors": tensors, "synced_buffers": [b.clone() for b in state["synced_buffers"]],
            "synced_step": state["synced_step"], "ops": state["communication_ops"]}


def _paradigm(algorithm: str, model: nn.Module, optimizer: torch.optim.Optimizer,
              replicas: VetoingReplicas | None) -> Any:
    if algorithm == "bmuf":
        return BlockMomentumSGD(model, optimizer, {"sync_period": PERIOD}, replicas)
    return ElasticAveragingSGD(model, optimizer, {"sync_period": PERIOD, "moving_rate": 0.3},
                               replicas)


def _rounds(rank: int, port: int, results: Path, algorithm: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    record: dict[str, Any] = {}
    # The same three rounds three ways: the restart mode's, per-step with every round committed,
    # per-step with round 2 refused (its result must be exactly the state before it).
    for name, replicas in (("restart", None), ("committed", VetoingReplicas(set())),
                           ("vetoed", VetoingReplicas({2}))):
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        paradigm = _paradigm(algorithm, model, optimizer, replicas)
        before_refused: dict[str, Any] | None = None
        for step in range(1, 3 * PERIOD + 1):
            _local_step(model, optimizer, rank, step)
            if step % PERIOD == 0 and replicas is not None and replicas.rounds + 1 == 2:
                before_refused = _snapshot(model, paradigm)
            paradigm.after_step(step)
            if before_refused is not None and "after_refused" not in record.get(name, {}):
                record.setdefault(name, {})["after_refused"] = _snapshot(model, paradigm)
                record[name]["before_refused"] = before_refused
                before_refused = None
        record.setdefault(name, {})["final"] = _snapshot(model, paradigm)
    torch.save(record, results / f"rank-{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.parametrize("algorithm", ["bmuf", "easgd"])
def test_a_refused_round_leaves_every_tensor_as_it_was_and_a_committed_one_is_the_restart_modes(
        tmp_path: Path, algorithm: str) -> None:
    # spawn, not fork: a fork of a process whose OpenMP pool already ran (pytest's, after other
    # tests) can deadlock in the child's first parallel kernel
    run_ranks(_rounds, (free_port(), tmp_path, algorithm), WORLD)
    for rank in range(WORLD):
        record = torch.load(tmp_path / f"rank-{rank}.pt")
        # per-step, every round committed: bit for bit the restart mode's three rounds
        restart, committed = record["restart"]["final"], record["committed"]["final"]
        assert torch.equal(restart["parameters"], committed["parameters"])
        for key in restart["tensors"]:
            assert torch.equal(restart["tensors"][key], committed["tensors"][key]), key
        assert restart["ops"] == committed["ops"] == 3
        # the refused round: parameters, BatchNorm buffers, the paradigm's state, its step and
        # its count of rounds exactly as they were before it
        before, after = record["vetoed"]["before_refused"], record["vetoed"]["after_refused"]
        assert torch.equal(before["parameters"], after["parameters"])
        assert all(torch.equal(a, b) for a, b in zip(before["buffers"], after["buffers"],
                                                      strict=True))
        assert all(torch.equal(a, b) for a, b in zip(before["synced_buffers"],
                                                      after["synced_buffers"], strict=True))
        for key, value in before["tensors"].items():
            assert torch.equal(value, after["tensors"][key]), key
        assert after["synced_step"] == before["synced_step"] == PERIOD
        assert after["ops"] == before["ops"] == 1
        # and the run went on: the third round committed (2 of 3), and differs from the
        # all-committed run, whose second round was applied
        assert record["vetoed"]["final"]["ops"] == 2
        assert not torch.equal(record["vetoed"]["final"]["parameters"], committed["parameters"])


def _gradients(rank: int, port: int, results: Path) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    grads = {}
    for name, replicas in (("ddp", None), ("per-step", VetoingReplicas(set())),
                           ("half-left", ShrunkReplicas())):
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        paradigm = SyncSGD(model, optimizer, {}, replicas)
        trained = paradigm.training_model()
        generator = torch.Generator().manual_seed(7 + rank)
        x, y = torch.randn(8, 4, generator=generator), torch.randint(0, 3, (8,),
                                                                     generator=generator)
        nn.functional.cross_entropy(trained(x), y).backward()
        if replicas is not None:
            assert trained is model  # no DDP wrapper under per-step recovery
            paradigm.average_gradients()
        grads[name] = [p.grad.clone() for p in model.parameters()]
    torch.save(grads, results / f"rank-{rank}.pt")
    dist.destroy_process_group()


def test_sync_sgds_flat_gradient_average_is_ddps_over_the_global_batch(tmp_path: Path) -> None:
    run_ranks(_gradients, (free_port(), tmp_path), WORLD)
    for rank in range(WORLD):
        grads = torch.load(tmp_path / f"rank-{rank}.pt")
        for ddp, flat in zip(grads["ddp"], grads["per-step"], strict=True):
            assert torch.allclose(ddp, flat, rtol=0, atol=1e-7)
        # Half the job's workers took part: their mean gradient at half the size, the global
        # batch's mean with the missing half counted as zero (the rate was scaled for it all).
        for ddp, half in zip(grads["ddp"], grads["half-left"], strict=True):
            assert torch.allclose(ddp / 2, half, rtol=0, atol=1e-7)


class JobOfThreeNodes(VetoingReplicas):
    """A per-step job of three nodes of one process each, seen from one of them."""

    def __init__(self) -> None:
        super().__init__(set())
        self.workers = 3


def _defaults(rank: int, port: int, results: Path) -> None:
    # As the per-step loop makes them: over the node's own process group (one process), the
    # job's replica groups attached afterwards.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=1)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    bmuf = BlockMomentumSGD(model, optimizer, {"sync_period": PERIOD})
    easgd = ElasticAveragingSGD(model, optimizer, {"sync_period": PERIOD})
    for paradigm in (bmuf, easgd):
        paradigm.replicas = JobOfThreeNodes()
    torch.save({"eta": bmuf.eta, "alpha": easgd.alpha}, results / "defaults.pt")
    dist.destroy_process_group()


def test_the_papers_defaults_count_the_jobs_workers_under_per_step_recovery(
        tmp_path: Path) -> None:
    # N was read when the paradigm was made, from the node's own group: 1. EASGD's moving rate
    # was 0.9 instead of 0.3 (its center overshot and every per-step EASGD run diverged to
    # NaN, with or without a failure), BMUF's block momentum 0 instead of 2/3.
    run_ranks(_defaults, (free_port(), tmp_path), 1)
    defaults = torch.load(tmp_path / "defaults.pt")
    assert defaults["eta"] == pytest.approx(1 - 1 / 3)
    assert defaults["alpha"] == pytest.approx(0.9 / 3)
