"""The streaming reader against exact oracles: rows carry their own index, so every batch can be
checked example by example against the split it came from."""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from sublimate.components.data.datasets import (
    Split,
    read_metadata,
    write_dataset,
    write_synthetic_dataset,
)
from sublimate.components.data.streaming import (
    ShardReader,
    evaluation_batches,
    rank_pieces,
    steps_per_epoch,
)

SHAPE = (1, 8, 8)


def indexed(folder: Path, train: int, shard_size: int, test: int = 50) -> Path:
    """A dataset whose example i is an image filled with i (exact in float32), label i % 10."""
    def split(count: int, first: int) -> Split:
        ids = np.arange(first, first + count)
        return Split(np.broadcast_to(ids[:, None, None, None], (count, *SHAPE)).astype(np.float32),
                     ids % 10)

    return write_dataset(folder, {"train": split(train, 0), "test": split(test, 10**6)},
                         name="indexed", num_classes=10, shard_size=shard_size)


def ids_of(batches: object) -> list[np.ndarray]:
    """The example indices of each batch, checking the labels travelled with their rows."""
    out = []
    for x, y in batches:  # type: ignore[attr-defined]
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape[1:] == SHAPE and x.dtype == np.float32 and y.dtype == np.int64
        ids = x[:, 0, 0, 0].astype(np.int64)
        assert (x == ids[:, None, None, None]).all(), "a row was torn"
        np.testing.assert_array_equal(y, ids % 10)
        out.append(ids)
    return out


@pytest.fixture(scope="module")
def uneven(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2,400 examples in 7 uneven shards (6 x 350 + 300)."""
    return indexed(tmp_path_factory.mktemp("uneven") / "d", 2400, 350)


@pytest.mark.parametrize(("world", "batch"), [(1, 48), (3, 16), (8, 20)])
def test_every_example_exactly_once_per_epoch_across_ranks(uneven: Path, world: int,
                                                            batch: int) -> None:
    # 2400 / world is a whole number of batches here, so nothing is dropped: an exact partition.
    # world 8 > 7 shards: ranks share shards and take disjoint rows of them.
    for epoch in (0, 1):
        seen = np.concatenate([ids for rank in range(world) for ids in ids_of(
            ShardReader(uneven, local_batch=batch, rank=rank, world=world, seed=5,
                        buffer_size=200).epoch(epoch))])
        np.testing.assert_array_equal(np.sort(seen), np.arange(2400))


def test_remainder_is_dropped_and_the_rest_seen_once(tmp_path: Path) -> None:
    folder = indexed(tmp_path / "d", 2011, 300)
    metadata = read_metadata(folder)
    for world, batch in [(1, 64), (2, 50), (3, 7), (16, 5)]:
        steps = steps_per_epoch(metadata, world, batch)
        assert steps == 2011 // (world * batch)
        per_epoch = []
        for epoch in range(3):
            seen = []
            for rank in range(world):
                batches = ids_of(ShardReader(folder, local_batch=batch, rank=rank, world=world,
                                             seed=1, buffer_size=128).epoch(epoch))
                assert len(batches) == steps and all(len(b) == batch for b in batches)
                seen.extend(batches)
            ids = np.concatenate(seen)
            assert len(np.unique(ids)) == len(ids) == world * steps * batch
            per_epoch.append(set(ids.tolist()))
        # The dropped examples change from epoch to epoch (the sequence is rotated).
        assert len(per_epoch[0] | per_epoch[1] | per_epoch[2]) > len(per_epoch[0])


def test_equal_steps_on_every_rank_with_uneven_shards(tmp_path: Path) -> None:
    # Shards of 1000, 1000, 1000, 37 rows: dealing whole shards would give one rank 37 rows.
    folder = indexed(tmp_path / "d", 3037, 1000)
    metadata = read_metadata(folder)
    for world in (2, 3, 4, 5):
        expected = steps_per_epoch(metadata, world, 32)
        for epoch in range(4):
            counts = {len(ShardReader(folder, local_batch=32, rank=rank, world=world, seed=epoch,
                                      buffer_size=256).epoch(epoch)) for rank in range(world)}
            assert counts == {expected}


def test_same_seed_same_order_other_epoch_or_seed_other_order(uneven: Path) -> None:
    def order(seed: int, epoch: int) -> np.ndarray:
        reader = ShardReader(uneven, local_batch=32, rank=1, world=2, seed=seed, buffer_size=256)
        return np.concatenate(ids_of(reader.epoch(epoch)))

    np.testing.assert_array_equal(order(7, 2), order(7, 2))
    assert not np.array_equal(order(7, 2), order(7, 3))
    assert not np.array_equal(order(7, 2), order(8, 2))
    # Shuffled within windows, not only by shard: consecutive rows are rarely consecutive ids.
    assert (np.abs(np.diff(order(7, 2))) == 1).mean() < 0.05


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_at_a_batch_yields_the_rest_of_the_epoch(uneven: Path, num_workers: int) -> None:
    reader = ShardReader(uneven, local_batch=24, rank=1, world=2, seed=3, buffer_size=100)
    full = ids_of(reader.epoch(4))  # in-process, no DataLoader: the reference
    prefetch = 2 if num_workers else None
    for start in (0, 1, 7, len(full) - 1, len(full)):
        tail = ids_of(reader.batches(4, start, num_workers=num_workers,
                                     prefetch_factor=prefetch))
        assert len(tail) == len(full) - start
        for got, want in zip(tail, full[start:], strict=True):
            np.testing.assert_array_equal(got, want)


def test_feature_shape_is_kept_for_images(uneven: Path) -> None:
    import torch

    x, y = next(iter(ShardReader(uneven, local_batch=16).batches(0)))
    assert isinstance(x, torch.Tensor) and x.shape == (16, *SHAPE) and x.dtype == torch.float32
    assert y.shape == (16,) and y.dtype == torch.int64 and x.is_contiguous()
    conv = torch.nn.Conv2d(1, 4, 3)  # a CNN takes the batch as it comes
    assert conv(x).shape == (16, 4, 6, 6)


def test_fewer_shards_than_ranks_gives_disjoint_rows_of_the_same_shard() -> None:
    pieces = [rank_pieces([100], seed=0, epoch=1, rank=r, world=4) for r in range(4)]
    rows = [set(range(p.start, p.stop)) for ps in pieces for p in ps]
    assert all(p.shard == 0 for ps in pieces for p in ps)
    assert sum(len(r) for r in rows) == 100 and len(set().union(*rows)) == 100


def test_memory_is_one_window_not_the_split(tmp_path: Path) -> None:
    # 40,000 rows of 256 bytes (10 MB) in shards of 3,000; the window is 1,024 rows (256 KB).
    folder = write_synthetic_dataset(tmp_path / "big", train_examples=40_000, test_examples=10,
                                     feature_shape=(64,), shard_size=3_000)
    reader = ShardReader(folder, local_batch=128, buffer_size=1_024, seed=2)
    reader.epoch(1)[0]  # the first read imports and caches (zip, npy headers): not per-window
    epoch = reader.epoch(0)
    tracemalloc.start()
    try:
        batches = sum(1 for _ in epoch)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert batches == 40_000 // 128
    assert epoch.peak_rows <= reader.window == 1_024  # mapped rows: exactly one window
    window_bytes = reader.window * 64 * 4
    assert peak < 3 * window_bytes, f"allocated {peak} bytes at peak for a {window_bytes} window"
    # Loading whole shards (mmap=False, or compressed shards): a window plus at most the two
    # shards it starts and ends in.
    loaded = ShardReader(folder, local_batch=128, buffer_size=1_024, seed=2, mmap=False).epoch(0)
    assert sum(1 for _ in loaded) == batches
    assert 3_000 <= loaded.peak_rows <= reader.window + 2 * 3_000


def test_old_metadata_and_compressed_shards_read_the_same(uneven: Path, tmp_path: Path) -> None:
    reference = ids_of(ShardReader(uneven, local_batch=32, world=2, rank=0, seed=9,
                                   buffer_size=300).epoch(1))
    old = tmp_path / "old"
    old.mkdir()
    metadata = json.loads((uneven / "metadata.json").read_text())
    for entry in metadata["splits"]["train"]["shards"]:
        del entry["examples"]  # written before per-shard counts: read from the shard headers
        with np.load(uneven / entry["file"]) as arrays:
            np.savez_compressed(old / entry["file"], x=arrays["x"], y=arrays["y"])
    (old / "metadata.json").write_text(json.dumps(metadata))
    assert steps_per_epoch(metadata, 2, 32) == len(reference)
    again = ids_of(ShardReader(old, local_batch=32, world=2, rank=0, seed=9,
                               buffer_size=300).epoch(1))
    assert len(again) == len(reference)
    for got, want in zip(again, reference, strict=True):
        np.testing.assert_array_equal(got, want)


def test_evaluation_streams_the_split_in_order(uneven: Path) -> None:
    batches = ids_of(evaluation_batches(uneven, "test", batch_size=16))
    assert [len(b) for b in batches] == [16, 16, 16, 2]
    np.testing.assert_array_equal(np.concatenate(batches), np.arange(10**6, 10**6 + 50))


def test_a_thread_reads_ahead_in_order_and_hands_over_errors() -> None:
    from sublimate.components.data.streaming import ThreadPrefetch

    assert list(ThreadPrefetch(range(100), depth=3)) == list(range(100))

    def failing():  # type: ignore[no-untyped-def]
        yield 1
        raise OSError("shard unreadable")

    items = iter(ThreadPrefetch(failing(), depth=2))
    assert next(items) == 1
    with pytest.raises(OSError, match="shard unreadable"):
        next(items)
    # A consumer that stops early (a resumed or failed epoch) ends the reading thread.
    early = iter(ThreadPrefetch(range(10_000), depth=2))
    assert next(early) == 0
    early.close()
    deadline = time.monotonic() + 5
    while any(t.name == "sublimate-prefetch" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the prefetch thread did not end"
        time.sleep(0.01)
