"""What the periodic paradigms (BMUF, EASGD) and the parameter server keep besides the weights:
the last partial block, BatchNorm buffers, state on the model's device, consistent snapshots;
and the learning-rate rule each paradigm follows. Exact oracles, real gloo groups."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from sublimate.components.paradigms import flat_parameters, lr_schedule
from sublimate.components.paradigms.async_sgd import ParameterServer
from sublimate.components.paradigms.bmuf import BlockMomentumSGD
from sublimate.components.paradigms.easgd import ElasticAveragingSGD
from tests.ranks import run_ranks

WORLD = 2
PERIOD = 4


def _bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Tanh(), nn.Linear(3, 2))


def _local_step(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int, step: int) -> None:
    # Each rank sees data of its own scale: their BatchNorm statistics differ.
    generator = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(6, 4, generator=generator) * (1 + 2 * rank) + rank
    y = torch.randint(0, 2, (6,), generator=generator)
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


def _buffers(model: nn.Module) -> list[torch.Tensor]:
    return [buffer.detach().clone() for buffer in model.buffers()]


def _periodic_run(rank: int, port: int, results: Path, algorithm: str, steps: int) -> None:
    """``steps`` local steps (not a multiple of PERIOD), then finish(): what each rank held."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    model = _bn_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)
    paradigm: BlockMomentumSGD | ElasticAveragingSGD
    if algorithm == "bmuf":  # eta = 0, zeta = 1: each round's result is the workers' mean
        paradigm = BlockMomentumSGD(model, optimizer, {"sync_period": PERIOD,
                                                       "block_momentum": 0.0, "block_lr": 1.0})
    else:
        paradigm = ElasticAveragingSGD(model, optimizer, {"sync_period": PERIOD,
                                                          "moving_rate": 0.25})
    record: dict[str, Any] = {}
    for step in range(1, steps + 1):
        _local_step(model, optimizer, rank, step)
        if step == PERIOD:  # the buffers each rank had just before the first round
            record["buffers_before_round"] = _buffers(model)
        paradigm.after_step(step)
        if step == PERIOD:
            record["buffers_after_round"] = _buffers(model)
    record["local_before_finish"] = flat_parameters(model)
    record["center_before_finish"] = paradigm.consensus().clone()
    record["buffers_before_finish"] = _buffers(model)
    record["result_before_finish"] = flat_parameters(paradigm.result_model())
    paradigm.finish(steps)
    record["result"] = flat_parameters(paradigm.result_model())
    record["result_buffers"] = _buffers(paradigm.result_model())
    record["ops"] = paradigm.communication_ops
    # A run resumed after it finished calls finish() again: no second round.
    state = paradigm.state_dict()
    paradigm.load_state_dict(state)
    paradigm.finish(steps)
    record["result_after_second_finish"] = flat_parameters(paradigm.result_model())
    record["ops_after_second_finish"] = paradigm.communication_ops
    torch.save(record, results / f"rank{rank}.pt")
    dist.destroy_process_group()


def _spawn(tmp_path: Path, algorithm: str, steps: int) -> list[dict[str, Any]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    run_ranks(_periodic_run, (port, tmp_path, algorithm, steps), WORLD)
    return [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(WORLD)]


def test_bmuf_finish_syncs_the_last_partial_block(tmp_path: Path) -> None:
    """6 steps at period 4: the result includes steps 5 and 6. With eta = 0 and zeta = 1 a
    round makes the global model the workers' mean, so the oracle is that mean."""
    ranks = _spawn(tmp_path, "bmuf", PERIOD + 2)
    mean_local = (ranks[0]["local_before_finish"] + ranks[1]["local_before_finish"]) / 2
    for record in ranks:
        assert torch.allclose(record["result"], mean_local, atol=1e-6)
        # Without finish() the result stopped at step 4: the last two steps were lost.
        assert not torch.allclose(record["result_before_finish"], mean_local, atol=1e-4)
        assert record["ops"] == 2
        assert torch.equal(record["result_after_second_finish"], record["result"])
        assert record["ops_after_second_finish"] == 2


def test_easgd_finish_pulls_the_last_steps_into_the_center(tmp_path: Path) -> None:
    ranks = _spawn(tmp_path, "easgd", PERIOD + 2)
    alpha = 0.25
    center = ranks[0]["center_before_finish"]
    expected = center + sum(alpha * (record["local_before_finish"] - center) for record in ranks)
    for record in ranks:
        assert torch.allclose(record["result"], expected, atol=1e-6)
        assert record["ops"] == 2
        assert torch.equal(record["result_after_second_finish"], record["result"])


@pytest.mark.parametrize("algorithm", ["bmuf", "easgd"])
def test_batchnorm_statistics_are_averaged_at_every_round(tmp_path: Path, algorithm: str) -> None:
    ranks = _spawn(tmp_path, algorithm, PERIOD + 2)
    floating_before = [[buffer for buffer in record["buffers_before_round"]
                        if buffer.is_floating_point()] for record in ranks]
    assert not torch.allclose(floating_before[0][0], floating_before[1][0]), \
        "the ranks' data must differ for this test to mean anything"
    mean_before = [(first + second) / 2 for first, second in zip(*floating_before, strict=True)]
    for record in ranks:
        after = [buffer for buffer in record["buffers_after_round"] if buffer.is_floating_point()]
        for averaged, expected in zip(after, mean_before, strict=True):
            assert torch.allclose(averaged, expected, atol=1e-6)
    # The result model carries the buffers of the last round (finish()), identical on all ranks
    # and equal to the mean of what the ranks held before it.
    final_mean = [(first + second) / 2 for first, second in zip(
        *[[b for b in record["buffers_before_finish"] if b.is_floating_point()]
          for record in ranks], strict=True)]
    for record in ranks:
        result = [buffer for buffer in record["result_buffers"] if buffer.is_floating_point()]
        for got, expected in zip(result, final_mean, strict=True):
            assert torch.allclose(got, expected, atol=1e-6)
    counters = [[b for b in record["result_buffers"] if not b.is_floating_point()]
                for record in ranks]
    assert counters[0] and all(torch.equal(a, b) for a, b in zip(*counters, strict=True))


def _single_process_group(port: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


@pytest.fixture
def group() -> Any:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _single_process_group(port)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("algorithm", ["bmuf", "easgd"])
def test_restored_paradigm_state_lives_on_the_models_device(group: None, algorithm: str) -> None:
    """Checkpoints load onto the CPU. A model on another device (a GPU; here the meta device,
    which this machine has) must get its paradigm state there too, or the next collective
    mixes devices."""
    model = _bn_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    paradigm = BlockMomentumSGD(model, optimizer, {"sync_period": PERIOD}) \
        if algorithm == "bmuf" else ElasticAveragingSGD(model, optimizer, {"sync_period": PERIOD})
    saved = paradigm.state_dict()
    model.to("meta")
    paradigm.load_state_dict(saved)
    tensors = [value for value in paradigm.state_dict().values()
               if isinstance(value, torch.Tensor)] + paradigm.synced_buffers
    assert tensors and all(tensor.device.type == "meta" for tensor in tensors)


def _server(momentum: float = 0.9) -> ParameterServer:
    model = _bn_model()
    return ParameterServer(model, torch.optim.SGD(model.parameters(), lr=0.1,
                                                  momentum=momentum), num_trainers=2)


def _gradients(server: ParameterServer, scale: float) -> list[torch.Tensor]:
    return [torch.full_like(parameter, scale) for parameter in server.model.parameters()]


def test_a_parameter_server_checkpoint_is_one_moment_while_trainers_push() -> None:
    """The state handed to the checkpoint writer is a copy taken under the lock: pushes applied
    while it is written do not change weights, momentum, version or clocks on disk."""
    server = _server()
    server.push_pull(0, _gradients(server, 1.0), 0, 0.1)
    saved = server.state_dict()
    frozen = {name: value.clone() for name, value in saved["model"].items()}
    momentum = [state["momentum_buffer"].clone()
                for state in saved["optimizer"]["state"].values()]
    server.push_pull(1, _gradients(server, 3.0), 1, 0.1)  # a trainer pushes during the save
    assert saved["version"] == 1 and saved["clocks"] == [1, 0]
    for name, value in saved["model"].items():
        assert torch.equal(value, frozen[name]), name
    for before, state in zip(momentum, saved["optimizer"]["state"].values(), strict=True):
        assert torch.equal(state["momentum_buffer"], before)
    # ... and the live server did move on.
    assert server.version == 2
    assert not torch.equal(next(server.model.parameters()), next(iter(frozen.values())))


def test_the_parameter_server_model_carries_the_trainers_mean_buffers() -> None:
    server = _server()
    names = [name for name, _ in server.model.named_buffers()]
    first = [torch.full_like(buffer, 1.0) if buffer.is_floating_point()
             else torch.tensor(4) for buffer in server.model.buffers()]
    second = [torch.full_like(buffer, 3.0) if buffer.is_floating_point()
              else torch.tensor(6) for buffer in server.model.buffers()]
    server.push_pull(0, _gradients(server, 1.0), 0, 0.1, first)
    server.push_pull(1, _gradients(server, 1.0), 1, 0.1, second)
    snapshot = server.snapshot()
    for name in names:
        if snapshot[name].is_floating_point():
            assert torch.equal(snapshot[name], torch.full_like(snapshot[name], 2.0)), name
        else:
            assert int(snapshot[name]) == 6, name  # counters: the most any trainer counted
    assert all(torch.equal(server.state_dict()["model"][name], snapshot[name]) for name in names)


SETTINGS = {"learning_rate": 0.1, "lr_scaling": "linear", "global_batch_size": 256,
            "reference_batch_size": 64, "warmup_epochs": 0}


@pytest.mark.parametrize(("algorithm", "extra", "expected"), [
    ("sync", {}, 0.4),  # the global batch of 256
    ("easgd", {}, 0.4),  # averaged local SGD: the global batch (Lin et al. 2020)
    ("async", {}, 0.1),  # one trainer's 64
    # BMUF at eta = 1 - 1/4, zeta = 1: gain 4, each learner at its local batch's rate
    ("bmuf", {"block_momentum": "auto", "block_lr": 1.0}, 0.1),
    ("bmuf", {"block_momentum": 0.0, "block_lr": 1.0}, 0.4),  # plain model averaging
    ("bmuf", {"block_momentum": 0.5, "block_lr": 1.0}, 0.2),
])
def test_linear_scaling_follows_the_batch_one_update_averages(
        algorithm: str, extra: dict[str, Any], expected: float) -> None:
    settings = {**SETTINGS, "algorithm": algorithm, **extra}
    assert lr_schedule.scaled_rate(settings, 4) == pytest.approx(expected)
    assert lr_schedule.scaled_rate({**settings, "lr_scaling": "none"}, 4) == 0.1


def test_async_trainers_warm_up_over_their_own_steps() -> None:
    from sublimate.components.processes.async_sgd import trainer_learning_rate
    from sublimate.components.processes.request import ParameterServerRequest

    request = ParameterServerRequest.from_values({
        **SETTINGS, "global_batch_size": 512, "warmup_epochs": 2, "num_trainers": 2,
        "role": "trainer", "rpc_endpoint": "127.0.0.1:1", "data_dir": "d", "run_dir": "r"})
    # target: 0.1 x 256 / 64 = 0.4, reached after 2 epochs of 10 steps
    rates = [trainer_learning_rate(request, step, steps_per_epoch=10)
             for step in (0, 10, 20, 30)]
    assert rates == pytest.approx([0.1, 0.25, 0.4, 0.4])
