"""One ``train`` launcher per run folder: the lock file it holds while its job runs.

:class:`RunLock` is taken before any worker starts and released once the job has ended; a
second launcher on the same folder gets :class:`RunLockBusy`, naming the owner; a dead
owner's lock is taken over.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from sublimate.components.base import run_files
from sublimate.components.base.process_identity import start_ticks
from sublimate.components.monitoring import metrics

# Two runs given the same run-id (or a launcher started by hand beside a workflow's) would
# write the same checkpoints, model and metrics. The launcher holds a lock file in the run
# folder from before any worker starts until its job has ended; it records its owner, so that
# a refusal names who holds the folder.
#
# The lock is flock(2) on the file, which the kernel drops when its holder dies however it
# dies. On NFS the Linux client turns flock into a lock held by the server (NFSv4, or NLM on
# v3), so it excludes launchers on other hosts too, and a dead host's lock goes when its lease
# expires (90 s by default); mounted with ``nolock`` or ``local_lock=flock|all`` it only
# excludes processes of one host. Where flock is not supported at all (ENOLCK, EOPNOTSUPP)
# the owner record alone decides, which leaves a window of a few milliseconds between two
# launchers that start together.

RUN_LOCK_FILE = run_files.LAUNCHER_LOCK
# How long a retried step waits for the lock of its own lost attempt on another host, which
# an NFS server keeps until the lost client's lease expires.
LEASE_WAIT_SECONDS = 120.0


class RunLockBusy(RuntimeError):
    """Another live launcher holds the run folder; the message names it and the file."""


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def lock_owner(workflow: str, run_dir: Path) -> dict[str, object]:
    """This launcher, as its lock file records it."""
    return {"host": socket.gethostname(), "boot_id": _boot_id(), "pid": os.getpid(),
            "start_ticks": start_ticks(os.getpid()),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z",
                                     time.localtime(metrics.process_start_time())),
            "workflow": workflow, "run_dir": str(run_dir)}


def describe_owner(owner: dict[str, object]) -> str:
    if not owner:
        return "a launcher that has not recorded itself yet"
    workflow = f"workflow {owner['workflow']}, " if owner.get("workflow") else ""
    return (f"pid {owner.get('pid')} on {owner.get('host')} ({workflow}started "
            f"{owner.get('started')})")


class RunLock:
    """The run folder's lock file; :meth:`acquire` before any worker starts, :meth:`release`
    once the job has ended."""

    def __init__(self, run_dir: Path, owner: dict[str, object],
                 lease_wait_seconds: float = LEASE_WAIT_SECONDS, poll: float = 1.0) -> None:
        self.path = run_dir / RUN_LOCK_FILE
        self.owner = owner
        self.lease_wait_seconds = lease_wait_seconds
        self.poll = poll
        self._fd: int | None = None

    def _same_step(self, other: dict[str, object]) -> bool:
        """Whether ``other`` was an earlier attempt of this workflow's step on this folder."""
        return bool(self.owner["workflow"]) and other.get("workflow") == self.owner["workflow"] \
            and other.get("run_dir") == self.owner["run_dir"]

    def _alive_here(self, other: dict[str, object]) -> bool | None:
        """Whether ``other`` still runs (None: it ran on another host, which cannot be asked)."""
        if other.get("host") != self.owner["host"]:
            return None
        if other.get("boot_id") != self.owner["boot_id"]:
            return False  # this host has rebooted since
        pid = other.get("pid")
        return isinstance(pid, int) and start_ticks(pid) == other.get("start_ticks") \
            and pid != os.getpid()

    def _busy(self, other: dict[str, object]) -> RunLockBusy:
        return RunLockBusy(
            f"run folder {self.path.parent} is in use by the launcher {describe_owner(other)} "
            f"(lock file {self.path}); wait for that run to end or give this one another "
            "run-id")

    def acquire(self) -> str | None:
        """Take the lock, or raise :class:`RunLockBusy`; returns a line to say when a stale
        lock was taken over."""
        deadline = time.monotonic() + self.lease_wait_seconds
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                taken = self._try_acquire(fd, deadline)
            except BaseException:
                os.close(fd)
                raise
            if taken is None:  # not yet: the file went, or a lease may still expire
                os.close(fd)
                time.sleep(self.poll)
                continue
            self._fd = fd
            return taken or None

    def _try_acquire(self, fd: int, deadline: float) -> str | None:
        """'' or a takeover line once the lock is ours; None to try again."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked: bool | None = True
        except BlockingIOError:
            locked = False
        except OSError as error:
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            locked = None  # no locks on this filesystem: the owner record decides
        if locked:
            # A releasing owner unlinks the file before it unlocks it: the lock on a file no
            # longer at this path guards nothing, so start again on the new one.
            try:
                if os.stat(self.path).st_ino != os.fstat(fd).st_ino:
                    return None
            except FileNotFoundError:
                return None
        other = _read_owner(fd)
        if locked is False:
            if self._same_step(other) and self._alive_here(other) is None \
                    and time.monotonic() < deadline:
                return None  # this step's lost attempt: its host's lease may still expire
            raise self._busy(other)
        takeover = ""
        if other:
            alive = self._alive_here(other)
            if alive:
                raise self._busy(other)
            if alive is False:
                takeover = f"took over the stale lock {self.path} of {describe_owner(other)}, " \
                           "which no longer runs"
            elif locked:  # another host's launcher whose lock the NFS server has dropped
                takeover = f"took over the lock {self.path} of {describe_owner(other)}, " \
                           "whose lock was released (it ended, or its host was lost)"
            elif self._same_step(other):
                takeover = f"took over the lock {self.path} of {describe_owner(other)}, an " \
                           "earlier attempt of this step"
            else:  # no flock and another host: nothing tells whether it still runs
                raise RunLockBusy(f"{self._busy(other)}; if it no longer runs, remove the "
                                  "lock file")
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(self.owner, sort_keys=True) + "\n").encode(), 0)
        os.fsync(fd)
        return takeover

    def release(self) -> None:
        """Remove the lock file (only if it is still this lock's) and unlock it."""
        if self._fd is None:
            return
        try:
            if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:
                os.unlink(self.path)
        except FileNotFoundError:
            pass
        finally:
            os.close(self._fd)  # drops the flock, after the file is gone
            self._fd = None


def _read_owner(fd: int) -> dict[str, object]:
    """The owner a lock file records ({} if none yet, or unreadable)."""
    try:
        size = os.fstat(fd).st_size
        record = json.loads(os.pread(fd, size, 0).decode() or "{}") if size else {}
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}
