"""The model registry: immutable model versions and an append-only log of champion changes, on a
local folder (the shared volume's ``registry/``) or any fsspec URL (``s3://bucket/prefix``).

Layout (docs/registry.md says why each part is safe under concurrent writers)::

    versions/<id>/.claim.json     written first, create-exclusive: the id is this publisher's
    versions/<id>/<files...>      the model's files (model.pt, metrics.json, ...)
    versions/<id>/model.json      written LAST, create-exclusive: lineage, metrics, file sizes
                                  and SHA-256; a version without it is invisible
    champion/00000001.json ...    one immutable, create-exclusive entry per champion change;
                                  the current champion is the highest entry

Nothing is ever overwritten, and nothing relies on a rename (S3 has none): a version appears at the
single PUT of its ``model.json``, the champion changes at the single PUT of a new log entry, and two
writers racing for the same name are told apart by the store itself (``O_EXCL``-like hard links
locally, ``If-None-Match: *`` on S3; other stores, which cannot, are read but never written).
S3 credentials and endpoint come from the environment, as for
staging (:mod:`sublimate.components.data.object_store`). Import cost: no torch, no Hera.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import random
import re
import secrets
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sublimate.components.base.disk_full import describe, disk_full_cause
from sublimate.components.base.durable_files import fsync_file, fsync_folder
from sublimate.components.base.runtime import SHARED_VOLUME_PATH
from sublimate.components.data import object_store

FORMAT = 1  # model.json's and the champion entries' "format": bump on an incompatible change
DEFAULT_URL = f"{SHARED_VOLUME_PATH}/registry"  # where a pipeline step finds it
VERSIONS = "versions"
CHAMPION = "champion"
TMP = ".tmp"  # local staging of create-exclusive writes, and the S3 capability probe
MODEL_FILE = "model.json"
CLAIM_FILE = ".claim.json"
METRICS_FILE = "metrics.json"
RESERVED = frozenset({MODEL_FILE, CLAIM_FILE})
# A version folder without model.json whose id (its start time) is older than this is a killed
# publish's leftover, removed by the next publish. Generous, so that a slow upload of a large
# model is never mistaken for one; a publisher also checks its claim is still there before it
# writes model.json.
DEFAULT_STALE_AFTER = 24 * 3600.0
CHUNK = 8 * 2**20
# Sortable without coordination: UTC start time to the second, then 32 random bits.
_ID = re.compile(r"^(\d{8}T\d{6})Z-[0-9a-f]{8}$")
_ENTRY = re.compile(r"^(\d{8})\.json$")
# Attempts at appending a champion entry while others win the race for each number; every loss
# means another writer made progress, so this bounds only pathological contention.
_APPEND_ATTEMPTS = 200
# S3 stores where conditional writes were checked to work, per endpoint and bucket (a probe
# costs three requests; once per process is enough).
_EXCLUSIVE_CHECKED: set[tuple[str, str]] = set()

# Why a rollback cannot be done, as every registry says it (this one, MLflow's).
NOTHING_TO_ROLL_BACK = ("there is no champion to roll back from; promote a version first "
                        "(sublimate models promote VERSION)")


def nothing_before(champion: str) -> str:
    return (f"the champion {champion} has no earlier champion to roll back to; promote a "
            "version instead (sublimate models promote VERSION)")


class RegistryError(Exception):
    """A registry operation was refused or failed; the message names the registry and the fix."""


class ChampionMoved(RegistryError):
    """``promote(expect=...)`` found another champion than expected: someone promoted since."""


# ``promote``'s default: promote whatever the champion is now.
_ANY_CHAMPION = object()


@dataclass(frozen=True)
class ModelVersion:
    id: str
    created: str  # ISO 8601, UTC
    lineage: dict = field(hash=False)
    metrics: dict = field(hash=False)
    files: dict = field(hash=False)  # relative name -> {"size": bytes, "sha256": hex}
    url: str = ""  # the version's folder

    @property
    def size(self) -> int:
        return sum(int(info["size"]) for info in self.files.values())


def new_version_id(now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    return f"{now:%Y%m%dT%H%M%S}Z-{secrets.token_hex(4)}"


def version_started(version_id: str) -> float | None:
    """The Unix time a version id was created at (its publish started), None if not an id."""
    match = _ID.match(version_id)
    if match is None:
        return None
    return datetime.strptime(match[1], "%Y%m%dT%H%M%S").replace(tzinfo=UTC).timestamp()


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_actor() -> str:
    """Who changes the champion, for the history, when the caller does not say (a pipeline
    step passes ``by="workflow/<name>"``): the user and host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container's uid without a passwd entry
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def _json_bytes(record: dict[str, Any]) -> bytes:
    def path_like(value: Any) -> str:
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        raise TypeError(f"{type(value).__name__} {value!r} is not JSON")

    return (json.dumps(record, indent=2, sort_keys=True, default=path_like) + "\n").encode()


class Registry:
    """A model registry at ``url`` (a local path, ``file://...``, ``s3://bucket/prefix``)."""

    def __init__(self, url: str | os.PathLike[str], *,
                 stale_after: float = DEFAULT_STALE_AFTER) -> None:
        self.url = os.fspath(url).rstrip("/") or "/"
        self.stale_after = stale_after
        self._public = object_store.public_url(self.url)
        try:
            self._fs, self._root = object_store.open_url(self.url)
        except object_store.StoreError as error:
            raise self._error(f"cannot open it ({self._cause(error)}); give a local folder or "
                              "an fsspec URL such as s3://bucket/prefix") from error
        protocols = self._fs.protocol if isinstance(self._fs.protocol, tuple) \
            else (self._fs.protocol,)
        self._local = "file" in protocols or "local" in protocols
        self._s3 = object_store.is_s3(self.url)

    def __repr__(self) -> str:
        return f"Registry({self._public!r})"

    # ---- reading -----------------------------------------------------------------------------

    def versions(self) -> list[ModelVersion]:
        """Every complete version (one with its model.json), oldest first."""
        with self._storage("listing the versions"):
            folders = self._version_folders()
            paths = [self._path(VERSIONS, vid, MODEL_FILE)
                     for vid, names in folders.items() if MODEL_FILE in names]
            raw = self._fs.cat(paths) if paths else {}
        found = [self._parse_version(path, data) for path, data in raw.items()]
        return sorted(found, key=lambda v: (v.created, v.id))

    def get(self, version_id: str) -> ModelVersion:
        """The complete version ``version_id``; RegistryError naming it if there is none."""
        if not isinstance(version_id, str) or _ID.match(version_id) is None:
            raise self._error(f"'{version_id}' is not a version id (ids look like "
                              f"{new_version_id()}; `sublimate models ls` lists them)")
        path = self._path(VERSIONS, version_id, MODEL_FILE)
        try:
            with self._storage(f"reading version {version_id}"):
                data = self._fs.cat_file(path)
        except RegistryError as error:
            if isinstance(error.__cause__, FileNotFoundError) \
                    and not object_store.missing_bucket(error.__cause__):
                raise self._error(f"no version '{version_id}' (`sublimate models ls --registry "
                                  f"{self._public}` lists the versions)") from None
            raise
        return self._parse_version(path, data)

    def champion(self) -> ModelVersion | None:
        """The current champion, None before the first promotion."""
        _, head = self._head()
        return None if head is None else self._entry_version(head)

    def history(self) -> list[dict[str, Any]]:
        """Every champion change, oldest first: version, previous, reason, time, by (and seq,
        action)."""
        with self._storage("reading the champion log"):
            numbers = self._entry_numbers()
            raw = self._fs.cat([self._entry_path(n) for n in numbers]) if numbers else {}
        entries = [self._parse_entry(path, data) for path, data in raw.items()]
        return sorted(entries, key=lambda e: e["seq"])

    def download(self, version_id: str, dest: Path) -> Path:
        """The version's files (and its model.json) into ``dest``, each checked against the
        size and SHA-256 recorded at publish; returns ``dest``."""
        version = self.get(version_id)
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        for name, info in sorted(version.files.items()):
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".partial")
            digest = hashlib.sha256()
            size = 0
            try:
                # (a full disk here is the destination's, not the registry's)
                with self._storage(f"downloading {name} of version {version_id} to {dest}",
                                   disk=dest), \
                        self._fs.open(self._path(VERSIONS, version_id, name), "rb") as source, \
                        open(partial, "wb") as out:
                    while chunk := source.read(CHUNK):
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
            except BaseException:
                partial.unlink(missing_ok=True)  # no part of a file left behind
                raise
            if size != info["size"] or digest.hexdigest() != info["sha256"]:
                partial.unlink(missing_ok=True)
                raise self._error(f"{name} of version {version_id} does not match its model.json"
                                  f" ({size} bytes, sha256 {digest.hexdigest()[:12]}... instead "
                                  f"of {info['size']} bytes, {info['sha256'][:12]}...): the "
                                  "stored copy is damaged; publish the model again")
            os.replace(partial, target)
        (dest / MODEL_FILE).write_bytes(_json_bytes(self._record(version)))
        return dest

    # ---- publishing --------------------------------------------------------------------------

    def publish(self, files_dir: Path, lineage: dict[str, Any]) -> ModelVersion:
        """Copy every file under ``files_dir`` into a new, immutable version with ``lineage``.

        The version becomes visible only when its model.json is written, last; a publish that
        fails removes what it wrote, and one that is killed leaves a folder that no reader
        sees and a later publish removes once it is older than ``stale_after``.
        """
        sources = self._sources(Path(files_dir))
        if not isinstance(lineage, dict):
            raise self._error(f"lineage must be a dict, not {type(lineage).__name__}")
        try:
            _json_bytes(lineage)
        except (TypeError, ValueError) as error:
            raise self._error(f"the lineage cannot be stored as JSON ({error}); pass strings, "
                              "numbers, lists and dicts") from error
        self._check_exclusive_create()
        self.clean_leftovers()
        version_id = self._claim()
        folder = self._path(VERSIONS, version_id)
        model_path = self._path(VERSIONS, version_id, MODEL_FILE)
        record: dict[str, Any] = {}
        try:
            files = {name: self._upload(source, self._path(VERSIONS, version_id, name))
                     for name, source in sources}
            record = {"format": FORMAT, "id": version_id, "created": _now_iso(),
                      "lineage": lineage, "metrics": self._metrics(lineage, dict(sources)),
                      "files": files}
            with self._storage(f"checking the claim of version {version_id}"):
                claimed = self._fs.exists(self._path(VERSIONS, version_id, CLAIM_FILE))
            if not claimed:
                raise self._error(f"version {version_id} was removed as a stale leftover while "
                                  f"it was being published (it took over {self.stale_after:.0f}"
                                  " s); publish again, or give the registry a larger "
                                  "stale_after")
            if not self._create_exclusive(model_path, _json_bytes(record)):
                raise self._error(f"version {version_id} already has a {MODEL_FILE}: another "
                                  "writer used its id; publish again")
        except BaseException as error:
            # An error while writing model.json may hide a PUT that did succeed (a timeout on
            # the response): the version is then complete and is ours, since the id is.
            if record and self._exists_quietly(model_path):
                return self._version(record)
            self._remove_quietly(folder)  # which frees what a full disk took, too
            if isinstance(error, Exception) and not isinstance(error, RegistryError):
                raise self._error(f"publishing {files_dir} failed, nothing was published "
                                  f"({self._cause(error)})") from error
            if isinstance(error, RegistryError) and disk_full_cause(error) is not None:
                raise RegistryError(f"{error}; nothing was published") from error
            raise
        return self._version(record)

    def clean_leftovers(self) -> list[str]:
        """Remove the folders of publishes that never completed and started more than
        ``stale_after`` seconds ago; returns their ids."""
        removed = []
        now = time.time()
        with self._storage("listing the versions"):
            folders = self._version_folders()
        for vid, names in sorted(folders.items()):
            started = version_started(vid)
            # Folders that are not ids are someone else's: never removed.
            if MODEL_FILE in names or started is None or now - started < self.stale_after:
                continue
            self._remove_quietly(self._path(VERSIONS, vid))
            removed.append(vid)
        if self._local:
            staging = Path(self._path(TMP))
            for leftover in staging.glob("*") if staging.is_dir() else []:
                with suppress(OSError):
                    if now - leftover.stat().st_mtime >= self.stale_after:
                        leftover.unlink()
        return removed

    # ---- the champion ------------------------------------------------------------------------

    def promote(self, version_id: str, reason: str, *, by: str | None = None,
                expect: str | object | None = _ANY_CHAMPION) -> ModelVersion:
        """Make ``version_id`` the champion (a no-op if it already is: a retried step does not
        add a second entry).

        ``expect``: the champion's id the decision was made against (None: no champion). If
        another champion is there when the entry is written, :class:`ChampionMoved` is raised
        and nothing changes: a gate that compared against yesterday's champion never replaces
        one promoted meanwhile by a concurrent pipeline (a compare-and-set on the log's head).
        """
        self._check_exclusive_create()  # a store that cannot take the entry is said first
        version = self.get(version_id)

        def entry(seq: int, head: dict[str, Any] | None) -> dict[str, Any] | None:
            if head is not None and head["version"] == version.id:
                return None
            current = None if head is None else head["version"]
            if expect is not _ANY_CHAMPION and current != expect:
                raise ChampionMoved(
                    f"model registry '{self._public}': the champion is {current or '(none)'}, not "
                    f"{expect or '(none)'} as when {version.id} was judged; not promoted")
            return {"action": "promote", "version": version.id,
                    "previous": None if head is None else head["version"],
                    "undo": seq, "reason": reason}

        self._append(entry, by)
        return version

    def rollback(self, reason: str, *, by: str | None = None) -> ModelVersion:
        """Make the champion before the current one the champion again (undoing the last
        promotion; a second rollback undoes the one before)."""

        def entry(seq: int, head: dict[str, Any] | None) -> dict[str, Any]:
            if head is None:
                raise self._error(NOTHING_TO_ROLL_BACK)
            if not head.get("undo"):
                raise self._error(nothing_before(head["version"]))
            restored = self._read_entry(int(head["undo"]))
            # Read before the entry is written: a rollback to a version that cannot be read is
            # refused, rather than done and then reported as a failure.
            target.append(self._entry_version(restored))
            return {"action": "rollback", "version": restored["version"],
                    "previous": head["version"], "undo": restored.get("undo", 0),
                    "reason": reason}

        target: list[ModelVersion] = []
        self._append(entry, by)
        return target[-1]

    def _append(self, make: Callable[[int, dict[str, Any] | None], dict[str, Any] | None],
                by: str | None) -> dict[str, Any]:
        """Append the entry ``make`` builds from the current head, as entry head+1, created
        exclusively; a writer that loses the race for that number re-reads and tries again."""
        self._check_exclusive_create()
        for attempt in range(_APPEND_ATTEMPTS):
            seq, head = self._head()
            entry = make(seq, head)
            if entry is None:
                assert head is not None
                return head
            entry = {"format": FORMAT, "seq": seq + 1, "time": _now_iso(),
                     "by": by or default_actor(), **entry}
            if self._create_exclusive(self._entry_path(seq + 1), _json_bytes(entry)):
                return entry
            # Lost entry seq+1 to another writer: back off a little (randomly, so that the
            # losers of one round do not collide again in the next) and build on its entry.
            time.sleep(random.uniform(0, 0.02 * min(attempt + 1, 10)))
        raise self._error(f"could not append to the champion log after {_APPEND_ATTEMPTS} "
                          "attempts (other writers kept winning); try again")

    def _head(self) -> tuple[int, dict[str, Any] | None]:
        with self._storage("reading the champion log"):
            numbers = self._entry_numbers()
        if not numbers:
            return 0, None
        return numbers[-1], self._read_entry(numbers[-1])

    def _read_entry(self, seq: int) -> dict[str, Any]:
        path = self._entry_path(seq)
        with self._storage(f"reading champion entry {seq}"):
            data = self._fs.cat_file(path)
        return self._parse_entry(path, data)

    def _entry_version(self, entry: dict[str, Any]) -> ModelVersion:
        try:
            return self.get(entry["version"])
        except RegistryError as error:
            raise self._error(f"champion entry {entry['seq']} names version {entry['version']}"
                              f", which cannot be read ({error}); promote another version")\
                from error

    def _entry_numbers(self) -> list[int]:
        folder = self._path(CHAMPION)
        try:
            names = self._fs.ls(folder, detail=False)
        except FileNotFoundError as error:
            if object_store.missing_bucket(error):
                raise
            return []
        numbers = []
        for name in names:
            match = _ENTRY.match(name.rstrip("/").rsplit("/", 1)[-1])
            if match:
                numbers.append(int(match[1]))
        return sorted(numbers)

    def _entry_path(self, seq: int) -> str:
        return self._path(CHAMPION, f"{seq:08d}.json")

    # ---- storage -----------------------------------------------------------------------------

    def _path(self, *parts: str) -> str:
        path = self._root
        for part in parts:
            path = object_store.join(path, part)
        return path

    def _version_folders(self) -> dict[str, set[str]]:
        """Every folder under versions/ and the names of the files in it (one listing)."""
        root = self._path(VERSIONS)
        try:
            paths = self._fs.find(root)
        except FileNotFoundError as error:
            if object_store.missing_bucket(error):
                raise
            return {}
        folders: dict[str, set[str]] = {}
        prefix = root.rstrip("/") + "/"
        for path in paths:
            relative = path[len(prefix):] if path.startswith(prefix) else path
            vid, _, name = relative.partition("/")
            if name:
                folders.setdefault(vid, set()).add(name)
        return folders

    def _sources(self, files_dir: Path) -> list[tuple[str, Path]]:
        if not files_dir.is_dir():
            raise self._error(f"cannot publish {files_dir}: not a folder (give the folder that "
                              "holds the model's files)")
        sources = []
        for path in sorted(files_dir.rglob("*")):
            if path.is_dir():
                continue
            name = path.relative_to(files_dir).as_posix()
            if not path.is_file():
                raise self._error(f"cannot publish {path}: not a regular file")
            if name in RESERVED:
                raise self._error(f"cannot publish {files_dir}: '{name}' is the registry's own "
                                  "record of a version; rename that file")
            sources.append((name, path))
        if not sources:
            raise self._error(f"cannot publish {files_dir}: the folder is empty")
        return sources

    def _claim(self) -> str:
        """A new version id, claimed by creating its folder's claim file exclusively."""
        for _ in range(10):
            version_id = new_version_id()
            claim = {"id": version_id, "started": _now_iso(), "by": default_actor(),
                     "pid": os.getpid()}
            if self._create_exclusive(self._path(VERSIONS, version_id, CLAIM_FILE),
                                      _json_bytes(claim)):
                return version_id
        raise self._error("could not claim a new version id ten times in a row; check the "
                          "clock and try again")

    def _upload(self, source: Path, target: str) -> dict[str, Any]:
        """Copy one file, hashing it on the way (one read, so the hash is of what was sent)."""
        digest = hashlib.sha256()
        size = 0
        with self._storage(f"uploading {source.name} to {target}"):
            if self._local:
                Path(target).parent.mkdir(parents=True, exist_ok=True)
            with open(source, "rb") as stream, self._fs.open(target, "wb") as out:
                while chunk := stream.read(CHUNK):
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
            if self._local:
                # Flushed before model.json can name it: a crash must not leave a complete
                # version whose model.pt is empty.
                fsync_file(Path(target))
        return {"size": size, "sha256": digest.hexdigest()}

    def _create_exclusive(self, path: str, data: bytes) -> bool:
        """Write ``data`` at ``path`` whole, unless something is there already: True if this
        call created it, False if it existed. Readers never see a part of it."""
        with self._storage(f"writing {path.rsplit('/', 1)[-1]}"):
            if self._local:
                return self._create_exclusive_local(path, data)
            return self._create_exclusive_s3(path, data)  # _check_exclusive_create: S3

    def _create_exclusive_local(self, path: str, data: bytes) -> bool:
        # Written and flushed under a temporary name, then hard-linked into place: link(2)
        # fails if the name exists (create-exclusive, even on NFS) and the name appears with
        # all of its content at once, which O_EXCL alone would not give a concurrent reader.
        staging = Path(self._path(TMP))
        staging.mkdir(parents=True, exist_ok=True)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=staging, prefix="create-")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(temporary, target)
            except FileExistsError:
                return False
            except OSError as error:
                raise self._error(f"the filesystem under {staging} refused a hard link "
                                  f"({error.strerror}), which the registry needs to create "
                                  "files exclusively; put the registry on a filesystem with "
                                  "hard links (local disks, NFS, CephFS, EFS)") from error
        finally:
            with suppress(OSError):
                os.unlink(temporary)
        fsync_folder(target.parent)
        return True

    def _create_exclusive_s3(self, path: str, data: bytes) -> bool:
        # A PUT with If-None-Match: * (s3fs's mode="create"). The object appears whole or not at
        # all; a second PUT of the name gets 412 PreconditionFailed, and one racing an
        # in-flight first may get 409 ConditionalRequestConflict: retried, as AWS advises.
        for attempt in range(5):
            try:
                self._fs.pipe_file(path, data, mode="create")
                return True
            except Exception as error:
                if _precondition_failed(error):
                    return False
                if not _conditional_conflict(error) or attempt == 4:
                    raise
                time.sleep(random.uniform(0.05, 0.2))
        raise AssertionError("unreachable")

    def _check_exclusive_create(self) -> None:
        """Refuse to write where a name cannot be created exclusively: any store but a local
        (or mounted) folder and S3, and an S3 store that ignores ``If-None-Match: *`` (old MinIO
        and others). There, two promoters could both 'win' the same entry.

        Other fsspec backends accept ``open(path, "xb")`` but most implement it as a write that
        overwrites, or at best as a look-then-write that two writers both pass; a probe cannot
        tell the second kind from a real exclusive create, so they are refused outright (their
        registries can still be read).
        """
        if self._local:
            return
        if not self._s3:
            protocol = "/".join(self._fs.protocol) if isinstance(self._fs.protocol, tuple) \
                else self._fs.protocol
            raise self._error(f"cannot publish, promote or roll back on a '{protocol}' store: "
                              "the registry needs a create that fails when the name exists, "
                              "which only a local or mounted folder (link(2)) and S3 "
                              "(If-None-Match: *) give it; use a shared folder or s3://")
        key = (object_store.endpoint(), self._root.split("/", 1)[0])
        if key in _EXCLUSIVE_CHECKED:
            return
        probe = self._path(TMP, f"probe-{secrets.token_hex(8)}")
        first = self._create_exclusive(probe, b"1")
        second = self._create_exclusive(probe, b"2")
        self._remove_quietly(probe)
        if not first or second:
            raise self._error(f"the S3 store at {object_store.endpoint()} ignores conditional "
                              "writes (If-None-Match: *), so concurrent publishers and "
                              "promoters could overwrite each other; use a store that supports "
                              "them (AWS S3, SeaweedFS, recent MinIO) or a shared folder")
        _EXCLUSIVE_CHECKED.add(key)

    def _exists_quietly(self, path: str) -> bool:
        try:
            self._forget_listings()
            return bool(self._fs.exists(path))
        except Exception:
            return False

    def _remove_quietly(self, path: str) -> None:
        """Best effort: what is left is invisible and removed by a later publish."""
        with suppress(Exception):
            self._forget_listings()
            self._fs.rm(path, recursive=True)

    # ---- records -----------------------------------------------------------------------------

    def _metrics(self, lineage: dict[str, Any], sources: dict[str, Path]) -> dict[str, Any]:
        """The lineage's metrics, else the published metrics.json's."""
        if isinstance(lineage.get("metrics"), dict):
            return lineage["metrics"]
        if METRICS_FILE in sources:
            with suppress(OSError, ValueError):
                metrics = json.loads(sources[METRICS_FILE].read_text())
                if isinstance(metrics, dict):
                    return metrics
        return {}

    def _version(self, record: dict[str, Any]) -> ModelVersion:
        return ModelVersion(id=record["id"], created=record["created"],
                            lineage=record.get("lineage") or {},
                            metrics=record.get("metrics") or {}, files=record["files"],
                            url=f"{self.url}/{VERSIONS}/{record['id']}")

    @staticmethod
    def _record(version: ModelVersion) -> dict[str, Any]:
        return {"format": FORMAT, "id": version.id, "created": version.created,
                "lineage": version.lineage, "metrics": version.metrics, "files": version.files}

    def _parse_version(self, path: str, data: bytes) -> ModelVersion:
        try:
            record = json.loads(data)
            version = self._version(record)
            if not all(isinstance(info["size"], int) and isinstance(info["sha256"], str)
                       for info in version.files.values()):
                raise ValueError("a file without its size and sha256")
        except (ValueError, TypeError, KeyError) as error:
            raise self._error(f"{path} is damaged ({error}); it was written whole, so something "
                              "else changed it: restore it from a backup or remove its "
                              "folder") from error
        return version

    def _parse_entry(self, path: str, data: bytes) -> dict[str, Any]:
        try:
            entry = json.loads(data)
            missing = {"seq", "version", "previous", "reason", "time", "by"} - set(entry)
            if missing:
                raise ValueError(f"no {', '.join(sorted(missing))}")
        except (ValueError, TypeError, KeyError) as error:
            raise self._error(f"champion entry {path} is damaged ({error}); it was written "
                              "whole, so something else changed it") from error
        return entry

    # ---- errors ------------------------------------------------------------------------------

    def _error(self, what: str) -> RegistryError:
        return RegistryError(f"model registry '{self._public}': {what}")

    def _cause(self, error: BaseException) -> str:
        full = disk_full_cause(error) if getattr(self, "_local", False) else None
        if full is not None:  # the registry's disk, named as its user can free it
            return describe(full, self._root, "writing into the registry")
        # object_store.explain words the cause (credentials, endpoint, bucket, disk full...)
        # for a dataset URL; the registry keeps the cause and names itself instead.
        text = str(object_store.explain(self.url, error))
        return text.removeprefix(f"dataset '{self._public}': ")

    def _forget_listings(self) -> None:
        """Drop s3fs's cached listings of this registry before every access.

        s3fs caches listings per filesystem instance (shared by the process) and answers
        ``info``/``cat_file``/``open`` from them without asking S3: a listing taken while another
        process was mid-publish (its folder holding only the claim) made a later ``get`` of
        that version fail with FileNotFoundError (seen in the race test). The registry changes
        under every reader, so it never reads through that cache; other prefixes keep theirs.
        """
        cache = getattr(self._fs, "dircache", None)
        if not cache:
            return
        root = self._root.rstrip("/")
        for key in list(cache):
            if key == root or key.startswith(root + "/"):
                cache.pop(key, None)
        self._fs.invalidate_cache(root)  # and its parents, whose listings name it

    @contextmanager
    def _storage(self, doing: str, disk: Path | None = None) -> Iterator[None]:
        """Turn whatever the store raised while ``doing`` into one RegistryError; a full disk
        is named: ``disk`` (a download's destination), else the registry's own folder."""
        self._forget_listings()
        try:
            yield
        except RegistryError:
            raise
        except Exception as error:
            full = disk_full_cause(error) if self._local or disk is not None else None
            if full is not None:  # which disk, and what did not fit, in one line
                raise self._error(describe(full, disk or self._root, doing)) from error
            fix = ""
            if object_store.missing_bucket(error):
                fix = "; create the bucket or fix the registry URL"
            raise self._error(f"{doing} failed: {self._cause(error)}{fix}") from error


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _s3_code(error: BaseException) -> tuple[str, int]:
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return "", 0
    code = str(response.get("Error", {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


def _precondition_failed(error: BaseException) -> bool:
    # s3fs maps AWS's 412 (which names the If-None-Match condition) to FileExistsError; other
    # stores (SeaweedFS) omit the condition and s3fs raises a generic OSError caused by it.
    for link in _chain(error):
        if isinstance(link, FileExistsError):
            return True
        code, status = _s3_code(link)
        if code == "PreconditionFailed" or status == 412:
            return True
    return "pre-conditions you specified did not hold" in str(error)


def _conditional_conflict(error: BaseException) -> bool:
    for link in _chain(error):
        code, status = _s3_code(link)
        if code == "ConditionalRequestConflict" or status == 409:
            return True
    return "ConditionalRequestConflict" in str(error)
