"""Run reports from the files a run leaves on the volume, and `sublimate report`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sublimate.components.monitoring.run_report import (
    PLOTS,
    ReportError,
    build_report,
    draw,
    draw_panel,
    format_comparison,
    run_labels,
    write_report,
)
from sublimate.pipelines.cli.report import add_report_command
from sublimate.pipelines.run_lookup import resolve_run

PNG = b"\x89PNG\r\n\x1a\n"


def fake_run(run_dir: Path, algorithm: str = "sync", epochs: int = 3,
             accuracies: list[float] | None = None, final_accuracy: float = 0.95,
             **summary: object) -> Path:
    """A run folder as the train and evaluate steps leave it (two ranks).

    ``accuracies``: rank 0's per-epoch test accuracy (none recorded by default).
    """
    (run_dir / "metrics").mkdir(parents=True)
    (run_dir / "train-summary.json").write_text(json.dumps({
        "algorithm": algorithm, "world_size": 2, "epochs": epochs, "steps": 22 * epochs,
        "global_batch_size": 64, "train_seconds": 1.5, "samples_per_second": 3000.0,
        "final_learning_rate": 0.1, "backend": "gloo", "accuracy_curve": [], **summary}))
    (run_dir / "metrics.json").write_text(json.dumps(
        {"split": "test", "examples": 359, "loss": 0.2, "accuracy": final_accuracy}))
    for rank in (0, 1):
        records = [{"epoch": e, "step": 22 * e, "loss": 2.0 / e, "learning_rate": 0.1,
                    "samples_per_second": 1000.0 * e, "data_seconds": 0.01,
                    "compute_seconds": 0.06, "comm_seconds": 0.03} for e in range(1, epochs + 1)]
        if rank == 0 and accuracies:
            for record, accuracy in zip(records, accuracies, strict=True):
                record["test_accuracy"] = accuracy
        if len(records) > 1:  # a resumed run records epoch 2 again: the last record counts
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



def test_each_panel_is_cut_from_the_overview_whole_and_apart_from_the_others(
        tmp_path: Path) -> None:
    # The panels are cut out of the overview's pixels (drawn once): each must be that image's
    # own pixels, one quarter of it (no neighbour's axes), with what lies outside its axes
    # (the time split's legend, below them) inside the cut.
    import numpy as np
    from PIL import Image

    run_dir = fake_run(tmp_path / "run-a", accuracies=[0.5, 0.7, 0.9])
    write_report(run_dir)
    folder = run_dir / "report"
    overview = np.asarray(Image.open(folder / "overview.png"))
    height, width = overview.shape[:2]
    places = []
    for name in PLOTS:
        panel = np.asarray(Image.open(folder / f"{name}.png"))
        rows, columns = panel.shape[:2]
        assert 0.35 * width < columns <= 0.5 * width and 0.35 * height < rows <= 0.5 * height
        # where it lies in the overview: the one offset, near its quarter's corner, at which
        # its pixels are the overview's (its middle row first: margins are plain white)
        quarter_top, quarter_left = len(places) // 2 * height // 2, len(places) % 2 * width // 2
        middle = panel[rows // 2]
        tops = range(max(0, quarter_top - 60), min(height - rows, quarter_top + 60) + 1)
        lefts = range(max(0, quarter_left - 60), min(width - columns, quarter_left + 60) + 1)
        found = [(top, left) for top in tops for left in lefts
                 if np.array_equal(overview[top + rows // 2, left:left + columns], middle)
                 and np.array_equal(overview[top:top + rows, left:left + columns], panel)]
        places.append((*found[0], rows, columns))
    for index, (top, left, rows, columns) in enumerate(places):  # no two cuts overlap
        for other_top, other_left, other_rows, other_columns in places[index + 1:]:
            assert top + rows <= other_top or other_top + other_rows <= top \
                or left + columns <= other_left or other_left + other_columns <= left
    legend = np.asarray(Image.open(folder / "time-split.png"))[-40:, :, :3].reshape(-1, 3)
    for colour in ((0x4C, 0x72, 0xB0), (0xDD, 0x84, 0x52), (0x55, 0xA8, 0x68)):
        assert (legend == colour).all(axis=1).any(), colour  # compute, comm, data patches


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


# --- finding a run ------------------------------------------------------------------------------

def runner_folder(home: Path, workflow: str, run_id: str, link: str | None = "results",
                  **run: object) -> tuple[Path, Path]:
    """`sublimate run`'s folder for a train run whose results went to ``run_id`` on the volume:
    ``outputs/<link>`` points at them, as the runner links a workflow output naming a folder."""
    results = fake_run(home / "volumes" / "sublimate-data" / "runs" / run_id, **run)  # type: ignore[arg-type]
    folder = home / "runs" / workflow
    folder.mkdir(parents=True)
    (folder / "status.json").write_text(json.dumps({
        "name": workflow, "phase": "Succeeded", "parameters": {"run-id": run_id},
        "outputs": {"parameters": {"results": f"/mnt/sublimate/runs/{run_id}"}}}))
    if link:
        (folder / "outputs").mkdir()
        (folder / "outputs" / link).symlink_to(results)
    return folder, results.resolve()


def test_a_run_is_found_by_name_by_run_folder_or_by_results_folder(
        home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # -p run-id=exp-1: the workflow's name and the results' folder name differ
    folder, results = runner_folder(home, "sublimate-train-x7k2p", "exp-1")
    for reference in ("exp-1", "sublimate-train-x7k2p", str(folder), str(results),
                      str(folder / "outputs" / "results")):
        assert resolve_run(reference).resolve() == results, reference
    # the printed run folder, as `sublimate run` suggests: named by its run id, not "results"
    assert _report_cli(str(folder)) == 0
    assert "exp-1: sync on 2 workers, 3 epochs" in capsys.readouterr().out
    assert json.loads((results / "report" / "report.json").read_text())["run"] == "exp-1"


def test_a_run_folder_leads_to_results_through_any_output_link(home: Path) -> None:
    folder, results = runner_folder(home, "my-train-abcde", "my-train-abcde", link="model-dir")
    dataset = home / "volumes" / "sublimate-data" / "datasets" / "digits"
    dataset.mkdir(parents=True)
    (folder / "outputs" / "dataset-dir").symlink_to(dataset)  # holds no results: passed over
    assert resolve_run(str(folder)).resolve() == results
    assert resolve_run("my-train-abcde").resolve() == results


def test_a_failed_run_without_output_links_is_found_by_its_run_id(home: Path) -> None:
    # a run that failed before its outputs were set: status.json still names the run id
    folder, results = runner_folder(home, "sublimate-train-q1w2e", "nightly", link=None)
    assert resolve_run(str(folder)).resolve() == results
    assert resolve_run("sublimate-train-q1w2e").resolve() == results


def test_a_folder_that_is_no_run_says_what_was_looked_for(
        home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "notes.txt").write_text("not a run")
    with pytest.raises(ReportError, match="not a run folder") as raised:
        resolve_run(str(stray))
    for looked_for in ("train-summary.json", "metrics/", "status.json", "outputs/"):
        assert looked_for in str(raised.value)
    assert _report_cli(str(stray)) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("report: error: ")

    # a `sublimate run` folder whose run never trained: its links and its run id are named
    untrained = home / "runs" / "other-wf"
    (untrained / "outputs").mkdir(parents=True)
    (untrained / "outputs" / "summary").symlink_to(stray)
    (untrained / "status.json").write_text(json.dumps({"name": "other-wf", "parameters": {}}))
    with pytest.raises(ReportError) as raised:
        resolve_run("other-wf")
    assert "outputs/summary" in str(raised.value)
    assert str(home / "volumes" / "sublimate-data" / "runs" / "other-wf") in str(raised.value)


# --- what the plots show ------------------------------------------------------------------------

def _assert_every_point_inside(ax: object) -> int:
    """Every plotted line vertex and scatter marker strictly inside the axes' limits."""
    (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())  # type: ignore[attr-defined]
    points = [tuple(xy) for line in ax.get_lines() for xy in line.get_xydata()]  # type: ignore[attr-defined]
    points += [tuple(xy) for collection in ax.collections  # type: ignore[attr-defined]
               for xy in collection.get_offsets()]
    for x, y in points:
        assert x0 < x < x1 and y0 < y < y1, (ax.get_title(), (x, y), (x0, x1), (y0, y1))  # type: ignore[attr-defined]
    return len(points)


def test_the_accuracy_panel_draws_the_curve_and_the_final_figure_whole(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    perfect = build_report(fake_run(tmp_path / "a", epochs=4, accuracies=[0.5, 0.8, 0.97, 1.0],
                                    final_accuracy=1.0))
    figure = draw_panel("accuracy", [perfect])
    ax = figure.axes[0]
    (curve,) = ax.get_lines()
    assert list(curve.get_xdata()) == [1, 2, 3, 4]
    assert list(curve.get_ydata()) == [0.5, 0.8, 0.97, 1.0]
    (final,) = ax.collections
    assert [tuple(xy) for xy in final.get_offsets()] == [(4.0, 1.0)]
    assert _assert_every_point_inside(ax) == 5
    assert ax.get_ylim()[1] >= 1.02  # room above a perfect score for the whole marker
    plt.close(figure)

    # only the evaluate step's figure (no per-epoch evaluation): one whole point
    figure = draw_panel("accuracy", [build_report(fake_run(tmp_path / "b", epochs=1))])
    assert _assert_every_point_inside(figure.axes[0]) == 1
    plt.close(figure)


def test_every_panel_of_a_comparison_keeps_its_points_inside(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    reports = [build_report(fake_run(tmp_path / "a", epochs=3, accuracies=[0.2, 0.9, 0.99],
                                     final_accuracy=0.99)),
               build_report(fake_run(tmp_path / "b", algorithm="bmuf", epochs=5,
                                     accuracies=[0.1, 0.5, 0.7, 0.8, 0.85],
                                     final_accuracy=0.85))]
    figure = draw(reports)
    panels = dict(zip(PLOTS, figure.axes, strict=True))
    for name in ("loss", "accuracy", "throughput"):
        assert _assert_every_point_inside(panels[name]) > 0, name
    assert _assert_every_point_inside(panels["accuracy"]) == 3 + 1 + 5 + 1
    plt.close(figure)


def test_compared_runs_are_labelled_by_what_differs(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    sync = build_report(fake_run(tmp_path / "sublimate-train-a1b2c"))
    bmuf = build_report(fake_run(tmp_path / "sublimate-train-d3e4f", algorithm="bmuf",
                                 global_batch_size=128, final_learning_rate=0.2))
    assert run_labels([sync, bmuf]) == ["sync, batch 64, final lr 0.1",
                                        "bmuf, batch 128, final lr 0.2"]
    figure = draw([sync, bmuf])
    legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert legend == ["sync, batch 64, final lr 0.1", "bmuf, batch 128, final lr 0.2"]
    rows = [label.get_text() for label in figure.axes[3].get_yticklabels()]
    assert "bmuf, batch 128, final lr 0.2 rank-1" in rows
    title = figure._suptitle.get_text()
    assert title.startswith("sync, batch 64, final lr 0.1 vs bmuf, batch 128, final lr 0.2")
    assert "2 workers" in title and "3 epochs" in title and "sublimate-train" not in title
    plt.close(figure)

    # nothing differs: the run ids are all that tells them apart
    twin = build_report(fake_run(tmp_path / "sublimate-train-g5h6i"))
    assert run_labels([sync, twin]) == ["sublimate-train-a1b2c", "sublimate-train-g5h6i"]
    # two of three alike: the algorithm, and the run id only where the algorithm is shared
    assert run_labels([sync, twin, bmuf]) == [
        "sync, batch 64, final lr 0.1 (sublimate-train-a1b2c)",
        "sync, batch 64, final lr 0.1 (sublimate-train-g5h6i)",
        "bmuf, batch 128, final lr 0.2"]
    assert run_labels([sync]) == ["sync"]


def test_launch_to_first_step_is_reported_with_its_phases(tmp_path: Path) -> None:
    from sublimate.components.monitoring.run_report import format_summary

    startup = {"torchx-launch": 1.5, "imports": 3.0, "rendezvous": 2.896, "data": 0.004}
    run_dir = fake_run(tmp_path / "run", launch_to_first_step_seconds=7.4, startup=startup)
    report = write_report(run_dir, plots=False)
    saved = json.loads((run_dir / "report" / "report.json").read_text())
    assert saved["launch_to_first_step_seconds"] == 7.4 and saved["startup"] == startup
    assert ("launch to first step 7.4s (imports 3.0s, rendezvous 2.9s, torchx-launch 1.5s, "
            "data 4ms)" in format_summary(report))
    # an older run without the figures: no line rather than a made-up one
    assert "launch" not in format_summary(build_report(fake_run(tmp_path / "old")))


# --- the evaluate step's own figures --------------------------------------------------------------

def test_evaluate_times_the_evaluation_not_the_loading(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """examples_per_second divides by the forward pass's time: a clock that only moves while
    the data is read (100 s) and while the model runs (2 s) tells them apart exactly."""
    import numpy as np

    from sublimate.components.data import datasets
    from sublimate.components.model import checkpoint, models
    from sublimate.components.steps import evaluate

    data_dir = datasets.write_dataset(
        tmp_path / "data", {"test": datasets.Split(
            np.random.default_rng(0).random((40, 4), dtype=np.float32),
            np.arange(40, dtype=np.int64) % 3)}, name="tiny", num_classes=3)
    config = {"num_features": 4, "num_classes": 3, "hidden": 8}
    run_dir = tmp_path / "run"
    checkpoint.save({"architecture": "mlp", "config": config, "algorithm": "sync", "steps": 5,
                     "state_dict": models.mlp(**config).state_dict()}, run_dir / "model.pt")

    clock = [0.0]
    monkeypatch.setattr(evaluate, "perf_counter", lambda: clock[0])
    read_split, build_model = datasets.read_split, models.build_model

    def slow_read(folder: Path, split: str) -> datasets.Split:
        clock[0] += 100.0
        return read_split(folder, split)

    def slow_model(architecture: str, model_config: dict[str, object]) -> object:
        model = build_model(architecture, model_config)
        model.register_forward_pre_hook(lambda *_: clock.__setitem__(0, clock[0] + 2.0))
        return model

    monkeypatch.setattr(datasets, "read_split", slow_read)
    monkeypatch.setattr(models, "build_model", slow_model)
    accuracy_path = tmp_path / "out" / "accuracy"
    assert evaluate.main(["--model-dir", str(run_dir), "--data-dir", str(data_dir),
                          "--accuracy-path", str(accuracy_path)]) == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["examples"] == 40
    assert metrics["seconds"] == 2.0 and metrics["examples_per_second"] == 20.0
    assert metrics["total_seconds"] == 102.0
    assert float(accuracy_path.read_text()) == metrics["accuracy"]


def _with_stragglers(run_dir: Path, flagged: dict[int, list[dict[str, object]]]) -> Path:
    """Rank 0's epoch records as a straggler-checking loop writes them: epoch -> flagged."""
    log = run_dir / "metrics" / "rank-0.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()[:-1]]
    for record in records:
        record["stragglers"] = flagged.get(record["epoch"], [])
    log.write_text("\n".join(json.dumps(record) for record in records) + "\n")
    return run_dir


def test_the_report_names_stragglers_and_where_their_time_goes(tmp_path: Path) -> None:
    from sublimate.components.monitoring.run_report import format_summary
    from sublimate.components.monitoring.stragglers import RankTiming, find_stragglers

    def flagged(compute: float, data: float = 0.0) -> list[dict[str, object]]:
        ranks = [RankTiming(r, f"node{r // 2}", 10, 1.0, 0.0, 0.1, 0.9) for r in range(3)]
        ranks.append(RankTiming(3, "node1", 10, 1.0, data, compute, 0.0))
        return find_stragglers(ranks).records()

    run_dir = _with_stragglers(fake_run(tmp_path / "slow", epochs=3),
                               {2: flagged(0.25), 3: flagged(0.3)})
    report = write_report(run_dir, plots=False)
    stragglers = json.loads((run_dir / "report" / "report.json").read_text())["stragglers"]
    assert stragglers == report["stragglers"]
    assert stragglers["epochs_checked"] == 3
    [rank] = stragglers["ranks"]
    assert {key: rank[key] for key in ("rank", "node", "epochs", "cause")} == \
        {"rank": 3, "node": "node1", "epochs": [2, 3], "cause": "compute"}
    assert (rank["ratio_mean"], rank["ratio_max"], rank["cause_ratio"]) == (2.75, 3.0, 2.75)
    assert rank["excess_seconds_per_step"] == pytest.approx(0.0175)
    assert ("  straggler rank 3 (node1): 2.8x median work in 2/3 epochs (max 3.0x), "
            "compute 2.8x median, +17.50 ms/step") in format_summary(report).splitlines()


def test_a_run_that_checked_and_found_no_straggler_says_so(tmp_path: Path) -> None:
    from sublimate.components.monitoring.run_report import format_summary

    report = build_report(_with_stragglers(fake_run(tmp_path / "even"), {}))
    assert report["stragglers"] == {"epochs_checked": 3, "ranks": []}
    assert "  stragglers: none in 3 epochs" in format_summary(report).splitlines()
    older = build_report(fake_run(tmp_path / "older"))  # recorded before straggler detection
    assert "stragglers" not in older and "straggler" not in format_summary(older)


# --- every kind of run the product makes, with what it left ------------------------------------

def _library_run(run_dir: Path, metrics: dict[str, object]) -> Path:
    """What a loop of one's own on the library leaves: epoch records of every rank, a committed
    checkpoint, its own metrics.json; no train-summary.json (the built-in loop writes that)."""
    fake_run(run_dir)
    (run_dir / "train-summary.json").unlink()
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "latest.json").write_text(
        json.dumps({"algorithm": "bmuf", "step": 66, "world_size": 2}))
    return run_dir


def test_a_loop_on_the_library_is_described_from_its_records(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """No `? on ? workers`, and no KeyError for a metrics.json that holds only an accuracy."""
    monkeypatch.setenv("SUBLIMATE_HOME", str(tmp_path))
    runs = tmp_path / "volumes" / "sublimate-data" / "runs"
    _library_run(runs / "mine", {"accuracy": 0.9})
    assert _report_cli("mine", "--no-plots") == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "mine: bmuf on 2 workers, 3 epochs, 66 steps"
    assert "test accuracy 0.9000" in out and "(loss" not in out
    # the job's throughput: the mean of its epochs' (a repeated epoch counted once)
    assert build_report(runs / "mine")["samples_per_second"] == pytest.approx(2000.0)


def test_own_metrics_of_any_name_are_reported(tmp_path: Path) -> None:
    from sublimate.components.monitoring.run_report import format_summary

    report = build_report(_library_run(tmp_path / "detector", {"mAP": 0.625, "loss": 1.5}))
    assert report["metrics"] == {"mAP": 0.625} and report["test"] == {"loss": 1.5}
    assert "test loss 1.5000, mAP 0.6250" in format_summary(report)


def test_a_plain_script_that_wrote_only_its_metrics_has_a_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SUBLIMATE_HOME", str(tmp_path))
    run = tmp_path / "volumes" / "sublimate-data" / "runs" / "plain"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps({"accuracy": 0.5}))
    assert _report_cli("plain", "--no-plots") == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "plain: no training records (own code that does not use sublimate's reporter)",
        "  test accuracy 0.5000"]


def test_a_failed_run_reports_its_first_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A run that failed before its first epoch: the report names the rank and its error."""
    from sublimate.components.base.elastic_errors import ERROR_FILE_ENV, write_failure

    monkeypatch.setenv("SUBLIMATE_HOME", str(tmp_path))
    run = tmp_path / "volumes" / "sublimate-data" / "runs" / "broken"
    for rank, message in ((1, "ValueError: bad shape"), (0, "RuntimeError: peer closed")):
        error_file = run / "logs" / "elastic" / f"node{rank}" / "job-1_9x_y8z7w" / \
            "attempt_0" / "0" / "error.json"
        error_file.parent.mkdir(parents=True)
        monkeypatch.setenv(ERROR_FILE_ENV, str(error_file))
        monkeypatch.setenv("RANK", str(rank))
        write_failure(message)
    assert _report_cli("broken", "--no-plots") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "broken: failed before its first epoch record"
    assert out[1].startswith("  failed: rank 1 (node1): ValueError: bad shape (traceback: ")


def test_a_sweep_is_reported_by_any_of_its_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """`sublimate report` on a sweep (its run folder, its name, its report.md): its points and
    the best one, not "has this run trained yet?"."""
    monkeypatch.setenv("SUBLIMATE_HOME", str(tmp_path))
    sweep = tmp_path / "volumes" / "sublimate-data" / "sweeps" / "sw"
    sweep.mkdir(parents=True)
    (sweep / "report.json").write_text(json.dumps({
        "sweep": "sw", "metric": "accuracy", "goal": "max",
        "best": {"id": "p01", "run-id": "sw-p01", "params": {"lr": 0.1}, "metric": 0.9},
        "points": [
            {"id": "p00", "params": {"lr": 0.5}, "status": "failed", "missing": "no metrics.json",
             "metric": None},
            {"id": "p01", "params": {"lr": 0.1}, "status": "ok", "metric": 0.9}]}))
    runner = tmp_path / "runs" / "sw"
    (runner / "outputs").mkdir(parents=True)
    (runner / "status.json").write_text("{}")
    (runner / "outputs" / "report").symlink_to(sweep / "report.md")
    (sweep / "report.md").write_text("# Sweep sw\n")
    for reference in ("sw", str(runner), str(sweep / "report.md")):
        assert _report_cli(reference) == 0
        assert capsys.readouterr().out.splitlines() == [
            "sw: sweep of 2 points, 1 failed; accuracy, higher is better",
            "  best p01 (run sw-p01): accuracy 0.9000",
            "  p00  lr=0.5: failed: no metrics.json",
            "  p01  lr=0.1: accuracy 0.9000",
            f"  report: {sweep / 'report.md'}"]


def test_two_runs_are_compared_side_by_side() -> None:
    """`sublimate report A B`'s table: the final figures of both, B - A, better or worse by
    the figure's own direction; a figure neither has is left out."""
    a = {"run": "a", "final_loss": 0.05, "test": {"accuracy": 0.96, "loss": 0.1},
         "samples_per_second": 16000.0, "train_seconds": 5.2, "steps": 440,
         "algorithm": "sync", "workers": 2}
    b = {**a, "run": "b", "final_loss": 0.09, "test": {"accuracy": 0.93, "loss": 0.2},
         "samples_per_second": 17000.0, "train_seconds": 3.1, "steps": 220}
    labels = run_labels([a, b])
    table = format_comparison([a, b]).splitlines()
    assert table[0].split() == ["A:", *labels[0].split(), "B:", *labels[1].split(), "B", "-", "A"]
    assert [" ".join(row.split()) for row in table[1:]] == [
        "final training loss 0.05 0.09 +0.04 (worse)",
        "test accuracy 0.96 0.93 -0.03 (worse)",
        "test loss 0.1 0.2 +0.1 (worse)",
        "samples/s 16,000 17,000 +1,000 (better)",
        "training time (s) 5.2 3.1 -2.1 (better)",
        "steps 440 220 -220",
    ]
