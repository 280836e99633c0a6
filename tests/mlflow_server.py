"""A real MLflow tracking server on loopback for the tests: ``mlflow server`` (the full
``mlflow`` package, in the ``test`` extra) with a SQLite store and an artifact folder under a
test's temporary folder, bound to 127.0.0.1 on a free port, one worker. It answers ``/health``
after about 11 s on 2 cores, so the tests of a module share one."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def mlflow_command() -> list[str] | None:
    """How to start the server (None: the full mlflow package is not installed)."""
    executable = Path(sys.executable).with_name("mlflow")
    if executable.is_file():
        return [str(executable)]
    found = shutil.which("mlflow")
    return [found] if found else None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def closed_port() -> int:
    """A port nothing listens on (a server that is down)."""
    return free_port()


@contextmanager
def mlflow_server(workdir: Path, timeout: float = 90.0) -> Iterator[str]:
    """A running server; yields its URI. Stopped, with its whole process group, at the end."""
    command = mlflow_command()
    if command is None:
        raise RuntimeError("mlflow is not installed: pip install -e '.[test]'")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = open(workdir / "mlflow.log", "wb")  # noqa: SIM115 - closed in finally
    # SIGTERM to the server when the thread that started it ends (PR_SET_PDEATHSIG), so a
    # killed test run leaves no server behind; its own session, so that it and its workers
    # are stopped together.
    process = subprocess.Popen(
        ["setpriv", "--pdeathsig", "TERM", "--", *command, "server",
         "--backend-store-uri", f"sqlite:///{workdir / 'mlflow.db'}",
         "--artifacts-destination", str(workdir / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=workdir,
        # no job runner: MLflow 3 starts several huey consumers for its GenAI jobs (scorers,
        # evaluations), which sublimate never submits and which took CPU from the suite
        env={**os.environ, "MLFLOW_TRACKING_URI": "",
             "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {process.returncode}:\n"
                                   + (workdir / "mlflow.log").read_text()[-2000:])
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=1) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not answer in {timeout:g}s:\n"
                                   + (workdir / "mlflow.log").read_text()[-2000:])
            time.sleep(0.2)
        yield uri
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
