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

The runner does this as root on the pods' behalf, so no path a pod could have planted a link on
is looked up on the host: a target or an output is resolved inside its root (its volume's
folder, the pod's layer; a key inside the repository) by ``inside``, and used through file
descriptors; an input is made in a folder of the runner's own and moved in by one rename.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, NamedTuple, cast

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
    repository_root,
)
from .paths import inside

if TYPE_CHECKING:
    import tarfile

    from .inside import InRoot

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


def save_output(art: dict, where: InRoot, home: Path, workflow_name: str, pod_name: str
                ) -> Stored | None:
    """Store a pod's output ``art`` (resolved), left at ``where``: resolved inside its root (a
    link the pod left is followed inside its volume or layer, never out to this machine's
    files) and read through descriptors only. None when the pod left nothing there;
    ``NodeError`` on a bad key or what cannot be stored."""
    from .inside import InRoot, open_parent, open_path  # a pod with outputs pays for it

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
    try:
        source = open_path(where)
    except OSError:  # missing, a removal in the pod's view, a loop, a file on the way
        return None
    try:
        kind = os.fstat(source).st_mode
        if not (stat.S_ISREG(kind) or stat.S_ISDIR(kind)):
            raise NodeError(f"output artifact {art['name']!r}: {art['path']} is neither a file "
                            "nor a folder")
        # The repository is a root too: an object stored as a link (a folder's, archive none)
        # is never followed out of it by a later key.
        repository = repository_root(home)
        repository.mkdir(parents=True, exist_ok=True)
        folder, name = open_parent(InRoot(repository, os.path.relpath(target, repository)),
                                   create=True)
        try:
            if "none" not in archive:
                level = (archive.get("tar") or {}).get("compressionLevel")
                level = _DEFAULT_LEVEL if level is None else int(level)
                _publish(folder, name, target,
                         lambda out: _tar_gz(source, base, out, level))
            elif stat.S_ISDIR(kind):
                # Objects under the prefix: S3's PutDirectory adds them and leaves others alone.
                _copy_entry(source, folder, name, merge=True)
            else:
                _publish(folder, name, target, lambda out: _copy_content(source, out))
        finally:
            os.close(folder)
    except OSError as exc:
        raise NodeError(f"output artifact {art['name']!r}: cannot store {art['path']}: "
                        f"{exc.strerror or exc}") from exc
    finally:
        os.close(source)
    return Stored(target, bucket, key)


def read_parameter(where: InRoot) -> str:
    """The text a pod left at ``where`` for an output parameter (``valueFrom.path``), resolved
    inside its root and read through the file's descriptor; bytes that are not UTF-8 are
    replaced, as Argo keeps any bytes. ``OSError`` when no file is there."""
    from .inside import open_path, reopen

    fd = open_path(where)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IsADirectoryError(errno.EISDIR, "not a file", str(where))
        with os.fdopen(reopen(fd, os.O_RDONLY), "rb") as f:
            data = f.read()
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace")


def make_parent(where: InRoot) -> None:
    """The folders above ``where`` (an output's place, before its pod writes it), made inside
    its root; none where a link on the way leads nowhere inside it (the pod's own write then
    fails there, as it would in a container)."""
    from .inside import open_parent

    with contextlib.suppress(OSError, ValueError):
        where.root.mkdir(parents=True, exist_ok=True)  # the runner's own folder
        os.close(open_parent(where, create=True)[0])


def _publish(folder: int, name: str, target: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write an object next to ``name`` in ``folder`` and rename it there: a reader in another
    node sees the old object or the new one, never half of one."""
    try:
        info = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        pass
    else:
        if stat.S_ISDIR(info.st_mode):
            raise NodeError(f"{target}: the key is a prefix of other objects in the repository")
    tmp = f".{name}.{os.urandom(8).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o666, dir_fd=folder)
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=folder)


def _copy_content(source: int, out: IO[bytes]) -> None:
    """A file's bytes, mode and times (``shutil.copy2``), from its ``O_PATH`` descriptor."""
    from .inside import reopen

    with os.fdopen(reopen(source, os.O_RDONLY), "rb") as f:
        shutil.copyfileobj(f, out, 1 << 20)
    out.flush()
    info = os.fstat(source)
    os.fchmod(out.fileno(), stat.S_IMODE(info.st_mode))
    os.utime(out.fileno(), ns=(info.st_atime_ns, info.st_mtime_ns))


def _copy_entry(source: int, folder: int, name: str, merge: bool = False) -> None:
    """Copy what ``source`` (an ``O_PATH`` descriptor) is to the entry ``name`` of ``folder``,
    through descriptors only (``shutil.copytree(symlinks=True)``): a folder with its tree, a
    link as a link (its text; never followed), a file with its mode and times; a device, a
    pipe or a socket is no object and is left out. ``merge``: a folder already there keeps
    what the copy does not replace, a file or link in the way is replaced."""
    from .inside import remove_at, reopen

    info = os.fstat(source)
    if stat.S_ISDIR(info.st_mode):
        try:
            there = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
        except FileNotFoundError:
            there = None
        if there is not None and not (merge and stat.S_ISDIR(there)):
            remove_at(folder, name)
            there = None
        if there is None:
            os.mkdir(name, 0o700, dir_fd=folder)
        copy = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                       dir_fd=folder)
        tree = reopen(source, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for entry in sorted(os.listdir(tree)):
                child = os.open(entry, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=tree)
                try:
                    _copy_entry(child, copy, entry, merge)
                finally:
                    os.close(child)
            os.fchmod(copy, stat.S_IMODE(info.st_mode))
            os.utime(copy, ns=(info.st_atime_ns, info.st_mtime_ns))
        finally:
            os.close(tree)
            os.close(copy)
    elif stat.S_ISLNK(info.st_mode):
        if merge:
            _make_room(folder, name)
        os.symlink(os.readlink("", dir_fd=source), name, dir_fd=folder)
    elif stat.S_ISREG(info.st_mode):
        if merge:
            _make_room(folder, name)
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      0o600, dir_fd=folder)
        with os.fdopen(out, "wb") as f:
            _copy_content(source, f)


def _make_room(folder: int, name: str) -> None:
    """Remove a file or link in the way of a new one; a folder there is an error (a key and a
    prefix of the same name cannot both be here)."""
    try:
        there = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(there):
        raise IsADirectoryError(errno.EISDIR, "a folder of other objects is in the way", name)
    os.unlink(name, dir_fd=folder)


class _Descriptor:
    """What ``TarFile.gettarinfo`` needs of a file object: a descriptor to ``fstat``."""

    def __init__(self, fd: int, name: str) -> None:
        self.fd, self.name = fd, name

    def fileno(self) -> int:
        return self.fd


def _tar_gz(source: int, arcname: str, out: IO[bytes], level: int) -> None:
    import gzip
    import tarfile  # only a run that archives pays for it

    with gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=level,
                       mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        _add(tar, source, arcname)


def _add(tar: tarfile.TarFile, source: int, arcname: str) -> None:
    """``TarFile.add`` (entries in name order, a folder with its tree, links as links, hard
    links to a file already added as such), through descriptors only: nothing the pod left is
    looked up by path, so a link swapped in meanwhile is never followed."""
    import tarfile

    from .inside import reopen

    info = os.fstat(source)
    if stat.S_ISLNK(info.st_mode):
        entry = tarfile.TarInfo(arcname)
        entry.type, entry.linkname = tarfile.SYMTYPE, os.readlink("", dir_fd=source)
        entry.mode, entry.mtime = stat.S_IMODE(info.st_mode), int(info.st_mtime)
        entry.uid, entry.gid = info.st_uid, info.st_gid
        tar.addfile(entry)
        return
    entry = tar.gettarinfo(arcname=arcname,  # it only fstat()s the descriptor
                           fileobj=cast("IO[bytes]", _Descriptor(source, arcname)))
    if entry is None:  # a socket: TarFile.add leaves one out too
        return
    if entry.type == tarfile.REGTYPE:
        with os.fdopen(reopen(source, os.O_RDONLY), "rb") as f:
            tar.addfile(entry, f)
        return
    tar.addfile(entry)  # a folder, a hard link, a pipe, a device: the header alone
    if entry.isdir():
        tree = reopen(source, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for name in sorted(os.listdir(tree)):
                child = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=tree)
                try:
                    _add(tar, child, f"{arcname}/{name}")
                finally:
                    os.close(child)
        finally:
            os.close(tree)


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


def _unpack_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """Python's ``tar`` filter (no entry outside the destination, as Argo checks), less device
    nodes and pipes: Argo's untar makes files, folders and links only, and a device node made
    by the runner would hand a pod a device it may not make itself."""
    import tarfile

    if member.isdev():
        return None
    return tarfile.tar_filter(member, dest)


def untar(tarball: Path, target: Path) -> None:
    """executor.go untar + unpack: extract; one entry becomes ``target``, several a folder.
    Both lie in a folder of the runner's own (``load_input``): no pod can plant a link there."""
    import tarfile

    staging = target.with_name(f"{target.name}.tmpdir")
    _remove(staging)
    staging.mkdir(parents=True)
    with tarfile.open(tarball, mode="r:gz") as tar:
        tar.extractall(staging, filter=_unpack_filter)
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
    path: str = ""  # the container path, as the manifest writes it (for messages)
    # The folder ``target`` lies in (a volume's, or the pod's layer): ``target`` is resolved
    # inside it (``inside``); None: ``target``'s own folder, trusted.
    root: Path | None = None
    # A folder of the runner's own, on the disk of ``root`` if it can be, where the artifact
    # is made (fetched, unpacked, cloned) before it is moved to ``target`` in one rename.
    staging: Path | None = None
    repository: Path | None = None  # the artifact repository ``source`` lies in (its root)


def input_source(art: dict, home: Path) -> Path | None:
    """The stored object a (resolved) input artifact reads: ``from`` (a stored object's path)
    with its ``subPath`` appended (controller/scope.go resolveArtifact: ``AppendToKey``), or a
    bucket location's key. None when it has neither."""
    if art.get("from"):
        source = Path(os.path.normpath(str(art["from"])))
        repository = repository_root(home)
        if not source.is_relative_to(repository):
            # Outputs are stored in the repository and only they are referred to: a ``from``
            # written out (``/etc/shadow``) would have the runner copy a host file into a pod.
            raise NodeError(f"input artifact {art['name']!r}: from: {str(art['from'])!r} is "
                            f"not an artifact of this home's repository ({repository})")
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
    """Put one input artifact at its target; ``NodeError`` when it cannot be loaded.

    The artifact is made in a folder of the runner's own (``art.staging``), then moved to its
    target in one rename, the target's folder opened inside its root: nothing is written
    through a link the pod (or an earlier pod on the volume) left on the way, nor unpacked
    into a folder a pod can change meanwhile."""
    from .inside import InRoot  # a pod with inputs pays for it

    root = art.root if art.root is not None else art.target.parent
    where = InRoot(root, os.path.relpath(art.target, root))
    if not posixpath.normpath("/" + where.path).strip("/"):
        raise NodeError(f"input artifact {art.name!r}: {art.path or art.target} is a volume's "
                        "mount point: an artifact cannot replace the volume")
    root.mkdir(parents=True, exist_ok=True)  # the runner's own folder (the layer's, a volume's)
    if art.staging is not None:
        art.staging.mkdir(parents=True, exist_ok=True)
    import tempfile  # only a pod with inputs pays for it

    work = Path(tempfile.mkdtemp(prefix=".input-", dir=art.staging))  # 0700: ours alone
    try:
        made = _make(art, work)
        if made is None:
            return
        if art.mode is not None and not made.is_symlink():
            os.chmod(made, art.mode)
        _place(art, made, where)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _make(art: Input, work: Path) -> Path | None:
    """The artifact, made in ``work``; None when there is none to put (an optional one that
    is not found)."""
    made = work / "artifact"
    if art.raw is not None:
        made.write_text(art.raw)
        return made
    if art.git is not None:
        _clone(art, made)
        return made
    fetched = work / "fetched"
    if art.url is not None:
        _download(art, fetched)
        if not fetched.exists():  # an optional artifact not found (404)
            return None
    elif art.source is not None:
        if not _fetch(art, work, fetched.name):
            return None
    else:
        return None
    if art.archive == "tar" or (art.archive is None and is_tarball(fetched)):
        import gzip
        import tarfile
        import zlib

        try:
            untar(fetched, made)
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
            origin = art.url or art.source
            raise NodeError(f"input artifact {art.name!r}: {origin} is not a gzipped tarball "
                            f"({exc})") from None
    else:
        fetched.rename(made)
    return made


def _fetch(art: Input, work: Path, name: str) -> bool:
    """Copy the stored object into ``work``, resolved inside the repository (an object stored
    as a link is never followed out of it); False for an optional one not found."""
    from .inside import InRoot, open_path

    source_path = art.source or Path()
    repository = art.repository if art.repository is not None else source_path.parent
    try:
        source = open_path(InRoot(repository, os.path.relpath(source_path, repository)))
    except OSError:
        if art.optional:  # executor.go: an optional artifact not found is skipped
            return False
        raise NodeError(f"input artifact {art.name!r}: {art.source} not found in the "
                        "artifact repository") from None
    folder = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _copy_entry(source, folder, name)
    finally:
        os.close(folder)
        os.close(source)
    return True


def _place(art: Input, made: Path, where: InRoot) -> None:
    """Move ``made`` to ``where``, replacing what is there (a link itself, never what it
    points to), in one rename into the target's folder opened inside its root; a copy through
    descriptors where the two lie on different disks."""
    from .inside import open_parent, remove_at

    try:
        folder, name = open_parent(where, create=True)
    except OSError as exc:
        raise NodeError(f"input artifact {art.name!r}: cannot be put at "
                        f"{art.path or art.target}: {exc.strerror or exc} (links on the way "
                        "are followed inside its volume or the pod's own files)") from None
    try:
        remove_at(folder, name)
        try:
            os.rename(made, name, dst_dir_fd=folder)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            source = os.open(made, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                _copy_entry(source, folder, name)
            finally:
                os.close(source)
    finally:
        os.close(folder)


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


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
