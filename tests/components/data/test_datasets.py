from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sublimate.components.data.datasets import (
    DatasetError,
    build_builtin,
    digits_splits,
    mnist1d_splits,
    npz_member,
    read_metadata,
    read_split,
    shard_examples,
    verify_dataset,
    write_synthetic_dataset,
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


def test_shards_record_their_example_counts_and_old_metadata_reads_them(tmp_path: Path) -> None:
    folder = build_builtin("digits", tmp_path / "digits")
    metadata = verify_dataset(folder)
    counts = [shard["examples"] for shard in metadata["splits"]["train"]["shards"]]
    assert counts == [1024, 414] and shard_examples(folder, metadata, "train") == counts
    for shard in metadata["splits"]["train"]["shards"]:
        del shard["examples"]  # metadata written before the counts were recorded
    assert shard_examples(folder, metadata, "train") == counts  # read from the shard headers


def test_npz_member_finds_the_data_offset_of_stored_arrays(tmp_path: Path) -> None:
    folder = write_synthetic_dataset(tmp_path / "s", train_examples=700, test_examples=10,
                                     feature_shape=(1, 4, 4), shard_size=300)
    for shard in read_metadata(folder)["splits"]["train"]["shards"]:
        path = folder / shard["file"]
        with np.load(path) as arrays:
            for name in ("x", "y"):
                member = npz_member(path, name)
                assert member.offset is not None and member.shape == arrays[name].shape
                mapped = np.memmap(path, dtype=member.dtype, mode="r", offset=member.offset,
                                   shape=member.shape)
                np.testing.assert_array_equal(mapped, arrays[name])
    np.savez_compressed(tmp_path / "c.npz", x=np.ones((3, 2), np.float32))
    assert npz_member(tmp_path / "c.npz", "x").offset is None  # compressed: cannot be mapped


def test_synthetic_dataset_is_written_shard_by_shard_and_reproducible(tmp_path: Path) -> None:
    first = write_synthetic_dataset(tmp_path / "a", train_examples=1000, test_examples=100,
                                    feature_shape=(8,), shard_size=256, seed=4)
    second = write_synthetic_dataset(tmp_path / "b", train_examples=1000, test_examples=100,
                                     feature_shape=(8,), shard_size=256, seed=4)
    metadata = verify_dataset(first)
    assert metadata["feature_shape"] == [8] and metadata["num_classes"] == 10
    assert [s["examples"] for s in metadata["splits"]["train"]["shards"]] == [256] * 3 + [232]
    assert [s["sha256"] for s in metadata["splits"]["train"]["shards"]] == \
        [s["sha256"] for s in read_metadata(second)["splits"]["train"]["shards"]]
    train, test = read_split(first, "train"), read_split(first, "test")
    assert not np.array_equal(train.x[:100], test.x)  # the splits are independent draws
    # Learnable: the nearest class centre (estimated on train) labels test well.
    centres = np.stack([train.x[train.y == c].mean(0) for c in range(10)])
    nearest = ((test.x[:, None, :] - centres[None]) ** 2).sum(-1).argmin(1)
    assert (nearest == test.y).mean() > 0.6  # chance is 0.1


def _digest(splits: dict) -> str:
    import hashlib

    digest = hashlib.sha256()
    for name in sorted(splits):
        digest.update(splits[name].x.tobytes())
        digest.update(splits[name].y.tobytes())
    return digest.hexdigest()


def test_mnist1d_is_generated_deterministically_without_touching_global_random_state() -> None:
    import random

    random.seed(7)
    np.random.seed(7)
    python_before, numpy_before = random.random(), np.random.random()
    random.seed(7)
    np.random.seed(7)
    first, provenance = mnist1d_splits(num_samples=500)
    # the generator seeds the global generators; the caller's sequence goes on unchanged
    assert (random.random(), np.random.random()) == (python_before, numpy_before)
    again, _ = mnist1d_splits(num_samples=500)
    other_seed, _ = mnist1d_splits(num_samples=500, seed=43)
    assert _digest(first) == _digest(again) != _digest(other_seed)
    train, test = first["train"], first["test"]
    assert train.x.shape == (400, 40) and test.x.shape == (100, 40)  # the package's 80/20 split
    assert train.x.dtype == np.float32 and train.y.dtype == np.int64
    assert np.bincount(np.concatenate([train.y, test.y]), minlength=10).tolist() == [50] * 10
    assert provenance["args"]["num_samples"] == 500 and provenance["args"]["seed"] == 42
    assert "url" not in provenance["args"] and provenance["version"]


def test_mnist1d_builtin_has_50000_training_examples_and_stages_once(tmp_path: Path) -> None:
    import time

    from sublimate.components.steps.stage_data import stage_dataset

    started = time.perf_counter()
    first = stage_dataset("mnist1d", tmp_path / "data")
    generation = time.perf_counter() - started
    metadata = verify_dataset(first.folder)
    assert first.folder == tmp_path / "data" / "mnist1d" and first.files_built == 11
    assert metadata["name"] == "mnist1d" and metadata["feature_shape"] == [40]
    assert metadata["num_classes"] == 10
    assert metadata["splits"]["train"]["examples"] == 50_000
    assert metadata["splits"]["test"]["examples"] == 12_500
    assert [s["examples"] for s in metadata["splits"]["train"]["shards"]] == [6250] * 8
    assert [s["examples"] for s in metadata["splits"]["test"]["shards"]] == [6250] * 2
    assert metadata["generator"]["args"]["num_samples"] == 62_500
    assert "no download" in metadata["source"]
    train = read_split(first.folder, "train")
    assert np.bincount(train.y, minlength=10).min() > 4_500  # every digit well represented
    # Staging again finds the complete folder: nothing is regenerated or rewritten.
    before = {p.name: p.stat().st_mtime_ns for p in first.folder.iterdir()}
    started = time.perf_counter()
    second = stage_dataset("mnist1d", tmp_path / "data")
    assert second.files_built == 0 and second.files_reused == 11
    assert {p.name: p.stat().st_mtime_ns for p in first.folder.iterdir()} == before
    assert time.perf_counter() - started < generation / 2
    assert build_builtin("mnist1d", first.folder) == first.folder  # kept as it is


def test_a_dataset_is_written_where_a_plain_string_says(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # what a user writes first: a folder name as text, relative to where they are
    from sublimate.components import Split, write_dataset

    monkeypatch.chdir(tmp_path)
    rows = np.zeros((4, 3), dtype=np.float32)
    written = write_dataset("mydata", {"train": Split(rows, np.arange(4) % 2),
                                       "test": Split(rows[:2], np.arange(2))},
                            name="mine", num_classes=2)
    assert written == Path("mydata") and (tmp_path / "mydata" / "metadata.json").is_file()
    assert write_dataset("mydata", {"train": Split(rows, np.arange(4) % 2)},
                         name="mine", num_classes=2) == Path("mydata")  # complete: kept
