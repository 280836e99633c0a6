"""Update-rule tests for the paradigms, on tiny models with fixed seeds and a real gloo group."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from sublimate.components.base.ports import free_port
from sublimate.components.paradigms import flat_parameters, paradigm_class
from sublimate.components.paradigms.bmuf import BlockMomentumSGD
from sublimate.components.paradigms.easgd import ElasticAveragingSGD
from sublimate.components.processes.async_sgd import ParameterServer
from tests.ranks import run_ranks

WORLD = 2
PERIOD = 3


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


def _spawn(function: object, tmp_path: Path, *extra: object) -> list[dict[str, Any]]:
    run_ranks(function, (free_port(), tmp_path, *extra), WORLD)
    return [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(WORLD)]


# --- BMUF with block momentum, against the update equations computed by hand ----------------
#
# The model is a Linear(2, 1) in float64 trained on a squared error with one known example per
# rank and step. Its gradient depends on the weights, so where a block starts (the Nesterov
# look-ahead or the global model) changes what the next block computes: an oracle that got the
# start wrong would disagree with a correct implementation, and the other way round.

BMUF_LR = 0.05
BMUF_BLOCKS = 2
# rank 0's initial [weight0, weight1, bias]; rank 1 starts elsewhere, and the paradigm must
# replace that with rank 0's model (its broadcast) before the first step
BMUF_START = (0.3, -0.2, 0.1)


def _bmuf_example(rank: int, step: int) -> tuple[torch.Tensor, float]:
    """Rank ``rank``'s example at 1-based ``step``: features and target, different per rank."""
    x = torch.tensor([1.0 + 0.5 * rank + 0.1 * step, -0.7 + 0.3 * rank - 0.05 * step],
                     dtype=torch.float64)
    return x, 2.0 - 3.0 * rank + 0.25 * step


def _bmuf_worker(rank: int, port: int, results: Path, config: dict[str, Any]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    model = nn.Linear(2, 1).double()
    with torch.no_grad():
        start = torch.tensor(BMUF_START, dtype=torch.float64) + 10.0 * rank
        model.weight.copy_(start[:2].view(1, 2))
        model.bias.copy_(start[2:])
    optimizer = torch.optim.SGD(model.parameters(), lr=BMUF_LR)
    bmuf = BlockMomentumSGD(model, optimizer, config)
    blocks = []
    for step in range(1, BMUF_BLOCKS * PERIOD + 1):
        x, y = _bmuf_example(rank, step)
        optimizer.zero_grad()
        (0.5 * (model(x.view(1, 2)).squeeze() - y) ** 2).backward()
        optimizer.step()
        bmuf.after_step(step)
        if step % PERIOD == 0:
            blocks.append({"global": bmuf.global_model.clone(),
                           "start": bmuf.block_start.clone(), "delta": bmuf.delta.clone(),
                           "local": flat_parameters(model),
                           "result": flat_parameters(bmuf.result_model())})
    torch.save({"blocks": blocks, "eta": bmuf.eta, "ops": bmuf.communication_ops},
               results / f"rank{rank}.pt")
    dist.destroy_process_group()


def _bmuf_by_hand(eta: float, zeta: float, nesterov: bool) -> list[dict[str, torch.Tensor]]:
    """Chen & Huo's block update (bmuf.py's docstring) in plain tensor arithmetic."""
    global_model = torch.tensor(BMUF_START, dtype=torch.float64)  # rank 0's, broadcast
    block_start = global_model.clone()
    delta = torch.zeros(3, dtype=torch.float64)
    blocks = []
    for block in range(BMUF_BLOCKS):
        finals = []
        for rank in range(WORLD):
            w = block_start.clone()  # [weight0, weight1, bias]
            for step in range(block * PERIOD + 1, (block + 1) * PERIOD + 1):
                x, y = _bmuf_example(rank, step)
                features = torch.cat([x, torch.ones(1, dtype=torch.float64)])
                residual = (w * features).sum() - y  # d/dw of (w.f - y)^2 / 2 is residual * f
                w = w - BMUF_LR * residual * features
            finals.append(w)
        block_update = sum(finals) / WORLD - block_start  # G = mean(w_i) - w_start
        delta = eta * delta + zeta * block_update
        global_model = global_model + delta
        block_start = global_model + eta * delta if nesterov else global_model.clone()
        blocks.append({"global": global_model, "start": block_start, "delta": delta})
    return blocks


@pytest.mark.parametrize(("config", "eta", "zeta", "nesterov"), [
    ({"sync_period": PERIOD, "block_momentum": 0.6, "block_lr": 0.8, "nesterov": True},
     0.6, 0.8, True),
    ({"sync_period": PERIOD, "block_momentum": 0.6, "block_lr": 1.2, "nesterov": False},
     0.6, 1.2, False),
    # the paper's defaults: eta = 1 - 1/N (0.5 for 2 workers), zeta = 1, Nesterov on
    ({"sync_period": PERIOD}, 1 - 1 / WORLD, 1.0, True),
], ids=["nesterov", "classic", "defaults"])
def test_bmuf_with_block_momentum_follows_the_block_update_equations(
        tmp_path: Path, config: dict[str, Any], eta: float, zeta: float,
        nesterov: bool) -> None:
    ranks = _spawn(_bmuf_worker, tmp_path, config)
    expected = _bmuf_by_hand(eta, zeta, nesterov)
    # float64 and the same operations in the same order: equal up to rounding in the last bits
    close = {"rtol": 0.0, "atol": 1e-12}
    for result in ranks:
        assert result["eta"] == eta and result["ops"] == BMUF_BLOCKS
        for block, want in zip(result["blocks"], expected, strict=True):
            torch.testing.assert_close(block["global"], want["global"], **close)
            torch.testing.assert_close(block["delta"], want["delta"], **close)
            torch.testing.assert_close(block["start"], want["start"], **close)
            # every worker continues from the block start; the run's result is the global model
            torch.testing.assert_close(block["local"], want["start"], **close)
            torch.testing.assert_close(block["result"], want["global"], **close)
    # The case tells the variants apart far beyond the tolerance, so an implementation that
    # dropped the momentum or the look-ahead (or applied it when off) would fail above.
    for other in (_bmuf_by_hand(0.0, zeta, nesterov), _bmuf_by_hand(eta, zeta, not nesterov)):
        assert (other[-1]["global"] - expected[-1]["global"]).abs().max() > 1e-3
    assert torch.equal(expected[0]["start"], expected[0]["global"]) != nesterov


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
    # every push sent 3 float32 gradients and got 3 parameters back: 12 bytes each way
    assert statistics["sent_payload_bytes_per_worker"] == 25 * 12
    assert statistics["ps_sent_bytes"] == 100 * 12


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
