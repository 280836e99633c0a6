"""checkpoint-format=dcp: asynchronous sharded checkpoints, resumed exactly on another number of
ranks, and read back under the weights-only rule. Real gloo groups of spawned processes."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from sublimate.components.base.ports import free_port
from sublimate.components.model import checkpoint
from sublimate.components.model.sharded_checkpoint import METADATA_FILE, WeightsOnlyReader
from sublimate.components.training import Checkpointer, ShardedCheckpointer
from tests.ranks import run_ranks

STEP = 3


def _model(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)


def _everything(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Every tensor and value a resume must restore: the model's, the optimizer's."""
    return {"model": {key: value.clone() for key, value in model.state_dict().items()},
            "optimizer": optimizer.state_dict()}


def _save_two_ranks(rank: int, port: int, run_dir: Path) -> None:
    """Two ranks train STEP steps under DDP, checkpoint in the background while training goes
    on, then wait for it; rank 0 keeps what it saved, as the reference."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    model, optimizer = _model(seed=0)
    ddp = DistributedDataParallel(model)
    saver = ShardedCheckpointer(run_dir, rank, 2, "sync")
    for step in range(1, STEP + 2):
        generator = torch.Generator().manual_seed(10 * step + rank)
        loss = nn.functional.cross_entropy(ddp(torch.randn(16, 6, generator=generator)),
                                           torch.randint(0, 3, (16,), generator=generator))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == STEP:
            saver.save(step, model, optimizer, train_seconds=1.5)
            if rank == 0:  # before the next step changes them
                torch.save(_everything(model, optimizer), run_dir / "reference.pt")
    saver.wait()
    dist.barrier()
    dist.destroy_process_group()


def _restore(rank: int, port: int, run_dir: Path, world: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    _restore_and_compare(run_dir, rank, world)
    dist.destroy_process_group()


def _restore_and_compare(run_dir: Path, rank: int, world: int) -> None:
    """Restore into a model with other weights and write which tensors or values differ."""
    model, optimizer = _model(seed=123 + rank)
    step, extra = ShardedCheckpointer(run_dir, rank, world, "sync").restore(model, optimizer)
    reference = torch.load(run_dir / "reference.pt", weights_only=True)
    differ = [name for name, ok in _compare(reference, _everything(model, optimizer)) if not ok]
    compared = len(list(_compare(reference, reference)))
    (run_dir / f"restored-{world}-{rank}.txt").write_text(
        f"{step} {extra['train_seconds']} {compared} {differ}")


def _compare(expected: Any, actual: Any, name: str = "") -> Any:
    """(name, equal) for every tensor and plain value, walking both states together."""
    if isinstance(expected, dict):
        assert sorted(map(str, expected)) == sorted(map(str, actual)), name
        for key in expected:
            yield from _compare(expected[key], actual[key], f"{name}/{key}")
    elif isinstance(expected, list | tuple):
        assert len(expected) == len(actual), name
        for index, (one, other) in enumerate(zip(expected, actual, strict=True)):
            yield from _compare(one, other, f"{name}/{index}")
    elif isinstance(expected, torch.Tensor):
        yield name, expected.dtype == actual.dtype and torch.equal(expected, actual)
    else:
        yield name, expected == actual


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder with step STEP checkpointed by two ranks (spawn, not fork: see
    test_per_step_rounds)."""
    run_dir = tmp_path_factory.mktemp("run")
    run_ranks(_save_two_ranks, (free_port(), run_dir), 2)
    return run_dir


def test_two_ranks_write_one_sharded_step_and_commit_it(saved: Path) -> None:
    folder = checkpoint.step_path(saved, STEP, 0).parent
    shards = sorted(path.name for path in folder.glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]  # each rank wrote its share
    assert (folder / METADATA_FILE).is_file()
    assert checkpoint.latest(saved) == {"step": STEP, "world_size": 2, "algorithm": "sync",
                                        "format": "dcp"}
    # Every tensor is written once, by one rank or the other, and both ranks took a share.
    metadata = WeightsOnlyReader(folder).read_metadata()
    written = [(index.fqn, index.offset) for index in metadata.storage_data]
    assert len(written) == len(set(written))
    assert {info.relative_path for info in metadata.storage_data.values()} == set(shards)


@pytest.mark.parametrize("world", [1, 3])
def test_a_step_saved_by_two_ranks_resumes_exactly_on_another_number(saved: Path,
                                                                     world: int) -> None:
    if world == 1:  # one process, no process group at all
        _restore_and_compare(saved, 0, 1)
    else:
        run_ranks(_restore, (free_port(), saved, world), world)
    for rank in range(world):
        step, seconds, compared, differ = (saved / f"restored-{world}-{rank}.txt") \
            .read_text().split(" ", 3)
        assert (int(step), float(seconds), differ) == (STEP, 1.5, "[]"), f"rank {rank}"
        assert int(compared) > 20  # every parameter, buffer, momentum and hyper-parameter


class _RunsCode:
    """What a planted file could hold: unpickling it would run ``touch <marker>``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def test_a_planted_metadata_file_is_refused_without_running_its_code(saved: Path,
                                                                     tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(saved, run_dir)
    marker = tmp_path / "ran"
    planted = checkpoint.step_path(run_dir, STEP, 0).parent / METADATA_FILE
    planted.write_bytes(pickle.dumps(_RunsCode(marker)))  # DCP itself reads it with pickle.load
    model, optimizer = _model(seed=1)
    with pytest.raises(checkpoint.CheckpointError) as refused:
        ShardedCheckpointer(run_dir, 0, 1, "sync").restore(model, optimizer)
    assert not marker.exists(), "loading the checkpoint ran the code its metadata carried"
    assert str(planted) in str(refused.value) and "posix.system" in str(refused.value)


def test_a_run_checkpointed_in_one_format_is_not_resumed_in_the_other(saved: Path) -> None:
    model, optimizer = _model(seed=1)
    with pytest.raises(checkpoint.CheckpointError, match="checkpoint-format dcp, this run has "
                       "files; resume with checkpoint-format dcp"):
        Checkpointer(saved, 0, 2, "sync").restore(model, optimizer)


def test_a_planted_value_in_a_shard_is_refused_in_one_line(tmp_path: Path) -> None:
    # DCP reports a rank's failure wrapped, as (exception, traceback) in CheckpointException;
    # the value reader's refusal must come out as the one-line CheckpointError it raised.
    import dataclasses
    import io

    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "step"
    dcp.save({"weights": torch.ones(3), "step": 7}, checkpoint_id=folder, no_dist=True)
    metadata_path = folder / METADATA_FILE
    metadata = pickle.loads(metadata_path.read_bytes())  # our own file, written just now
    index, info = next((i, s) for i, s in metadata.storage_data.items() if i.fqn == "step")
    shard = folder / info.relative_path
    data = shard.read_bytes()
    planted = io.BytesIO()
    torch.save(_RunsCode(tmp_path / "ran"), planted)
    new = planted.getvalue()
    shard.write_bytes(data[:info.offset] + new + data[info.offset + info.length:])
    shift = len(new) - info.length
    metadata.storage_data = {
        i: dataclasses.replace(s, length=len(new)) if i == index else
        dataclasses.replace(s, offset=s.offset + shift)
        if s.relative_path == info.relative_path and s.offset > info.offset else s
        for i, s in metadata.storage_data.items()}
    metadata_path.write_bytes(pickle.dumps(metadata))
    state: dict[str, Any] = {"weights": torch.zeros(3), "step": 0}
    from sublimate.components.model import sharded_checkpoint

    with pytest.raises(checkpoint.CheckpointError, match="value step holds more than plain "
                                                         "values"):
        sharded_checkpoint.load(state, folder)
    assert not (tmp_path / "ran").exists()
