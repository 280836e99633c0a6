"""One launcher per run folder: a second one is refused while the first lives, a dead one's
lock is taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sublimate.components.base.process_identity import start_ticks
from sublimate.components.data.datasets import build_builtin
from sublimate.components.launch.run_lock import (
    RUN_LOCK_FILE,
    RunLock,
    RunLockBusy,
    describe_owner,
    lock_owner,
)

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "LOGLEVEL": "WARNING"}


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_builtin("digits", tmp_path_factory.mktemp("data") / "digits")


def _launcher(digits: Path, run_dir: Path, termination: Path) -> list[str]:
    return [sys.executable, "-m", "sublimate.components.steps.train", "--data-dir", str(digits),
            "--run-dir", str(run_dir), "--scheduler", "local_cwd", "--nodes", "1",
            "--epochs", "2", "--global-batch-size", "32", "--workflow-name", termination.stem]


def _wait_for_owner(lock: Path, pid: int, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            owner = json.loads(lock.read_text() or "{}")
        except (OSError, ValueError):
            owner = {}
        if owner.get("pid") == pid:
            return owner
        time.sleep(0.02)
    raise AssertionError(f"launcher {pid} did not record itself in {lock}")


def test_a_second_launcher_on_the_same_run_folder_is_refused(digits: Path,
                                                             tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = subprocess.Popen(_launcher(digits, run_dir, tmp_path / "wf-first"), env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        owner = _wait_for_owner(run_dir / RUN_LOCK_FILE, first.pid)
        assert first.poll() is None, "the first launcher is still running"
        termination = tmp_path / "termination-log"
        second = subprocess.run(
            _launcher(digits, run_dir, tmp_path / "wf-second"), capture_output=True, text=True,
            timeout=120, env={**ENV, "SUBLIMATE_TERMINATION_LOG": str(termination)})
        first_out, first_err = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert second.returncode == 2, second.stdout + second.stderr
    assert second.stderr == (
        f"train: error: run folder {run_dir} is in use by the launcher pid {first.pid} on "
        f"{socket.gethostname()} (workflow wf-first, started {owner['started']}) (lock file "
        f"{run_dir / RUN_LOCK_FILE}); wait for that run to end or give this one another "
        "run-id\n")
    assert termination.read_text() == second.stderr.removeprefix("train: error: ").strip()
    assert "submitted" not in second.stdout
    # the first launcher's run is whole: one job, its model, its summary; the lock is gone
    assert first.returncode == 0, first_out + first_err
    assert "train: finished in" in first_out and "took over" not in first_err
    assert (run_dir / "model.pt").stat().st_size > 0
    assert json.loads((run_dir / "train-summary.json").read_text())
    assert len(list((run_dir / "logs" / "torchx").iterdir())) == 1
    assert not (run_dir / RUN_LOCK_FILE).exists()


def _dead_owner(run_dir: Path) -> dict[str, object]:
    """The record a launcher killed with SIGKILL leaves: its process is gone."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return {**lock_owner("wf-old", run_dir), "pid": gone.pid, "start_ticks": 1}


def test_a_stale_lock_is_taken_over_in_one_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dead = _dead_owner(run_dir)
    (run_dir / RUN_LOCK_FILE).write_text(json.dumps(dead))
    lock = RunLock(run_dir, lock_owner("wf-new", run_dir))
    said = lock.acquire()
    try:
        assert said == (f"took over the stale lock {run_dir / RUN_LOCK_FILE} of "
                        f"{describe_owner(dead)}, which no longer runs")
        recorded = json.loads((run_dir / RUN_LOCK_FILE).read_text())
        assert (recorded["pid"], recorded["workflow"]) == (os.getpid(), "wf-new")
        with pytest.raises(RunLockBusy, match=r"in use by the launcher pid \d+ .*workflow "
                                               r"wf-new"):
            RunLock(run_dir, lock_owner("wf-third", run_dir)).acquire()
    finally:
        lock.release()
    assert not (run_dir / RUN_LOCK_FILE).exists()
    assert RunLock(run_dir, lock_owner("wf-third", run_dir)).acquire() is None  # free again


def test_a_live_owner_is_refused_even_where_flock_is_not_kept(tmp_path: Path) -> None:
    # A record of a running process of this host, with no flock held (as on a filesystem
    # without locks): the record alone refuses.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner = {**lock_owner("wf-old", run_dir), "pid": alive.pid,
                 "start_ticks": start_ticks(alive.pid)}
        (run_dir / RUN_LOCK_FILE).write_text(json.dumps(owner))
        with pytest.raises(RunLockBusy, match=f"in use by the launcher pid {alive.pid} "):
            RunLock(run_dir, lock_owner("wf-new", run_dir)).acquire()
    finally:
        alive.kill()
        alive.wait()


def test_another_hosts_released_lock_is_taken_over(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lost = {**lock_owner("wf-1", run_dir), "host": "train-pod-lost", "pid": 7}
    (run_dir / RUN_LOCK_FILE).write_text(json.dumps(lost))
    lock = RunLock(run_dir, lock_owner("wf-1", run_dir))
    try:
        assert lock.acquire() == (
            f"took over the lock {run_dir / RUN_LOCK_FILE} of {describe_owner(lost)}, whose "
            "lock was released (it ended, or its host was lost)")
    finally:
        lock.release()
