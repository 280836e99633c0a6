from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sublimate.components.datasets import (
    DatasetError,
    build_builtin,
    digits_splits,
    read_split,
    verify_dataset,
)


def test_digits_split_is_stratified_and_disjoint() -> None:
    splits = digits_splits()
    train, test = splits["train"], splits["test"]
    assert len(train.y) + len(test.y) == 1797
    assert train.x.shape[1] == 64 and train.x.min() >= 0.0 and train.x.max() <= 1.0
    # every class keeps ~20% of its examples in the test set
    for label in range(10):
        share = (test.y == label).sum() / ((test.y == label).sum() + (train.y == label).sum())
        assert 0.15 < share < 0.25
    rows = {row.tobytes() for row in test.x}
    assert sum(row.tobytes() in rows for row in train.x) < 10  # digits has a few duplicate images


def test_built_dataset_round_trips_and_is_idempotent(tmp_path: Path) -> None:
    folder = build_builtin("digits", tmp_path / "digits")
    metadata = verify_dataset(folder)
    assert metadata["splits"]["train"]["examples"] == 1438
    assert len(metadata["splits"]["train"]["shards"]) == 2
    np.testing.assert_array_equal(read_split(folder, "test").y, digits_splits()["test"].y)
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    build_builtin("digits", folder)
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary folder left"


def test_verify_detects_a_corrupt_shard(tmp_path: Path) -> None:
    folder = build_builtin("digits", tmp_path / "digits")
    shard = next(folder.glob("test-*.npz"))
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DatasetError, match="does not match its checksum"):
        verify_dataset(folder)


def test_incomplete_folder_and_unknown_builtin(tmp_path: Path) -> None:
    (tmp_path / "half").mkdir()
    with pytest.raises(DatasetError, match=r"metadata\.json is missing"):
        verify_dataset(tmp_path / "half")
    with pytest.raises(DatasetError, match="unknown built-in dataset 'mnist'"):
        build_builtin("mnist", tmp_path / "mnist")
