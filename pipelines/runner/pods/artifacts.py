"""Artifacts in and out of a pod, as Argo's executor moves them (workflow/executor/executor.go).

Outputs (``save_output``, Argo's ``saveArtifact``/``stageArchiveFile``): the file or folder a pod
leaves at ``path`` is stored in the home's artifact repository (``repository``) at its key; with
no key, at ``{{workflow.name}}/{{pod.name}}/<file name>``. The ``archive`` strategy decides the
object: none given, or ``tar`` (``compressionLevel``, default gzip's default), makes a gzipped
tarball named ``<artifact name>.tgz`` whose one entry is the path's base name (a folder with its
tree, util/archive/archive.go); ``none: {}`` stores the file as it is, or a folder as the objects
under the key (S3's ``PutDirectory``). ``zip`` is refused by the checker.

Inputs (``load_input``, Argo's ``loadArtifact``/``unarchiveArtifact``): the object (a key's file,
or every object under a key prefix) is copied next to the target, then unpacked: ``archive:
none`` keeps it as it is, ``tar`` untars it, no ``archive`` untars it only when it is a gzipped
tarball. Untarring one entry puts that entry at the target; several, a folder of them. A
missing object fails the node, or is skipped for an ``optional`` artifact; ``raw`` is written
as given; ``http`` (this machine only) is downloaded and ``git`` (a local repository) cloned.
"""

from __future__ import annotations

import os
import posixpath
import shutil
from pathlib import Path
from typing import NamedTuple

from sublimate.pipelines.argo_terms import sub_path_problem

from ..errors import NodeError
from ..expressions.substitution import Vars, substitute
from ..manifest.repository import (
    DEFAULT_KEY_FORMAT,
    bucket_and_key,
    is_local_url,
    local_git_repo,
    location_kind,
    object_path,
)
from .paths import inside

# gzip.DEFAULT_COMPRESSION in Go's terms: zlib's own default.
_DEFAULT_LEVEL = -1


def workflow_artifacts(spec: dict, globals_: Vars) -> dict[str, dict]:
    """``spec.arguments.artifacts`` by name, substituted: the entrypoint's artifact arguments
    (Argo hands the workflow's arguments to the entrypoint as a step's)."""
    given = (spec.get("arguments") or {}).get("artifacts") or []
    resolved: list = substitute(given, globals_, "spec.arguments.artifacts")  # type: ignore[assignment]
    return {a["name"]: a for a in resolved}


class Stored(NamedTuple):
    """Where an output artifact went: the object's local path, its bucket and key."""

    path: Path
    bucket: str
    key: str


def save_output(art: dict, local: Path, home: Path, workflow_name: str, pod_name: str
                ) -> Stored:
    """Store a pod's output ``art`` (resolved), left at ``local``; ``NodeError`` on a bad key."""
    archive = art.get("archive") or {"tar": {}}  # executor.go: no strategy is tar
    if "zip" in archive:
        raise NodeError(f"output artifact {art['name']!r}: zip archives are not supported")
    base = posixpath.basename(posixpath.normpath(str(art["path"]))) or art["name"]
    file_name = base if "none" in archive else f"{art['name']}.tgz"
    bucket, key = bucket_and_key(art)
    if not key:  # executor.go saveArtifactFromFile: the repository's key format + file name
        key = posixpath.join(DEFAULT_KEY_FORMAT.replace("{{workflow.name}}", workflow_name)
                             .replace("{{pod.name}}", pod_name), file_name)
    try:
        target = object_path(home, bucket, key)
    except ValueError as exc:
        raise NodeError(f"output artifact {art['name']!r}: {exc}") from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    if "none" in archive:
        if local.is_dir():
            # Objects under the prefix: S3's PutDirectory adds them and leaves others alone.
            shutil.copytree(local, target, symlinks=True, dirs_exist_ok=True)
        else:
            _publish(target, lambda tmp: shutil.copy2(local, tmp))
    else:
        level = (archive.get("tar") or {}).get("compressionLevel")
        level = _DEFAULT_LEVEL if level is None else int(level)
        _publish(target, lambda tmp: _tar_gz(local, base, tmp, level))
    return Stored(target, bucket, key)


def _publish(target: Path, write) -> None:  # type: ignore[no-untyped-def]
    """Write an object next to ``target`` and rename it there: a reader in another node sees
    the old object or the new one, never half of one."""
    if target.is_dir() and not target.is_symlink():
        raise NodeError(f"{target}: the key is a prefix of other objects in the repository")
    tmp = target.with_name(f".{target.name}.{os.urandom(8).hex()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _tar_gz(source: Path, arcname: str, out: Path, level: int) -> None:
    import gzip
    import tarfile  # only a run that archives pays for it

    with open(out, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw,
                                              compresslevel=level, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w") as tar:
        tar.add(source, arcname=arcname)


def is_tarball(path: Path) -> bool:
    """executor.go isTarball: a gzip stream whose first tar header reads."""
    if not path.is_file():
        return False
    import tarfile

    try:
        with tarfile.open(path, mode="r:gz") as tar:
            return tar.next() is not None
    except (tarfile.TarError, OSError, EOFError):
        return False


def untar(tarball: Path, target: Path) -> None:
    """executor.go untar + unpack: extract; one entry becomes ``target``, several a folder."""
    import tarfile

    staging = target.with_name(f"{target.name}.tmpdir")
    _remove(staging)
    staging.mkdir(parents=True)
    with tarfile.open(tarball, mode="r:gz") as tar:
        tar.extractall(staging, filter="tar")  # no entry outside staging, as Argo checks
    entries = list(staging.iterdir())
    _remove(target)
    if len(entries) == 1:
        entries[0].rename(target)
        staging.rmdir()
    else:
        staging.rename(target)


class Input(NamedTuple):
    """An input artifact, resolved, ready to be put at ``target`` before the pod starts."""

    name: str
    target: Path
    source: Path | None = None  # a stored object (a file, or a folder: a key prefix)
    raw: str | None = None
    url: str | None = None  # http
    headers: tuple[tuple[str, str], ...] = ()
    git: dict | None = None
    archive: str | None = None  # "none", "tar", or None: a tarball is unpacked
    optional: bool = False
    mode: int | None = None


def input_source(art: dict, home: Path) -> Path | None:
    """The stored object a (resolved) input artifact reads: ``from`` (a stored object's path)
    with its ``subPath`` appended (controller/scope.go resolveArtifact: ``AppendToKey``), or a
    bucket location's key. None when it has neither."""
    if art.get("from"):
        source = Path(str(art["from"]))
        if not art.get("subPath"):
            return source
        sub_path = str(art["subPath"])
        problem = sub_path_problem(sub_path)
        target = inside(source, sub_path) if problem is None else None
        if target is None:  # it would read outside the artifact it names
            raise NodeError(f"input artifact {art['name']!r}: subPath: "
                            f"{problem or f'{sub_path!r} leaves the artifact through a link'}")
        return target
    kind = location_kind(art)
    if kind is None or kind in ("http", "git"):
        return None
    # subPath is only applied to a ``from`` (the executor never reads it).
    bucket, key = bucket_and_key(art)
    try:
        return object_path(home, bucket, key)
    except ValueError as exc:
        raise NodeError(f"input artifact {art['name']!r}: {exc}") from exc


def load_input(art: Input) -> None:
    """Put one input artifact at its target; ``NodeError`` when it cannot be loaded."""
    target = art.target
    target.parent.mkdir(parents=True, exist_ok=True)
    if art.raw is not None:
        target.write_text(art.raw)
        _chmod(art)
        return
    fetched = target.with_name(f"{target.name}.tmp")
    _remove(fetched)
    try:
        if art.url is not None:
            _download(art, fetched)
        elif art.git is not None:
            _clone(art, target)
            return
        elif art.source is not None:
            if not art.source.exists():
                if art.optional:  # executor.go: an optional artifact not found is skipped
                    return
                raise NodeError(f"input artifact {art.name!r}: {art.source} not found in the "
                                "artifact repository")
            _copy(art.source, fetched)
        else:
            return
        tar = art.archive == "tar" or (art.archive is None and is_tarball(fetched))
        if tar:
            untar(fetched, target)
        else:
            _remove(target)
            fetched.rename(target)
    finally:
        _remove(fetched)
    _chmod(art)


def _download(art: Input, out: Path) -> None:
    if not is_local_url(art.url or ""):
        raise NodeError(f"input artifact {art.name!r}: http artifact {art.url!r} is outside "
                        "this machine (only 127.0.0.1 and localhost are fetched)")
    import urllib.error
    import urllib.request

    request = urllib.request.Request(art.url or "", headers=dict(art.headers))
    try:
        with urllib.request.urlopen(request, timeout=60) as response, open(out, "wb") as f:
            shutil.copyfileobj(response, f)
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and art.optional:
            return
        raise NodeError(f"input artifact {art.name!r}: {art.url}: {exc}") from exc
    except OSError as exc:
        raise NodeError(f"input artifact {art.name!r}: {art.url}: {exc}") from exc


def _clone(art: Input, target: Path) -> None:
    git = art.git or {}
    repo = local_git_repo(str(git.get("repo") or ""))
    if repo is None:
        raise NodeError(f"input artifact {art.name!r}: git artifact {git.get('repo')!r} is "
                        "outside this machine (only a local repository is cloned)")
    import subprocess  # only a git artifact pays for it

    _remove(target)
    commands = [["git", "clone", "--quiet", repo, str(target)]]
    if git.get("revision"):
        commands.append(["git", "-C", str(target), "checkout", "--quiet", str(git["revision"])])
    for command in commands:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise NodeError(f"input artifact {art.name!r}: {' '.join(command[:2])}: "
                            f"{done.stderr.strip()}")


def _copy(source: Path, target: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, target, symlinks=True)
    else:
        shutil.copy2(source, target)


def _chmod(art: Input) -> None:
    if art.mode is not None and art.target.exists():
        os.chmod(art.target, art.mode)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
