"""Checkpoint files on the shared volume: what is read back, and what is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from sublimate.components.model import checkpoint


class _RunsCode:
    """What a planted file could hold: unpickling it would run ``touch <marker>``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def test_a_planted_file_is_refused_without_running_its_code(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    planted = checkpoint.step_path(tmp_path, 20, 0)
    planted.parent.mkdir(parents=True)
    torch.save({"model": {}, "payload": _RunsCode(marker)}, planted)
    checkpoint.commit(tmp_path, 20, 1, "sync")
    with pytest.raises(checkpoint.CheckpointError) as refused:
        checkpoint.load_rank(tmp_path, 0, 1, "sync")
    assert not marker.exists(), "loading the checkpoint ran the code it carried"
    assert str(planted) in str(refused.value)
    assert "posix.system" in str(refused.value)


def test_what_the_training_saves_loads_back(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    state = {"step": 7, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "paradigm": {"center": torch.ones(3), "synced_step": 4, "communication_ops": 1},
             "rng": torch.get_rng_state(), "cuda_rng": None,
             "extra": {"train_seconds": 1.5, "position": [1, 2], "name": "x"}}
    checkpoint.save_rank(tmp_path, 7, 0, state)
    checkpoint.commit(tmp_path, 7, 1, "sync")
    loaded = checkpoint.load_rank(tmp_path, 0, 1, "sync")
    assert loaded is not None and loaded["extra"] == state["extra"]
    assert torch.equal(loaded["optimizer"]["state"][0]["momentum_buffer"],
                       state["optimizer"]["state"][0]["momentum_buffer"])


def test_a_missing_rank_file_of_a_committed_step_is_an_error_not_a_fresh_start(
        tmp_path: Path) -> None:
    for rank in (0, 1):
        checkpoint.save_rank(tmp_path, 40, rank, {"step": 40})
    checkpoint.commit(tmp_path, 40, 2, "bmuf")
    missing = checkpoint.step_path(tmp_path, 40, 1)
    missing.unlink()
    assert checkpoint.load_rank(tmp_path, 0, 2, "bmuf") == {"step": 40}
    with pytest.raises(checkpoint.CheckpointError, match="missing, although") as error:
        checkpoint.load_rank(tmp_path, 1, 2, "bmuf")
    assert str(missing) in str(error.value)


def test_no_checkpoint_is_a_fresh_start(tmp_path: Path) -> None:
    assert checkpoint.load_rank(tmp_path, 0, 2, "sync") is None


def test_a_rename_is_flushed_with_its_folder(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The file, then the folder holding the rename, reach the disk before save returns."""
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(handle: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{handle}"))
        real_fsync(handle)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    path = tmp_path / "sub" / "state.pt"
    checkpoint.save({"x": torch.zeros(1)}, path)
    assert len(synced) == 2
    assert Path(synced[0]).parent == path.parent and Path(synced[0]).name.startswith(".state.pt.")
    assert synced[1] == str(path.parent)
