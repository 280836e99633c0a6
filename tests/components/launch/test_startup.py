"""Launch-to-first-step: what the train step records about its own start-up, and what keeps it
short (no torch in the launcher, workers forked from the torchrun agent)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sublimate.components.data.datasets import build_builtin
from sublimate.components.monitoring import metrics

# On CPU nodes the torchrun agent imports torch, meets the other nodes and forks its workers.
FORKED_PHASES = ["launcher", "scheduler", "agent_imports", "agent_rendezvous", "preload", "fork",
                 "interpreter", "imports", "process_group", "data", "setup", "first_step"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_builtin("digits", tmp_path_factory.mktemp("data") / "digits")


def _launch(data_dir: Path, run_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sublimate.components.steps.train", "--data-dir", str(data_dir),
         "--run-dir", str(run_dir), "--scheduler", "local_cwd", "--checkpoint-every", "0",
         *flags], env=ENV, capture_output=True, text=True, timeout=300, check=False)


def test_the_clock_splits_the_launch_into_phases_that_sum_to_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    monkeypatch.setenv(metrics.LAUNCH_TIME_ENV, f"{now - 5:.3f}")
    monkeypatch.setenv(metrics.SUBMIT_TIME_ENV, f"{now - 4.5:.3f}")
    clock = metrics.StartupClock(now - 0.5)
    for phase in ("imports", "process_group", "first_step"):
        clock.mark(phase)
    phases = clock.phases()
    assert list(phases) == ["launcher", "agents", "interpreter", "imports", "process_group",
                            "first_step"]
    assert phases["launcher"] == pytest.approx(0.5, abs=0.002)
    assert sum(phases.values()) == pytest.approx(clock.total(), abs=0.01)
    assert min(phases.values()) >= 0
    assert metrics.format_startup(4.1, {"launcher": 0.6, "agents": 1.93, "first_step": 0.3}) == \
        "launch to first step 4.1s (launcher 0.6s, agents 1.9s, first step 0.3s)"


def test_without_the_launcher_the_clock_starts_with_the_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(metrics.LAUNCH_TIME_ENV, raising=False)
    monkeypatch.delenv(metrics.SUBMIT_TIME_ENV, raising=False)
    created = metrics.process_start_time()
    assert created <= time.time()
    clock = metrics.StartupClock(time.time())
    clock.mark("first_step")
    assert list(clock.phases()) == ["interpreter", "first_step"]
    assert clock.origin <= clock.marks[0][1]


def test_the_launcher_submits_without_importing_torch(digits: Path, tmp_path: Path) -> None:
    # torch takes about a second to import: the workers need it, the launcher must not pay it
    program = (
        "import sys\n"
        "from sublimate.components.data import datasets\n"
        "from sublimate.components.launch import job_runner, launcher\n"
        "from sublimate.components.steps import train\n"
        f"args = train.parse_args(['--data-dir', {str(digits)!r}, '--run-dir', "
        f"{str(tmp_path / 'run')!r}])\n"
        "assert datasets.data_problem(args.data_dir, args.global_batch_size, True) is None\n"
        "launcher.build_app(args, train.plan(args))\n"
        "job_runner.make_runner('local_cwd')\n"
        "print(sorted(m for m in ('torch', 'prometheus_client') if m in sys.modules))\n")
    completed = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                               check=True, env=ENV)
    assert completed.stdout.strip() == "[]"


def test_a_sync_run_records_its_launch_to_first_step(digits: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    completed = _launch(digits, run_dir, "--epochs", "2")
    assert completed.returncode == 0, completed.stderr
    summary = json.loads((run_dir / "train-summary.json").read_text())
    total, phases = summary["launch_to_first_step_seconds"], summary["startup"]
    assert isinstance(total, float) and total > 0
    assert list(phases) == FORKED_PHASES  # in the order they happened
    assert min(phases.values()) >= 0
    assert sum(phases.values()) == pytest.approx(total, abs=0.02)
    # one line in the step's log, after training
    lines = [line for line in completed.stdout.splitlines()
             if line.startswith("train: launch to first step ")]
    assert lines == [f"train: {metrics.format_startup(total, phases)}"]
    assert "(launcher " in lines[0] and " first step " in lines[0]
    # in the first epoch's record of every rank, each measuring its own
    for rank in (0, 1):
        records = [json.loads(line) for line in
                   (run_dir / "metrics" / f"rank-{rank}.jsonl").read_text().splitlines()]
        assert records[0]["launch_to_first_step_seconds"] > 0
        assert "launch_to_first_step_seconds" not in records[1]
    # per-epoch evaluation is on by default: an accuracy per epoch, from rank 0
    assert [point[1] for point in summary["accuracy_curve"]] == [22, 44]
    assert summary["evaluation_seconds"] >= 0


def test_evaluation_can_be_turned_off(digits: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    completed = _launch(digits, run_dir, "--epochs", "1", "--eval-every-epoch", "false")
    assert completed.returncode == 0, completed.stderr
    summary = json.loads((run_dir / "train-summary.json").read_text())
    assert summary["accuracy_curve"] == [] and summary["evaluation_seconds"] == 0
    assert "test-accuracy" not in completed.stdout
    record = json.loads((run_dir / "metrics" / "rank-0.jsonl").read_text().splitlines()[0])
    assert "test_accuracy" not in record


def test_an_async_run_records_its_launch_and_evaluates(digits: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    completed = _launch(digits, run_dir, "--algorithm", "async", "--epochs", "1")
    assert completed.returncode == 0, completed.stderr
    summary = json.loads((run_dir / "train-summary.json").read_text())
    total, phases = summary["launch_to_first_step_seconds"], summary["startup"]
    # no torchrun agent here: TorchX starts the server and trainers itself
    assert list(phases) == ["launcher", "scheduler", "interpreter", "imports", "data", "setup",
                            "process_group", "first_step"]
    assert sum(phases.values()) == pytest.approx(total, abs=0.02)
    assert len(summary["accuracy_curve"]) == 1
    assert "train: launch to first step " in completed.stdout


def test_joining_the_process_group_imports_nothing() -> None:
    # A worker imports torch._dynamo in a background thread while it joins its process group;
    # that is safe only while the main thread imports nothing meanwhile (module-lock order).
    program = (
        "import sys\n"
        "import torch.distributed as dist\n"
        "from sublimate.components import training\n"
        "from sublimate.components.processes import worker\n"
        "before = set(sys.modules)\n"
        "training.join('gloo', timeout_seconds=300)\n"
        "print(sorted(set(sys.modules) - before))\n"
        "dist.destroy_process_group()\n")
    env = {**ENV, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0", "RANK": "0", "WORLD_SIZE": "1"}
    completed = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                               env=env, check=True, timeout=120)
    assert completed.stdout.strip() == "[]"


def test_a_forked_worker_counts_its_agents_phases(monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    monkeypatch.delenv(metrics.LAUNCH_TIME_ENV, raising=False)
    monkeypatch.setenv(metrics.AGENT_MARKS_ENV, json.dumps(
        [["scheduler", now - 3], ["agent_imports", now - 2], ["agent_rendezvous", now - 1],
         ["preload", now - 1]]))
    clock = metrics.StartupClock(now)
    clock.mark("first_step")
    # run by hand (no launcher): the clock starts when the agent did
    assert list(clock.phases()) == ["agent_imports", "agent_rendezvous", "preload", "fork",
                                    "interpreter", "first_step"]
    assert clock.total() == pytest.approx(3, abs=0.05)
