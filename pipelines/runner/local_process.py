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
import signal
import subprocess
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

KILL_GRACE_S = 5.0

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
        if os.getppid() != runner_pid:
            os._exit(143)  # the runner is already gone: do not start a step nobody stops

    return preexec


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
    ) -> None:
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
        self._log_lock = threading.Lock()
        self._stopped = threading.Event()

    def start(self) -> None:
        """Start the process; ``OSError`` (command not found...) propagates to the caller."""
        prctl = _resolve_prctl() if self.die_with_runner else None
        preexec = _die_with_runner(prctl, os.getpid()) if prctl is not None else None
        if self.setup is not None:  # a mount namespace (mounts.setup): after PDEATHSIG is set
            preexec = _then(preexec, self.setup)
        self._log = open(self.log_path, "ab" if self.append else "wb")  # noqa: SIM115 - closed in wait()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=preexec,  # lock-free: see _die_with_runner
            )
        except OSError as exc:
            self._log.write(f"failed to start {self.argv[0]!r}: {exc}\n".encode())
            self._log.close()
            raise
        self._readers = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, True), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, False), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _pump(self, pipe: IO[bytes], is_stdout: bool) -> None:
        for line in iter(pipe.readline, b""):
            for secret in self.masked:
                line = line.replace(secret, b"***")
            if not is_stdout and self.engine_line is not None and \
                    self.engine_line(line.decode("utf-8", "replace").rstrip("\r\n")):
                continue
            if is_stdout:
                self._stdout.append(line)
            with self._log_lock:
                self._log.write(line)
                self._log.flush()
            if self.on_line is not None:
                self.on_line(line.decode("utf-8", "replace").rstrip("\r\n"))
        pipe.close()

    def wait(self) -> tuple[int, str]:
        """Wait for the exit code and the captured stdout."""
        assert self.proc is not None
        code = self.proc.wait()
        for reader in self._readers:
            reader.join(timeout=1.0)
        if any(reader.is_alive() for reader in self._readers):
            # Background children still hold the pipes; Argo would have torn the pod down.
            self._signal(signal.SIGKILL)
            for reader in self._readers:
                reader.join()
        self._log.close()
        return code, b"".join(self._stdout).decode("utf-8", "replace")

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
