"""Bring your own training code: the worked examples run end to end under `sublimate run`, and
the contract around them (entry points, arguments, evaluation, the chosen metric)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sublimate.components.base.settings import SettingError, check
from sublimate.components.launch import launcher
from tests.conftest import (
    REPO,
    finish_run,
    first_checkpoint,
    pod_pid,
    results_folder,
    run_cli,
    run_outputs,
    start_run,
)

PLAIN = "examples/plain_torchrun/train.py"
PLAIN_ARGS = "--data $SUBLIMATE_DATA_DIR --out $SUBLIMATE_RUN_DIR --epochs 6"


def test_a_plain_torchrun_script_runs_as_it_is(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = run_cli("run", "-p", f"entrypoint={PLAIN}", "-p", f"entrypoint-args={PLAIN_ARGS}",
                     home=home)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    written = json.loads((results_folder(home) / "metrics.json").read_text())
    outputs = run_outputs(result.stdout)
    # The evaluate step reported what the script wrote, as the pipeline's chosen metric.
    assert float(outputs["metric"]) == pytest.approx(written["accuracy"])
    assert written["accuracy"] > 0.85
    log = result.stdout + result.stderr
    assert "written by the training code" in log
    assert "[node0] epoch 6 loss" in log
    # It saved no model.pt of its own name: no output points at one.
    status = json.loads(next((home / "runs").glob("*/status.json")).read_text())
    (train,) = [node for node in status["nodes"] if node["display_name"] == "train(0)"]
    assert train["outputs"]["parameters"]["model-path"] == ""
    assert "(no model.pt)" in log
    # The run said `sublimate report`; its report is its metrics, with no training records.
    assert "report: sublimate report" in result.stdout
    report = run_cli("report", "--no-plots", str(results_folder(home)), home=home)
    assert report.returncode == 0, report.stderr
    assert f"test accuracy {written['accuracy']:.4f}" in report.stdout


def _worker_pid(rank: int, marker: str) -> int | None:
    """The training process of ``rank`` running ``marker`` (a user's entry point)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in command and "torch.distributed.run" not in command \
                and f"RANK={rank}".encode() in environ:
            return int(proc.name)
    return None


def test_own_loop_with_the_library_bmuf_on_two_nodes_resumes_after_a_kill(
        tmp_path: Path) -> None:
    """The CNN example (a user's loop on sublimate.components.training): BMUF across 2 nodes,
    image data in the layout; rank 1 is SIGKILLed after the first checkpoint, torchrun restarts
    the workers, and the loop resumes from the committed step with its data position."""
    home = tmp_path / "home"
    process = start_run(home, "-p", "entrypoint=examples.cnn_bmuf.train",
                        "-p",
                        "dataset=py:sublimate.components.examples.example_datasets:digit_images",
                        "-p", "algorithm=bmuf", "-p", "sync-period=4", "-p", "epochs=6",
                        "-p", "checkpoint-every=20", "-p", "max-restarts=1")
    killed_after = None
    try:
        _, committed = first_checkpoint(home, process, timeout=240)
        deadline = time.monotonic() + 60
        while killed_after is None and time.monotonic() < deadline and process.poll() is None:
            pid = _worker_pid(1, "examples.cnn_bmuf.train")
            if pid is not None:
                killed_after = committed
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
    finally:
        output = finish_run(process)
    assert killed_after is not None, "the run ended before a checkpoint was committed"
    assert process.returncode == 0, output[-4000:]
    resumed = [int(step) for step in re.findall(r"resumed from checkpoint at step (\d+)", output)]
    assert resumed, output[-3000:]
    # At most checkpoint-every steps are repeated: the resume is from the last committed step.
    assert resumed[0] >= killed_after
    metrics = json.loads((results_folder(home) / "metrics.json").read_text())
    assert metrics["accuracy"] > 0.7
    # The library's reporter wrote the run's epoch records for every rank and the report.
    results = results_folder(home)
    assert {path.name for path in (results / "metrics").glob("rank-*.jsonl")} == {
        "rank-0.jsonl", "rank-1.jsonl"}
    assert "epoch 6/6 step 132/132" in output


def test_entrypoint_arguments_expand_only_the_contract() -> None:
    env = {"SUBLIMATE_DATA_DIR": "/data/x", "SUBLIMATE_RUN_DIR": "/runs/y", "OTHER": "z"}
    assert launcher.entrypoint_arguments(
        "--data $SUBLIMATE_DATA_DIR --out=${SUBLIMATE_RUN_DIR}/m '$HOME' $OTHER", env) == [
        "--data", "/data/x", "--out=/runs/y/m", "$HOME", "$OTHER"]


def test_entrypoint_problems_name_the_entrypoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUBLIMATE_LOCAL_CWD", str(REPO))
    assert launcher.entrypoint_problem(PLAIN, local=True) is None
    assert launcher.entrypoint_problem("examples.cnn_bmuf.train", local=True) is None
    assert launcher.entrypoint_problem("examples/nope.py", local=True) == \
        f"entrypoint 'examples/nope.py': no such script ({REPO / 'examples/nope.py'})"
    assert launcher.entrypoint_problem("examples.nope:main", local=True) == \
        "entrypoint 'examples.nope:main': no module named 'examples.nope'"
    assert "No module named 'nopkg'" in launcher.entrypoint_problem("nopkg.sub", local=True)


def test_a_bad_entrypoint_fails_the_run_in_one_line(tmp_path: Path) -> None:
    result = run_cli("run", "-p", "entrypoint=examples/missing.py", home=tmp_path / "home")
    assert result.returncode != 0
    assert "entrypoint 'examples/missing.py': no such script" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize(("values", "message"), [
    ({"entrypoint": "my.train", "algorithm": "async"},
     "with entrypoint, use sync, bmuf, easgd or diloco"),
    ({"framework": "tensorflow"}, "framework tensorflow needs your own code"),
])
def test_rules_between_entrypoint_settings(values: dict[str, str], message: str) -> None:
    with pytest.raises(SettingError, match=message):
        check(values)
    check({**values, "entrypoint": "my.train", "algorithm": "sync"})


def _evaluate(model_dir: Path, *extra: str) -> tuple[int, str]:
    result = subprocess.run(
        [sys.executable, "-m", "sublimate.components.steps.evaluate", "--model-dir", str(model_dir),
         "--data-dir", str(model_dir), "--metric-path", str(model_dir / "out-metric"), *extra],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO)
    return result.returncode, result.stdout + result.stderr


def test_evaluate_runs_an_own_evaluation_and_outputs_the_chosen_metric(tmp_path: Path) -> None:
    script = tmp_path / "my_eval.py"
    script.write_text(
        "import json, os, pathlib\n"
        "run = pathlib.Path(os.environ['SUBLIMATE_RUN_DIR'])\n"
        "(run / 'metrics.json').write_text(json.dumps({'mAP': 0.625, 'loss': 1.5}))\n")
    code, output = _evaluate(tmp_path, "--eval-entrypoint", str(script), "--metric", "mAP")
    assert code == 0, output
    assert (tmp_path / "out-metric").read_text() == "0.625"
    code, output = _evaluate(tmp_path, "--eval-entrypoint", str(script), "--metric", "iou")
    assert code == 2
    assert "metric 'iou' is not in" in output and "(it has: loss, mAP)" in output


def test_evaluate_refuses_an_own_evaluation_that_writes_nothing(tmp_path: Path) -> None:
    script = tmp_path / "silent.py"
    script.write_text("print('evaluated, but forgot to write')\n")
    code, output = _evaluate(tmp_path, "--eval-entrypoint", str(script))
    assert code == 2
    assert f"did not write {tmp_path / 'metrics.json'}" in output


def test_keras_with_multiworkermirroredstrategy_runs_under_sublimate_run(tmp_path: Path) -> None:
    """The TensorFlow example through the real path: the shim builds TF_CONFIG on each node."""
    from tests.test_example_tensorflow import _require_tensorflow

    _require_tensorflow()
    home = tmp_path / "home"
    result = run_cli("run", "-p", "entrypoint=examples/keras_multiworker/train.py",
                     "-p", "framework=tensorflow", "-p", "epochs=3", "-p", "learning-rate=0.05",
                     home=home, timeout=400)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    written = json.loads((results_folder(home) / "metrics.json").read_text())
    assert float(run_outputs(result.stdout)["metric"]) == pytest.approx(written["accuracy"])
    assert written["accuracy"] > 0.8
    # Both nodes' workers joined one strategy: the example prints its replica count.
    assert re.search(r"\[node0\].*2 replicas", log), log[-3000:]


def test_the_watchdog_stops_a_hung_job_names_the_ranks_and_relaunches_it(
        tmp_path: Path) -> None:
    """Rank 1 freezes (SIGSTOP) with the collective timeout far away: every rank stops stepping,
    the launcher's watchdog stops the job after stall-seconds with one message naming the ranks,
    their nodes and the step, and relaunches it from the last checkpoint."""
    home = tmp_path / "home"
    # Rank 1 stops itself at step 30 (fault injection, the launcher's first attempt only): no
    # race between the test and a job that, on a fast machine, trains 880 steps in 2.5 s (and
    # so no need for more steps than the relaunch's few after its checkpoint).
    started = time.monotonic()
    result = run_cli("run", "-p", "epochs=4", "-p", "checkpoint-every=20",
                     "-p", "max-restarts=1", "-p", "stall-seconds=6", "-p", "recovery=restart",
                     "-p", "collective-timeout=600", "--env", "SUBLIMATE_FREEZE_AT_STEP=30",
                     "--env", "SUBLIMATE_FAIL_RANK=1", home=home, timeout=400)
    output = result.stdout + result.stderr
    froze = re.search(r"fault injection: freezing rank 1 \(pid (\d+)\) at step 30", output)
    assert froze, output[-3000:]
    frozen = int(froze.group(1))
    assert result.returncode == 0, output[-4000:]
    message = re.search(r"train: error: training stalled: no progress for (\d+)s: ranks 0,1 "
                        r"\(node0, node1\) stopped reporting at step (\d+)", output)
    assert message, output[-3000:]
    assert int(message.group(1)) >= 6
    assert "relaunching from the last checkpoint (relaunch 1 of 1)" in output
    assert re.search(r"resumed from checkpoint at step \d+", output)
    assert time.monotonic() - started > 6
    # The relaunch's start-up is its own: its launcher phase does not hold the stalled attempt
    # (at least stall-seconds of it).
    relaunched = re.findall(r"launch to first step [0-9.]+s \(launcher ([0-9.]+)s", output)
    assert relaunched and float(relaunched[-1]) < 6, output[-3000:]
    # Nothing of the frozen worker is left running (the pid it printed is its pod's PID
    # namespace's: pod_pid finds it on this machine, by the run's home in its environment).
    assert pod_pid(frozen, str(home)) is None
