"""Running one node's command as a local process group, with its log captured."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

KILL_GRACE_S = 5.0


class LocalProcess:
    """A command in its own session, so that stopping it stops everything it started."""

    def __init__(
        self,
        argv: list[str],
        cwd: Path,
        env: dict[str, str],
        log_path: Path,
        on_line: Callable[[str], None] | None = None,
    ) -> None:
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
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in wait()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
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

    def stop(self) -> None:
        """SIGTERM the whole process group, then SIGKILL it after a grace period."""
        if self.proc is None or self._stopped.is_set():
            return
        self._stopped.set()
        self._signal(signal.SIGTERM)
        timer = threading.Timer(KILL_GRACE_S, self._signal, args=(signal.SIGKILL,))
        timer.daemon = True
        timer.start()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def _signal(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)
