"""Run reports from the files a run leaves on the volume, and `sublimate report`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sublimate.pipelines.report import (
    PLOTS,
    ReportError,
    add_report_command,
    build_report,
    resolve_run,
    write_report,
)

PNG = b"\x89PNG\r\n\x1a\n"


def fake_run(run_dir: Path, algorithm: str = "sync", epochs: int = 3) -> Path:
    """A run folder as the train and evaluate steps leave it (two ranks)."""
    (run_dir / "metrics").mkdir(parents=True)
    (run_dir / "train-summary.json").write_text(json.dumps({
        "algorithm": algorithm, "world_size": 2, "epochs": epochs, "steps": 22 * epochs,
        "global_batch_size": 64, "train_seconds": 1.5, "samples_per_second": 3000.0,
        "accuracy_curve": []}))
    (run_dir / "metrics.json").write_text(json.dumps(
        {"split": "test", "examples": 359, "loss": 0.2, "accuracy": 0.95}))
    for rank in (0, 1):
        records = [{"epoch": e, "step": 22 * e, "loss": 2.0 / e, "learning_rate": 0.1,
                    "samples_per_second": 1000.0 * e, "data_seconds": 0.01,
                    "compute_seconds": 0.06, "comm_seconds": 0.03} for e in range(1, epochs + 1)]
        # a resumed run records epoch 2 again: the report keeps the last record
        records.insert(1, {**records[1], "loss": 99.0})
        (run_dir / "metrics" / f"rank-{rank}.jsonl").write_text(
            "\n".join(json.dumps(r) for r in records) + "\n{truncated")
    return run_dir


def test_report_describes_the_run_and_draws_every_plot(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path / "run-a")
    report = write_report(run_dir)
    saved = json.loads((run_dir / "report" / "report.json").read_text())
    assert saved["run"] == "run-a" and saved["algorithm"] == "sync"
    assert saved["test"]["accuracy"] == 0.95 and saved["final_loss"] == pytest.approx(2 / 3)
    assert [p["epoch"] for p in saved["epochs_log"]] == [1, 2, 3]
    assert saved["epochs_log"][1]["loss"] == 1.0  # the repeated epoch's last record, not 99
    split = saved["time_split"]["rank-1"]
    assert (split["compute"], split["comm"], split["data"]) == pytest.approx((0.6, 0.3, 0.1))
    for name in [*PLOTS, "overview"]:
        assert (run_dir / "report" / f"{name}.png").read_bytes()[:8] == PNG
    assert report["plots"]["overview"] == "overview.png"


def test_a_run_that_never_trained_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="has this run trained yet"):
        build_report(tmp_path)


def _report_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="sublimate")
    add_report_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["report", *argv])
    return args.handler(args)


def test_report_command_looks_up_run_ids_and_compares_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SUBLIMATE_HOME", str(tmp_path))
    runs = tmp_path / "volumes" / "sublimate-data" / "runs"
    fake_run(runs / "sync-run")
    fake_run(runs / "bmuf-run", algorithm="bmuf")
    assert resolve_run("sync-run") == runs / "sync-run"

    assert _report_cli("sync-run") == 0
    out = capsys.readouterr().out
    assert "sync-run: sync on 2 workers, 3 epochs" in out and "test accuracy 0.9500" in out
    assert "rank-0" in out and "compute  60%" in out

    output = tmp_path / "cmp.png"
    assert _report_cli("sync-run", str(runs / "bmuf-run"), "--output", str(output)) == 0
    assert output.read_bytes()[:8] == PNG
    assert f"comparison: {output}" in capsys.readouterr().out
    assert (runs / "bmuf-run" / "report" / "report.json").is_file()

    assert _report_cli("sync-run", "--json", "--no-plots") == 0
    assert json.loads(capsys.readouterr().out)["algorithm"] == "sync"


def test_report_command_names_a_missing_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SUBLIMATE_HOME", str(tmp_path))
    assert _report_cli("nope") == 2
    assert "run 'nope': no such run folder" in capsys.readouterr().err
