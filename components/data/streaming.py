"""Streaming a split of the dataset layout in batches, with memory bounded by a shuffle window.

The built-in loop holds the whole training split in every worker. This reader holds one shuffle
window instead: memory is O(window + batch x prefetch) rows per process, whatever the split's size,
and each rank reads only its share of the shards from the volume.

How an epoch is planned (all from ``metadata.json``: per-shard example counts, no data read):

1. **Shards are dealt by row range.** The split's shards are put in an order drawn from
   (seed, epoch), laid end to end as one virtual sequence of N examples, and that sequence is
   rotated by an offset drawn from the same generator. Rank r takes positions
   ``[r*q, (r+1)*q)`` of the rotated sequence, ``q = N // world``: every rank gets exactly q
   examples (the ``N mod world`` others, a different few each epoch, sit out this epoch), reads
   only the shards its range covers (at most two of them partly), and the ranks' rows are
   disjoint. A split with fewer shards than ranks needs no special case: ranks take disjoint row
   ranges of the same shards, and read only those rows.
2. **A shuffle window.** A rank's q positions are cut into windows of ``window`` examples (the
   buffer size rounded down to whole batches); each window is permuted by a generator seeded with
   (seed, epoch, rank, window index) and cut into batches. Only the current window's rows are
   mapped or loaded. This is a block shuffle, not a sliding reservoir: it mixes examples within a
   window and, through the shard order and the rotation, across epochs; it cannot mix examples
   further apart than the window within one epoch (so write shards in a shuffled order, as
   ``write_dataset`` callers should).
3. **A batch is a pure function of its index.** Batch b's rows depend on (metadata, seed, epoch,
   rank, world, local batch, buffer size) and b only, never on what was read before. So a resumed
   epoch (``start_batch=k``) yields exactly batches k, k+1, ... of an uninterrupted one, and the
   number of DataLoader workers changes nothing: the DataLoader hands batch indices to its
   workers round robin and returns the results in index order.

Batches per epoch are ``(N // world) // local_batch`` on every rank (:func:`steps_per_epoch`),
so collective paradigms take the same number of steps everywhere; the remainder of a rank's q
examples (fewer than one batch, drawn from its last window) is dropped.

Reading: shards written by ``np.savez`` store their members uncompressed, so the rows a window
needs are memory-mapped from the file at the member's data offset (``datasets.npz_member``) with
``MADV_WILLNEED`` read-ahead, and batches are gathered with numpy fancy indexing: no per-example
Python, no decompression, and the page cache is shared by all DataLoader workers. Compressed
shards (``np.savez_compressed``) or ``mmap=False`` fall back to loading the shards the window
touches, whole.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from sublimate.components.data.datasets import (
    DatasetError,
    npz_member,
    read_metadata,
    shard_examples,
)

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

DEFAULT_BUFFER = 16_384  # examples in one shuffle window (before rounding to whole batches)
_SHARD_ORDER_STREAM = 0x5348  # keeps the shard-order generator apart from the window ones
_WINDOW_STREAM = 0x574E


def _seed(value: int) -> int:
    """SeedSequence takes non-negative entropy only; any int seed maps to one."""
    return value % (1 << 63)


def steps_per_epoch(metadata: dict[str, Any], world: int, local_batch: int,
                    split: str = "train", *, drop_last: bool = True) -> int:
    """Batches every rank takes per epoch from ``split``: ``(N // world) // local_batch``.

    The same on every rank (each rank is dealt exactly ``N // world`` examples), which collective
    training needs. ``N`` is the sum of the per-shard counts when the metadata records them, the
    split's ``examples`` otherwise. ``drop_last=False`` counts a last, shorter batch (evaluation).
    """
    if world < 1 or local_batch < 1:
        raise ValueError(f"world ({world}) and local_batch ({local_batch}) must be >= 1")
    entry = metadata["splits"][split]
    counts = [shard.get("examples") for shard in entry["shards"]]
    total = sum(counts) if all(c is not None for c in counts) else int(entry["examples"])
    return _steps(total, world, local_batch, drop_last)


def _steps(total: int, world: int, local_batch: int, drop_last: bool) -> int:
    if drop_last:
        return (total // world) // local_batch
    # The largest rank's share (shares differ by at most one example), last batch shorter.
    return _ceil_div(_ceil_div(total, world), local_batch)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of shard ``shard`` (an index into the split's shard list)."""

    shard: int
    start: int
    stop: int


def rank_pieces(counts: Sequence[int], *, seed: int, epoch: int, rank: int, world: int,
                shuffle: bool = True, drop_last: bool = True) -> list[Piece]:
    """The row ranges rank ``rank`` reads in ``epoch``, in stream order (module docstring, 1).

    Without ``shuffle`` the shards keep their metadata order and nothing is rotated; without
    ``drop_last`` the ranks' shares differ by at most one example and cover the whole split.
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    sizes = np.asarray(counts, dtype=np.int64)
    total = int(sizes.sum())
    if shuffle:
        rng = np.random.default_rng([_seed(seed), epoch, _SHARD_ORDER_STREAM])
        order = rng.permutation(len(sizes))
        rotation = int(rng.integers(total)) if total else 0
    else:
        order, rotation = np.arange(len(sizes)), 0
    if drop_last:
        begin, end = rank * (total // world), (rank + 1) * (total // world)
    else:
        begin, end = rank * total // world, (rank + 1) * total // world
    starts = np.concatenate([[0], np.cumsum(sizes[order])])  # of each shard in the sequence
    ranges = [(begin + rotation, end + rotation)]
    if end + rotation > total:  # the rotated range wraps past the sequence's end
        ranges = [(begin + rotation, total), (max(begin + rotation - total, 0),
                                               end + rotation - total)]
        ranges = [(a, b) for a, b in ranges if b > a and a < total]
    pieces = []
    for low, high in ranges:
        first = int(np.searchsorted(starts, low, side="right")) - 1
        for slot in range(first, len(order)):
            if starts[slot] >= high:
                break
            lo, hi = max(low, starts[slot]), min(high, starts[slot + 1])
            if hi > lo:
                pieces.append(Piece(int(order[slot]), int(lo - starts[slot]),
                                    int(hi - starts[slot])))
    return pieces


@dataclass
class _Shard:
    """One shard's file and, once looked at, where its arrays lie."""

    path: Path
    x: Any = None  # datasets.ArrayMember of "x", read on first use
    y: Any = None


@dataclass
class _Window:
    """The current window: its permutation and the rows it maps (or loads)."""

    index: int
    order: np.ndarray  # stream positions, relative to the window's start, in shuffled order
    segment_starts: np.ndarray  # window-relative start of each segment (a piece within it)
    arrays: list[tuple[np.ndarray, np.ndarray]]  # per segment: its rows of x and y
    rows: int  # rows this window holds in memory or mapped (the memory counter)


@dataclass
class EpochBatches:
    """One rank's batches of one epoch: ``len()`` batches, ``self[b]`` is batch b as numpy
    ``(x (B, *feature_shape) float32, y (B,) int64)``.

    A map-style dataset of batches: a ``DataLoader(batch_size=None, sampler=range(k, len))``
    over it yields batches k, k+1, ... in order, with any number of workers (each worker keeps
    its own window; consecutive indices share one, so a window is planned once per worker).
    """

    folder: Path
    files: list[str]
    feature_shape: tuple[int, ...]
    pieces: list[Piece]
    local_batch: int
    window: int  # examples per shuffle window, a multiple of local_batch
    batches: int
    seed: int
    epoch: int
    rank: int
    shuffle: bool
    mmap: bool
    # Per process (rebuilt lazily in each DataLoader worker); not part of the batch's identity.
    peak_rows: int = field(default=0, compare=False)
    _shards: dict[int, _Shard] = field(default_factory=dict, compare=False, repr=False)
    _current: _Window | None = field(default=None, compare=False, repr=False)
    _loaded: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict,
                                                              compare=False, repr=False)

    def __post_init__(self) -> None:
        sizes = np.array([p.stop - p.start for p in self.pieces], dtype=np.int64)
        self._piece_starts = np.concatenate([[0], np.cumsum(sizes)])  # stream position of each
        self.examples = int(self._piece_starts[-1])

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """All batches in order, in this process (no DataLoader)."""
        for index in range(self.batches):
            yield self[index]

    @property
    def resident_rows(self) -> int:
        """Rows this process holds for the current window (mapped or loaded)."""
        return 0 if self._current is None else self._current.rows

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        if not 0 <= index < self.batches:
            raise IndexError(f"batch {index} of {self.batches}")
        per_window = self.window // self.local_batch
        window = self._window(index // per_window)
        first = (index % per_window) * self.local_batch
        positions = window.order[first:first + self.local_batch]
        x = np.empty((len(positions), *self.feature_shape), dtype=np.float32)
        y = np.empty(len(positions), dtype=np.int64)
        segment = np.searchsorted(window.segment_starts, positions, side="right") - 1
        # One vectorised gather per segment (a window spans few): no per-example Python.
        for part in np.unique(segment):
            slots = np.flatnonzero(segment == part)
            rows = positions[slots] - window.segment_starts[part]
            ascending = np.argsort(rows)  # reads the mapped rows front to back
            slots, rows = slots[ascending], rows[ascending]
            xs, ys = window.arrays[part]
            x[slots] = xs[rows]
            y[slots] = ys[rows]
        return x, y

    def _window(self, index: int) -> _Window:
        if self._current is not None and self._current.index == index:
            return self._current
        begin = index * self.window
        end = min(begin + self.window, self.examples)
        if self.shuffle:
            rng = np.random.default_rng([_seed(self.seed), self.epoch, self.rank, index,
                                         _WINDOW_STREAM])
            order = rng.permutation(end - begin)
        else:
            order = np.arange(end - begin)
        # The window's segments: (window-relative start, shard, first row, last row + 1).
        segments = []
        piece = int(np.searchsorted(self._piece_starts, begin, side="right")) - 1
        while piece < len(self.pieces) and self._piece_starts[piece] < end:
            spec = self.pieces[piece]
            lo = max(begin, int(self._piece_starts[piece]))
            hi = min(end, int(self._piece_starts[piece + 1]))
            row = spec.start + lo - int(self._piece_starts[piece])
            segments.append((lo - begin, spec.shard, row, row + hi - lo))
            piece += 1
        # Let go of the last window before reading this one: never two windows at once.
        self._current = None
        needed = {shard for _, shard, _, _ in segments}
        for shard in set(self._loaded) - needed:
            del self._loaded[shard]
        arrays, mapped_rows = [], 0
        for _, shard, row, stop in segments:
            pair = self._rows(shard, row, stop)
            if shard not in self._loaded:
                mapped_rows += stop - row
            arrays.append(pair)
        rows = mapped_rows + sum(len(pair[1]) for pair in self._loaded.values())
        self._current = _Window(index, order,
                                np.array([start for start, *_ in segments], dtype=np.int64),
                                arrays, rows)
        self.peak_rows = max(self.peak_rows, rows)
        return self._current

    def _shard(self, index: int) -> _Shard:
        shard = self._shards.get(index)
        if shard is None:
            path = self.folder / self.files[index]
            shard = self._shards[index] = _Shard(path, npz_member(path, "x"),
                                                 npz_member(path, "y"))
            if shard.x.shape[1:] != self.feature_shape or shard.y.shape[0] != shard.x.shape[0]:
                raise DatasetError(f"{path}: x {shard.x.shape} and y {shard.y.shape} do not "
                                   f"match feature_shape {list(self.feature_shape)}")
        return shard

    def _rows(self, index: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``[start, stop)`` of shard ``index``: mapped when the shard allows it."""
        shard = self._shard(index)
        if self.mmap and index not in self._loaded and _mappable(shard.x, np.float32) \
                and _mappable(shard.y, np.int64):
            return (_map_rows(shard.path, shard.x, start, stop),
                    _map_rows(shard.path, shard.y, start, stop))
        if index not in self._loaded:
            with np.load(shard.path) as arrays:
                self._loaded[index] = (np.ascontiguousarray(arrays["x"], dtype=np.float32),
                                       np.ascontiguousarray(arrays["y"], dtype=np.int64))
        x, y = self._loaded[index]
        return x[start:stop], y[start:stop]


def _mappable(member: Any, dtype: type) -> bool:
    return member.offset is not None and not member.fortran_order \
        and member.dtype == np.dtype(dtype)


def _map_rows(path: Path, member: Any, start: int, stop: int) -> np.ndarray:
    """Rows ``[start, stop)`` of a stored ``.npz`` member, memory-mapped read-only."""
    row_bytes = member.dtype.itemsize * int(np.prod(member.shape[1:], dtype=np.int64))
    shape = (stop - start, *member.shape[1:])
    if stop <= start or row_bytes == 0:
        return np.empty(shape, dtype=member.dtype)
    offset = member.offset + start * row_bytes
    aligned = offset - offset % mmap.ALLOCATIONGRANULARITY
    with open(path, "rb") as handle:
        mapping = mmap.mmap(handle.fileno(), offset - aligned + (stop - start) * row_bytes,
                            access=mmap.ACCESS_READ, offset=aligned)
    if hasattr(mapping, "madvise"):
        # Start reading the window's rows now, in large requests, rather than one page fault at a
        # time while gathering: on a network volume that is the difference.
        mapping.madvise(mmap.MADV_WILLNEED)
    # The array keeps the mapping alive; it is unmapped when the window lets go of it.
    return np.frombuffer(mapping, dtype=member.dtype, count=int(np.prod(shape)),
                         offset=offset - aligned).reshape(shape)


class ShardReader:
    """Streams one split of a dataset folder in batches for one rank (module docstring).

    ``buffer_size`` is the shuffle window in examples (rounded down to whole batches, at least
    one); memory per process is about one window of rows plus the batches in flight. Without
    ``shuffle`` (evaluation) shards and rows keep their order; without ``drop_last`` the last,
    shorter batch is kept and the ranks' shares differ by at most one example.
    """

    def __init__(self, folder: Path, split: str = "train", *, local_batch: int, rank: int = 0,
                 world: int = 1, seed: int = 0, shuffle: bool = True,
                 buffer_size: int = DEFAULT_BUFFER, drop_last: bool = True,
                 mmap: bool = True) -> None:
        if local_batch < 1 or buffer_size < 1:
            raise ValueError(f"local_batch ({local_batch}) and buffer_size ({buffer_size}) "
                             f"must be >= 1")
        self.folder, self.split = Path(folder), split
        self.metadata = read_metadata(self.folder)
        self.counts = shard_examples(self.folder, self.metadata, split)
        self.files = [shard["file"] for shard in self.metadata["splits"][split]["shards"]]
        self.feature_shape = tuple(int(d) for d in self.metadata["feature_shape"])
        self.local_batch, self.rank, self.world, self.seed = local_batch, rank, world, seed
        self.shuffle, self.drop_last, self.mmap = shuffle, drop_last, mmap
        self.window = max(1, buffer_size // local_batch) * local_batch
        # Batches per epoch, the same every epoch (and on every rank when drop_last).
        self.steps = _steps(sum(self.counts), world, local_batch, drop_last)

    def epoch(self, epoch: int) -> EpochBatches:
        """This rank's batches of ``epoch`` (a map-style dataset; see :class:`EpochBatches`)."""
        pieces = rank_pieces(self.counts, seed=self.seed, epoch=epoch, rank=self.rank,
                             world=self.world, shuffle=self.shuffle, drop_last=self.drop_last)
        examples = sum(p.stop - p.start for p in pieces)
        batches = examples // self.local_batch if self.drop_last \
            else _ceil_div(examples, self.local_batch)
        return EpochBatches(self.folder, self.files, self.feature_shape, pieces,
                            self.local_batch, self.window, batches, self.seed, epoch, self.rank,
                            self.shuffle, self.mmap)

    def batches(self, epoch: int, start_batch: int = 0, *, num_workers: int = 0,
                prefetch_factor: int | None = None, pin_memory: bool = False,
                ) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        """A DataLoader yielding ``(x, y)`` tensors: batches ``start_batch .. steps-1`` of
        ``epoch``, in order, whatever ``num_workers`` is.

        ``x`` is ``(B, *feature_shape)`` float32 (images keep their shape), ``y`` ``(B,)`` int64.
        ``pin_memory`` pins them for an asynchronous host-to-GPU copy. With no workers and a
        ``prefetch_factor``, a thread of this process reads that many batches ahead
        (:class:`ThreadPrefetch`).
        """
        from torch.utils.data import DataLoader

        batches = self.epoch(epoch)
        if not 0 <= start_batch <= len(batches):
            raise ValueError(f"start_batch {start_batch} is outside epoch's {len(batches)} "
                             f"batches")
        # EpochBatches is a map-style dataset by its protocol (__len__, __getitem__)
        dataset = cast("Dataset[tuple[torch.Tensor, torch.Tensor]]", batches)
        loader: DataLoader[tuple[torch.Tensor, torch.Tensor]] = DataLoader(
            dataset, batch_size=None, sampler=range(start_batch, len(batches)),
                            num_workers=num_workers, pin_memory=pin_memory,
                            prefetch_factor=prefetch_factor if num_workers else None)
        if num_workers == 0 and prefetch_factor:
            return ThreadPrefetch(loader, prefetch_factor)
        return loader


class ThreadPrefetch:
    """Iterates ``source`` in a background thread, up to ``depth`` items ahead.

    Reading a batch is mostly page faults on the mapped shards and numpy copies, which release
    the GIL, so a thread overlaps them with the training step without the cost of a DataLoader
    worker process (on a small machine a worker process competes with training for the cores).
    Items come in order; an exception in the thread is raised at the consumer.
    """

    _DONE = object()

    def __init__(self, source: Iterable[Any], depth: int = 2) -> None:
        self.source, self.depth = source, max(1, depth)

    def __iter__(self) -> Iterator[Any]:
        import queue
        import threading

        items: queue.Queue[Any] = queue.Queue(self.depth)
        stop = threading.Event()

        def produce() -> None:
            try:
                for item in self.source:
                    while not stop.is_set():
                        try:
                            items.put(item, timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
                items.put(self._DONE)
            except BaseException as error:  # handed to the consumer, raised there
                items.put(error)

        thread = threading.Thread(target=produce, name="sublimate-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                item = items.get()
                if item is self._DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()  # a consumer that stops early (a resumed epoch, an error) ends the thread


def evaluation_batches(folder: Path, split: str = "test", batch_size: int = 8192, *,
                       num_workers: int = 0) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """The whole of ``split`` in order, in batches of ``batch_size`` (the last one shorter),
    for one process: memory is a few batches, whatever the split's size."""
    reader = ShardReader(folder, split, local_batch=batch_size, shuffle=False, drop_last=False,
                         buffer_size=batch_size)
    return reader.batches(0, num_workers=num_workers)
