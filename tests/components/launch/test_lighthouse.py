"""The Lighthouse role (launch/lighthouse.py): torchft's Rust quorum server, without torch."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from sublimate.components.base.ports import free_port
from sublimate.components.launch import lighthouse
from tests.conftest import wait_for


def _dashboard(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1) as answer:
            return answer.read().decode()
    except OSError:
        return None


def test_the_lighthouse_serves_without_loading_torch() -> None:
    """torchft's own ``torchft_lighthouse`` script imports the torchft package, whose __init__
    loads torch: 1.2 CPU-s before a server that never uses it listens. The role loads torchft's
    extension module alone."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", lighthouse.MODULE, "--port", str(port), "--min-groups", "2",
         "--bind", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        page = wait_for(lambda: _dashboard(port), 60, "the lighthouse's dashboard")
        assert "Lighthouse" in page
        mapped = Path(f"/proc/{process.pid}/maps").read_text()
        assert "_torchft" in mapped and "libtorch" not in mapped
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.stdout is not None
    assert "quorums of at least 2 group(s)" in process.stdout.read()


def test_a_missing_torchft_is_one_line_saying_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lighthouse.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit) as exit_:
        lighthouse.main(["--port", "1", "--min-groups", "1", "--bind", "127.0.0.1"])
    assert exit_.value.code == ("lighthouse: error: torchft's lighthouse is not installed: "
                                "recovery per-step needs torchft (pip install torchft)")
