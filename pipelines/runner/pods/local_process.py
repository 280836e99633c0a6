"""Running one node's command as a local process group, with its log captured.

A step's process is tied to the runner's life: it starts with ``PR_SET_PDEATHSIG`` set to
SIGTERM (Linux), so a runner killed outright (SIGKILL, the OOM killer) still sends each running
step the SIGTERM that ``argo stop`` would, and a step that cleans up on SIGTERM (the train step's
launcher cancels its TorchX job) does so. The signal fires when the *thread* that started the
process ends: a pod's thread waits for its process, so that is the runner's own end.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

KILL_GRACE_S = 5.0
PIPE_GRACE_S = 1.0  # after the process exits, for its pipes to close

_PR_SET_PDEATHSIG = 1
_prctl_lock = threading.Lock()
_prctl: Callable[..., int] | None = None
_prctl_resolved = False


def _resolve_prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up once in the runner, never in a forked child (a lookup takes
    locks that another thread may hold at fork time); None where there is none (not Linux)."""
    global _prctl, _prctl_resolved
    with _prctl_lock:
        if not _prctl_resolved:
            _prctl_resolved = True
            try:
                import ctypes  # deferred: only a run that starts processes pays for it

                _prctl = ctypes.CDLL(None, use_errno=True).prctl
            except (OSError, AttributeError):
                _prctl = None
    return _prctl


def _die_with_runner(prctl: Callable[..., int], runner_pid: int) -> Callable[[], None]:
    """The child's last act before exec: ask for SIGTERM when the runner ends.

    Popen's ``preexec_fn`` runs in the forked child of a threaded process, where taking any lock
    another thread held at the fork can deadlock; this one makes two system calls through an
    already-resolved function and touches no lock (no import, no logging, no I/O). The setting
    survives ``exec`` and ``setsid``. A runner that died before the call left the child to init:
    the ``getppid`` check catches that race.
    """

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        # (0: the init of a PID namespace of its own, whose parent is out of its sight)
        if os.getppid() not in (runner_pid, 0):
            os._exit(143)  # the runner is already gone: do not start a step nobody stops

    return preexec


def _exit_notice(pid: int) -> int | None:
    """A descriptor that becomes readable when the process ends (a pidfd, Linux 5.3), or None
    where there is none (the waiter then looks at the process every 0.2 s)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _then(first: Callable[[], None] | None, then: Callable[[], None]) -> Callable[[], None]:
    def preexec() -> None:
        if first is not None:
            first()
        then()

    return preexec


class LocalProcess:
    """A command in its own session, so that stopping it stops everything it started."""

    def __init__(
        self,
        argv: list[str],
        cwd: Path,
        env: dict[str, str],
        log_path: Path,
        on_line: Callable[[str], None] | None = None,
        append: bool = False,  # a containerSet retry: Argo appends the attempt's log
        setup: Callable[[], None] | None = None,  # lock-free, in the child before exec
        # False: the runner's death is someone else's to act on (a container's keeper:
        # ``images.keeper``), so the process gets no PR_SET_PDEATHSIG.
        die_with_runner: bool = True,
        # Called with each stderr line; True keeps it out of the log and the output (a
        # container engine's own report of the step's end: ``images``).
        engine_line: Callable[[str], bool] | None = None,
        # Secret values to replace with *** in the log and the output (``k8s_objects``).
        masked: Iterable[str] = (),
        # True: the process is PID 1 of a PID namespace of its own (a contained pod: its
        # ``setup`` makes it the namespace's init, ``sandbox``).
        pid_namespace: bool = False,
    ) -> None:
        self.pid_namespace = pid_namespace
        self.masked = sorted((os.fsencode(m) for m in masked), key=len, reverse=True)
        self.append = append
        self.setup = setup
        self.die_with_runner = die_with_runner
        self.engine_line = engine_line
        self.argv = argv
        self.cwd = cwd
        self.env = env
        self.log_path = log_path
        self.on_line = on_line
        self.proc: subprocess.Popen[bytes] | None = None
        self._stdout: list[bytes] = []
        self._stopped = threading.Event()
        self.log_error: OSError | None = None  # the log could not be written (``_log_failed``)

    def start(self) -> None:
        """Start the process; ``OSError`` (command not found...) propagates to the caller."""
        prctl = _resolve_prctl() if self.die_with_runner else None
        preexec = _die_with_runner(prctl, os.getpid()) if prctl is not None else None
        if self.setup is not None:  # a mount namespace (mounts.setup): after PDEATHSIG is set
            preexec = _then(preexec, self.setup)
        self._log = open(self.log_path, "ab" if self.append else "wb")  # noqa: SIM115 - closed in wait()
        namespace: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if self.pid_namespace:
            from .sandbox import children_in_new_pid_namespace  # only contained pods

            namespace = children_in_new_pid_namespace()
        try:
            with namespace:
                self.proc = self._popen(preexec)
        except OSError as exc:
            self._log.write(f"failed to start {self.argv[0]!r}: {exc}\n".encode())
            self._log.close()
            raise

    def _popen(self, preexec: Callable[[], None] | None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=preexec,  # lock-free: see _die_with_runner
        )

    def _line(self, line: bytes, is_stdout: bool) -> None:
        """One line of the process's output (its newline kept), as it comes; a secret's value
        in it is replaced by ``***`` before anything sees it."""
        for secret in self.masked:
            line = line.replace(secret, b"***")
        text = line.decode("utf-8", "replace").rstrip("\r\n")
        if not is_stdout and self.engine_line is not None and self.engine_line(text):
            return
        if is_stdout:
            self._stdout.append(line)
        try:
            self._log.write(line)
        except OSError as error:
            self._log_failed(error)
        if self.on_line is not None:
            self.on_line(text)

    def wait(self) -> tuple[int, str]:
        """Read the output as it comes until the process has ended, then return its exit code
        and the captured stdout. The waiting thread reads both pipes itself: a reader thread
        per pipe would be two more threads, and wake-ups, per step. Once the process has
        exited, its pipes get ``PIPE_GRACE_S`` to close; background children still holding
        them are then killed, as Argo would have torn the pod down."""
        assert self.proc is not None and self.proc.stdout and self.proc.stderr
        streams = {self.proc.stdout.fileno(): True, self.proc.stderr.fileno(): False}
        partial = dict.fromkeys(streams, b"")
        exited = _exit_notice(self.proc.pid)
        deadline: float | None = None  # set once the process has exited
        killed = False
        with selectors.DefaultSelector() as selector:
            for fd in streams:
                selector.register(fd, selectors.EVENT_READ)
            if exited is not None:
                selector.register(exited, selectors.EVENT_READ)
            while any(fd in selector.get_map() for fd in streams):
                if deadline is None:
                    timeout = None if exited is not None else 0.2  # no pidfd: look now and then
                else:
                    timeout = None if killed else max(0.0, deadline - time.monotonic())
                ready = selector.select(timeout)
                if deadline is not None and not ready and not killed:
                    self._signal(signal.SIGKILL)  # children kept the pipes open
                    killed = True
                for key, _ in ready:
                    if key.fd == exited:
                        selector.unregister(exited)
                        deadline = time.monotonic() + PIPE_GRACE_S
                        continue
                    data = os.read(key.fd, 65536)
                    if not data:
                        selector.unregister(key.fd)
                        if partial[key.fd]:
                            self._line(partial[key.fd], streams[key.fd])
                        continue
                    *lines, partial[key.fd] = (partial[key.fd] + data).split(b"\n")
                    for line in lines:
                        self._line(line + b"\n", streams[key.fd])
                    try:
                        self._log.flush()
                    except OSError as error:
                        self._log_failed(error)
                if deadline is None and exited is None and self.proc.poll() is not None:
                    deadline = time.monotonic() + PIPE_GRACE_S
        if exited is not None:
            os.close(exited)
        code = self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()
        try:
            self._log.close()
        except OSError as error:
            self._log_failed(error)
        if self.log_error is not None:  # the process has ended and nothing of it is left
            from sublimate.components.base.disk_full import disk_full_cause, disk_full_error

            cause = disk_full_cause(self.log_error)
            if cause is None:
                raise self.log_error
            raise disk_full_error(cause, self.log_path,
                                  f"writing the log {self.log_path}") from self.log_error
        return code, b"".join(self._stdout).decode("utf-8", "replace")

    def _log_failed(self, error: OSError) -> None:
        """The log cannot be written (its disk is full): its output is still read, so that the
        process never blocks on a full pipe, and the error is raised once it has ended."""
        self.log_error = self.log_error or error
        with contextlib.suppress(OSError):  # its buffer, which cannot be written either
            self._log.close()
        self._log = open(os.devnull, "wb")  # noqa: SIM115 - closed in wait()

    def stop(self, grace_s: float = KILL_GRACE_S) -> None:
        """SIGTERM the whole process group, then SIGKILL it after a grace period."""
        if self.proc is None or self._stopped.is_set():
            return
        self._stopped.set()
        self._signal(signal.SIGTERM)
        timer = threading.Timer(grace_s, self._signal, args=(signal.SIGKILL,))
        timer.daemon = True
        timer.start()

    def kill(self) -> None:
        """SIGKILL the whole process group now (``argo terminate``: no grace period)."""
        if self.proc is None:
            return
        self._stopped.set()
        self._signal(signal.SIGKILL)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def _signal(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)
