"""Update-rule tests for the paradigms, on tiny models with fixed seeds and a real gloo group."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from sublimate.components.async_sgd import ParameterServer
from sublimate.components.paradigms import flat_parameters, paradigm_class
from sublimate.components.paradigms.bmuf import BlockMomentumSGD
from sublimate.components.paradigms.easgd import ElasticAveragingSGD

WORLD = 2
PERIOD = 3


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))


def _local_step(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, step: int) -> None:
    generator = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(5, 4, generator=generator)
    y = torch.randint(0, 2, (5,), generator=generator)
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def _bmuf_vs_periodic_averaging(rank: int, port: int, results: Path) -> None:
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    bmuf_model, reference = _tiny_model(), _tiny_model()
    bmuf_opt = torch.optim.SGD(bmuf_model.parameters(), lr=0.5, momentum=0.9)
    reference_opt = torch.optim.SGD(reference.parameters(), lr=0.5, momentum=0.9)
    bmuf = BlockMomentumSGD(bmuf_model, bmuf_opt, {"sync_period": PERIOD, "block_momentum": 0.0,
                                                    "block_lr": 1.0, "nesterov": True})
    # torch's averager counts its own calls from 0: average after 1-based steps 3, 6, 9, ...
    averager = PeriodicModelAverager(period=PERIOD, warmup_steps=PERIOD - 1)
    for step in range(1, 3 * PERIOD + 1):
        _local_step(bmuf_model, bmuf_opt, rank, step)
        bmuf.after_step(step)
        _local_step(reference, reference_opt, rank, step)
        averager.average_parameters(reference.parameters())
    torch.save({"bmuf": flat_parameters(bmuf.result_model()),
                "local": flat_parameters(bmuf_model), "reference": flat_parameters(reference),
                "ops": bmuf.communication_ops}, results / f"rank{rank}.pt")
    dist.destroy_process_group()


def _easgd_one_round(rank: int, port: int, results: Path) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    model = _tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    easgd = ElasticAveragingSGD(model, optimizer, {"sync_period": PERIOD, "moving_rate": 0.25})
    center_before = easgd.center.clone()
    for step in range(1, PERIOD + 1):
        _local_step(model, optimizer, rank, step)
        if step == PERIOD:
            before = flat_parameters(model)
        easgd.after_step(step)
    torch.save({"center_before": center_before, "worker_before": before,
                "worker_after": flat_parameters(model), "center_after": easgd.center.clone()},
               results / f"rank{rank}.pt")
    dist.destroy_process_group()


def _spawn(function: object, tmp_path: Path) -> list[dict[str, torch.Tensor]]:
    mp.spawn(function, args=(_free_port(), tmp_path), nprocs=WORLD, join=True)
    return [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(WORLD)]


def test_bmuf_without_momentum_is_periodic_model_averaging(tmp_path: Path) -> None:
    ranks = _spawn(_bmuf_vs_periodic_averaging, tmp_path)
    for result in ranks:
        torch.testing.assert_close(result["bmuf"], result["reference"])
        torch.testing.assert_close(result["local"], result["reference"])
        assert result["ops"] == 3  # one all-reduce per block
    # averaging really happened: both workers hold the same model although their data differed
    torch.testing.assert_close(ranks[0]["bmuf"], ranks[1]["bmuf"])


def test_easgd_round_follows_the_elastic_update_equations(tmp_path: Path) -> None:
    ranks = _spawn(_easgd_one_round, tmp_path)
    alpha = 0.25
    center = ranks[0]["center_before"]
    assert not torch.equal(ranks[0]["worker_before"], ranks[1]["worker_before"])
    expected_center = center + alpha * sum(r["worker_before"] - center for r in ranks)
    for result in ranks:
        expected_worker = result["worker_before"] - alpha * (result["worker_before"] - center)
        torch.testing.assert_close(result["worker_after"], expected_worker)
        torch.testing.assert_close(result["center_after"], expected_center)


def test_parameter_server_applies_every_gradient_exactly_once() -> None:
    model = nn.Linear(3, 1, bias=False)
    start = model.weight.detach().clone()
    server = ParameterServer(model, torch.optim.SGD(model.parameters(), lr=0.1), num_trainers=4)
    pushed: list[torch.Tensor] = []
    lock = threading.Lock()

    def trainer(index: int) -> None:
        version = 0
        for step in range(25):
            gradient = torch.full((1, 3), float(index * 100 + step))
            with lock:
                pushed.append(gradient)
            _, version = server.push_pull(index, [gradient], version, learning_rate=0.1)
        server.finish(index)

    threads = [threading.Thread(target=trainer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statistics = server.statistics()
    assert statistics["updates_applied"] == 100 and statistics["pushes_per_trainer"] == [25] * 4
    assert sum(statistics["staleness_histogram"].values()) == 100
    torch.testing.assert_close(model.weight.detach(), start - 0.1 * torch.stack(pushed).sum(0))


def test_staleness_bound_holds_back_a_trainer_that_runs_ahead() -> None:
    model = nn.Linear(2, 1)
    server = ParameterServer(model, torch.optim.SGD(model.parameters(), lr=0.01),
                             num_trainers=2, staleness_bound=2)
    gradients = [torch.zeros_like(p) for p in model.parameters()]
    server.push_pull(0, gradients, 0, 0.01)
    server.push_pull(0, gradients, 1, 0.01)
    blocked = threading.Thread(target=server.push_pull, args=(0, gradients, 2, 0.01))
    blocked.start()
    blocked.join(timeout=0.5)
    assert blocked.is_alive(), "trainer 0 ran 3 pushes ahead of trainer 1 with a bound of 2"
    server.push_pull(1, gradients, 2, 0.01)
    blocked.join(timeout=5)
    assert not blocked.is_alive() and server.statistics()["bound_waits"] == 1


def test_unknown_algorithm_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown algorithm 'hogwild' \\(known: async, bmuf"):
        paradigm_class("hogwild")
