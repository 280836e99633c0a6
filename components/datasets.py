"""The on-disk dataset layout shared by every step, and the built-in datasets.

A dataset on the shared volume is one folder::

    <name>/
      metadata.json            # written last: its presence means the folder is complete
      train-00000-of-00002.npz # shards: arrays "x" (float32, N x features) and "y" (int64, N)
      train-00001-of-00002.npz
      test-00000-of-00001.npz

``metadata.json`` holds the format version, feature shape, class count, and for every split its
example count and shards with their byte sizes and SHA-256 digests, so any step can verify what it
reads. Folders are built under a temporary name and renamed into place, so a reader never sees a
half-written dataset.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

FORMAT_VERSION = 1
METADATA_FILE = "metadata.json"
BUILTIN_DATASETS = ("digits",)


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
    target: Path,
    splits: dict[str, Split],
    *,
    name: str,
    num_classes: int,
    shard_size: int = 1024,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``splits`` as a complete dataset folder at ``target``, atomically.

    An existing complete folder at ``target`` is left untouched (and returned): staging is
    idempotent and never rewrites data that a running job may be reading.
    """
    if (target / METADATA_FILE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        split_meta: dict[str, Any] = {}
        for split_name, split in splits.items():
            count = len(split.y)
            num_shards = max(1, -(-count // shard_size))
            shards = []
            for index in range(num_shards):
                rows = slice(index * shard_size, (index + 1) * shard_size)
                shard_name = f"{split_name}-{index:05d}-of-{num_shards:05d}.npz"
                shard_path = staging / shard_name
                with open(shard_path, "wb") as handle:
                    np.savez(handle, x=split.x[rows].astype(np.float32),
                             y=split.y[rows].astype(np.int64))
                shards.append({"file": shard_name, "bytes": shard_path.stat().st_size,
                               "sha256": sha256_of(shard_path)})
            split_meta[split_name] = {"examples": count, "shards": shards}
        first = next(iter(splits.values()))
        metadata = {
            "format_version": FORMAT_VERSION,
            "name": name,
            "feature_shape": list(first.x.shape[1:]),
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


def verify_dataset(folder: Path, known_digests: dict[str, str] | None = None) -> dict[str, Any]:
    """Check every shard's size and SHA-256 against the metadata; return the metadata.

    ``known_digests`` (file name -> SHA-256) spares re-reading files whose bytes were already
    hashed on their way in, e.g. while staging downloaded them.
    """
    known_digests = known_digests or {}
    metadata = read_metadata(folder)
    for split_name, split in metadata["splits"].items():
        for shard in split["shards"]:
            path = folder / shard["file"]
            if not path.is_file():
                raise DatasetError(f"{path}: shard of split '{split_name}' is missing")
            digest = known_digests.get(shard["file"]) or sha256_of(path)
            if path.stat().st_size != shard["bytes"] or digest != shard["sha256"]:
                raise DatasetError(f"{path}: content does not match its checksum in metadata")
    return metadata


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


def digits_splits(test_fraction: float = 0.2, seed: int = 0) -> dict[str, Split]:
    """scikit-learn's handwritten digits (UCI optdigits, 1,797 8x8 images), scaled to [0, 1].

    The CSV ships inside this package, so no download and no scikit-learn are needed. The split is
    stratified and fixed by ``seed`` so every run and every paradigm sees the same test set.
    """
    raw = resources.files("sublimate.components").joinpath("datasets/digits.csv.gz").read_bytes()
    table = np.loadtxt(gzip.decompress(raw).decode().splitlines(), delimiter=",")
    x = (table[:, :-1] / 16.0).astype(np.float32)
    y = table[:, -1].astype(np.int64)
    rng = np.random.default_rng(seed)
    test_rows = []
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


def build_builtin(name: str, target: Path) -> Path:
    if name != "digits":
        raise DatasetError(f"unknown built-in dataset '{name}' (built-in: "
                           f"{', '.join(BUILTIN_DATASETS)})")
    return write_dataset(target, digits_splits(), name="digits", num_classes=10, shard_size=1024,
                         extra={"source": "scikit-learn digits (UCI optdigits), CC BY 4.0"})
