from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
