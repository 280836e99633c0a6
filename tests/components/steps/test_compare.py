"""The sweep's compare step, on real runs: two that trained and were evaluated, one whose
training was killed, one that never started."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sublimate.components.data.datasets import build_builtin
from sublimate.components.steps import compare
from tests.conftest import REPO

PNG = b"\x89PNG\r\n\x1a\n"
# algorithm, global batch, epochs of the runs that succeed
RUNS = {"sync-64": ("sync", 64, 2), "bmuf-128": ("bmuf", 128, 3)}
POINTS = [
    {"id": "p00", "run-id": "sync-64", "params": {"algorithm": "sync", "global-batch-size": 64}},
    {"id": "p01", "run-id": "bmuf-128",
     "params": {"algorithm": "bmuf", "global-batch-size": 128}},
    {"id": "p02", "run-id": "killed", "params": {"algorithm": "sync", "global-batch-size": 128}},
    {"id": "p03", "run-id": "never-ran",
     "params": {"algorithm": "bmuf", "global-batch-size": 64}},
]


def _step(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=300, check=False,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


@pytest.fixture(scope="module")
def volume(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A shared volume after a sweep's train and evaluate steps ran, as the pipeline runs them."""
    root = tmp_path_factory.mktemp("volume")
    data = build_builtin("digits", root / "datasets" / "digits")
    for run_id, (algorithm, batch, epochs) in RUNS.items():
        trained = _step("sublimate.components.steps.train", "--data-dir", str(data), "--runs-root",
                        str(root / "runs"), "--run-id", run_id, "--scheduler", "local_cwd",
                        "--nodes", "2", "--epochs", str(epochs), "--algorithm", algorithm,
                        "--global-batch-size", str(batch), "--checkpoint-every", "0")
        assert trained.returncode == 0, trained.stderr
        evaluated = _step("sublimate.components.steps.evaluate", "--model-dir",
                          str(root / "runs" / run_id), "--data-dir", str(data))
        assert evaluated.returncode == 0, evaluated.stderr
    # rank 0 is killed at step 5: the job fails, its logs stay, evaluate never runs
    killed = _step("sublimate.components.steps.train", "--data-dir", str(data), "--runs-root",
                   str(root / "runs"), "--run-id", "killed", "--scheduler", "local_cwd",
                   "--nodes", "2", "--epochs", "2", "--global-batch-size", "128",
                   "--recovery", "restart", env={"SUBLIMATE_FAIL_AT_STEP": "5"})
    assert killed.returncode != 0
    return root


def _run_compare(volume: Path, sweep: str, points: list[dict], *flags: str,
                 ) -> tuple[int, Path, Path]:
    outputs = volume / "outputs" / sweep
    code = compare.main(["--points", json.dumps(points), "--sweep-dir",
                         str(volume / "sweeps" / sweep), "--runs-root", str(volume / "runs"),
                         "--best-point-path", str(outputs / "best-point"),
                         "--report-path", str(outputs / "report"), *flags])
    return code, volume / "sweeps" / sweep, outputs


def _records(run_dir: Path) -> dict[str, list[dict]]:
    return {path.stem: [json.loads(line) for line in path.read_text().splitlines()]
            for path in (run_dir / "metrics").glob("*.jsonl")}


def _oracle(run_dir: Path, target: float) -> dict:
    """The point's figures straight from the run's own files."""
    summary = json.loads((run_dir / "train-summary.json").read_text())
    accuracy = json.loads((run_dir / "metrics.json").read_text())["accuracy"]
    records = _records(run_dir)
    phases = {phase: sum(r[f"{phase}_seconds"] for rs in records.values() for r in rs)
              for phase in ("data", "compute", "comm")}
    reached = [seconds for seconds, _, value in summary["accuracy_curve"] if value >= target]
    if not reached and accuracy >= target:
        reached = [summary["train_seconds"]]
    sent = [rs[-1]["net_sent_bytes"] for rs in records.values()]
    # The report keeps each process's phase totals to 0.1 ms: on these runs of a few
    # milliseconds that moves the share by up to this much.
    share_error = 2 * 3 * len(records) * 0.5e-4 / sum(phases.values())
    return {"metric": accuracy, "samples_per_second": summary["samples_per_second"],
            "train_seconds": summary["train_seconds"], "epochs": summary["epochs"],
            "communication_share": pytest.approx(phases["comm"] / sum(phases.values()),
                                                 abs=share_error + 1e-4),
            "net_sent_bytes_per_worker": float(round(sum(sent) / len(sent))),
            "time_to_target_seconds": reached[0] if reached else None}


def test_the_table_holds_what_the_runs_files_say(volume: Path) -> None:
    code, sweep, outputs = _run_compare(volume, "grid", POINTS)
    assert code == 0
    report = json.loads((sweep / "report.json").read_text())
    accuracies = {run_id: json.loads((volume / "runs" / run_id / "metrics.json").read_text())
                  ["accuracy"] for run_id in RUNS}
    best_run = max(accuracies, key=accuracies.__getitem__)
    target = accuracies[best_run] * 0.95
    assert report["target"] == pytest.approx(target) and report["goal"] == "max"
    assert report["axes"] == ["algorithm", "global-batch-size"]
    by_id = {point["id"]: point for point in report["points"]}
    for point in POINTS[:2]:
        expected = _oracle(volume / "runs" / point["run-id"], target)
        row = by_id[point["id"]]
        assert row["status"] == "ok" and row["params"] == point["params"]
        assert {key: row[key] for key in expected} == expected, point["id"]
        assert row["epochs"] == RUNS[point["run-id"]][2]

    # the best point, as an output parameter
    best = json.loads((outputs / "best-point").read_text())
    best_point = next(p for p in POINTS if p["run-id"] == best_run)
    assert best == {**best_point, "metric": accuracies[best_run]}
    assert (outputs / "report").read_text() == str(sweep / "report.md")

    # failed points: in the table with what was missing, and the end of the train log
    killed, never = by_id["p02"], by_id["p03"]
    assert killed["status"] == never["status"] == "failed"
    assert killed["missing"] == "metrics.json missing" and "metrics.json" in killed["problem"]
    assert never["missing"] == "no run folder" and never["log_tail"] == []
    logs = list((volume / "runs" / "killed" / "logs").glob("**/combined.log"))
    first_to_stop = min(logs, key=lambda log: (log.stat().st_mtime_ns, str(log)))
    assert killed["log_file"] == str(first_to_stop.relative_to(volume / "runs" / "killed"))
    assert killed["log_tail"] == first_to_stop.read_text().rstrip("\n").splitlines()[-15:]

    markdown = (sweep / "report.md").read_text()
    for point in POINTS[:2]:
        accuracy = accuracies[point["run-id"]]
        assert f"| {point['id']} | {point['params']['algorithm']} | " \
               f"{point['params']['global-batch-size']} | ok | {accuracy:.4f} |" in markdown
    assert "| p02 | sync | 128 | **failed**: metrics.json missing |" in markdown
    assert "| p03 | bmuf | 64 | **failed**: no run folder |" in markdown
    assert killed["log_tail"][-1] in markdown
    with open(sweep / "points.csv", newline="") as handle:
        rows = {row["id"]: row for row in csv.DictReader(handle)}
    assert float(rows["p00"]["metric"]) == accuracies["sync-64"]
    assert rows["p01"]["global-batch-size"] == "128" and rows["p03"]["status"] == "failed"

    for name, file in compare.PLOTS.items():
        assert (sweep / file).read_bytes()[:8] == PNG, name
        assert (sweep / file).stat().st_size > 5000, name
        assert f"]({file})" in markdown


def test_the_best_point_follows_the_metric_goal(volume: Path) -> None:
    metrics = {run_id: json.loads((volume / "runs" / run_id / "metrics.json").read_text())
               for run_id in RUNS}
    for sweep, flags, metric, pick in (
            ("lowest-loss", ["--metric", "loss"], "loss", min),  # auto: a loss goes down
            ("worst-accuracy", ["--metric-goal", "min"], "accuracy", min),
            ("best-accuracy", ["--metric-goal", "max"], "accuracy", max)):
        code, _, outputs = _run_compare(volume, sweep, POINTS, *flags)
        assert code == 0
        expected = pick(RUNS, key=lambda run_id, m=metric: metrics[run_id][m])
        best = json.loads((outputs / "best-point").read_text())
        assert (best["run-id"], best["metric"]) == (expected, metrics[expected][metric]), sweep


def test_a_given_target_that_no_point_reaches_is_reported_as_not_reached(volume: Path) -> None:
    code, sweep, _ = _run_compare(volume, "strict", POINTS[:2], "--target", "0.999")
    assert code == 0
    report = json.loads((sweep / "report.json").read_text())
    assert report["target"] == 0.999 and report["target_rule"] == "as given"
    assert [p["time_to_target_seconds"] for p in report["points"]] == [None, None]
    assert (sweep / "report.md").read_text().count("| not reached |") == 2


def test_compare_fails_only_when_every_point_failed(
        volume: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, sweep, outputs = _run_compare(volume, "all-failed", POINTS, "--metric", "f1")
    assert code == 1
    error = capsys.readouterr().err
    assert "compare: error: every point of the sweep failed (4)" in error
    assert "p00: metric 'f1' is not in" in error and "p03: no run folder" in error
    assert not (outputs / "best-point").exists()
    markdown = (sweep / "report.md").read_text()  # still written: it says what went wrong
    assert markdown.count("**failed**") == 4 and "## Failed points" in markdown
    # one point succeeding is enough
    code, _, _ = _run_compare(volume, "one-ok", [POINTS[0], POINTS[3]])
    assert code == 0


@pytest.mark.parametrize(("points", "message"), [
    ("[not json", "points: not JSON"),
    ("[]", "points: expected a non-empty JSON list"),
    ('[{"id": "p0", "params": {}}]', "points[0].run-id: missing or not a non-empty string"),
    ('[{"id": "p0", "run-id": "../x"}]', "points[0].run-id: '../x' is not a run folder's name"),
    ('[{"id": "p0", "run-id": "a"}, {"id": "p0", "run-id": "b"}]',
     "points[1].id: 'p0' is used twice"),
    ('[{"id": "p0", "run-id": "a", "params": [1]}]', "points[0].params: expected an object"),
])
def test_bad_points_are_refused_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        points: str, message: str) -> None:
    monkeypatch.setenv("SUBLIMATE_TERMINATION_LOG", str(tmp_path / "termination"))
    assert compare.main(["--points", points, "--sweep-dir", str(tmp_path / "sweep"),
                         "--runs-root", str(tmp_path / "runs")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"compare: error: {message}") and error.count("\n") == 1
    assert (tmp_path / "termination").read_text().startswith(message)
    assert not (tmp_path / "sweep").exists()


def test_a_target_that_is_not_a_number_is_refused(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    assert compare.main(["--points", json.dumps(POINTS), "--sweep-dir", str(tmp_path),
                         "--target", "high"]) == 2
    assert "compare: error: target: 'high' is not a number" in capsys.readouterr().err


def test_template_has_the_inputs_and_outputs_the_pipeline_wires() -> None:
    step = compare.template(image="example/sublimate:1")
    inputs = {p.name: p.default for p in step.inputs}
    assert inputs == {"points": None, "sweep-dir": None, "metric": "accuracy",
                      "metric-goal": "auto", "target": "0"}
    assert [p.name for p in step.outputs] == ["best-point", "report"]
    assert step.command == ["python", "-m", "sublimate.components.steps.compare"]
    assert "--runs-root" in step.args and "/mnt/sublimate/runs" in step.args
    assert step.image == "example/sublimate:1"
    assert [v.mount_path for v in step.volumes] == ["/mnt/sublimate"]
