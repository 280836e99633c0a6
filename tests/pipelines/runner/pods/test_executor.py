"""The local executor's side of the contract, with real processes: a ``PodRequest`` in, a
``PodOutcome`` out, and the hooks called around the process."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from sublimate.pipelines.runner import LocalExecutor, PodOutcome, PodRequest
from sublimate.pipelines.runner.pods.scope import Stoppable


class Hooks:
    def __init__(self, stop_after: float | None = None) -> None:
        self.lines: list[str] = []
        self.started: list[Stoppable] = []
        self.exited: list[Stoppable] = []
        self.stop_after = stop_after

    def on_line(self, line: str) -> None:
        self.lines.append(line)

    def on_start(self, handle: Stoppable) -> None:
        self.started.append(handle)
        if self.stop_after is not None:
            threading.Timer(self.stop_after, handle.stop).start()

    def on_exit(self, handle: Stoppable) -> None:
        self.exited.append(handle)


def request(tmp_path: Path, argv: list[str], **fields: object) -> PodRequest:
    folder = tmp_path / "nodes" / "n-1"
    folder.mkdir(parents=True)
    return PodRequest(node_id="wf-1", node_name="wf.n", display_name="n", template="t",
                      argv=argv, env=fields.pop("env", {}),  # type: ignore[arg-type]
                      cwd=folder, folder=folder, run_dir=tmp_path, **fields)  # type: ignore[arg-type]


def test_runs_the_request_with_this_python_and_layered_env(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    # Only a short list of the runner's environment reaches a pod (pods/environment.py);
    # what `sublimate run --env` passed does, and the runner's own variables win.
    monkeypatch.setenv("FROM_RUNNER", "not for pods")
    monkeypatch.setenv("SUBLIMATE_LOCAL_RUN", "0")
    source = ("import os, sys; print(sys.executable); print(os.getcwd()); "
              "print(os.environ.get('FROM_RUNNER', 'absent'), os.environ['MINE'], "
              "os.environ['PASSED'], os.environ['SUBLIMATE_LOCAL_RUN'], "
              "os.environ['PYTHONUNBUFFERED']); "
              "print('to stderr', file=sys.stderr)")
    req = request(tmp_path, ["python", "-c", source], env={"MINE": "set"},
                  passed_env={"PASSED": "given"})
    hooks = Hooks()
    outcome = LocalExecutor().run(req, hooks)
    assert outcome.exit_code == 0 and not outcome.error and not outcome.stopped
    assert outcome.stdout.splitlines() == [sys.executable, str(req.cwd),
                                           "absent set given 1 1"]
    assert "to stderr" in hooks.lines and "to stderr" in req.log.read_text()
    assert len(hooks.started) == 1 and hooks.exited == hooks.started


def test_a_command_that_cannot_start(tmp_path: Path) -> None:
    hooks = Hooks()
    outcome = LocalExecutor().run(request(tmp_path, ["/no/such/binary"]), hooks)
    assert outcome == PodOutcome(exit_code=None,
                                 error="failed to start '/no/such/binary': No such file or "
                                       "directory")
    assert hooks.started == []  # never Running


def test_a_failure_reports_its_termination_message(tmp_path: Path) -> None:
    script = ('import os; open(os.environ["SUBLIMATE_TERMINATION_LOG"], "w")'
              '.write("bad\\n  input"); raise SystemExit(4)')
    req = request(tmp_path, [sys.executable, "-c", script])
    req.termination_log.write_text("stale, from before")  # removed before the start
    outcome = LocalExecutor().run(req, Hooks())
    assert (outcome.exit_code, outcome.message) == (4, "bad input")
    silent = request(tmp_path / "b", [sys.executable, "-c", "raise SystemExit(1)"])
    silent.termination_log.write_text("stale")
    assert LocalExecutor().run(silent, Hooks()).message == ""


def test_stopping_the_handle_stops_the_process_group(tmp_path: Path) -> None:
    began = time.monotonic()
    outcome = LocalExecutor().run(request(tmp_path, ["sh", "-c", "sleep 30 & sleep 30"]),
                                  Hooks(stop_after=0.2))
    assert outcome.stopped and outcome.exit_code != 0
    assert time.monotonic() - began < 5
