"""The ``compare`` step of a sweep: one report of every point, and the best point.

A sweep trains one run per point of a grid (``sublimate-sweep``); this step reads what each point's
run left on the shared volume (``<runs-root>/<run-id>/``: the evaluate step's ``metrics.json`` and
the run report's figures, :func:`sublimate.components.monitoring.run_report.build_report`) and
writes into ``--sweep-dir``::

    report.md                  the table and the plots, readable on GitHub
    report.json                every number below, per point, plus the curves
    points.csv                 the table, one row per point, raw numbers
    metric-by-axis.png         the final metric against each axis (one panel per axis)
    samples-per-second-by-axis.png   throughput against each axis
    loss-curves.png            every point's training loss per epoch, overlaid
    time-to-accuracy.png       test accuracy against training time, coloured by paradigm

The table: each axis, status, final metric, time to target, samples/s, communication share
(comm seconds over all step seconds of every process), bytes sent per worker (the mean over
the training processes of ``net_sent_bytes`` at their last epoch), train seconds and epochs.

**Time to target** is the training time (``train_seconds``, evaluation excluded) at the first
per-epoch test evaluation that reaches ``--target``; a run whose curve never does but whose final
metric does reaches it at the end of training. Only accuracy is evaluated per epoch, so for
another metric the time is the end of training when the final metric reaches the target, and
"not reached" otherwise. A ``--target`` of 0 or empty means 95% of the way to the best point:
the best final metric minus 5% of its magnitude (plus, for a metric where lower is better).

A point whose run folder, ``metrics.json`` or metric is missing is a **failed** point: it is in
the table as failed with what was missing and the end of its train log, and it never stops the
step. The step fails only when every point failed. (A point with its metric but no epoch
records, a user's own loop that does not use the reporter, is in the table with its metric and
"n/a" for the training figures.)
Outputs: ``best-point`` (JSON: id, run-id, params, metric) and ``report`` (report.md's path).
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sublimate.components.base import run_files
from sublimate.components.base import settings as declared
from sublimate.components.base.termination import OneLineParser, fail
from sublimate.components.monitoring.traffic import format_bytes
from sublimate.components.steps.gate import goal_of

STEP = "compare"
TARGET_FRACTION = 0.95  # the default target: this far of the way to the best point's metric
LOG_TAIL_LINES = 15
POINT_AXIS = "point"  # the x axis of the plots when the sweep has no axes: the point's id
REPORT = "report.md"
PLOTS = {"metric-by-axis": "metric-by-axis.png",
         "samples-per-second-by-axis": "samples-per-second-by-axis.png",
         "loss-curves": "loss-curves.png", "time-to-accuracy": "time-to-accuracy.png"}


@dataclass(frozen=True)
class Point:
    """One point of the sweep's grid: its id, its run folder's name and its axes' values."""

    id: str
    run_id: str
    params: dict[str, Any]


@dataclass
class Result:
    """What one point's run left: its figures, or why it failed."""

    point: Point
    problem: str = ""  # empty: the point succeeded; else what is missing, in a sentence
    missing: str = ""  # the same in a few words, for the table
    log_tail: list[str] = field(default_factory=list)
    log_file: str = ""
    metric: float | None = None
    report: dict[str, Any] = field(default_factory=dict)  # build_report's, for the figures
    time_to_target: float | None = None

    @property
    def ok(self) -> bool:
        return not self.problem

    @property
    def algorithm(self) -> str:
        return str(self.point.params.get("algorithm") or self.report.get("algorithm") or "?")

    def accuracy_curve(self) -> list[tuple[float, float]]:
        """(train seconds, test accuracy) after each epoch, from train-summary.json."""
        return [(float(seconds), float(accuracy))
                for seconds, _step, accuracy in self.report.get("accuracy_curve") or []]

    def communication_share(self) -> float | None:
        """Comm seconds / all step seconds, summed over every process of the run."""
        return self.share("comm")

    def share(self, phase: str) -> float | None:
        """A phase's seconds (data, compute, comm) / all step seconds, summed over every
        process of the run."""
        splits = (self.report.get("time_split") or {}).values()
        seconds = sum(split.get(f"{phase}_seconds", 0.0) for split in splits)
        total = sum(split.get(f"{part}_seconds", 0.0) for split in splits
                    for part in ("data", "compute", "comm"))
        return seconds / total if total > 0 else None

    def bytes_sent_per_worker(self) -> float | None:
        sent = list((self.report.get("net_sent_bytes") or {}).values())
        return sum(sent) / len(sent) if sent else None

    def figures(self) -> dict[str, Any]:
        """The point's row: every number of the table, unformatted (None: not recorded)."""
        report = self.report
        return {
            "id": self.point.id, "run-id": self.point.run_id, "params": self.point.params,
            "status": "ok" if self.ok else "failed", "problem": self.problem,
            "missing": self.missing,
            "metric": self.metric, "time_to_target_seconds": self.time_to_target,
            "samples_per_second": report.get("samples_per_second"),
            "communication_share": _rounded(self.communication_share(), 4),
            "compute_share": _rounded(self.share("compute"), 4),
            "net_sent_bytes_per_worker": _rounded(self.bytes_sent_per_worker(), 0),
            "sent_payload_bytes_per_worker": report.get("sent_payload_bytes_per_worker"),
            "sent_wire_bytes_per_worker": report.get("sent_wire_bytes_per_worker"),
            "net_sent_bytes": report.get("net_sent_bytes"),
            "train_seconds": report.get("train_seconds"),
            "epochs": report.get("epochs") or (len(report["epochs_log"])
                                               if report.get("epochs_log") else None),
            "algorithm": report.get("algorithm"), "world_size": report.get("world_size"),
            "accuracy_curve": report.get("accuracy_curve") or [],
            "loss_curve": [[p["epoch"], p["loss"]] for p in report.get("epochs_log") or []
                           if "loss" in p],
            "log_file": self.log_file, "log_tail": self.log_tail,
        }


def _rounded(value: float | None, digits: int) -> float | None:
    if value is None:
        return None
    return round(value, digits) if digits else float(round(value))


# --- input ------------------------------------------------------------------------------------

def parse_points(text: str) -> list[Point]:
    """The ``--points`` JSON; ValueError naming the point and field that is wrong."""
    try:
        document = json.loads(text)
    except ValueError as error:
        raise ValueError(f"points: not JSON ({error})") from None
    if not isinstance(document, list) or not document:
        raise ValueError("points: expected a non-empty JSON list of "
                         '{"id": ..., "run-id": ..., "params": {...}}')
    points, seen = [], set()
    for index, entry in enumerate(document):
        where = f"points[{index}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected an object, got {type(entry).__name__}")
        for key in ("id", "run-id"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise ValueError(f"{where}.{key}: missing or not a non-empty string")
        run_id = entry["run-id"]
        if "/" in run_id or run_id in (".", ".."):
            raise ValueError(f"{where}.run-id: '{run_id}' is not a run folder's name")
        params = entry.get("params", {})
        if not isinstance(params, dict):
            raise ValueError(f"{where}.params: expected an object of axis values")
        if entry["id"] in seen:
            raise ValueError(f"{where}.id: '{entry['id']}' is used twice")
        seen.add(entry["id"])
        points.append(Point(entry["id"], run_id, params))
    return points


def parse_target(text: str) -> float | None:
    """``--target``: a number, or None (0 or empty) for the default rule."""
    if not text.strip():
        return None
    try:
        target = float(text)
    except ValueError:
        raise ValueError(f"target: '{text}' is not a number (0 or empty: 95% of the best "
                         "point's metric)") from None
    if math.isnan(target):
        raise ValueError("target: NaN is not a target")
    return None if target == 0 else target


def axes_of(points: Sequence[Point]) -> list[str]:
    """Every axis that any point names, in the order they first appear."""
    return list(dict.fromkeys(name for point in points for name in point.params))


# --- reading the runs -------------------------------------------------------------------------

def log_tail(run_dir: Path, lines: int = LOG_TAIL_LINES) -> tuple[str, list[str]]:
    """The end of the run's train log: (its path in the run folder, its last lines).

    The train step keeps one log per node (``logs/.../<role>/<replica>/combined.log``, TorchX's
    layout). Of the most recent job, the log that stopped growing first is taken: the node that
    failed first stops writing first, and its peers' logs end with their consequences of it.
    """
    logs = sorted((run_dir / run_files.LOGS).glob("**/combined.log")) or \
        sorted((run_dir / run_files.LOGS).glob("**/*.log"))
    logs = [log for log in logs if log.stat().st_size]
    if not logs:
        return "", []
    jobs: dict[Path, list[Path]] = {}
    for log in logs:  # <job>/<role>/<replica>/combined.log
        jobs.setdefault(log.parents[2] if len(log.relative_to(run_dir).parts) > 3
                        else log.parent, []).append(log)
    latest = max(jobs.values(), key=lambda group: max(log.stat().st_mtime_ns for log in group))
    # File times are a few milliseconds coarse: on a tie, the lowest node (rank 0's) is taken.
    first_to_stop = min(latest, key=lambda log: (log.stat().st_mtime_ns, str(log)))
    text = first_to_stop.read_text(errors="replace").rstrip("\n").splitlines()
    return str(first_to_stop.relative_to(run_dir)), text[-lines:]


def _failed(result: Result, problem: str, missing: str, run_dir: Path | None = None) -> Result:
    result.problem, result.missing = problem, missing
    if run_dir is not None:
        result.log_file, result.log_tail = log_tail(run_dir)
    return result


def read_point(point: Point, runs_root: Path, metric: str) -> Result:
    """The point's figures from its run folder; a failed Result naming what is missing."""
    from sublimate.components.monitoring.run_report import ReportError, build_report, read_json

    run_dir = runs_root / point.run_id
    result = Result(point)
    if not run_dir.is_dir():
        return _failed(result, f"no run folder {run_dir} (its train step never started)",
                       "no run folder")
    evaluation = run_dir / run_files.EVALUATION
    metrics = read_json(evaluation)
    if not isinstance(metrics, dict):
        why = "is missing" if not evaluation.is_file() else \
            "is not valid JSON" if metrics is None else "is not a JSON object"
        return _failed(result, f"{evaluation} {why} (training or evaluation did not finish)",
                       f"{run_files.EVALUATION} {why.removeprefix('is ')}", run_dir)
    if metric not in metrics:
        known = ", ".join(sorted(metrics)) or "nothing"
        return _failed(result, f"metric '{metric}' is not in {evaluation} (it has: {known})",
                       f"no {metric} in {run_files.EVALUATION}", run_dir)
    value = metrics[metric]
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return _failed(result, f"metric '{metric}' in {evaluation} is {value!r}, not a number",
                       f"{metric} not a number", run_dir)
    result.metric = float(value)
    # a user's own loop that records no epochs: its metric alone, the figures n/a
    with contextlib.suppress(ReportError):
        result.report = build_report(run_dir)
    return result


def default_target(best: float, goal: str) -> float:
    """95% of the way to the best point: its metric less (or, lower being better, plus) 5% of
    its magnitude."""
    margin = (1 - TARGET_FRACTION) * abs(best)
    return best - margin if goal == "max" else best + margin


def reaches(value: float, target: float, goal: str) -> bool:
    return value >= target if goal == "max" else value <= target


def time_to_target(result: Result, metric: str, target: float, goal: str) -> float | None:
    """Training seconds until the point's metric first reached ``target`` (None: never)."""
    if metric == "accuracy":
        for seconds, accuracy in result.accuracy_curve():
            if reaches(accuracy, target, goal):
                return seconds
    if result.metric is not None and reaches(result.metric, target, goal):
        return result.report.get("train_seconds")  # at the end: the evaluate step's figure
    return None


def best_of(results: Sequence[Result], goal: str) -> Result | None:
    """The succeeded point with the best metric (the first of equals)."""
    done = [result for result in results if result.ok]
    if not done:
        return None
    sign = 1 if goal == "max" else -1
    return max(done, key=lambda result: sign * (result.metric or 0.0))


# --- plots ------------------------------------------------------------------------------------

def _x_of(result: Result, axis: str) -> Any:
    """The point's value on ``axis`` (``point``: its id, when the sweep has no axes)."""
    return result.point.id if axis == POINT_AXIS else result.point.params.get(axis)


def _axis_values(results: Sequence[Result], axis: str) -> tuple[list[Any], bool]:
    """The axis' distinct values in plotting order (numbers sorted, others as they come),
    and whether they are numbers."""
    values = [_x_of(result, axis) for result in results]
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return sorted(set(values)), True
    return list(dict.fromkeys(str(v) for v in values)), False


def _draw_axis_panel(ax: Any, shown: Sequence[Result], axes: Sequence[str], axis: str,
                     what: str, value_of: Callable[[Result], float | None]) -> None:
    ordered, numeric = _axis_values(shown, axis)

    def position(result: Result) -> Any:  # categories at 0, 1, 2 ...
        value = _x_of(result, axis)
        return value if numeric else ordered.index(str(value))

    if len(axes) == 2:  # a line per value of the other axis
        other = next(name for name in axes if name != axis)
        for index, value in enumerate(_axis_values(shown, other)[0]):
            group = sorted((r for r in shown if str(_x_of(r, other)) == str(value)),
                           key=position)
            ax.plot([position(r) for r in group], [value_of(r) for r in group], marker="o",
                    color=f"C{index}", label=f"{other} {value}")
        ax.legend(fontsize="small")
    else:
        ax.scatter([position(r) for r in shown], [value_of(r) for r in shown], color="C0",
                   zorder=3)
    if numeric and ordered and min(ordered) > 0 and max(ordered) / min(ordered) >= 8:
        ax.set_xscale("log", base=2)  # batch sizes and rates span powers of two
    if numeric:
        ax.set_xticks(ordered, [f"{v:g}" for v in ordered])
    elif ordered:
        ax.set_xticks(range(len(ordered)), ordered)
        ax.set_xlim(-0.5, len(ordered) - 0.5)
    ax.set(xlabel=axis, ylabel=what, title=f"{what} by {axis}")
    ax.grid(alpha=0.3)


def _draw_against_axes(results: Sequence[Result], axes: Sequence[str], what: str,
                       value_of: Callable[[Result], float | None], output: Path) -> None:
    """One panel per axis: ``value_of(result)`` against the axis' value; with exactly two
    axes, a line per value of the other axis, else the points alone."""
    from sublimate.components.monitoring.run_report import _pyplot

    plt = _pyplot()
    shown = [r for r in results if r.ok and value_of(r) is not None]
    panels = list(axes) or [POINT_AXIS]
    figure, grid = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.0),
                                squeeze=False)
    for ax, axis in zip(grid[0], panels, strict=True):
        _draw_axis_panel(ax, shown, axes, axis, what, value_of)
    figure.tight_layout()
    figure.savefig(output, dpi=100)
    plt.close(figure)


def _label(result: Result) -> str:
    params = ", ".join(f"{name} {value}" for name, value in result.point.params.items())
    return f"{result.point.id}: {params}" if params else result.point.id


def _draw_losses(results: Sequence[Result], output: Path) -> None:
    from matplotlib.ticker import MaxNLocator

    from sublimate.components.monitoring.run_report import DRAW, _pyplot

    plt = _pyplot()

    shown = [r for r in results if r.ok]
    figure, ax = plt.subplots(figsize=(7.5, 4.8))
    DRAW["loss"](ax, [r.report for r in shown], [_label(r) for r in shown])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
    ax.set_title("training loss per point")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="x-small")
    ax.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(output, dpi=100)
    plt.close(figure)


def _draw_time_to_accuracy(results: Sequence[Result], target: float | None, metric: str,
                           output: Path) -> None:
    from sublimate.components.monitoring.run_report import _pyplot

    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(7.5, 4.8))
    colours: dict[str, str] = {}
    for result in (r for r in results if r.ok):
        curve = result.accuracy_curve()
        if not curve:
            continue
        new = result.algorithm not in colours
        colour = colours.setdefault(result.algorithm, f"C{len(colours)}")
        seconds, accuracy = zip(*curve, strict=True)
        ax.plot(seconds, accuracy, marker="o", markersize=3, color=colour,
                label=result.algorithm if new else None)
        end = (seconds[-1], accuracy[-1])
        if metric == "accuracy" and result.metric is not None:
            # the evaluate step's figure, at the end of training (bmuf and easgd average the
            # workers once more after the last epoch's evaluation)
            end = (float(result.report.get("train_seconds") or seconds[-1]), result.metric)
            ax.scatter(*end, marker="*", s=120, color=colour, edgecolors="black",
                       linewidths=0.5, zorder=3)
        ax.annotate(result.point.id, end, fontsize="x-small", xytext=(6, 0),
                    textcoords="offset points", color=colour)
    if metric == "accuracy" and target is not None:
        ax.axhline(target, color="gray", linestyle="--", linewidth=1,
                   label=f"target {target:.4g}")
    if not colours:
        ax.text(0.5, 0.5, "no per-epoch accuracy recorded\n(eval-every-epoch was off)",
                ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set(title="test accuracy against training time, by paradigm (\u2605 final)"
           if metric == "accuracy" else "test accuracy against training time, by paradigm",
           xlabel="training seconds (evaluation excluded)", ylabel="test accuracy")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(output, dpi=100)
    plt.close(figure)


def draw_plots(results: Sequence[Result], axes: Sequence[str], metric: str,
               target: float | None, folder: Path) -> dict[str, str]:
    """Every plot of the report into ``folder``; {name: file name}."""
    _draw_against_axes(results, axes, f"final {metric}", lambda r: r.metric,
                       folder / PLOTS["metric-by-axis"])
    _draw_against_axes(results, axes, "samples/s",
                       lambda r: r.report.get("samples_per_second"),
                       folder / PLOTS["samples-per-second-by-axis"])
    _draw_losses(results, folder / PLOTS["loss-curves"])
    _draw_time_to_accuracy(results, target, metric, folder / PLOTS["time-to-accuracy"])
    return dict(PLOTS)


# --- the report -------------------------------------------------------------------------------


def _seconds(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"  # small runs take under a second


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def table_rows(results: Sequence[Result], axes: Sequence[str], metric: str,
               target: float | None) -> tuple[list[str], list[list[str]]]:
    """The Markdown table's header and rows (formatted for reading)."""
    target_text = f"{target:.4g}" if target is not None else "target"
    header = ["id", *axes, "status", f"final {metric}", f"time to {target_text} (s)",
              "samples/s", "comm share", "sent per worker (counted)",
              "sent per worker (namespace)", "train s", "epochs"]
    rows = []
    for result in results:
        row = result.figures()
        params = [_cell(result.point.params.get(axis, "")) for axis in axes]
        if not result.ok:
            rows.append([_cell(result.point.id), *params, f"**failed**: {result.missing}",
                         *["n/a"] * (len(header) - len(axes) - 2)])
            continue
        share = row["communication_share"]
        rows.append([
            _cell(result.point.id), *params, "ok", f"{result.metric:.4f}",
            _seconds(row["time_to_target_seconds"]) if row["time_to_target_seconds"] is not None
            else "not reached",
            f"{row['samples_per_second']:.0f}" if row["samples_per_second"] is not None
            else "n/a",
            f"{share * 100:.0f}%" if share is not None else "n/a",
            format_bytes(row["sent_wire_bytes_per_worker"]),
            format_bytes(row["net_sent_bytes_per_worker"]),
            _seconds(row["train_seconds"]) if row["train_seconds"] is not None else "n/a",
            str(row["epochs"]) if row["epochs"] is not None else "n/a"])
    return header, rows


def write_markdown(path: Path, document: dict[str, Any], results: Sequence[Result],
                   axes: Sequence[str]) -> None:
    metric, goal, target = document["metric"], document["goal"], document["target"]
    failed = [result for result in results if not result.ok]
    lines = [f"# Sweep {document['sweep']}: {len(results)} points, {len(failed)} failed", ""]
    direction = "higher" if goal == "max" else "lower"
    lines.append(f"Metric: **{metric}** ({direction} is better); time to target: training "
                 f"seconds until {metric} reached **{target:.4g}** ({document['target_rule']})."
                 if target is not None else f"Metric: **{metric}** ({direction} is better).")
    best = document["best"]
    if best:
        params = ", ".join(f"{k}={v}" for k, v in best["params"].items())
        lines += ["", f"Best point: **{best['id']}** (run `{best['run-id']}`"
                  + (f"; {params}" if params else "") + f"): {metric} {best['metric']:.4f}"]
    header, rows = table_rows(results, axes, metric, target)
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", "Communication share: comm seconds over all step seconds of every training "
              "process. Sent per worker (counted): the bytes the training algorithm's "
              "collectives put on the wire per process, counted where each is issued (ring "
              "all-reduce: 2(N-1)/N of the tensors; monitoring/traffic.py), on any scheduler. "
              "Sent per worker (namespace): what each process's network namespace sent "
              "(loopback excluded, protocol overhead included), averaged over the processes. "
              "With local_cwd the job's traffic stays on loopback and that figure is only "
              "whatever else the host sent meanwhile (docs/monitoring.md)."]
    if failed:
        lines += ["", "## Failed points"]
        for result in failed:
            lines += ["", f"### {result.point.id} (run `{result.point.run_id}`)", "",
                      _cell(result.problem)]
            if result.log_tail:
                lines += ["", f"End of `{result.log_file}`:", "", "~~~text",
                          *[line.replace("~~~", "~ ~ ~") for line in result.log_tail], "~~~"]
    if document["plots"]:
        titles = {"metric-by-axis": f"final {metric} against each axis",
                  "samples-per-second-by-axis": "samples/s against each axis",
                  "loss-curves": "training loss, every point",
                  "time-to-accuracy": "time to accuracy, by paradigm"}
        lines += ["", "## Plots"]
        for name, file in document["plots"].items():
            lines += ["", f"### {titles[name]}", "", f"![{titles[name]}]({file})"]
    path.write_text("\n".join(lines) + "\n")


def format_console(document: dict[str, Any], folder: Path) -> str:
    """A sweep's report for the terminal (``sublimate report SWEEP``), from its report.json:
    the best point, then one line per point with its axes, status and metric."""
    metric, points = document["metric"], document["points"]
    failed = [point for point in points if point.get("status") != "ok"]
    lines = [f"{document['sweep']}: sweep of {len(points)} points"
             + (f", {len(failed)} failed" if failed else "")
             + f"; {metric}, {'higher' if document['goal'] == 'max' else 'lower'} is better"]
    if document.get("best"):
        best = document["best"]
        lines.append(f"  best {best['id']} (run {best['run-id']}): {metric} {best['metric']:.4f}")
    for point in points:
        params = ", ".join(f"{axis}={value}" for axis, value in point.get("params", {}).items())
        outcome = f"{metric} {point['metric']:.4f}" if point.get("status") == "ok" \
            and isinstance(point.get("metric"), int | float) \
            else f"failed: {point.get('missing') or point.get('problem') or '?'}"
        lines.append(f"  {point['id']}  {params or '(no axes)'}: {outcome}")
    lines.append(f"  report: {folder / REPORT}")
    return "\n".join(lines)


def write_csv(path: Path, results: Sequence[Result], axes: Sequence[str]) -> None:
    columns = ["id", "run-id", *axes, "status", "metric", "time_to_target_seconds",
               "samples_per_second", "communication_share", "net_sent_bytes_per_worker",
               "sent_payload_bytes_per_worker", "sent_wire_bytes_per_worker",
               "train_seconds", "epochs", "problem"]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for result in results:
            row = result.figures()
            writer.writerow([row["id"], row["run-id"],
                             *[result.point.params.get(axis, "") for axis in axes],
                             *["" if row[key] is None else row[key] for key in columns[
                                 2 + len(axes):]]])


def compare(points: Sequence[Point], runs_root: Path, sweep_dir: Path, metric: str = "accuracy",
            metric_goal: str = declared.AUTO, target: float | None = None) -> dict[str, Any]:
    """Read every point, write the report into ``sweep_dir``; returns report.json's content
    (``best`` is None when every point failed)."""
    goal = goal_of(metric, metric_goal)
    results = [read_point(point, runs_root, metric) for point in points]
    best = best_of(results, goal)
    rule = "as given"
    if target is None and best is not None:
        target = default_target(best.metric, goal)  # type: ignore[arg-type]
        rule = (f"by default the best point's {best.metric:.4g} "
                f"{'less' if goal == 'max' else 'plus'} {1 - TARGET_FRACTION:.0%} of it")
    for result in results:
        if result.ok and target is not None:
            result.time_to_target = time_to_target(result, metric, target, goal)
    axes = axes_of(points)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {
        "sweep": sweep_dir.name, "metric": metric, "goal": goal, "target": target,
        "target_rule": rule, "axes": axes,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "best": {"id": best.point.id, "run-id": best.point.run_id,
                 "params": best.point.params, "metric": best.metric} if best else None,
        "points": [result.figures() for result in results],
        "plots": {},
    }
    if best is not None:
        document["plots"] = draw_plots(results, axes, metric, target, sweep_dir)
    (sweep_dir / "report.json").write_text(json.dumps(document, indent=2) + "\n")
    write_csv(sweep_dir / "points.csv", results, axes)
    write_markdown(sweep_dir / REPORT, document, results, axes)
    return document


# --- the step ---------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> Any:
    from sublimate.components.base.runtime import RUNS_PATH

    parser = OneLineParser(prog=STEP, description=__doc__.splitlines()[0])
    parser.add_argument("--points", required=True,
                        help='JSON list of {"id", "run-id", "params": {axis: value}}')
    parser.add_argument("--sweep-dir", type=Path, required=True,
                        help="folder the report is written to (on the shared volume)")
    parser.add_argument("--runs-root", type=Path, default=Path(RUNS_PATH),
                        help="folder holding one folder per run (default %(default)s)")
    parser.add_argument("--metric", default="accuracy", help="the metric of metrics.json")
    parser.add_argument("--metric-goal", default=declared.AUTO,
                        choices=(declared.AUTO, "max", "min"),
                        help="whether higher or lower is better (auto: by the metric's name)")
    parser.add_argument("--target", default="0",
                        help="the metric value for time to target (0 or empty: 95%% of the "
                             "best point's)")
    parser.add_argument("--best-point-path", type=Path, help="file to write best-point to")
    parser.add_argument("--report-path", type=Path, help="file to write report.md's path to")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        points = parse_points(args.points)
        target = parse_target(args.target)
    except ValueError as error:
        return fail(STEP, str(error))
    document = compare(points, args.runs_root, args.sweep_dir, args.metric, args.metric_goal,
                       target)
    report = args.sweep_dir / REPORT
    if (args.sweep_dir / run_files.MLFLOW_RUN).is_file():  # sweep-grid opened an MLflow run
        from sublimate.components.monitoring.mlflow_tracking import finish_sweep

        problem = finish_sweep(args.sweep_dir, document["best"], args.metric)
        if problem is not None:
            return fail(STEP, problem)
    failed = [point for point in document["points"] if point["status"] != "ok"]
    for point in failed:
        print(f"compare: point {point['id']} failed: {point['problem']}", flush=True)
    if document["best"] is None:
        return fail(STEP, f"every point of the sweep failed ({len(failed)}): "
                    + "; ".join(f"{p['id']}: {p['problem']}" for p in failed)
                    + f"; report in {report}", code=1)
    for path, value in ((args.best_point_path, json.dumps(document["best"])),
                        (args.report_path, str(report))):
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(value)
    best = document["best"]
    print(f"compare: {len(points) - len(failed)}/{len(points)} points succeeded; best "
          f"{best['id']} ({best['run-id']}) {args.metric} {best['metric']:.4f}; report {report}",
          flush=True)
    return 0


def template(name: str = STEP, **step_options: object):
    """The ``compare`` step: inputs ``points``, ``sweep-dir``, ``metric``, ``metric-goal`` and
    ``target``; outputs ``best-point`` and ``report``."""
    from hera.workflows import Parameter

    from sublimate.components.base.mlflow_connection import credentials_env as mlflow_env
    from sublimate.components.base.runtime import RUNS_PATH, python_step

    defaults = {"metric": "accuracy", "metric-goal": declared.AUTO, "target": "0"}
    step = python_step(
        name, "sublimate.components.steps.compare",
        inputs={"points": "--points", "sweep-dir": "--sweep-dir", "metric": "--metric",
                "metric-goal": "--metric-goal", "target": "--target"},
        outputs={"best-point": "--best-point-path", "report": "--report-path"},
        extra_args=["--runs-root", RUNS_PATH],
        env=mlflow_env(),  # tracking's server: a Secret, optional
        **step_options,  # type: ignore[arg-type]
    )
    step.inputs = [Parameter(name=p.name, default=defaults[p.name]) if p.name in defaults
                   else p for p in step.inputs]
    return step


if __name__ == "__main__":
    sys.exit(main())
