"""The ``namespace`` mode (``mount_modes``): a pod in a private mount namespace, its folders at
the manifest's paths, sharing this machine's files.

On Argo a container sees its volumes at their ``mountPath``s, its output files where the
template declares them, and a script template's source at ``/argo/staging/script``
(``ExecutorScriptSourcePath``, workflow/common/common.go). The ``overlay`` mode (``views``, the
default where it can be) gives each pod a private view of the whole tree; where it cannot, this
module's namespaces make the paths real all the same, so a path built at run time
(``os.path.join("/mnt", "data")``) or a look at ``/proc/mounts`` finds the mount, but the pods
share the host's files; the last resort (``paths.PathMap``) rewrites the paths where they are
spelt out.

How (Linux; root, or unprivileged user namespaces):

- the step's forked child, before ``exec``, leaves the runner's mount namespace
  (``unshare(CLONE_NEWNS)``, with ``CLONE_NEWUSER`` when not root), makes every mount private
  (nothing it mounts propagates back to the host), builds a *prepared root* and ``chroot``s
  into it. The root is a tmpfs that mirrors the host's ``/``: every top-level entry is
  recursively bind-mounted (so the host's files, ``/proc``, ``/dev`` stay as they are and
  writable where they were), and each pod folder is then bind-mounted at its container path;
- a container path whose folder does not exist on the host (``/mnt/data``, ``/tmp/outputs``,
  ``/argo/staging``) is made in a tmpfs: the host folder it would go in is mirrored the same
  way (a tmpfs over it in the prepared root, each host entry bind-mounted back), so nothing
  is ever created in the host's folders. Why not the alternatives: an overlay on the parent
  would turn the step's writes to existing host files under it (a run folder under ``/tmp``)
  into private copies the runner never sees, and hides the mounts below it; a plain tmpfs on
  the parent hides the host's entries. The cost is one bind per entry of a mirrored folder;
- the namespace ends with the step's last process: its mounts go with it, on the host there is
  nothing to unmount. The prepared root's mount point is an empty folder in the node folder,
  removed when the pod ends;
- the host's entries are listed when the pod is planned: one that another process removes
  before the pod starts is skipped (``mirror`` steps), not a reason to fail the pod.

All the planning (which folders to mirror, what to bind where) happens in the runner; the
child only makes system calls through libc functions resolved beforehand, as
``process._die_with_runner`` does (no lock, import or I/O between ``fork`` and ``exec``). It
runs after ``PR_SET_PDEATHSIG`` is set, and the step is still the runner's own child, so a
killed runner's SIGTERM still reaches it; networking is untouched.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

# Argo's script path (workflow/common/common.go: ExecutorScriptSourcePath).
SCRIPT_PATH = "/argo/staging/script"
# Exit status of a step whose namespace could not be built (a shell's "cannot execute").
SETUP_FAILED = 126

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_MS_RDONLY = 1
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2


class _Libc(NamedTuple):
    unshare: Callable[..., int]
    mount: Callable[..., int]
    umount2: Callable[..., int]
    chroot: Callable[..., int]
    get_errno: Callable[[], int]


_lock = threading.Lock()
_libc: _Libc | None = None
_probed: str | None = None  # "" when namespaces work, else why not


def _resolve_libc() -> _Libc:
    global _libc
    if _libc is None:
        import ctypes  # deferred: only a run in namespace mode pays for it

        libc = ctypes.CDLL(None, use_errno=True)
        _libc = _Libc(libc.unshare, libc.mount, libc.umount2, libc.chroot, ctypes.get_errno)
    return _libc


def unavailable() -> str:
    """Why this process cannot run pods in mount namespaces ("" when it can): probed once, by
    a forked child that makes a namespace, a private tmpfs and a bind, then exits (~2 ms)."""
    global _probed
    with _lock:
        if _probed is None:
            _probed = _probe()
        return _probed


def _probe() -> str:
    if not hasattr(os, "fork") or not Path("/proc/self/mountinfo").exists():
        return "not Linux"
    try:
        _resolve_libc()
    except (OSError, AttributeError) as exc:
        return f"no libc mount functions ({exc})"
    return try_in_child([("tmpfs", b"/proc"), ("bind", b"/dev", b"/proc")], _run_step,
                        os.geteuid(), os.getegid())


def try_in_child(steps: list[tuple], run_step: Callable[[_Libc, tuple], None], uid: int,
                 gid: int) -> str:
    """Run the steps in a forked child that leaves the runner's mount namespace first (what a
    probe does): "" when they all worked, else what failed."""
    libc = _resolve_libc()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            os.close(read_fd)
            _enter(libc, uid, gid)
            for step in steps:
                run_step(libc, step)
            code = 0
        except OSError as exc:
            os.write(write_fd, str(exc).encode())
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        message = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        return ""
    return message or "the probe failed"


def _check(libc: _Libc, result: int, what: str) -> None:
    if result != 0:
        errno = libc.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _enter(libc: _Libc, uid: int, gid: int) -> None:
    """Leave the runner's mount namespace (and, not being root, its user namespace, keeping
    this user's ids) and stop mounts propagating back."""
    if uid == 0:
        _check(libc, libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    else:
        _check(libc, libc.unshare(_CLONE_NEWNS | _CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
        for name, text in (("setgroups", b"deny"), ("uid_map", b"%d %d 1" % (uid, uid)),
                           ("gid_map", b"%d %d 1" % (gid, gid))):
            fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
            try:
                os.write(fd, text)
            finally:
                os.close(fd)
    _check(libc, libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "private /")


# --------------------------------------------------------------------------- planning


class Bind(NamedTuple):
    """A local file or folder and the container path it is mounted at."""

    target: str
    source: Path
    read_only: bool = False


class Namespace(NamedTuple):
    """What a pod's namespace holds; ``steps`` is the planned list of system calls."""

    binds: tuple[Bind, ...]
    root: Path  # the prepared root's mount point (an empty folder in the node folder)
    cwd: str  # the working directory, a container path
    mirrored: tuple[str, ...]  # host folders mirrored to make a missing path in them
    steps: tuple[tuple, ...]


def binds_for(mounts: list, folder: Path, working_dir: str, script: bool
              ) -> tuple[list[Bind], str]:
    """The pod's folders and the container paths they are mounted at, or ``([], why)`` when a
    path cannot be mounted (the pod's paths are then rewritten, as without namespaces).
    ``mounts`` are ``plan.Mount``s; ``folder`` the node folder."""
    binds: list[Bind] = []
    for mount in mounts:
        if mount.volume:
            binds.append(Bind(mount.path, mount.local, mount.read_only))
            continue
        # A path the template declares outside any volume (outputs, input artifacts,
        # workingDir) lives in the node's private fs/: its folder is mounted (a file that does
        # not exist yet cannot be: an output's absence must stay visible).
        target = mount.path.rstrip("/") or "/"
        if target != working_dir.rstrip("/"):
            target = os.path.dirname(target)
        if target == "/":
            return [], f"{mount.path} is directly under /"
        if os.path.isdir(target):  # a host folder (/tmp): mounting over it would hide it
            return [], f"{mount.path} lies in the host folder {target}"
        binds.append(Bind(target, folder / "fs" / target.lstrip("/")))
    if script:
        binds.append(Bind(SCRIPT_PATH, folder / "script"))
    for bind in binds:
        # A link on the way would lead the mount (and the folders made for it) out of the
        # prepared root, onto the host.
        path = bind.target
        while path != "/":
            if os.path.islink(path):
                return [], f"{bind.target}: {path} is a symbolic link on this machine"
            path = os.path.dirname(path)
    # Shallowest first; a folder inside one already mounted from the same place is there.
    binds.sort(key=lambda b: (b.target.count("/"), b.target))
    kept: list[Bind] = []
    for bind in binds:
        if any(bind.target == k.target or (
                bind.target.startswith(k.target + "/")
                and k.source / os.path.relpath(bind.target, k.target) == bind.source)
               for k in kept):
            continue
        kept.append(bind)
    return kept, ""


def plan(binds: list[Bind], folder: Path, cwd: str) -> Namespace:
    """The system calls that build a pod's prepared root, decided here in the runner. Folders
    a mount point needs inside a mounted pod folder are made now (they are the run's own)."""
    root = folder / ".root"
    rootb = os.fsencode(root)
    steps: list[tuple] = [("tmpfs", rootb)]
    mirrored: list[str] = []
    made: set[str] = set()  # container folders created in a tmpfs
    where: dict[str, Path] = {}  # container path -> the local folder mounted there

    def mounted(path: str) -> Path | None:
        for target in sorted(where, key=len, reverse=True):
            if path.startswith(target + "/"):
                return where[target] / os.path.relpath(path, target)
        return None

    def mirror(host_folder: str) -> None:
        mirrored.append(host_folder)
        if host_folder != "/":
            steps.append(("tmpfs", rootb + os.fsencode(host_folder)))
        with os.scandir(host_folder) as entries:
            for entry in entries:
                _mirror_entry(steps, rootb, entry, host_folder)

    mirror("/")
    for bind in binds:
        parts = bind.target.strip("/").split("/")
        for depth in range(1, len(parts) + 1):
            path = "/" + "/".join(parts[:depth])
            is_file = depth == len(parts) and not bind.source.is_dir()
            if path in made:
                continue
            local = mounted(path)
            if local is not None:  # inside a pod folder mounted already: make it there
                if not local.exists():
                    local.parent.mkdir(parents=True, exist_ok=True)
                    local.touch() if is_file else local.mkdir()
                continue
            if os.path.lexists(path):
                continue
            parent = os.path.dirname(path)
            if parent not in mirrored and parent not in made:
                mirror(parent)
            steps.append(("touch" if is_file else "mkdir", rootb + os.fsencode(path)))
            made.add(path)
        steps.append(("bind", os.fsencode(bind.source), rootb + os.fsencode(bind.target)))
        if bind.read_only:
            steps.append(("readonly", rootb + os.fsencode(bind.target)))
        where[bind.target] = bind.source
    # The recursive binds of the host's folders copied the prepared root's own mount point
    # (it is in the node folder): detach that copy, then enter the root.
    steps.append(("detach", rootb + rootb))
    steps.append(("chroot", rootb))
    steps.append(("chdir", os.fsencode(cwd)))
    return Namespace(tuple(binds), root, cwd, tuple(mirrored), tuple(steps))


def _mirror_entry(steps: list[tuple], rootb: bytes, entry: os.DirEntry, folder: str) -> None:
    """One host entry brought back into its mirrored folder. Another process may remove it
    at any time (``/tmp`` is everybody's): one gone by now is left out, and one gone by the
    time the pod starts is skipped there (the ``mirror`` steps)."""
    source = os.path.join(folder, entry.name)
    target = rootb + os.fsencode(source)
    try:
        mode = entry.stat(follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            steps.append(("symlink", os.fsencode(os.readlink(source)), target))
            return
    except FileNotFoundError:
        return
    steps.append(("mirror", ("mkdir" if stat.S_ISDIR(mode) else "touch", target),
                  ("bind", os.fsencode(source), target)))


# --------------------------------------------------------------------------- in the child


def namespace_setup(request: object) -> Callable[[], None] | None:
    """For a ``plan.PodRequest`` in namespace mode, the child's setup (None otherwise): the
    prepared root is planned now, in the runner, and its mount point made."""
    binds = getattr(request, "binds", None)
    if binds is None:
        return None
    folder: Path = request.folder  # type: ignore[attr-defined]
    namespace = plan(binds, folder, request.working_dir)  # type: ignore[attr-defined]
    namespace.root.mkdir(exist_ok=True)
    return setup(namespace, request.termination_log)  # type: ignore[attr-defined]


def namespace_cleanup(request: object) -> None:
    """Remove the prepared root's (empty) mount point: the namespace ended with the pod."""
    if getattr(request, "binds", None) is not None:
        with contextlib.suppress(OSError):
            (request.folder / ".root").rmdir()  # type: ignore[attr-defined]


def setup(namespace: Namespace, termination_log: Path) -> Callable[[], None]:
    """The function the forked child runs before ``exec`` (after ``PR_SET_PDEATHSIG``): it
    builds the namespace; on failure it says why on stderr and in the termination log and
    exits with ``SETUP_FAILED``, so the node fails with that message."""
    return in_child(namespace.steps, _run_step, termination_log, "mount namespace",
                    os.geteuid(), os.getegid())


def in_child(steps: tuple | list, run_step: Callable[[_Libc, tuple], None],
             termination_log: Path, what: str, uid: int, gid: int) -> Callable[[], None]:
    """The function a forked child runs before ``exec``: leave the runner's mount namespace,
    then ``run_step`` each planned step; on failure say why (``what: ...``) on stderr and in
    the termination log and exit with ``SETUP_FAILED``, so the node fails with that message.
    Everything it uses is resolved here, in the runner."""
    libc = _resolve_libc()
    log = os.fsencode(termination_log)

    def build() -> None:
        try:
            _enter(libc, uid, gid)
            for step in steps:
                run_step(libc, step)
        except OSError as exc:
            message = f"{what}: {exc}\n".encode()
            os.write(2, message)
            try:
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.write(fd, message)
                os.close(fd)
            except OSError:
                pass
            os._exit(SETUP_FAILED)

    return build


def _run_step(libc: _Libc, step: tuple) -> None:
    kind = step[0]
    if kind == "mirror":
        # A host entry listed when the pod was planned: removed since, it is not there for the
        # pod either (ENOENT), which is no reason to fail the pod.
        with contextlib.suppress(FileNotFoundError):
            for inner in step[1:]:
                _run_step(libc, inner)
    elif kind == "tmpfs":
        _check(libc, libc.mount(b"tmpfs", step[1], b"tmpfs", 0, b"mode=755"),
               f"tmpfs on {os.fsdecode(step[1])}")
    elif kind == "bind":
        _check(libc, libc.mount(step[1], step[2], None, _MS_BIND | _MS_REC, None),
               f"bind {os.fsdecode(step[1])}")
    elif kind == "readonly":
        _check(libc, libc.mount(None, step[1], None,
                                _MS_BIND | _MS_REMOUNT | _MS_RDONLY, None),
               f"read-only {os.fsdecode(step[1])}")
    elif kind == "mkdir":
        with contextlib.suppress(FileExistsError):
            os.mkdir(step[1], 0o755)
    elif kind == "touch":
        os.close(os.open(step[1], os.O_WRONLY | os.O_CREAT, 0o644))
    elif kind == "symlink":
        os.symlink(step[1], step[2])
    elif kind == "detach":
        libc.umount2(step[1], _MNT_DETACH)  # absent when the root is not under a bound folder
    elif kind == "chroot":
        _check(libc, libc.chroot(step[1]), "chroot")
    elif kind == "chdir":
        os.chdir(step[1])
