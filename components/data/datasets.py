"""The on-disk dataset layout shared by every step, and the built-in datasets.

A dataset on the shared volume is one folder::

    <name>/
      metadata.json            # written last: its presence means the folder is complete
      train-00000-of-00002.npz # shards: arrays "x" (float32, N x features) and "y" (int64, N)
      train-00001-of-00002.npz
      test-00000-of-00001.npz

``metadata.json`` holds the format version, feature shape, class count, and for every split its
example count and shards with their byte sizes, SHA-256 digests and example counts (older folders
lack the per-shard counts: :func:`shard_examples` then reads them from the shard headers), so any
step can verify what it reads. ``sublimate.components.data.streaming`` reads the shards without
loading a split into memory.
Folders are built under a temporary name and renamed into place, so a reader never sees a
half-written dataset.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import struct
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_VERSION = 1
METADATA_FILE = "metadata.json"
BUILTIN_DATASETS = ("digits", "mnist1d")


class DatasetError(ValueError):
    """A dataset folder is missing, incomplete or corrupt; the message names the path."""


@dataclass(frozen=True)
class Split:
    x: np.ndarray
    y: np.ndarray


def sha256_of(path: Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def write_dataset(
    target: str | os.PathLike[str],
    splits: dict[str, Split],
    *,
    name: str,
    num_classes: int,
    shard_size: int = 1024,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``splits`` as a complete dataset folder at ``target``, atomically.

    An existing complete folder at ``target`` (a path, or its text) is left untouched (and
    returned): staging is idempotent and never rewrites data that a running job may be reading.
    """
    def shards_of(split: Split) -> Iterator[Split]:
        count = len(split.y)
        for start in range(0, max(count, 1), shard_size):
            yield Split(split.x[start:start + shard_size], split.y[start:start + shard_size])

    first = next(iter(splits.values()))
    return write_shards(target, {split_name: shards_of(split)
                                 for split_name, split in splits.items()},
                        name=name, num_classes=num_classes,
                        feature_shape=tuple(first.x.shape[1:]), extra=extra)


def write_shards(
    target: str | os.PathLike[str],
    splits: dict[str, Iterable[Split]],
    *,
    name: str,
    num_classes: int,
    feature_shape: tuple[int, ...],
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a dataset folder from splits given shard by shard, atomically.

    Each split is an iterable of shards (``Split`` of one shard's rows), consumed one at a time,
    so a generator can produce a split far larger than memory. The shard count in the file names
    (``-of-NNNNN``) is only known at the end, so shards are renamed once their split is done.
    Each shard's example count is recorded in the metadata (``examples``) so that a streaming
    reader can plan an epoch without opening the shards. An existing complete folder at
    ``target`` is left untouched (and returned).
    """
    target = Path(target)  # a user's "mydata" as well as a Path
    if (target / METADATA_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        split_meta: dict[str, Any] = {}
        for split_name, shard_iter in splits.items():
            written: list[tuple[Path, int]] = []
            for index, shard in enumerate(shard_iter):
                if tuple(shard.x.shape[1:]) != tuple(feature_shape) or len(shard.x) != len(shard.y):
                    raise ValueError(f"split '{split_name}' shard {index}: x {shard.x.shape}, "
                                     f"y {shard.y.shape} do not match feature_shape "
                                     f"{tuple(feature_shape)}")
                path = staging / f".{split_name}-{index:05d}.npz"
                with open(path, "wb") as handle:
                    # Uncompressed on purpose: the streaming reader memory-maps stored members.
                    np.savez(handle, x=np.ascontiguousarray(shard.x, dtype=np.float32),
                             y=np.ascontiguousarray(shard.y, dtype=np.int64))
                written.append((path, len(shard.y)))
            if not written:  # an empty split is still one (empty) shard, as before
                path = staging / f".{split_name}-00000.npz"
                with open(path, "wb") as handle:
                    np.savez(handle, x=np.zeros((0, *feature_shape), np.float32),
                             y=np.zeros(0, np.int64))
                written.append((path, 0))
            shards = []
            for index, (path, count) in enumerate(written):
                shard_name = f"{split_name}-{index:05d}-of-{len(written):05d}.npz"
                path.rename(staging / shard_name)
                shard_path = staging / shard_name
                shards.append({"file": shard_name, "bytes": shard_path.stat().st_size,
                               "sha256": sha256_of(shard_path), "examples": count})
            split_meta[split_name] = {"examples": sum(count for _, count in written),
                                      "shards": shards}
        metadata = {
            "format_version": FORMAT_VERSION,
            "name": name,
            "feature_shape": list(feature_shape),
            "num_classes": num_classes,
            "splits": split_meta,
            **(extra or {}),
        }
        (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n")
        try:
            os.rename(staging, target)
        except OSError:
            # Another stager finished first (rename onto a non-empty folder fails): theirs wins.
            if not (target / METADATA_FILE).is_file():
                raise
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


# A training split larger than this streams from the volume under data-loading=auto.
STREAM_ABOVE_BYTES = 1 << 30


def streams(data_loading: str, metadata: dict[str, Any]) -> bool:
    """Whether the training split streams (data-loading stream, or auto and a large split)."""
    if data_loading != "auto":
        return data_loading == "stream"
    shards = metadata["splits"]["train"]["shards"]
    return sum(int(shard.get("bytes", 0)) for shard in shards) > STREAM_ABOVE_BYTES


def read_metadata(folder: Path) -> dict[str, Any]:
    path = folder / METADATA_FILE
    if not folder.is_dir():
        raise DatasetError(f"dataset folder {folder} does not exist")
    if not path.is_file():
        raise DatasetError(f"dataset folder {folder} is incomplete: {METADATA_FILE} is missing")
    try:
        metadata = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise DatasetError(f"{path} is not valid JSON: {error}") from error
    if metadata.get("format_version") != FORMAT_VERSION:
        raise DatasetError(f"{path}: unsupported format_version "
                           f"{metadata.get('format_version')!r} (expected {FORMAT_VERSION})")
    return metadata


def verify_dataset(folder: Path, known_digests: dict[str, str] | None = None,
                   shown_as: str | None = None) -> dict[str, Any]:
    """Check every shard's size and SHA-256 against the metadata, and its arrays' types and
    shapes against the layout; return the metadata.

    ``known_digests`` (file name -> SHA-256) spares re-reading files whose bytes were already
    hashed on their way in, e.g. while staging downloaded them. ``shown_as`` names the folder
    in messages (the source a user gave, not a hidden copy being staged).
    """
    known_digests = known_digests or {}
    metadata = read_metadata(folder)
    shown = (shown_as or str(folder)).rstrip("/")
    for split_name, split in metadata["splits"].items():
        for shard in split["shards"]:
            path = folder / shard["file"]
            name = f"{shown}/{shard['file']}"
            if not path.is_file():
                raise DatasetError(f"{name}: shard of split '{split_name}' is missing")
            digest = known_digests.get(shard["file"]) or sha256_of(path)
            if path.stat().st_size != shard["bytes"] or digest != shard["sha256"]:
                raise DatasetError(f"{name}: content does not match its checksum in "
                                   f"{METADATA_FILE}")
            layout_problem = _layout_problem(path, metadata)
            if layout_problem:
                raise DatasetError(f"{name}: {layout_problem}")
    return metadata


# What training reads: float32 examples (torch's default dtype, the models' weights) and int64
# labels (cross-entropy's targets). Anything else fails deep in the first step.
LAYOUT_DTYPES = {"x": np.dtype(np.float32), "y": np.dtype(np.int64)}


def _layout_problem(path: Path, metadata: dict[str, Any]) -> str | None:
    """Why a shard's arrays are not the layout's (read from their headers only), or None."""
    try:
        members = {name: npz_member(path, name) for name in LAYOUT_DTYPES}
    except KeyError as error:
        return f"not a shard of the layout (no array {error} in it: it needs x and y)"
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        return f"not a readable .npz shard ({error})"
    for name, wanted in LAYOUT_DTYPES.items():
        dtype = members[name].dtype
        if dtype != wanted:
            return (f"{name} is {dtype}, the layout holds {wanted} (convert it with "
                    f"{name}.astype(np.{wanted}), or write the dataset with "
                    "sublimate.components.write_dataset, which converts)")
    x_shape, y_shape = members["x"].shape, members["y"].shape
    feature_shape = tuple(metadata.get("feature_shape") or x_shape[1:])
    if x_shape[1:] != feature_shape or x_shape[:1] != y_shape[:1] or len(y_shape) != 1:
        return (f"x has shape {x_shape} and y {y_shape}; the layout needs x (N, "
                f"{', '.join(map(str, feature_shape))}) and y (N,) as metadata.json's "
                "feature_shape says")
    return None


def read_split(folder: Path, split_name: str) -> Split:
    metadata = read_metadata(folder)
    if split_name not in metadata["splits"]:
        known = ", ".join(sorted(metadata["splits"]))
        raise DatasetError(f"{folder}: no split '{split_name}' (has: {known})")
    xs, ys = [], []
    for shard in metadata["splits"][split_name]["shards"]:
        with np.load(folder / shard["file"]) as arrays:
            xs.append(arrays["x"])
            ys.append(arrays["y"])
    return Split(np.concatenate(xs), np.concatenate(ys))


@dataclass(frozen=True)
class ArrayMember:
    """Where one array of an ``.npz`` shard lies, from its headers only (no data read)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    # Byte offset of the array's data in the .npz file when the member is stored uncompressed
    # (np.savez), so it can be memory-mapped; None when compressed (np.savez_compressed).
    offset: int | None


_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # a zip local file header, 30 bytes


def npz_member(path: Path, name: str) -> ArrayMember:
    """Shape, dtype and data offset of array ``name`` in the ``.npz`` file ``path``.

    Reads the zip directory, the member's local header and its ``.npy`` header: a few hundred
    bytes whatever the shard's size.
    """
    with open(path, "rb") as raw, zipfile.ZipFile(raw) as archive:
        info = archive.getinfo(f"{name}.npy")
        with archive.open(info) as member:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(member)
            else:
                shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(member)
            npy_header = member.tell()
        offset = None
        if info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 0x1:
            # The central directory's extra field may differ from the local one (zip64), so the
            # data offset comes from the local header itself.
            raw.seek(info.header_offset)
            fields = _LOCAL_HEADER.unpack(raw.read(_LOCAL_HEADER.size))
            if fields[0] != b"PK\x03\x04":
                raise DatasetError(f"{path}: member {name}.npy has a corrupt local header")
            name_length, extra_length = fields[-2], fields[-1]
            offset = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length \
                + npy_header
    return ArrayMember(tuple(shape), np.dtype(dtype), bool(fortran_order), offset)


def shard_examples(folder: Path, metadata: dict[str, Any], split_name: str) -> list[int]:
    """Example count of every shard of a split, in metadata order.

    From the metadata's per-shard ``examples`` when present (folders written since they were
    recorded); otherwise from each shard's ``y`` header, which reads a few hundred bytes per
    shard and no data.
    """
    if split_name not in metadata["splits"]:
        known = ", ".join(sorted(metadata["splits"]))
        raise DatasetError(f"{folder}: no split '{split_name}' (has: {known})")
    counts = []
    for shard in metadata["splits"][split_name]["shards"]:
        count = shard.get("examples")
        if count is None:
            count = npz_member(folder / shard["file"], "y").shape[0]
        counts.append(int(count))
    return counts


def synthetic_shards(count: int, *, feature_shape: tuple[int, ...], num_classes: int,
                     shard_size: int, seed: int, stream: int = 0,
                     noise: float = 1.0) -> Iterator[Split]:
    """``count`` examples of a learnable synthetic task, one shard at a time.

    Gaussian clusters: class ``c``'s examples are a fixed random centre plus unit noise scaled by
    ``noise``. Each shard is drawn from its own seed (``seed``, ``stream``, shard index), so a
    shard is generated (and regenerated) without the ones before it, and only one shard is ever
    in memory. Use different ``stream`` values for the splits of one dataset: same centres,
    independent examples.
    """
    width = int(np.prod(feature_shape))
    centres = np.random.default_rng([seed, 0xC3]).normal(size=(num_classes, width)) \
        .astype(np.float32)
    for index, start in enumerate(range(0, count, shard_size)):
        rows = min(shard_size, count - start)
        rng = np.random.default_rng([seed, stream, index])
        y = rng.integers(num_classes, size=rows, dtype=np.int64)
        x = rng.standard_normal((rows, width), dtype=np.float32)
        x *= noise
        x += centres[y]
        yield Split(x.reshape(rows, *feature_shape), y)


def write_synthetic_dataset(target: Path, *, train_examples: int, test_examples: int,
                            feature_shape: tuple[int, ...] = (64,), num_classes: int = 10,
                            shard_size: int = 4096, seed: int = 0, noise: float = 1.0,
                            name: str = "synthetic") -> Path:
    """Write a synthetic dataset in the layout, shard by shard: memory is one shard whatever the
    size, so benchmarks and tests can make splits larger than memory."""
    def split(count: int, stream: int) -> Iterator[Split]:
        return synthetic_shards(count, feature_shape=feature_shape, num_classes=num_classes,
                                shard_size=shard_size, seed=seed, stream=stream, noise=noise)

    return write_shards(target, {"train": split(train_examples, 1),
                                 "test": split(test_examples, 2)},
                        name=name, num_classes=num_classes, feature_shape=tuple(feature_shape),
                        extra={"source": f"synthetic (seed {seed}, noise {noise})"})


def digits_splits(test_fraction: float = 0.2, seed: int = 0) -> dict[str, Split]:
    """scikit-learn's handwritten digits (UCI optdigits, 1,797 8x8 images), scaled to [0, 1].

    The CSV ships inside this package, so no download and no scikit-learn are needed. The split is
    stratified and fixed by ``seed`` so every run and every paradigm sees the same test set.
    """
    raw = resources.files("sublimate.components.data").joinpath(
        "builtin/digits.csv.gz").read_bytes()
    table = np.loadtxt(gzip.decompress(raw).decode().splitlines(), delimiter=",")
    x = (table[:, :-1] / 16.0).astype(np.float32)
    y = table[:, -1].astype(np.int64)
    rng = np.random.default_rng(seed)
    test_rows: list[np.ndarray] = []
    for label in np.unique(y):
        rows = np.flatnonzero(y == label)
        rng.shuffle(rows)
        test_rows.extend(rows[: round(len(rows) * test_fraction)])
    test_mask = np.zeros(len(y), dtype=bool)
    test_mask[test_rows] = True
    train_rows = np.flatnonzero(~test_mask)
    rng.shuffle(train_rows)
    return {
        "train": Split(x[train_rows], y[train_rows]),
        "test": Split(x[test_mask], y[test_mask]),
    }


# mnist1d at the size sublimate builds it: 62,500 examples, split 80/20 by the package into
# 50,000 training and 12,500 test examples, from the package's own default seed.
MNIST1D_EXAMPLES = 62_500
MNIST1D_SEED = 42
# 8 training and 2 test shards of 1 MB each: every shard is full, and a job of up to 8 ranks
# streams whole shards.
MNIST1D_SHARD_SIZE = 6_250


def mnist1d_splits(num_samples: int = MNIST1D_EXAMPLES,
                   seed: int = MNIST1D_SEED) -> tuple[dict[str, Split], dict[str, Any]]:
    """MNIST-1D (Greydanus 2020, arXiv:2011.14439): 1-D signals of 40 points made from 10
    digit templates by random padding, scaling, translation, correlated and white noise and
    shear, generated here by the ``mnist1d`` package's ``make_dataset``.

    Never ``mnist1d.data.get_dataset``: that one downloads a pickle. The generator draws from
    the global ``random``/``numpy.random`` state after seeding it, so the same seed and package
    version give the same arrays; the caller's global random state is restored afterwards.
    Returns the splits (``train``: the first 80%, ``test``: the rest, as the package splits
    them) and the generation's provenance for the dataset's metadata.
    """
    import random
    from importlib.metadata import version

    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed = num_samples, seed
    numpy_state, python_state = np.random.get_state(), random.getstate()
    try:
        generated = make_dataset(args)
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)
    splits = {"train": Split(generated["x"].astype(np.float32), generated["y"].astype(np.int64)),
              "test": Split(generated["x_test"].astype(np.float32),
                            generated["y_test"].astype(np.int64))}
    provenance = {
        "package": "mnist1d", "version": version("mnist1d"),
        "function": "mnist1d.data.make_dataset", "licence": "Apache-2.0",
        "reference": "Greydanus, Scaling down deep learning (2020), arXiv:2011.14439",
        # every argument of the generation (the download URL it never used left out)
        "args": {key: value for key, value in vars(args).items() if key != "url"},
    }
    return splits, provenance


def build_builtin(name: str, target: Path) -> Path:
    """Write built-in dataset ``name`` at ``target`` (an existing complete folder is kept)."""
    if name == "digits":
        return write_dataset(target, digits_splits(), name="digits", num_classes=10,
                             shard_size=1024,
                             extra={"source": "scikit-learn digits (UCI optdigits), CC BY 4.0"})
    if name == "mnist1d":
        if (target / METADATA_FILE).is_file():
            return target  # complete already: spare the generation (seconds of CPU)
        splits, provenance = mnist1d_splits()
        return write_dataset(
            target, splits, name="mnist1d", num_classes=10, shard_size=MNIST1D_SHARD_SIZE,
            extra={"source": f"MNIST-1D generated locally by mnist1d {provenance['version']} "
                             f"(make_dataset, {MNIST1D_EXAMPLES} examples, seed "
                             f"{MNIST1D_SEED}), Apache-2.0; no download",
                   "generator": provenance})
    raise DatasetError(f"unknown built-in dataset '{name}' (built-in: "
                       f"{', '.join(BUILTIN_DATASETS)})")


def data_problem(data_dir: Path, global_batch_size: int, needs_test: bool = False) -> str | None:
    """What makes ``data_dir`` unusable with this batch, in one line naming the setting; None
    when it is fine.

    Only the staged dataset knows its size, so this is known once the train step runs: the
    launcher asks before it starts any worker and every worker asks again, with this one
    wording. Every paradigm walks the global batch through one epoch (async trainers each take
    their slice of it), so a global batch larger than the training split means no step at all.
    """
    try:
        metadata = read_metadata(data_dir)
    except DatasetError as error:
        return f"data-dir: {error}"
    try:
        splits = dict(metadata["splits"])
        examples = int(splits["train"]["examples"])
    except (KeyError, TypeError, ValueError) as error:
        found = f"no {error}" if isinstance(error, KeyError) else "unreadable"
        return (f"data-dir: {data_dir}/metadata.json does not give the train split's example "
                f"count ({found})")
    if global_batch_size > examples:
        return (f"global-batch-size {global_batch_size} is larger than the {examples} training "
                f"examples of {data_dir}")
    if needs_test and "test" not in splits:
        return (f"eval-every-epoch: dataset {data_dir} has no test split to evaluate on "
                "(set eval-every-epoch to false)")
    return None
