"""Nothing of a ``local_cwd`` job outlives its launcher, however the launcher ends.

TorchX's ``local_cwd`` starts every node (a torchrun agent) in a session of its own, and the
agents fork or start the workers. A launcher that cancels its job on SIGTERM cleans all that
up, but a launcher that ends otherwise does not: killed with SIGKILL (the runner's grace period
after a stop, the OOM killer), or by a second SIGTERM while it cancels (a runner killed outright
sends its steps one ``PR_SET_PDEATHSIG`` SIGTERM per thread that exits, so a launcher can get
several). The agents are then reparented to init and go on: for the rendezvous's join timeout,
for a collective's timeout, or to the end of the training.

So every process of the job carries a mark in its environment (:data:`MARK_ENV`, set on each
replica before it starts; agents, forked workers and workers that torchrun starts afresh all
inherit it), and a small reaper process, started before the first replica, holds the read end
of a pipe whose write end only the launcher has. When that pipe reaches its end (the launcher
closed it after its job, or died, however it died), the reaper SIGKILLs every process that
carries the mark, until none is left. A SIGKILL is safe here: checkpoints are committed by a
rename, and nobody is left to report on a graceful end. ``local_netns`` needs none of this:
each node is a PID namespace whose holder dies with the launcher (``PR_SET_PDEATHSIG``), and
the kernel ends every process of a namespace whose init died.

The reaper runs this file as a script, ``python -I -S job_reaper.py VARIABLE MARK``: only the
standard library, so it starts in a few tens of milliseconds and costs the job's start-up
nothing. The test suite uses the same reaper, with a variable of its own, for every process a
test starts (``tests/conftest.py``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

MARK_ENV = "SUBLIMATE_JOB_MARK"
# How long the reaper keeps killing (processes forking while it kills) before it gives up.
REAP_SECONDS = 10.0
# How long the launcher waits for the reaper to finish after closing its pipe.
CLOSE_SECONDS = REAP_SECONDS + 5.0


def marked_processes(mark: str, variable: str = MARK_ENV) -> list[int]:
    """The pids of the running processes whose environment holds ``variable=mark`` (a process
    that is a zombie already has no environment to read)."""
    entry = f"\0{variable}={mark}\0".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        # gone meanwhile, or another user's
        with contextlib.suppress(OSError), open(f"/proc/{name}/environ", "rb") as environ:
            if entry in b"\0" + environ.read():
                found.append(int(name))
    return found


def reap(mark: str, variable: str = MARK_ENV, seconds: float = REAP_SECONDS) -> int:
    """SIGKILL every process marked ``variable=mark`` until none is left (or ``seconds``
    passed); returns how many were killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + seconds
    while (found := marked_processes(mark, variable)) and time.monotonic() < deadline:
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        time.sleep(0.01)  # let the kernel take them down before looking again
    return len(killed)


def watch(mark: str, variable: str = MARK_ENV) -> None:
    """The reaper's life: wait for the end of stdin (the launcher's end), then :func:`reap`.

    Started in its own session, so the runner's stop (a signal to the launcher's process group)
    does not reach it, and deaf to SIGINT and SIGHUP besides: a Ctrl-C must leave it to act.
    """
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):
        pass
    reap(mark, variable)


class JobReaper:
    """The starter's side: the mark for the processes to end with it, and the reaper process.

    ``variable``: the environment variable that carries the mark (the launcher's jobs use
    :data:`MARK_ENV`; another starter, such as the test suite, uses its own, so that the two
    kinds of marks never hide each other).
    """

    def __init__(self, variable: str = MARK_ENV) -> None:
        self.variable = variable
        self.mark = f"{os.getpid()}-{secrets.token_hex(8)}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the reaper (once): before the first replica, so that none can escape it."""
        if self.process is not None:
            return
        # The pipe's write end stays in this process alone (non-inheritable, and every
        # subprocess closes its other descriptors), so its end is this process's end.
        self.process = subprocess.Popen(
            [sys.executable, "-I", "-S", str(Path(__file__).resolve()), self.variable,
             self.mark],
            stdin=subprocess.PIPE, start_new_session=True)

    def close(self) -> None:
        """End whatever of the job is left, and wait for the reaper to do it (safe to repeat)."""
        if self.process is None or self.process.stdin is None or self.process.stdin.closed:
            return
        self.process.stdin.close()
        try:
            self.process.wait(timeout=CLOSE_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# the reaper: python -I -S job_reaper.py VARIABLE MARK
if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -I -S job_reaper.py VARIABLE MARK")
    watch(sys.argv[2], sys.argv[1])
