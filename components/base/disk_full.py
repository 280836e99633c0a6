"""A full disk in one line: which disk, and what was being written.

A write that finds its disk full (``ENOSPC``; ``EDQUOT``, the user's quota, likewise) fails deep
inside whatever was writing, and says little there: torch's zip writer raises ``unexpected pos
35520 vs 35472`` with the ``OSError`` only as its context, ``torch.distributed.checkpoint``
gathers it per rank into a ``CheckpointException``, a buffered file raises it on ``close`` with
no file name. What a user needs is the disk to free (its mount point, as the process that wrote
sees it: a step sees its volume at the manifest's path) and what did not fit:

    disk full: no space left on /mnt/sublimate (tmpfs) while saving checkpoint step 44 to ...

Writers wrap what they write in :func:`writing`, which turns such a failure into a
:class:`DiskFullError` saying that; :func:`explain` finds the line (or words one) for any
exception whose chain holds a full disk, for the catch-alls at a program's edge.

Light imports only: the local runner and ``sublimate run`` load this on their way.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .runtime import shown_path

# What each errno says of the disk; both mean "free space on that disk, then run again".
FULL_ERRNOS = {errno.ENOSPC: "disk full: no space left", errno.EDQUOT: "disk quota exceeded"}


class DiskFullError(OSError):
    """A write that did not fit, in one line (``str``): the disk and what was being written.
    An ``OSError`` with the errno of the original failure, so that whoever handled a full disk
    as an ``OSError`` still does."""

    def __init__(self, message: str, code: int = errno.ENOSPC) -> None:
        super().__init__(code, message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[type[DiskFullError], tuple[str, int]]:
        # OSError pickles as (errno, strerror), in the other order: DCP and multiprocessing
        # carry a rank's exception across processes by pickling it.
        return DiskFullError, (self.message, self.errno or errno.ENOSPC)


def disk_full_cause(error: BaseException) -> OSError | None:
    """The full disk behind ``error``: itself, or an exception it was raised from or while
    handling, in an exception group, or in a ``CheckpointException``'s per-rank failures
    (torch's DCP); None when no disk was full."""
    pending: list[object] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop(0)
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in FULL_ERRNOS:
            return current
        pending += [current.__cause__, current.__context__]
        pending += list(getattr(current, "exceptions", None) or ())
        failures = getattr(current, "failures", None)  # DCP: {rank: (exception, traceback)}
        if isinstance(failures, dict):
            pending += [failure[0] if isinstance(failure, tuple) and failure else failure
                        for failure in failures.values()]
    return None


def mount_of(path: str | Path) -> tuple[str, str]:
    """The mount point that holds ``path`` (which need not exist yet) and its filesystem's type,
    as this process sees them (``/proc/self/mountinfo``); ``("/", "")`` where that cannot be
    read."""
    target = os.path.realpath(path)
    best, kind = "/", ""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as table:
            lines = table.readlines()
    except OSError:
        return _mount_by_walking(target), ""
    for line in lines:
        # ``id parent major:minor root mount-point options... - type source super-options``
        fields = line.split()
        if "-" not in fields[6:] or len(fields) < 5:
            continue
        point = _unescape(fields[4])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        # ``>=``: a later line at the same point is mounted over the earlier one.
        if inside and len(point) >= len(best):
            best, kind = point, fields[fields.index("-", 6) + 1]
    return best, kind


def _unescape(field: str) -> str:
    """A mountinfo path, whose spaces, tabs, newlines and backslashes are octal escapes."""
    for code in ("040", "011", "012", "134"):
        field = field.replace(f"\\{code}", chr(int(code, 8)))
    return field


def _mount_by_walking(target: str) -> str:
    folder = Path(target)
    while not os.path.ismount(folder) and folder != folder.parent:
        folder = folder.parent
    return str(folder)


def describe(error: OSError, path: str | Path, what: str) -> str:
    """``disk full: no space left on /mnt/x (tmpfs) while <what>``: the disk that holds
    ``path``, and what was being written. In a local run the mount point of a volume is named
    by its folder on this machine, where the user can free it (``runtime.shown_path``)."""
    point, kind = mount_of(path)
    point = shown_path(point)
    said = FULL_ERRNOS.get(error.errno or errno.ENOSPC, FULL_ERRNOS[errno.ENOSPC])
    return f"{said} on {point}{f' ({kind})' if kind else ''} while {what}"


def disk_full_error(cause: OSError, path: str | Path, what: str) -> DiskFullError:
    """The :class:`DiskFullError` for ``cause`` (an ``ENOSPC`` or ``EDQUOT``), its disk found
    from ``path``."""
    return DiskFullError(describe(cause, path, what), cause.errno or errno.ENOSPC)


@contextmanager
def writing(path: str | Path, what: str) -> Iterator[None]:
    """Raise a :class:`DiskFullError` naming the disk of ``path`` and ``what`` (``saving
    checkpoint step 3 to ...``) when the body fails for a full disk; anything else passes."""
    try:
        yield
    except DiskFullError:
        raise  # said already, by a writer nearer to the disk
    except BaseException as error:
        cause = disk_full_cause(error)
        if cause is None:
            raise
        raise disk_full_error(cause, path, what) from error


def said(error: BaseException) -> str | None:
    """The line a writer said (a :class:`DiskFullError` in ``error``'s chain), if one did."""
    pending: list[BaseException | None] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, DiskFullError):
            return current.message
        pending += [current.__cause__, current.__context__]
    return None


def explain(error: BaseException, what: str = "", near: Iterable[str | Path] = ()
            ) -> str | None:
    """The one line for ``error`` when a full disk is behind it, else None: the line a writer
    said (:func:`said`), else words for the bare ``OSError``: its file's disk; with no file
    named (a buffered file fails on ``close``), the first of this process's output files whose
    disk is full (a ``print`` that found its log's disk full), else the first of the paths
    ``near`` (what the program was told to write to) whose disk is full; else the errno alone."""
    cause = disk_full_cause(error)
    if cause is None:
        return None
    line = said(error)
    if line is not None:
        return line
    if cause.filename:
        return describe(cause, cause.filename, what or f"writing {cause.filename}")
    output = _full_output()
    if output is not None:
        return describe(cause, output, what or f"writing this process's output to {output}")
    for path in near:
        if is_full(path):
            return describe(cause, path, what or "writing (the error names no file; this "
                                                 "disk has no space left)")
    return f"{FULL_ERRNOS[cause.errno or errno.ENOSPC]} while {what or 'writing'} " \
           f"({cause.strerror or 'no file named'})"


def is_full(path: str | Path) -> bool:
    """Whether the disk that holds ``path`` (or its nearest existing folder) has no space
    left for this user."""
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return os.statvfs(folder).f_bavail == 0
    except OSError:
        return False


def full_disk_note(path: str | Path) -> str | None:
    """``disk full: no space left on /x (tmpfs), which holds <path>`` when the disk of
    ``path`` has no space left, else None: for a failure whose process could write no word of
    its own there (an error file, a log)."""
    if not is_full(path):
        return None
    point, kind = mount_of(path)
    return (f"{FULL_ERRNOS[errno.ENOSPC]} on {shown_path(point)}{f' ({kind})' if kind else ''}"
            f", which holds {shown_path(path)}")


def _full_output() -> str | None:
    """Where this process's stdout or stderr goes, when that is a file on a full disk."""
    for fd in (1, 2):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/") and os.path.isfile(target) and is_full(target):
            return target
    return None
