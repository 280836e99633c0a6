"""Copying a dataset's files from object storage onto the volume: the transfer engine of the
``stage-data`` step (:mod:`sublimate.components.steps.stage_data` decides what to copy and
publishes the copy).

On S3 a pool of threads issues the GETs; an object above :data:`PART_SIZE` is split into ranged
GETs written with ``os.pwrite`` into one file, and every GET (each part too) carries
``If-Match: <listed ETag>``, so an object replaced mid-copy is an error, not a mix. Other
filesystems go through fsspec's own ``get``. Each file lands under a temporary name, its SHA-256
computed as the bytes arrive, and is renamed into place.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sublimate.components.data import object_store
from sublimate.components.data.datasets import METADATA_FILE, DatasetError, sha256_of

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

DEFAULT_CONCURRENCY = 32
PART_SIZE = 16 << 20  # objects above this are fetched as concurrent ranged GETs of this size
_CHUNK = 1 << 20


def say(line: str) -> None:
    """A progress line, with any credentials in a URL redacted."""
    print(object_store.redact(line), flush=True)


@dataclass(frozen=True)
class RemoteFile:
    name: str   # relative to the dataset folder
    path: str   # inside the filesystem
    size: int
    token: str  # ETag (S3), md5/checksum (others) or size+mtime (local): changes with the content



class Progress:
    """Prints files, bytes and throughput about once a second while a transfer runs."""

    def __init__(self, total_files: int, total_bytes: int, interval: float = 1.0,
                 out: Callable[[str], None] | None = None) -> None:
        self.total_files, self.total_bytes, self.interval = total_files, total_bytes, interval
        self.files = self.bytes = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._out = out or say
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add(self, nbytes: int = 0, files: int = 0) -> None:
        with self._lock:
            self.bytes += nbytes
            self.files += files

    def line(self) -> str:
        elapsed = max(time.perf_counter() - self._started, 1e-9)
        return (f"stage-data: {self.files}/{self.total_files} files, "
                f"{self.bytes / 1e6:.1f}/{self.total_bytes / 1e6:.1f} MB, "
                f"{self.bytes / 1e6 / elapsed:.1f} MB/s")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._out(self.line())

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def content_token(info: dict[str, Any]) -> str:
    """What changes with a listed file's content: its ETag (S3), md5/checksum (others) or
    size and mtime (local)."""
    for key in ("ETag", "etag", "md5Hash", "checksum", "crc32c"):
        if info.get(key):
            return str(info[key])
    return f"{info.get('size')}:{info.get('mtime', info.get('LastModified', ''))}"


def _changed_mid_copy(url: str, name: str, why: str) -> DatasetError:
    return DatasetError(f"dataset '{object_store.public_url(url)}': {name} changed while it was "
                        f"being copied ({why}); nothing was staged, re-run once the upload is done")


class _Cancelled(Exception):
    """Another transfer failed first; this one stopped early (never reported)."""


class _Transfer:
    """One object on its way into ``folder``: fetched whole, or in ranged parts for a large one.

    Every GET carries ``If-Match: <listed ETag>``. Bytes land in ``.<name>.part`` (parts with
    ``os.pwrite`` at their offset in a file sized up front), the SHA-256 is computed while they
    arrive (for a parted object, over the contiguous prefix as soon as it grows: one sequential
    pass, overlapping the transfer of later parts), and the file is renamed into place once whole.
    """

    def __init__(self, client: Any, bucket: str, key: str, remote: RemoteFile, folder: Path,
                 url: str, part_size: int, progress: Progress, stop: threading.Event,
                 digests: dict[str, str]) -> None:
        self.client, self.bucket, self.key, self.remote = client, bucket, key, remote
        self.part, self.final = folder / f".{remote.name}.part", folder / remote.name
        self.url, self.progress, self.stop, self.digests = url, progress, stop, digests
        self.where = object_store.join(url, remote.name)
        size = remote.size
        self.ranges = [(start, min(start + part_size, size))
                       for start in range(0, size, part_size)] if size > part_size else [(0, size)]
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._done = [False] * len(self.ranges)
        self._hashed = 0          # parts [0, _hashed) are in the digest
        self._hashing = False     # one thread at a time extends the digest
        self._sha = hashlib.sha256()

    def jobs(self) -> list[Callable[[], None]]:
        if len(self.ranges) == 1:
            return [self._whole]
        return [functools.partial(self._ranged, index) for index in range(len(self.ranges))]

    # -- network
    def _get(self, byte_range: str | None) -> Any:
        extra = {"Range": byte_range} if byte_range else {}
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self.key,
                                          IfMatch=self.remote.token, **extra)["Body"]
        except Exception as error:
            raise object_store.explain(self.where, error) from error

    def _read(self, body: Any) -> bytes:
        if self.stop.is_set():
            raise _Cancelled
        try:
            return body.read(_CHUNK)
        except Exception as error:
            raise object_store.explain(self.where, error) from error

    # -- a whole object in one GET, hashed as it is written
    def _whole(self) -> None:
        body = self._get(None)
        try:
            with open(self.part, "wb") as out:
                while chunk := self._read(body):
                    out.write(chunk)
                    self._sha.update(chunk)
                    self.progress.add(len(chunk))
        finally:
            body.close()
        self._land()

    # -- one ranged part of a large object
    def _ranged(self, index: int) -> None:
        start, end = self.ranges[index]
        body = self._get(f"bytes={start}-{end - 1}")
        try:
            fd = self._open()
            offset = start
            while chunk := self._read(body):
                if offset + len(chunk) > end:
                    break
                os.pwrite(fd, chunk, offset)
                offset += len(chunk)
                self.progress.add(len(chunk))
        finally:
            body.close()
        if offset != end:
            raise _changed_mid_copy(self.url, self.remote.name,
                                    f"bytes {start}-{end - 1} came back as a different length")
        with self._lock:
            self._done[index] = True
            if self._hashing:
                return  # the thread that is hashing will take this part too
            self._hashing = True
        self._extend_digest()

    def _open(self) -> int:
        with self._lock:
            if self._fd is None:
                self._fd = os.open(self.part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                                   0o644)
                os.ftruncate(self._fd, self.remote.size)
            return self._fd

    def _extend_digest(self) -> None:
        """Hash every finished part that follows the digest so far; land the file once whole."""
        while True:
            with self._lock:
                if self._hashed == len(self.ranges) or not self._done[self._hashed]:
                    self._hashing = False
                    complete = self._hashed == len(self.ranges)
                    break
                start, end = self.ranges[self._hashed]
            with open(self.part, "rb", buffering=0) as reader:  # from the page cache
                reader.seek(start)
                remaining = end - start
                while remaining:
                    if self.stop.is_set():
                        raise _Cancelled
                    chunk = reader.read(min(_CHUNK * 4, remaining))
                    if not chunk:
                        raise _changed_mid_copy(self.url, self.remote.name, "short file")
                    self._sha.update(chunk)
                    remaining -= len(chunk)
            with self._lock:
                self._hashed += 1
        if complete:
            self.close()
            self._land()

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _land(self) -> None:
        _land(self.part, self.final, self.remote, self.url)
        self.digests[self.remote.name] = self._sha.hexdigest()
        self.progress.add(files=1)


def _fetch_s3(fs: Any, files: list[RemoteFile], folder: Path, url: str, progress: Progress,
              concurrency: int, digests: dict[str, str]) -> None:
    """Concurrent GETs from a thread pool, large objects split into ranged parts."""
    client = object_store.transfer_client(url, max(1, concurrency))
    stop = threading.Event()
    transfers = []
    for remote in files:
        bucket, key, _ = fs.split_path(remote.path)
        transfers.append(_Transfer(client, bucket, key, remote, folder, url, PART_SIZE, progress,
                                   stop, digests))
    jobs = [job for transfer in transfers for job in transfer.jobs()]
    pool = ThreadPoolExecutor(max_workers=max(1, min(concurrency, len(jobs))),
                              thread_name_prefix="stage-data")
    try:
        futures = [pool.submit(job) for job in jobs]
        wait(futures, return_when=FIRST_EXCEPTION)
        failed = [f for f in futures if f.done() and not f.cancelled() and f.exception()
                  and not isinstance(f.exception(), _Cancelled)]
        if failed:
            stop.set()
            raise failed[0].exception()  # type: ignore[misc]
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)
        for transfer in transfers:
            transfer.close()


def _fetch_generic(fs: AbstractFileSystem, files: list[RemoteFile], folder: Path, url: str,
                   progress: Progress, concurrency: int) -> None:
    """Any other fsspec filesystem: a thread pool of get_file, then a re-check of each token."""

    def fetch(remote: RemoteFile) -> None:
        part = folder / f".{remote.name}.part"
        fs.get_file(remote.path, str(part))
        if content_token(fs.info(remote.path)) != remote.token:
            raise _changed_mid_copy(url, remote.name, "its checksum/mtime no longer matches")
        _land(part, folder / remote.name, remote, url)
        progress.add(remote.size, files=1)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for future in [pool.submit(fetch, remote) for remote in files]:
            future.result()


def _land(part: Path, final: Path, remote: RemoteFile, url: str) -> None:
    size = part.stat().st_size
    if size != remote.size:
        raise _changed_mid_copy(url, remote.name, f"{size} bytes arrived, the listing said "
                                f"{remote.size}")
    os.rename(part, final)


def fetch(fs: AbstractFileSystem, files: list[RemoteFile], folder: Path, url: str,
           concurrency: int, digests: dict[str, str] | None = None) -> None:
    """Fetch ``files`` into ``folder``; the SHA-256 of what arrived goes into ``digests`` where
    the transfer computed it (S3), so verification need not read those files again."""
    if not files:
        return
    with Progress(len(files), sum(f.size for f in files)) as progress:
        if object_store.is_s3(url):
            _fetch_s3(fs, files, folder, url, progress, concurrency,
                      {} if digests is None else digests)
        else:
            _fetch_generic(fs, files, folder, url, progress, concurrency)


def read_metadata_from(fs: AbstractFileSystem, remote: RemoteFile, folder: Path, url: str,
                        concurrency: int) -> dict[str, Any]:
    fetch(fs, [remote], folder, url, concurrency)
    try:
        return json.loads((folder / METADATA_FILE).read_text())
    except json.JSONDecodeError as error:
        raise DatasetError(f"dataset '{object_store.public_url(url)}': {METADATA_FILE} is not "
                           f"valid JSON: {error}") from error


def reusable(name: str, remote: RemoteFile, sha256: str, previous: Path,
              manifest: dict[str, Any] | None, digests: dict[str, str]) -> bool:
    """Whether the earlier copy's file can stand in for ``remote`` without a transfer."""
    local = previous / name
    if not local.is_file() or local.stat().st_size != remote.size:
        return False
    entry = (manifest or {}).get("files", {}).get(name)
    if entry and entry["token"] == remote.token and entry["sha256"] == sha256:
        return True
    # No manifest (an older copy) or a new ETag: reuse only what hashes the same.
    digests[name] = sha256_of(local)
    return digests[name] == sha256


def sha256_of_or_none(path: Path) -> str | None:
    return sha256_of(path) if path.is_file() else None


def link_or_copy(source: Path, target: Path) -> None:
    # A hard link shares the bytes; files are never modified in place, so the old copy and a job
    # still reading it are unaffected.
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
