"""Paths resolved inside a root folder, the way a container runtime resolves a container's paths.

The runner reads and writes files on a pod's behalf, as root: it puts input artifacts at their
paths and reads output parameters and artifacts back. Those paths lie on a volume (a host
folder that other pods write too, and that outlives the run) or in the pod's own layer, and a
pod can leave a link anywhere on them: ``ln -s /etc /mnt/vol/dir`` in one step, and the next
step's artifact at ``/mnt/vol/dir/x`` would be written into the host's ``/etc``. A container
runtime never follows such a link out of the container: an absolute link starts again at the
container's root, and ``..`` stops there. Here the root is the folder the path lies in (a
volume's host folder, or the pod's layer), so every path is resolved inside it, never on the
host, and what is found is then used through its file descriptor: nothing is looked up by
path again, so a pod that swaps a folder for a link between a check and a use gains nothing.

``openat2(2)`` with ``RESOLVE_IN_ROOT`` (Linux 5.6) does exactly this in the kernel; where it is
missing (an older kernel, a seccomp filter that refuses it) the same walk is made here, one
component at a time, each opened with ``O_NOFOLLOW`` relative to its parent's descriptor and a
link's text read from the link itself and walked in turn (40 links at most, as Linux allows).
"""

from __future__ import annotations

import contextlib
import errno
import os
import platform
import posixpath
import shutil
import stat
from pathlib import Path
from typing import NamedTuple

# openat2(2)'s resolve flags (linux/openat2.h).
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
# The system call's number: the same in every architecture's table since Linux 5.1 (424 and
# up were numbered once for all), but for the few that offset their whole table.
_OPENAT2 = 437
_UNOFFSET = frozenset({"x86_64", "aarch64", "arm64", "riscv64", "ppc64le", "ppc64", "s390x",
                       "i686", "i386", "armv7l", "armv6l", "loongarch64"})
MAX_LINKS = 40  # Linux's own limit (ELOOP)

_openat2_works: bool | None = None  # None: not tried yet


class InRoot(NamedTuple):
    """A path below a root folder: ``root`` on this machine, ``path`` inside it ("/"-separated,
    ``""`` for the root itself). Links on the way are followed inside ``root`` only."""

    root: Path
    path: str = ""

    def __str__(self) -> str:
        return str(self.root / self.path) if self.path else str(self.root)


def _clean(path: str) -> str:
    """A path as written, lexically cleaned (as Go's ``filepath.Clean`` and Kubernetes take a
    container path): relative to the root, ``""`` for the root itself."""
    return posixpath.normpath("/" + path).lstrip("/")


def open_in_root(root_fd: int, path: str, flags: int = os.O_PATH) -> int:
    """A new descriptor (close-on-exec) of ``path`` resolved inside the folder ``root_fd``: an
    absolute link starts again at ``root_fd``, ``..`` stops there, ``/proc``'s magic links are
    refused; ``flags`` open what is found (``O_PATH`` by default: nothing of it is opened, a
    device's driver included). ``OSError`` as ``open(2)`` gives it: ``FileNotFoundError`` for a
    missing component, ``NotADirectoryError``, ``ELOOP`` past 40 links."""
    global _openat2_works
    if _openat2_works is not False:
        try:
            return _openat2(root_fd, path, flags | os.O_CLOEXEC)
        except _Unavailable:
            _openat2_works = False
    found = _walk(root_fd, path)
    if flags == os.O_PATH:
        return found
    try:
        return reopen(found, flags)
    finally:
        os.close(found)


def reopen(fd: int, flags: int) -> int:
    """Open again what ``fd`` (an ``O_PATH`` descriptor) refers to, with ``flags``: through
    ``/proc/self/fd``, which names that very file, however it was reached (no path is walked)."""
    return os.open(f"/proc/self/fd/{fd}", flags | os.O_CLOEXEC)


class _Unavailable(Exception):
    """openat2 cannot be used here: the walk in Python stands in for it."""


_syscall = None


def _openat2(root_fd: int, path: str, flags: int) -> int:
    global _syscall, _openat2_works
    if _syscall is None:
        if platform.system() != "Linux" or platform.machine() not in _UNOFFSET:
            raise _Unavailable
        import ctypes  # only the first resolution pays for it

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        how_type = ctypes.c_uint64 * 3  # struct open_how {u64 flags, mode, resolve}

        def call(dirfd: int, name: bytes, open_flags: int) -> int:
            how = how_type(open_flags, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
            result = libc.syscall(ctypes.c_long(_OPENAT2), ctypes.c_int(dirfd),
                                  ctypes.c_char_p(name), ctypes.byref(how),
                                  ctypes.c_size_t(ctypes.sizeof(how)))
            return int(result) if result >= 0 else -ctypes.get_errno()

        _syscall = call
    name = os.fsencode(path) or b"."
    for _ in range(16):
        result = _syscall(root_fd, name, flags)
        if result >= 0:
            _openat2_works = True
            return result
        if result == -errno.EAGAIN:  # a rename raced a `..`: the kernel asks for another try
            continue
        if result in (-errno.ENOSYS, -errno.EPERM) and _openat2_works is None:
            raise _Unavailable  # no openat2 here (an old kernel, a seccomp filter)
        if result in (-errno.EINVAL, -errno.E2BIG) and _openat2_works is None:
            raise _Unavailable  # a kernel that knows openat2 but not RESOLVE_IN_ROOT
        raise OSError(-result, os.strerror(-result), path)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)


def _walk(root_fd: int, path: str) -> int:
    """``RESOLVE_IN_ROOT`` one component at a time: an ``O_PATH`` descriptor of what ``path``
    names inside ``root_fd``. ``folders`` holds the descriptors of the folders walked through,
    so that ``..`` goes back to the one the walk came from, and never above ``root_fd``."""
    todo = [part for part in reversed(path.split("/")) if part not in ("", ".")]
    folders = [root_fd]  # folders[0] is the caller's
    links = 0
    try:
        while todo:
            part = todo.pop()
            if part == "..":
                if len(folders) > 1:
                    os.close(folders.pop())
                continue
            fd = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folders[-1])
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                try:
                    target = os.readlink("", dir_fd=fd)  # the link's own text, not a path's
                finally:
                    os.close(fd)
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                if target.startswith("/"):  # absolute: from the root again
                    while len(folders) > 1:
                        os.close(folders.pop())
                todo += [p for p in reversed(target.split("/")) if p not in ("", ".")]
                continue
            if todo and not stat.S_ISDIR(mode):
                os.close(fd)
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            folders.append(fd)
        if len(folders) == 1:
            return os.open(".", os.O_PATH | os.O_CLOEXEC, dir_fd=root_fd)
        return folders.pop()
    finally:
        for fd in folders[1:]:
            os.close(fd)


def _open_root(root: Path) -> int:
    # The root itself is the runner's own folder (a volume's, the pod's layer): its path is
    # trusted; what lies below it is not.
    return os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def open_path(where: InRoot) -> int:
    """An ``O_PATH`` descriptor of what ``where`` names, resolved inside its root; a whiteout
    (overlayfs's 0/0 character device: removed in the pod's view) is ``FileNotFoundError``.
    The root may be a file when ``where.path`` is empty (a file bound into the pod)."""
    if not _clean(where.path):
        fd = os.open(where.root, os.O_PATH | os.O_CLOEXEC)
    else:
        root_fd = _open_root(where.root)
        try:
            fd = open_in_root(root_fd, where.path)
        finally:
            os.close(root_fd)
    info = os.fstat(fd)
    if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
        os.close(fd)
        raise FileNotFoundError(errno.ENOENT, "removed in the pod's view", str(where))
    return fd


def find(where: InRoot) -> Path | None:
    """Where ``where`` lies on this machine once resolved inside its root (for a message or a
    look: the runner itself reads through ``open_path``), or None when nothing is there."""
    try:
        fd = open_path(where)
    except OSError:
        return None
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    finally:
        os.close(fd)


def open_parent(where: InRoot, create: bool = False) -> tuple[int, str]:
    """The folder ``where`` lies in, resolved inside its root (an ``O_RDONLY`` descriptor, to
    make, open, rename or remove entries relative to it), and its last name; with ``create``,
    the missing folders on the way are made, each in the folder its parent resolved to (as
    ``mkdir -p`` in the container would). ``ValueError`` when ``where`` is its root itself."""
    path = _clean(where.path)
    if not path:
        raise ValueError(f"{where.root} is the root itself")
    parent, _, name = path.rpartition("/")
    root_fd = _open_root(where.root)
    try:
        try:
            return open_in_root(root_fd, parent, os.O_RDONLY | os.O_DIRECTORY), name
        except FileNotFoundError:
            if not create:
                raise
        # Made one folder at a time, each resolved again from the root: a link on the way is
        # followed inside the root, and so is one made or changed meanwhile.
        flags = os.O_RDONLY | os.O_DIRECTORY
        parts = parent.split("/")
        current = os.open(".", flags | os.O_CLOEXEC, dir_fd=root_fd)
        try:
            for index, part in enumerate(parts):
                prefix = "/".join(parts[:index + 1])
                try:
                    found = open_in_root(root_fd, prefix, flags)
                except FileNotFoundError:
                    # made meanwhile, or a link that leads nowhere: resolved again below
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, dir_fd=current)
                    found = open_in_root(root_fd, prefix, flags)
                os.close(current)
                current = found
        except BaseException:
            os.close(current)
            raise
        return current, name
    finally:
        os.close(root_fd)


def remove_at(folder_fd: int, name: str) -> None:
    """Remove the entry ``name`` of a folder, whatever it is: a link itself (never what it
    points to), a file, or a folder with its tree (``shutil.rmtree`` walks by descriptor and
    follows no link)."""
    try:
        info = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(name, dir_fd=folder_fd)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=folder_fd)
