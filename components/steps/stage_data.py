"""The ``stage-data`` step: materialise a dataset on the shared volume.

``--dataset`` is a built-in name (``digits``, ``mnist1d``), a Python entry point
``py:module:function`` that returns the splits, or a path / fsspec URL (``s3://bucket/prefix``,
``file://``, ``gs://`` ...) of a folder in the layout described in
:mod:`sublimate.components.data.datasets`.

A URL is copied into ``<data-root>/<dataset-id>``:

- one listing of the source (sizes and ETags) decides what to fetch: files whose size and ETag
  match the previous copy's manifest are hard-linked from it, so a re-run over an unchanged source
  transfers nothing, and a changed source is still noticed;
- the rest is fetched concurrently, each file under a temporary name renamed into place; on S3 a
  pool of threads issues the GETs, an object above :data:`PART_SIZE` is split into ranged GETs
  written with ``os.pwrite`` into one file, and every GET (each part too) carries
  ``If-Match: <listed ETag>``, so an object replaced mid-copy is an error, not a mix;
- the new copy is built in a hidden folder, verified against the SHA-256 digests in
  ``metadata.json`` (computed as the bytes arrive, so no file is read back twice), given its
  manifest (:data:`MANIFEST_FILE`) last, and only then swapped with the earlier copy, which a
  failure (missing bucket, refused credentials, disk full ...) leaves intact.

Publishing, for every kind of dataset (a built-in or ``py:`` one is built the same way):

- the copy is built in ``<data-root>/.<dataset-id>~<host>~<pid>~<start>~<random>/dataset``, a
  staging folder whose name says who owns it (the process's start time, in clock ticks since
  boot, tells a live owner from a later process given the same pid). Each staging first removes
  the staging folders of the same dataset whose owner is gone: on this host, a process that no
  longer runs (a staging killed by SIGKILL or the OOM killer leaves its folder behind, possibly
  with most of a dataset in it); from another host (another pod, whose pids mean nothing here),
  one in which nothing changed for :data:`FOREIGN_STALE_S`;
- before it is published, every file and folder of the copy is fsynced, and the data root after
  the rename that publishes it: a crash never leaves a published copy with empty or missing files;
- a reader of ``<data-root>/<dataset-id>`` always finds a complete copy, the earlier one or the
  new one, never none and never a mix. Where the filesystem has RENAME_EXCHANGE (Linux on local
  filesystems), ``<dataset-id>`` is a folder, swapped with the new copy in one ``renameat2``.
  Where it has not (NFS, CephFS; tried on two empty folders before the first copy is published),
  a folder cannot be replaced in one step, so ``<dataset-id>`` is a relative link into the staging
  folder that built the current copy (``<dataset-id> -> .<dataset-id>~.../dataset``); a new copy
  is published by renaming a new link over it, which POSIX makes atomic on every filesystem, and
  the earlier copy's folder is removed only after that rename. A folder left at ``<dataset-id>``
  on such a filesystem by an older sublimate is the one exception: it is moved aside and replaced
  by a link in two renames, once.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import hashlib
import importlib
import json
import os
import posixpath
import re
import shutil
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sublimate.components.base.contract import import_user_code, user_path
from sublimate.components.base.disk_full import describe, disk_full_cause, writing
from sublimate.components.base.durable_files import fsync_file, fsync_folder
from sublimate.components.base.process_identity import start_ticks
from sublimate.components.base.runtime import shown_path
from sublimate.components.base.termination import disk_full_in_one_line
from sublimate.components.data import object_store
from sublimate.components.data.datasets import (
    BUILTIN_DATASETS,
    FORMAT_VERSION,
    METADATA_FILE,
    DatasetError,
    Split,
    build_builtin,
    sha256_of,
    verify_dataset,
    write_dataset,
)
from sublimate.components.data.transfer import (
    DEFAULT_CONCURRENCY,
    RemoteFile,
    content_token,
    fetch,
    link_or_copy,
    read_metadata_from,
    reusable,
    say,
    sha256_of_or_none,
)

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem
    from hera.workflows.models import Memoize

MANIFEST_FILE = ".sublimate-stage.json"
ENTRY_POINT_PREFIX = "py:"


def dataset_id(dataset: str) -> str:
    """A stable folder name for ``dataset``: readable, and unique per source URL."""
    if dataset in BUILTIN_DATASETS:
        return dataset
    dataset = dataset.rstrip("/")
    readable = dataset.rsplit(":", 1)[-1] if dataset.startswith(ENTRY_POINT_PREFIX) else \
        dataset.rsplit("/", 1)[-1]
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", readable) or "dataset"
    return f"{stem}-{hashlib.sha256(dataset.encode()).hexdigest()[:10]}"


@dataclass
class StageReport:
    """What a staging did; ``files_fetched == 0`` means no byte crossed the network."""

    folder: Path
    files_fetched: int = 0
    bytes_fetched: int = 0
    files_reused: int = 0
    files_built: int = 0  # written here from a built-in or py:module:function dataset
    seconds: float = 0.0
    fetched: list[str] = field(default_factory=list)

    @property
    def rate_mb_s(self) -> float:
        return self.bytes_fetched / 1e6 / max(self.seconds, 1e-9)


# --------------------------------------------------------------------------- listing and manifest

def _list_source(fs: AbstractFileSystem, root: str, url: str) -> dict[str, RemoteFile]:
    """One flat listing of the dataset folder (the layout has no subfolders)."""
    try:
        entries = fs.ls(root, detail=True)
    except FileNotFoundError as error:
        if object_store.missing_bucket(error):
            raise object_store.explain(url, error) from error
        entries = []
    except Exception as error:  # every store error becomes one clear message
        raise object_store.explain(url, error) from error
    files = {}
    for info in entries:
        if info.get("type") != "file":
            continue
        name = posixpath.basename(info["name"].rstrip("/"))
        files[name] = RemoteFile(name, info["name"], int(info["size"]), content_token(info))
    if not files and not entries:
        where = f" (no objects under this prefix at {object_store.endpoint()})" \
            if object_store.is_s3(url) else ""
        raise DatasetError(f"dataset '{object_store.public_url(url)}': no such directory{where}")
    if METADATA_FILE not in files:
        raise DatasetError(f"dataset '{object_store.public_url(url)}': not a sublimate dataset "
                           f"({METADATA_FILE} is missing; publish it with the documented layout, "
                           "e.g. `sublimate data push`)")
    return files


def _read_manifest(folder: Path, url: str) -> dict[str, Any] | None:
    """The manifest of a complete earlier copy of ``url`` at ``folder``, if there is one."""
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if manifest.get("source") != object_store.public_url(url) or \
            not (folder / METADATA_FILE).is_file():
        return None
    return manifest


def _unchanged(manifest: dict[str, Any] | None, listing: dict[str, RemoteFile],
               folder: Path) -> bool:
    if not manifest:
        return False
    for name, entry in manifest["files"].items():
        remote = listing.get(name)
        if remote is None or (remote.size, remote.token) != (entry["bytes"], entry["token"]):
            return False
        local = folder / name
        if not local.is_file() or local.stat().st_size != entry["bytes"]:
            return False
    return True


def _wanted(metadata: dict[str, Any], listing: dict[str, RemoteFile],
            url: str) -> list[tuple[RemoteFile, str]]:
    """The shards named by ``metadata`` with their expected SHA-256, checked against the listing."""
    if metadata.get("format_version") != FORMAT_VERSION:
        raise DatasetError(f"dataset '{object_store.public_url(url)}': unsupported format_version "
                           f"{metadata.get('format_version')!r} (expected {FORMAT_VERSION})")
    wanted = []
    for split in metadata["splits"].values():
        for shard in split["shards"]:
            remote = listing.get(shard["file"])
            if remote is None:
                raise DatasetError(f"dataset '{object_store.public_url(url)}': {METADATA_FILE} "
                                   f"names {shard['file']}, which is not there")
            if remote.size != shard["bytes"]:
                raise DatasetError(f"dataset '{object_store.public_url(url)}': {shard['file']} "
                                   f"is {remote.size} bytes, {METADATA_FILE} says "
                                   f"{shard['bytes']} (changed while it was being published?)")
            wanted.append((remote, shard["sha256"]))
    return wanted


# ------------------------------------------------------------------------ staging and publishing

STAGING_MARK = "~"  # never in a dataset id: `.<id>~...` names only this module's folders
# A staging folder of another host (another pod) cannot be judged by its pid: it is removed
# once nothing in it has changed for this long.
FOREIGN_STALE_S = 24 * 3600
_RENAME_EXCHANGE = 2
_NO_EXCHANGE = (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP)


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", os.uname().nodename) or "host"


def _new_staging(target: Path) -> Path:
    """A hidden folder beside ``target`` that names its owner: ``.<id>~<host>~<pid>~<start>~<n>``.
    The dataset is built in its ``dataset`` subfolder; a later staging removes the folder if its
    owner no longer runs (:func:`_remove_stale_stagings`)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    owner = f"{_host()}{STAGING_MARK}{os.getpid()}{STAGING_MARK}{start_ticks(os.getpid()) or 0}"
    while True:
        folder = target.parent / f".{target.name}{STAGING_MARK}{owner}{STAGING_MARK}" \
                                 f"{os.urandom(4).hex()}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue


def _linked_staging(target: Path) -> Path | None:
    """The staging folder that ``target`` links into (the layout without RENAME_EXCHANGE), or
    None if ``target`` is not such a link."""
    try:
        text = os.readlink(target)
    except OSError:
        return None
    first = text.split("/", 1)[0]
    if "/" not in text or not first.startswith(f".{target.name}{STAGING_MARK}"):
        return None  # not a link this module made: never touch what it points to
    return target.parent / first


def _owner_gone(folder: Path, target: Path) -> bool:
    """Whether ``folder``'s staging was abandoned: its owner on this host no longer runs, or,
    from another host, nothing in it changed for :data:`FOREIGN_STALE_S`."""
    fields = folder.name[len(target.name) + 2:].split(STAGING_MARK)
    if len(fields) != 4 or not fields[1].isdigit() or not fields[2].isdigit():
        return False  # not named by _new_staging
    host, pid, ticks = fields[0], int(fields[1]), int(fields[2])
    if host == _host():
        if ticks:
            return start_ticks(pid) != ticks
        try:  # no /proc when it was named: the pid alone must do
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    try:
        changed = max(path.stat().st_mtime for path in (folder, *folder.iterdir()))
    except OSError:
        return False
    return time.time() - changed > FOREIGN_STALE_S


def _remove_stale_stagings(target: Path) -> list[Path]:
    """Remove the staging folders of ``target`` whose owner is gone (a staging killed by SIGKILL
    or the OOM killer leaves one, possibly with most of a dataset in it), except the one that
    ``target`` links to. Returns what was removed."""
    removed: list[Path] = []
    try:
        entries = list(target.parent.iterdir())
    except OSError:
        return removed
    for folder in entries:
        if not folder.name.startswith(f".{target.name}{STAGING_MARK}") or \
                not _owner_gone(folder, target):
            continue
        if folder == _linked_staging(target):  # read again now: a stager may just have linked
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _sync_tree(folder: Path) -> None:
    """fsync every file in ``folder``, then the folder: before a rename publishes it, all of it
    is on disk, so a crash never leaves a published dataset with empty or missing files."""
    for entry in os.scandir(folder):
        if entry.is_dir(follow_symlinks=False):
            _sync_tree(Path(entry.path))
        elif entry.is_file(follow_symlinks=False):
            fsync_file(Path(entry.path))
    fsync_folder(folder)


def _publish(staging: Path, target: Path, replace: bool) -> bool:
    """Make ``staging/dataset`` the dataset at ``target``; False if ``replace`` is off and a
    complete copy was there first (theirs stays: a job may be reading it).

    With RENAME_EXCHANGE (Linux, local filesystems) ``target`` is a folder, swapped with the new
    copy in one step. Without it (NFS, CephFS), a folder cannot be replaced in one step, so the
    first copy is published as a relative link ``target -> .<id>~<owner>/dataset`` and each new
    copy by renaming a new link over it (atomic on every POSIX filesystem); the old copy is
    removed only once no name leads to it. Either way a reader always finds a complete copy.
    """
    data = staging / "dataset"
    _sync_tree(data)
    parent = target.parent
    if not target.exists() and not target.is_symlink():
        try:
            if _can_exchange(staging):
                os.rename(data, target)
                shutil.rmtree(staging, ignore_errors=True)
            else:
                os.symlink(_link_text(staging), target)
            fsync_folder(parent)
            return True
        except OSError:
            if not target.exists():
                raise
            # Another stager published first: fall through, as if it had been there before.
    if not replace and (target / METADATA_FILE).is_file():
        shutil.rmtree(staging, ignore_errors=True)
        return False
    if target.is_symlink():
        _relink(staging, target)
        return True
    if _exchange(data, target):
        fsync_folder(parent)
        shutil.rmtree(staging, ignore_errors=True)  # "dataset" in it is now the earlier copy
        return True
    # A folder on a filesystem without RENAME_EXCHANGE (staged there by an older sublimate): the
    # one replacement that cannot be atomic. It moves into our staging folder and a link takes
    # its place at once; from now on every replacement is a link's rename.
    os.rename(target, staging / "earlier")
    _relink(staging, target)
    shutil.rmtree(staging / "earlier", ignore_errors=True)
    return True


def _link_text(staging: Path) -> str:
    return f"{staging.name}/dataset"  # relative: the volume may be mounted anywhere


def _relink(staging: Path, target: Path) -> None:
    """Point the link ``target`` at ``staging/dataset`` by renaming a new link over it, then
    remove the staging folder it pointed to before."""
    earlier = _linked_staging(target)
    link = staging / "link"
    link.unlink(missing_ok=True)
    os.symlink(_link_text(staging), link)
    os.rename(link, target)
    fsync_folder(target.parent)
    if earlier is not None and earlier != staging:
        shutil.rmtree(earlier, ignore_errors=True)


def _renameat2(a: Path, b: Path, flags: int) -> None:
    """Linux's renameat2(2); ``OSError`` (``ENOSYS`` where libc has no such call)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError) as error:
        raise OSError(errno.ENOSYS, "renameat2 is not available", str(b)) from error
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(b))


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` in one step; False where the filesystem (or libc) cannot."""
    try:
        _renameat2(a, b, _RENAME_EXCHANGE)
    except OSError as error:
        if error.errno in _NO_EXCHANGE:
            return False
        raise
    return True


def _can_exchange(staging: Path) -> bool:
    """Whether the filesystem of ``staging`` supports RENAME_EXCHANGE, tried on two empty
    folders inside it (a killed probe leaves nothing outside the staging folder)."""
    first, second = staging / "probe-a", staging / "probe-b"
    first.mkdir()
    second.mkdir()
    try:
        return _exchange(first, second)
    finally:
        first.rmdir()
        second.rmdir()


# --------------------------------------------------------------------------------------- staging

def stage_url(url: str, target: Path, *, concurrency: int = DEFAULT_CONCURRENCY) -> StageReport:
    """Copy the dataset at ``url`` to ``target`` incrementally and atomically (see module doc)."""
    started = time.perf_counter()
    fs, root = object_store.open_url(url)
    listing = _list_source(fs, root, url)
    manifest = _read_manifest(target, url)
    if _unchanged(manifest, listing, target):
        try:
            verify_dataset(target)
            say(f"stage-data: {shown_path(target)} is already complete; nothing to transfer "
                 f"({len(listing)} objects listed, source unchanged)")
            return StageReport(target, files_reused=len(manifest["files"]),  # type: ignore[index]
                               seconds=time.perf_counter() - started)
        except DatasetError as error:
            say(f"stage-data: the earlier copy is damaged ({error}); staging again")
            manifest = None
    staging = _new_staging(target)
    try:
        data = staging / "dataset"
        data.mkdir()
        report, digests = _stage_into(fs, url, listing, data, target, manifest, concurrency)
        # hashed on the way in: no file is read twice; errors name the source, not this copy
        verify_dataset(data, digests, shown_as=object_store.public_url(url))
        _write_manifest(data, url, listing)
        _publish(staging, target, replace=True)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if disk_full_cause(error) is not None or (isinstance(error, OSError)
                                                  and not isinstance(error, DatasetError)):
            raise _os_error(url, target, error) from error
        raise
    report.folder, report.seconds = target, time.perf_counter() - started
    return report


def _stage_into(fs: AbstractFileSystem, url: str, listing: dict[str, RemoteFile], staging: Path,
                previous: Path, manifest: dict[str, Any] | None,
                concurrency: int) -> tuple[StageReport, dict[str, str]]:
    report = StageReport(staging)
    digests: dict[str, str] = {}  # SHA-256 of files already read once (while fetched or reused)
    meta_remote = listing[METADATA_FILE]
    entry = (manifest or {}).get("files", {}).get(METADATA_FILE)
    if entry and entry["token"] == meta_remote.token and entry["sha256"] == sha256_of_or_none(
            previous / METADATA_FILE):
        link_or_copy(previous / METADATA_FILE, staging / METADATA_FILE)
        metadata = json.loads((staging / METADATA_FILE).read_text())
        report.files_reused += 1
    else:
        metadata = read_metadata_from(fs, meta_remote, staging, url, concurrency)
        report.fetched.append(METADATA_FILE)
    to_fetch = []
    for remote, sha256 in _wanted(metadata, listing, url):
        if reusable(remote.name, remote, sha256, previous, manifest, digests):
            link_or_copy(previous / remote.name, staging / remote.name)
            report.files_reused += 1
        else:
            to_fetch.append(remote)
    fetch(fs, to_fetch, staging, url, concurrency, digests)
    report.fetched += [remote.name for remote in to_fetch]
    report.files_fetched = len(report.fetched)
    report.bytes_fetched = sum(listing[name].size for name in report.fetched)
    return report, digests


def _write_manifest(folder: Path, url: str, listing: dict[str, RemoteFile]) -> None:
    """The completion marker, written last: source, and per file its size, ETag and SHA-256."""
    metadata = json.loads((folder / METADATA_FILE).read_text())
    digests = {shard["file"]: shard["sha256"] for split in metadata["splits"].values()
               for shard in split["shards"]}
    digests[METADATA_FILE] = sha256_of(folder / METADATA_FILE)
    manifest = {
        "source": object_store.public_url(url),
        "completed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": {name: {"bytes": listing[name].size, "token": listing[name].token,
                         "sha256": digest} for name, digest in sorted(digests.items())},
    }
    part = folder / f".{MANIFEST_FILE}.part"
    part.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.rename(part, folder / MANIFEST_FILE)


def _os_error(url: str, target: Path, error: BaseException) -> DatasetError:
    cause = disk_full_cause(error)
    if cause is not None:  # which disk, in one line; whatever wrapped it (a transfer's pool)
        line = describe(cause, target, f"staging it into {shown_path(target)}")
        return DatasetError(f"dataset '{object_store.public_url(url)}': {line}; the earlier "
                            "copy, if any, is untouched")
    return object_store.explain(url, error)


def stage_entry_point(dataset: str, target: Path) -> Path:
    """Build a dataset from ``py:module:function`` (the function returns ``{split: Split}``)."""
    spec = dataset[len(ENTRY_POINT_PREFIX):]
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise DatasetError(f"dataset '{dataset}': expected py:module:function")
    import_user_code()  # a local run imports as its user would, from where it started
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise DatasetError(f"dataset '{dataset}': cannot load {spec}: {error}") from error
    if (target / METADATA_FILE).is_file():
        return target
    splits = function()
    if not isinstance(splits, dict) or not all(isinstance(s, Split) for s in splits.values()):
        raise DatasetError(f"dataset '{dataset}': {spec}() must return a dict of "
                           "split name -> datasets.Split")
    num_classes = int(max(int(s.y.max()) for s in splits.values() if len(s.y))) + 1
    return write_dataset(target, splits, name=function_name, num_classes=num_classes,
                         extra={"source": dataset})


def stage_dataset(dataset: str, data_root: Path, *,
                  concurrency: int = DEFAULT_CONCURRENCY) -> StageReport:
    """Make ``dataset`` available under ``data_root``; report what was transferred."""
    started = time.perf_counter()
    dataset = _local_source(dataset)
    target = data_root / dataset_id(dataset)
    for folder in _remove_stale_stagings(target):
        say(f"stage-data: removed {folder.name}, left by a staging that was killed")
    if dataset in BUILTIN_DATASETS or dataset.startswith(ENTRY_POINT_PREFIX):
        complete = (target / METADATA_FILE).is_file()
        if complete:
            say(f"stage-data: {shown_path(target)} is already complete; nothing to transfer")
        else:
            _build_into_place(dataset, target)
        verify_dataset(target)
        files = sum(1 for path in target.iterdir() if path.is_file())
        return StageReport(target, files_reused=files if complete else 0,
                           files_built=0 if complete else files,
                           seconds=time.perf_counter() - started)
    return stage_url(dataset, target, concurrency=concurrency)


def _local_source(dataset: str) -> str:
    """``dataset`` with a local path made absolute, as the user meant it (a relative path is
    from where they ran ``sublimate run``); built-ins, ``py:`` and URLs as they are."""
    if "://" in dataset or dataset in BUILTIN_DATASETS or dataset.startswith(ENTRY_POINT_PREFIX):
        return dataset
    path = user_path(dataset)
    if path.exists():
        return str(path.resolve())
    if "/" in dataset or dataset.startswith("."):
        shown = "" if str(path) == dataset else f" ({path})"
        raise DatasetError(f"dataset '{dataset}': no such directory{shown}")
    raise DatasetError(f"dataset '{dataset}' is neither a built-in dataset "
                       f"({', '.join(BUILTIN_DATASETS)}) nor an existing path or URL")


def _build_into_place(dataset: str, target: Path) -> None:
    """Build a built-in or ``py:`` dataset in a staging folder and publish it, unless another
    stager published one first (a built dataset never changes: theirs is as good)."""
    staging = _new_staging(target)
    try:
        if dataset in BUILTIN_DATASETS:
            build_builtin(dataset, staging / "dataset")
        else:
            stage_entry_point(dataset, staging / "dataset")
        _publish(staging, target, replace=False)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)  # which also frees what the build took
        cause = disk_full_cause(error)
        if cause is not None:
            line = describe(cause, target, f"building it into {shown_path(target)}")
            raise DatasetError(f"dataset '{dataset}': {line}") from error
        raise


def stage(dataset: str, data_root: Path) -> Path:
    """Make ``dataset`` available under ``data_root`` and return its verified folder."""
    return stage_dataset(dataset, data_root).folder


def summary(report: StageReport) -> str:
    """The closing line: machine-greppable counts (tests and benchmarks read them)."""
    built = f"built {report.files_built} files; " if report.files_built else ""
    return (f"stage-data: {built}transferred {report.files_fetched} files, "
            f"{report.bytes_fetched} bytes in {report.seconds:.2f}s "
            f"({report.rate_mb_s:.1f} MB/s); reused {report.files_reused} files")


@disk_full_in_one_line("stage-data")
def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stage-data", description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True,
                        help="built-in name, py:module:function, path or fsspec URL")
    parser.add_argument("--data-root", required=True, type=Path,
                        help="folder on the shared volume that holds staged datasets")
    parser.add_argument("--output-path", type=Path,
                        help="file to write the staged folder's path to (an Argo output)")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY,
                        help="simultaneous transfers (default %(default)s)")
    args = parser.parse_args(None if argv is None else list(argv))
    try:
        report = stage_dataset(args.dataset, args.data_root, concurrency=args.concurrency)
    except DatasetError as error:
        from sublimate.components.base.termination import fail

        return fail("stage-data", object_store.redact(str(error)))
    folder = report.folder
    metadata = json.loads((folder / METADATA_FILE).read_text())
    counts = ", ".join(f"{name}={split['examples']}" for name, split in metadata["splits"].items())
    say(summary(report))
    say(f"stage-data: {metadata['name']} ready at {shown_path(folder)} ({counts}) "
         f"in {report.seconds:.2f}s")
    if args.output_path:
        args.output_path.parent.mkdir(parents=True, exist_ok=True)
        with writing(args.output_path, f"writing the output {args.output_path}"):
            args.output_path.write_text(str(folder))
    return 0


DEFAULT_CREDENTIALS_SECRET = "sublimate-s3"


def template(name: str = "stage-data", credentials_secret: str = DEFAULT_CREDENTIALS_SECRET,
             **step_options: object):
    """The ``stage-data`` step: input ``dataset``; output ``dataset-dir`` (the staged folder).

    Object-store credentials and endpoint come from the Kubernetes Secret
    ``credentials_secret`` (every key optional); locally, from the usual AWS variables.
    """
    from sublimate.components.base.runtime import DATASETS_PATH, python_step
    from sublimate.components.data.object_store import credentials_env

    return python_step(
        name, "sublimate.components.steps.stage_data",
        inputs={"dataset": "--dataset"},
        outputs={"dataset-dir": "--output-path"},
        extra_args=["--data-root", DATASETS_PATH],
        env=credentials_env(credentials_secret),
        memoize=staging_memo(),
        **step_options,  # type: ignore[arg-type]
    )


# The ConfigMap (locally, $SUBLIMATE_HOME/memo/<name>/) holding the staged datasets' entries.
MEMO_CACHE = "sublimate-stage-data"
UNMEMOIZED_KEY = "stage-data-unmemoized"


def content_key(name: str) -> str:
    """A built-in dataset's content, as a memoization key: its bytes are fixed by this code
    (digits: the bundled file; mnist1d: the generator's size and seed), and by the layout's
    version, so a sublimate that changes them renders a new key (``sublimate render``)."""
    from sublimate.components.data import datasets

    digest = hashlib.sha256(f"{name}:{FORMAT_VERSION}:".encode())
    if name == "digits":
        digest.update((Path(datasets.__file__).parent / "builtin" / "digits.csv.gz")
                      .read_bytes())
    else:
        digest.update(f"{datasets.MNIST1D_EXAMPLES}:{datasets.MNIST1D_SEED}".encode())
    return f"stage-data-{name}-{digest.hexdigest()[:16]}"


def staging_memo() -> Memoize:  # hera is imported lazily: step code must not pay for it
    """Argo memoization of staging by the dataset's content, where a key for the content is
    known before staging: a built-in dataset's (:func:`content_key`). A URL, a folder or a
    ``py:`` dataset has none without reading the source (a listing, or running the function),
    so its entry is written under one shared key with ``maxAge`` 0: never a hit. Staging an
    unchanged URL again already fetches nothing (its manifest)."""
    from hera.workflows.models import Cache, LocalObjectReference, Memoize

    dataset = "inputs.parameters.dataset"
    choices = " : ".join(f"{dataset} == '{name}' ? '{content_key(name)}'"
                         for name in BUILTIN_DATASETS)
    builtins = ", ".join(f"'{name}'" for name in BUILTIN_DATASETS)
    return Memoize(
        key=f"{{{{={choices} : '{UNMEMOIZED_KEY}'}}}}",
        max_age=f"{{{{={dataset} in [{builtins}] ? '' : '0s'}}}}",
        cache=Cache(config_map=LocalObjectReference(name=MEMO_CACHE)))


if __name__ == "__main__":
    sys.exit(main())
