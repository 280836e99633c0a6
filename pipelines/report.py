"""Run reports: one JSON summary and a few PNG plots per run, and side-by-side comparisons.

A report is built only from what the run already left on the shared volume:
``train-summary.json`` (the train step), ``metrics.json`` (the evaluate step: test loss and
accuracy), ``metrics/<label>.jsonl`` (one record per epoch from every training process) and
``metrics-endpoints.json``. It is written to ``<run>/report/``::

    report.json        the summary below (``sublimate report RUN`` prints it)
    overview.png       the four panels in one image
    loss.png  accuracy.png  throughput.png  time-split.png

The evaluate step writes it at the end of every pipeline run; ``sublimate report RUN [RUN...]``
prints and regenerates it, and with several runs draws them in one comparison plot.
matplotlib is imported lazily (Agg backend) and is optional: without it only the JSON is written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# components.metrics (prometheus-client) is imported by the functions that need it, so that
# registering `sublimate report` costs the other commands nothing.

REPORT_DIR = "report"
PLOTS = ("loss", "accuracy", "throughput", "time-split")
# Where run ids live: the shared volume of the local runner.
RUNS_UNDER = Path("volumes") / "sublimate-data" / "runs"


class ReportError(Exception):
    """A run that cannot be found or holds nothing to report."""


def _metrics() -> Any:
    from sublimate.components import metrics

    return metrics


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _by_epoch(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Last record per epoch, in epoch order (a resumed run repeats the epoch it crashed in)."""
    latest = {record["epoch"]: record for record in records if "epoch" in record}
    return [latest[epoch] for epoch in sorted(latest)]


def home() -> Path:
    return Path(os.environ.get("SUBLIMATE_HOME") or Path.home() / ".sublimate")


def resolve_run(reference: str, sublimate_home: Path | None = None) -> Path:
    """A run folder path, or a run id under ``$SUBLIMATE_HOME/volumes/sublimate-data/runs``."""
    path = Path(reference).expanduser()
    if path.is_dir():
        return path
    candidate = (sublimate_home or home()) / RUNS_UNDER / reference
    if "/" not in reference and candidate.is_dir():
        return candidate
    raise ReportError(f"run '{reference}': no such run folder (looked for {path} and {candidate})")


def build_report(run_dir: Path) -> dict[str, Any]:
    """The report of one run as a dict (nothing is written)."""
    run_dir = Path(run_dir)
    summary = _read_json(run_dir / "train-summary.json") or {}
    evaluation = _read_json(run_dir / "metrics.json")
    logs = {path.stem: _by_epoch(list(_metrics().iter_jsonl(path)))
            for path in sorted((run_dir / "metrics").glob("*.jsonl"))}
    if not summary and not logs:
        raise ReportError(f"{run_dir}: no train-summary.json and no metrics/*.jsonl: "
                          "has this run trained yet?")
    # The job-wide curve: the parameter server's view for async, rank 0's for the others.
    main = logs.get("ps") or logs.get("rank-0") or next(iter(logs.values()), [])
    curve = [{key: record[key] for key in ("epoch", "step", "loss", "samples_per_second",
                                           "learning_rate", "test_accuracy", "staleness_mean")
              if key in record} for record in main]
    split = {}
    for label, records in logs.items():
        totals = [sum(record.get(f"{phase}_seconds", 0.0) for record in records)
                  for phase in _metrics().PHASES]
        if sum(totals) > 0:
            split[label] = {**{f"{phase}_seconds": round(total, 4)
                               for phase, total in zip(_metrics().PHASES, totals, strict=True)},
                            **{phase: round(fraction, 4)
                               for phase, fraction in _metrics().time_split(*totals).items()}}
    losses = [point["loss"] for point in curve if "loss" in point]
    report: dict[str, Any] = {
        "run": run_dir.name,
        "run_dir": str(run_dir),
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        **{key: summary.get(key) for key in (
            "algorithm", "world_size", "epochs", "steps", "global_batch_size", "train_seconds",
            "samples_per_second", "communication_ops_per_epoch", "resumed_from_step")
           if key in summary},
        "final_loss": losses[-1] if losses else None,
        "test": {key: evaluation[key] for key in ("split", "examples", "loss", "accuracy")
                 if key in evaluation} if evaluation else None,
        "time_split": split,
        "epochs_log": curve,
        "accuracy_curve": summary.get("accuracy_curve", []),
    }
    if summary.get("algorithm") == "async":
        report["async"] = {key: summary.get(key) for key in (
            "updates_applied", "staleness_mean", "staleness_max", "bound_waits")}
    endpoints = _read_json(run_dir / _metrics().ENDPOINTS_FILE)
    if endpoints:
        report["metrics_endpoints"] = {key: value.get("address")
                                       for key, value in endpoints.get("endpoints", {}).items()}
    return report


def format_summary(report: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    test = report.get("test") or {}
    lines = [f"{report['run']}: {report.get('algorithm', '?')} on {report.get('world_size', '?')} "
             f"workers, {report.get('epochs', '?')} epochs, {report.get('steps', '?')} steps"]
    figures = []
    if report.get("train_seconds") is not None:
        figures.append(f"trained in {report['train_seconds']:.1f}s")
    if report.get("samples_per_second"):
        figures.append(f"{report['samples_per_second']:.0f} samples/s")
    if report.get("final_loss") is not None:
        figures.append(f"final loss {report['final_loss']:.4f}")
    if "accuracy" in test:
        figures.append(f"test accuracy {test['accuracy']:.4f} (loss {test['loss']:.4f})")
    if figures:
        lines.append("  " + ", ".join(figures))
    for label, split in report.get("time_split", {}).items():
        lines.append(f"  {label:<10} compute {split['compute'] * 100:3.0f}%  "
                     f"comm {split['comm'] * 100:3.0f}%  data {split['data'] * 100:3.0f}%")
    if report.get("async"):
        lines.append(f"  staleness mean {report['async']['staleness_mean']}, "
                     f"max {report['async']['staleness_max']}")
    return "\n".join(lines)


# --- plots ------------------------------------------------------------------------------------

def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on workers, CI or pods
    import matplotlib.pyplot as plt

    return plt


def _label(report: dict[str, Any], several: bool) -> str:
    return f"{report['run']} ({report.get('algorithm', '?')})" if several \
        else report.get("algorithm") or report["run"]


def _draw_loss(ax: Any, reports: Sequence[dict[str, Any]]) -> None:
    for report in reports:
        points = [(p["epoch"], p["loss"]) for p in report["epochs_log"] if "loss" in p]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", markersize=3,
                    label=_label(report, len(reports) > 1))
    ax.set(title="training loss", xlabel="epoch", ylabel="cross-entropy")
    if any(p.get("loss") for r in reports for p in r["epochs_log"]):
        ax.set_yscale("log")


def _draw_accuracy(ax: Any, reports: Sequence[dict[str, Any]]) -> None:
    drawn = False
    for index, report in enumerate(reports):
        color = f"C{index}"
        curve = [(p["epoch"], p["test_accuracy"]) for p in report["epochs_log"]
                 if "test_accuracy" in p]
        if curve:
            ax.plot(*zip(*curve, strict=True), color=color, marker="o", markersize=3,
                    label=_label(report, len(reports) > 1))
            drawn = True
        test = report.get("test") or {}
        if "accuracy" in test:  # the evaluate step's figure, at the last epoch
            epoch = report.get("epochs") or (report["epochs_log"][-1]["epoch"]
                                             if report["epochs_log"] else 1)
            ax.scatter([epoch], [test["accuracy"]], color=color, marker="*", s=160, zorder=3,
                       label=f"{_label(report, len(reports) > 1)}: test {test['accuracy']:.4f}")
            drawn = True
    ax.set(title="test accuracy", xlabel="epoch", ylabel="accuracy")
    last = max((report.get("epochs") or 1 for report in reports), default=1)
    ax.set_xlim(0.5, last + 0.5)  # one point (the final evaluation) still gets a sane axis
    if drawn:
        ax.set_ylim(top=1.0)
    else:
        ax.text(0.5, 0.5, "no accuracy yet\n(run the evaluate step)", ha="center",
                va="center", transform=ax.transAxes, color="gray")


def _draw_throughput(ax: Any, reports: Sequence[dict[str, Any]]) -> None:
    for report in reports:
        points = [(p["epoch"], p["samples_per_second"]) for p in report["epochs_log"]
                  if "samples_per_second" in p]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", markersize=3,
                    label=_label(report, len(reports) > 1))
    ax.set(title="throughput (whole job)", xlabel="epoch", ylabel="samples/s")
    ax.set_ylim(bottom=0)


def _draw_time_split(ax: Any, reports: Sequence[dict[str, Any]]) -> None:
    rows = [(f"{report['run'] + ' ' if len(reports) > 1 else ''}{label}", split)
            for report in reports for label, split in report.get("time_split", {}).items()]
    if not rows:
        ax.text(0.5, 0.5, "no step timings recorded", ha="center", va="center",
                transform=ax.transAxes, color="gray")
        return
    names = [name for name, _ in rows]
    left = [0.0] * len(rows)
    colors = {"compute": "#4C72B0", "comm": "#DD8452", "data": "#55A868"}
    for phase in ("compute", "comm", "data"):
        widths = [split[phase] * 100 for _, split in rows]
        ax.barh(names, widths, left=left, color=colors[phase], label=phase)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set(title="step time per rank (%)", xlim=(0, 100))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=3, fontsize="small",
              frameon=False)


DRAW = {"loss": _draw_loss, "accuracy": _draw_accuracy, "throughput": _draw_throughput,
        "time-split": _draw_time_split}


def _finish(ax: Any, name: str) -> None:
    from matplotlib.ticker import MaxNLocator

    if name != "time-split":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
    if name != "time-split" and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    ax.grid(alpha=0.3)


def plot(reports: Sequence[dict[str, Any]], output: Path, title: str) -> Path:
    """The four panels for one or more runs in one PNG."""
    plt = _pyplot()
    rows = max(len(r.get("time_split", {})) for r in reports) * len(reports)
    figure, axes = plt.subplots(2, 2, figsize=(12, 8 + max(0, rows - 6) * 0.3))
    for ax, name in zip(axes.flat, PLOTS, strict=True):
        DRAW[name](ax, reports)
        _finish(ax, name)
    figure.suptitle(title)
    figure.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=100)
    plt.close(figure)
    return output


def write_report(run_dir: Path, plots: bool = True) -> dict[str, Any]:
    """Build the report and write ``report/report.json`` and the PNGs; returns the report."""
    run_dir = Path(run_dir)
    report = build_report(run_dir)
    folder = run_dir / REPORT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    report["plots"] = {}
    if plots:
        try:
            plt = _pyplot()
        except ImportError:
            report["plots_skipped"] = "matplotlib is not installed"
        else:
            for name in PLOTS:
                figure, ax = plt.subplots(figsize=(6.4, 4.2))
                DRAW[name](ax, [report])
                _finish(ax, name)
                # fixed margins: tight_layout would double the time spent on these small plots
                figure.subplots_adjust(left=0.22 if name == "time-split" else 0.13,
                                       right=0.97, bottom=0.13, top=0.91)
                figure.savefig(folder / f"{name}.png", dpi=100)
                plt.close(figure)
                report["plots"][name] = f"{name}.png"
            plot([report], folder / "overview.png", _title([report]))
            report["plots"]["overview"] = "overview.png"
    temporary = folder / ".report.json.tmp"
    temporary.write_text(json.dumps(report, indent=2) + "\n")
    temporary.replace(folder / "report.json")
    return report


def _title(reports: Sequence[dict[str, Any]]) -> str:
    if len(reports) == 1:
        report = reports[0]
        return (f"{report['run']}: {report.get('algorithm', '?')}, "
                f"{report.get('world_size', '?')} workers, {report.get('epochs', '?')} epochs")
    return " vs ".join(str(r.get("algorithm") or r["run"]) for r in reports)


def compare(run_dirs: Sequence[Path], output: Path) -> Path:
    """One PNG with every run's loss, accuracy, throughput and time split side by side."""
    reports = [build_report(run_dir) for run_dir in run_dirs]
    return plot(reports, output, _title(reports))


# --- sublimate report -------------------------------------------------------------------------

def add_report_command(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``sublimate report RUN [RUN...]`` on the CLI's subparsers."""
    parser = subparsers.add_parser(
        "report", help="print a run's report and regenerate its plots; compare several runs",
        description="Print the summary of one or more runs and (re)generate report/ in each "
                    "run folder; with two or more runs also draw them side by side in one plot.")
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="a run folder, or a run id under "
                             "$SUBLIMATE_HOME/volumes/sublimate-data/runs")
    parser.add_argument("--output", "-o", type=Path, default=None,
                        help="where to write the comparison PNG (default: "
                             "$SUBLIMATE_HOME/reports/<run>-vs-<run>.png)")
    parser.add_argument("--json", action="store_true", help="print the report(s) as JSON")
    parser.add_argument("--no-plots", dest="plots", action="store_false",
                        help="write report.json only")
    parser.set_defaults(handler=command_report)
    return parser


def command_report(args: argparse.Namespace) -> int:
    try:
        run_dirs = [resolve_run(reference) for reference in args.runs]
        reports = [write_report(run_dir, plots=args.plots) for run_dir in run_dirs]
    except ReportError as error:
        print(f"report: error: {error}", file=sys.stderr)
        return 2
    comparison = None
    if len(run_dirs) > 1 and args.plots:
        output = args.output or home() / "reports" / (
            "-vs-".join(run_dir.name for run_dir in run_dirs) + ".png")
        try:
            comparison = compare(run_dirs, output)
        except ImportError:
            print("report: matplotlib is not installed; no comparison plot", file=sys.stderr)
    if args.json:
        print(json.dumps(reports[0] if len(reports) == 1 else reports, indent=2))
        return 0
    for report in reports:
        print(format_summary(report))
        if report["plots"]:
            print(f"  plots: {Path(report['run_dir']) / REPORT_DIR}/"
                  f"{{{','.join(report['plots'].values())}}}")
    if comparison:
        print(f"comparison: {comparison}")
    return 0
