"""Publish a dataset folder in sublimate's layout to any fsspec URL (``sublimate data push``).

The remote ``metadata.json`` is removed first and uploaded last, so while a dataset is being
(re)published a stager sees "not a sublimate dataset" rather than a mix of old and new shards.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sublimate.components.data import object_store
from sublimate.components.data.datasets import (
    BUILTIN_DATASETS,
    METADATA_FILE,
    DatasetError,
    build_builtin,
    verify_dataset,
)


@dataclass(frozen=True)
class PushReport:
    url: str
    files: int
    bytes: int
    seconds: float


def push(source: str, url: str, *, create_bucket: bool = False) -> PushReport:
    """Upload ``source`` (built-in name, ``py:module:function`` or dataset folder) to ``url``."""
    if source in BUILTIN_DATASETS or source.startswith("py:"):
        with tempfile.TemporaryDirectory(prefix="sublimate-push-") as scratch:
            return _push_folder(_build(source, Path(scratch)), url, create_bucket)
    folder = Path(source)
    if not folder.is_dir():
        raise DatasetError(f"'{source}' is neither a built-in dataset "
                           f"({', '.join(BUILTIN_DATASETS)}) nor a dataset folder")
    return _push_folder(folder, url, create_bucket)


def _build(source: str, scratch: Path) -> Path:
    if source in BUILTIN_DATASETS:
        return build_builtin(source, scratch / source)
    from sublimate.components.steps.stage_data import stage_entry_point

    return stage_entry_point(source, scratch / "dataset")


def _push_folder(folder: Path, url: str, create_bucket: bool) -> PushReport:
    started = time.perf_counter()
    metadata = verify_dataset(folder)  # never publish a damaged or incomplete folder
    shards = [shard["file"] for split in metadata["splits"].values() for shard in split["shards"]]
    fs, root = object_store.open_url(url)
    try:
        if object_store.is_s3(url):
            _ensure_bucket(fs, root.split("/", 1)[0], url, create_bucket)
        else:
            fs.makedirs(root, exist_ok=True)  # folders exist on their own only outside S3
        meta_path = object_store.join(root, METADATA_FILE)
        if fs.exists(meta_path):
            fs.rm_file(meta_path)
        # One batched, concurrent put (s3fs/fsspec async), then metadata.json alone, last.
        fs.put([str(folder / name) for name in shards],
               [object_store.join(root, name) for name in shards])
        fs.put_file(str(folder / METADATA_FILE), meta_path)
    except DatasetError:
        raise
    except Exception as error:  # every store error becomes one message naming the URL
        raise object_store.explain(url, error) from error
    files = [*shards, METADATA_FILE]
    return PushReport(object_store.public_url(url), len(files),
                      sum((folder / name).stat().st_size for name in files),
                      time.perf_counter() - started)


def _ensure_bucket(fs: Any, bucket: str, url: str, create: bool) -> None:
    # s3fs would create a missing bucket on the first put; a typo should not make a new bucket.
    try:
        fs.info(bucket)
    except FileNotFoundError:
        if not create:
            raise DatasetError(f"dataset '{object_store.public_url(url)}': bucket '{bucket}' does "
                               f"not exist at {object_store.endpoint()} (create it, or pass "
                               "--create-bucket)") from None
        fs.mkdir(bucket)
