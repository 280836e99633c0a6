"""A checkpoint that does not fit its disk (issue 40): the worker's failure names the disk and
the step, not torch's ``unexpected pos 35520 vs 35472``; nothing half-written is left, and the
last committed step stays the one a resume reads. Files and DCP's sharded folders alike, on a
real small tmpfs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from sublimate.components.base.disk_full import DiskFullError
from sublimate.components.base.ports import free_port
from sublimate.components.model import checkpoint
from sublimate.components.training import ShardedCheckpointer
from tests.ranks import run_ranks
from tests.small_disk import small_disk


def test_a_rank_file_that_does_not_fit_names_the_disk_and_the_step(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "64k") as disk:
        with pytest.raises(DiskFullError) as raised:
            checkpoint.save_rank(disk, 7, 0, {"model": torch.zeros(64 * 1024)})  # 256 kB
        path = checkpoint.step_path(disk, 7, 0)
        assert str(raised.value) == (f"disk full: no space left on {disk} (tmpfs) while saving "
                                     f"checkpoint step 7 to {path}")
        assert list(path.parent.iterdir()) == []  # its temporary file removed
        assert checkpoint.latest(disk) is None


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(256, 256)  # 257 kB, and as much again of momentum
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _save_twice(rank: int, port: int, run_dir: Path, said: Path) -> None:
    """Step 1 fits the disk, step 2 (kept beside it) does not: what each rank's wait() raised."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    model, optimizer = _model()
    model(torch.ones(1, 256)).sum().backward()
    optimizer.step()
    saver = ShardedCheckpointer(run_dir, rank, 2, "sync")
    saver.save(1, model, optimizer)
    saver.wait()
    try:
        saver.save(2, model, optimizer)
        saver.wait()
        said.with_name(f"rank-{rank}").write_text("saved")
    except DiskFullError as error:
        said.with_name(f"rank-{rank}").write_text(str(error))
    dist.barrier()
    dist.destroy_process_group()


def test_sharded_shards_that_do_not_fit_leave_the_last_committed_step(tmp_path: Path) -> None:
    said = tmp_path / "said" / "rank"
    said.parent.mkdir()
    with small_disk(tmp_path / "disk", "900k") as disk:
        run_ranks(_save_twice, (free_port(), disk, said), 2)
        folder = checkpoint.step_path(disk, 2, 0).parent
        for rank in (0, 1):  # DCP gathered the failure to every rank
            assert (said.parent / f"rank-{rank}").read_text() == (
                f"disk full: no space left on {disk} (tmpfs) while saving checkpoint step 2 "
                f"to {folder}"), rank
        assert checkpoint.latest(disk)["step"] == 1  # what a resume reads: whole
        assert not folder.exists()  # its shards removed: the space is free again
        assert sorted(os.listdir(checkpoint.step_path(disk, 1, 0).parent)) == [
            ".metadata", "__0_0.distcp", "__1_0.distcp", "rank-00000.pt", "rank-00001.pt"]
