"""Run reports: one JSON summary and a few PNG plots per run, and side-by-side comparisons.

A report is built only from what the run already left on the shared volume:
``train-summary.json`` (the train step), ``metrics.json`` (the evaluate step: test loss and
accuracy), ``metrics/<label>.jsonl`` (one record per epoch from every training process) and
``metrics-endpoints.json``. It is written to ``<run>/report/``::

    report.json        the summary below (``sublimate report RUN`` prints it)
    overview.png       the four panels in one image
    loss.png  accuracy.png  throughput.png  time-split.png

The evaluate step writes it at the end of every pipeline run; ``sublimate report RUN [RUN...]``
(:mod:`sublimate.pipelines.run_lookup`, which finds a run by any of its names) prints and
regenerates it, and with several runs draws them in one comparison plot, each run labelled by
what differs between them. matplotlib is imported lazily (Agg backend) and is optional: without
it only the JSON is written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sublimate.components.base import run_files
from sublimate.components.monitoring.traffic import format_bytes

# components.metrics (prometheus-client) is imported by the functions that need it, so that
# registering `sublimate report` costs the other commands nothing.

REPORT_DIR = run_files.REPORT
PLOTS = ("loss", "accuracy", "throughput", "time-split")


# Copied from train-summary.json into the report when present. The launch figures are the
# wall time from `sublimate run` starting the train step to the first optimizer step, and
# its phases (``startup``: phase -> seconds); on a small run they can exceed the training.
SUMMARY_KEYS = (
    "algorithm", "backend", "world_size", "epochs", "steps", "global_batch_size",
    "learning_rate", "final_learning_rate", "train_seconds", "samples_per_second",
    "communication_ops_per_epoch", "sent_payload_bytes_per_worker",
    "sent_wire_bytes_per_worker", "resumed_from_step", "launch_to_first_step_seconds",
    "startup")


class ReportError(Exception):
    """A run that cannot be found or holds nothing to report."""


def _metrics() -> Any:
    from sublimate.components.monitoring import metrics

    return metrics


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _by_epoch(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Last record per epoch, in epoch order (a resumed run repeats the epoch it crashed in)."""
    latest = {record["epoch"]: record for record in records if "epoch" in record}
    return [latest[epoch] for epoch in sorted(latest)]


# What the evaluate step adds to metrics.json about itself: not metrics of the model.
EVALUATION_BOOKKEEPING = frozenset({"split", "examples", "algorithm", "steps", "seconds",
                                    "examples_per_second", "total_seconds"})


def derived_summary(run_dir: Path, logs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """What a run without ``train-summary.json`` (a loop of your own on the library) tells of
    itself: the algorithm and world size its checkpoints committed, and the epochs, steps,
    training time and throughput of its epoch records."""
    derived: dict[str, Any] = {}
    committed = read_json(run_dir / run_files.CHECKPOINTS / run_files.LATEST) or {}
    for key in ("algorithm", "world_size"):
        if committed.get(key) is not None:
            derived[key] = committed[key]
    ranks = [records for label, records in logs.items() if label.startswith("rank-")]
    if ranks:
        derived.setdefault("world_size", len(ranks))
    main = logs.get("ps") or logs.get("rank-0") or next(iter(logs.values()), [])
    if main:
        derived["epochs"], derived["steps"] = main[-1].get("epoch"), main[-1].get("step")
        seconds = [record["seconds"] for record in main
                   if isinstance(record.get("seconds"), int | float)]
        if seconds:
            derived["train_seconds"] = round(sum(seconds), 3)
        rates = [record["samples_per_second"] for record in main
                 if isinstance(record.get("samples_per_second"), int | float)]
        if rates:
            derived["samples_per_second"] = round(sum(rates) / len(rates), 1)
    return {key: value for key, value in derived.items() if value is not None}


def build_report(run_dir: Path) -> dict[str, Any]:
    """The report of one run as a dict (nothing is written): whatever kind of run it is (the
    built-in loop, a loop on the library, a plain script that wrote only ``metrics.json``), with
    what it left."""
    run_dir = Path(run_dir)
    evaluation = read_json(run_dir / run_files.EVALUATION)
    evaluation = evaluation if isinstance(evaluation, dict) else None
    logs = {path.stem: _by_epoch(list(_metrics().iter_jsonl(path)))
            for path in sorted((run_dir / "metrics").glob("*.jsonl"))}
    summary = read_json(run_dir / run_files.SUMMARY) or {}
    failures = first_failures(run_dir)
    if not summary and not logs and evaluation is None and not failures:
        raise ReportError(f"{run_dir}: no train-summary.json, metrics/*.jsonl or metrics.json: "
                          "has this run trained yet?")
    summary = {**derived_summary(run_dir, logs), **summary}
    # The job-wide curve: the parameter server's view for async, rank 0's for the others, and
    # under per-step recovery the leading group's, whichever group led each epoch.
    led = _by_epoch([record for records in logs.values() for record in records
                     if record.get("leader")])
    main = led or logs.get("ps") or logs.get("rank-0") or next(iter(logs.values()), [])
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
    # What each process's network namespace had sent by its last epoch (see metrics.NET_DEV).
    sent = {label: records[-1]["net_sent_bytes"] for label, records in logs.items()
            if records and isinstance(records[-1].get("net_sent_bytes"), int)}
    report: dict[str, Any] = {
        "run": run_dir.name,
        "run_dir": str(run_dir),
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        **{key: summary.get(key) for key in SUMMARY_KEYS if key in summary},
        "final_loss": losses[-1] if losses else None,
        "test": {key: evaluation[key] for key in ("split", "examples", "loss", "accuracy")
                 if key in evaluation} if evaluation else None,
        # every other named metric (own code's mAP, ...), as metrics.json holds it
        "metrics": {key: value for key, value in (evaluation or {}).items()
                    if key not in ("loss", "accuracy") and key not in EVALUATION_BOOKKEEPING},
        "time_split": split,
        "epochs_log": curve,
        "accuracy_curve": summary.get("accuracy_curve", []),
    }
    if summary.get("fault_tolerance"):
        report["fault_tolerance"] = summary["fault_tolerance"]
    if summary.get("algorithm") == "async":
        report["async"] = {key: summary.get(key) for key in (
            "updates_applied", "staleness_mean", "staleness_max", "bound_waits")}
    if sent:
        report["net_sent_bytes"] = sent
    if failures:  # a run that failed, or that torchrun restarted after a failure
        report["failures"] = failures
    stragglers = straggler_summary(main)
    if stragglers is not None:
        report["stragglers"] = stragglers
    endpoints = read_json(run_dir / run_files.ENDPOINTS)
    if endpoints:
        report["metrics_endpoints"] = {key: value.get("address")
                                       for key, value in endpoints.get("endpoints", {}).items()}
    return report


def first_failures(run_dir: Path) -> list[dict[str, Any]]:
    """The first failing rank of each of the run's jobs and torchrun restarts, from their error
    files (:mod:`sublimate.components.base.elastic_errors`), in time order."""
    from sublimate.components.base.elastic_errors import read_failures

    first: dict[tuple[str, int], Any] = {}
    for failure in read_failures(run_dir):
        first.setdefault((failure.app_id, failure.restart), failure)
    return [{"who": failure.who, "message": failure.message, "job": failure.app_id,
             "restart": failure.restart, "error_file": str(failure.error_file)}
            for failure in first.values()]


def straggler_summary(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's stragglers, from the ``stragglers`` lists of the main epoch log's records.

    Rank 0 writes, in each epoch's record, the ranks it flagged that epoch
    (:meth:`sublimate.components.monitoring.stragglers.Finding.records`; an empty list: checked,
    none). Per flagged rank: its node, the epochs it was flagged in, its mean and largest ratio of
    own work per step to the median rank's, its excess per step, and the phase its time went to most
    often (with that phase's mean ratio to the median). None for runs that did not check (recorded
    before straggler detection, or a paradigm that does not judge).
    """
    checked = [record for record in records if isinstance(record.get("stragglers"), list)]
    if not checked:
        return None
    flagged: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    for record in checked:
        for entry in record["stragglers"]:
            flagged.setdefault(int(entry["rank"]), []).append((record["epoch"], entry))
    ranks = []
    for rank, seen in flagged.items():
        entries = [entry for _, entry in seen]
        causes = [entry.get("cause", "?") for entry in entries]
        cause = max(dict.fromkeys(causes), key=causes.count)  # most often; the first on a tie
        cause_ratios = [entry["cause_ratio"] for entry in entries
                        if entry.get("cause") == cause and entry.get("cause_ratio") is not None]
        ranks.append({
            "rank": rank, "node": entries[-1].get("node", "?"),
            "epochs": [epoch for epoch, _ in seen],
            "ratio_mean": round(sum(e["ratio"] for e in entries) / len(entries), 3),
            "ratio_max": round(max(e["ratio"] for e in entries), 3),
            "excess_seconds_per_step": round(
                sum(e.get("excess_seconds_per_step", 0.0) for e in entries) / len(entries), 6),
            "cause": cause,
            "cause_ratio": round(sum(cause_ratios) / len(cause_ratios), 3)
            if cause_ratios else None})
    # the rank flagged most often first: the one to look at
    ranks.sort(key=lambda entry: (-len(entry["epochs"]), -entry["ratio_mean"], entry["rank"]))
    return {"epochs_checked": len(checked), "ranks": ranks}


def _straggler_lines(stragglers: dict[str, Any]) -> list[str]:
    """``straggler rank 3 (node1): 2.5x median work in 3/3 epochs (max 2.6x), compute 2.5x
    median, +1.50 ms/step``; or that none was found."""
    checked = stragglers.get("epochs_checked", 0)
    if not stragglers.get("ranks"):
        return [f"  stragglers: none in {checked} epoch{'s' if checked != 1 else ''}"]
    lines = []
    for entry in stragglers["ranks"]:
        cause = entry["cause"] + (f" {entry['cause_ratio']:.1f}x median"
                                  if entry.get("cause_ratio") is not None else "")
        lines.append(
            f"  straggler rank {entry['rank']} ({entry['node']}): {entry['ratio_mean']:.1f}x "
            f"median work in {len(entry['epochs'])}/{checked} epochs "
            f"(max {entry['ratio_max']:.1f}x), {cause}, "
            f"+{entry['excess_seconds_per_step'] * 1000:.2f} ms/step")
    return lines


def _number(value: Any) -> str:
    """A metric as the summary shows it: four decimals for a number, anything else as it is."""
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _duration(seconds: float) -> str:
    """``1.5s``, or ``16ms`` below a second, where one decimal of a second would read 0.0s."""
    return f"{seconds:.1f}s" if seconds >= 1 else f"{seconds * 1000:.0f}ms"


def describe(report: dict[str, Any]) -> str:
    """``sync on 2 workers, 20 epochs, 440 steps``, from what the run recorded (own code that
    recorded no training: says so)."""
    parts = [f"{report[key]} {noun}" for key, noun in (
        ("world_size", "workers"), ("epochs", "epochs"), ("steps", "steps"))
        if report.get(key) is not None]
    if report.get("algorithm"):
        head = str(report["algorithm"])
        return f"{head} on {', '.join(parts)}" if parts else head
    if parts:
        return ", ".join(parts)
    return "failed before its first epoch record" if report.get("failures") \
        else "no training records (own code that does not use sublimate's reporter)"


def format_summary(report: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    test = report.get("test") or {}
    lines = [f"{report['run']}: {describe(report)}"]
    figures = []
    if report.get("train_seconds") is not None:
        figures.append(f"trained in {report['train_seconds']:.1f}s")
    if report.get("samples_per_second"):
        figures.append(f"{report['samples_per_second']:.0f} samples/s")
    if report.get("final_loss") is not None:
        figures.append(f"final loss {report['final_loss']:.4f}")
    if "accuracy" in test:  # the built-in evaluation's pair, and what own code wrote
        figures.append(f"test accuracy {_number(test['accuracy'])}"
                       + (f" (loss {_number(test['loss'])})" if "loss" in test else ""))
    elif "loss" in test:
        figures.append(f"test loss {_number(test['loss'])}")
    figures += [f"{name} {_number(value)}" for name, value in (report.get("metrics") or {}).items()]
    if figures:
        lines.append("  " + ", ".join(figures))
    if report.get("sent_wire_bytes_per_worker") is not None:
        namespace = list((report.get("net_sent_bytes") or {}).values())
        lines.append(f"  sent per worker: {format_bytes(report['sent_wire_bytes_per_worker'])} "
                     f"on the wire for {format_bytes(report['sent_payload_bytes_per_worker'])} "
                     "of tensors (counted at each collective)"
                     + (f"; its network namespace sent "
                        f"{format_bytes(sum(namespace) / len(namespace))}" if namespace else ""))
    if report.get("launch_to_first_step_seconds") is not None:
        # longest first: where the wait went (the summary's JSON keeps no chronological order)
        startup = [(phase, seconds) for phase, seconds in (report.get("startup") or {}).items()
                   if isinstance(seconds, int | float)]
        phases = ", ".join(f"{phase} {_duration(seconds)}" for phase, seconds
                           in sorted(startup, key=lambda item: -item[1]))
        lines.append(f"  launch to first step {report['launch_to_first_step_seconds']:.1f}s"
                     + (f" ({phases})" if phases else ""))
    for label, split in report.get("time_split", {}).items():
        lines.append(f"  {label:<10} compute {split['compute'] * 100:3.0f}%  "
                     f"comm {split['comm'] * 100:3.0f}%  data {split['data'] * 100:3.0f}%")
    ended = "restarted after" if report.get("test") or report.get("metrics") else "failed"
    for failure in report.get("failures") or []:
        lines.append(f"  {ended}: {failure['who']}: {failure['message']} "
                     f"(traceback: {failure['error_file']})")
    if report.get("stragglers"):
        lines += _straggler_lines(report["stragglers"])
    if report.get("async"):
        lines.append(f"  staleness mean {report['async']['staleness_mean']}, "
                     f"max {report['async']['staleness_max']}")
    recovery = report.get("fault_tolerance")
    if recovery and recovery.get("steps_attempted"):
        unit = recovery.get("unit", "step")
        lines.append(f"  per-step recovery: {recovery['nodes_lost']} node(s) lost, "
                     f"{recovery['steps_committed']} of {recovery['steps_attempted']} "
                     f"group-{unit}s committed ({100 * recovery['committed_ratio']:.2f}%)")
        for failure in recovery.get("failures", []):
            lines.append(f"    {failure_line(failure, unit)}")
    return "\n".join(lines)


def failure_line(failure: dict[str, Any], unit: str = "step") -> str:
    """One loss of a per-step job (an entry of ``fault_tolerance.failures``), in words; ``unit``:
    what the job commits (``step``, or ``round`` under a periodic paradigm)."""
    parts = [f"lost node{failure['node']}"]
    if failure.get("in_start_up"):
        parts.append("in its start-up, before its first step")
    elif failure.get("step") is not None:
        parts.append(f"after {unit} {failure['step']}")
    if failure.get("steps_lost") is not None and not failure.get("in_start_up"):
        parts.append(f"{failure['steps_lost']} {unit}(s) lost")
    if failure.get("survivors_stalled_seconds") is not None:
        parts.append(f"the others went on {failure['survivors_stalled_seconds']:.1f}s "
                     f"later ({failure['survivor_steps_dropped']} group-{unit}(s) dropped)")
    if failure.get("replacement_trained_after_seconds") is not None:
        parts.append(f"its replacement trained again "
                     f"{failure['replacement_trained_after_seconds']:.1f}s after starting"
                     + (f" (healed at {unit} {failure['healed_at_step']})"
                        if failure.get("healed_at_step") is not None else ""))
    return ", ".join(parts)


# --- labels -----------------------------------------------------------------------------------

# What can tell runs apart, in the order a label names it: report key -> how a value reads.
DESCRIBED_BY: tuple[tuple[str, Callable[[Any], str]], ...] = (
    ("algorithm", str),
    ("world_size", lambda value: f"{value} workers"),
    ("global_batch_size", lambda value: f"batch {value}"),
    ("epochs", lambda value: f"{value} epochs"),
    ("learning_rate", lambda value: f"lr {value:g}"),
    # the rate the run ended at (after linear scaling and warmup): what the worker records
    ("final_learning_rate", lambda value: f"final lr {value:g}"),
    ("backend", str),
)


def _describe(key: str, value: Any, show: Callable[[Any], str]) -> str:
    if value is None:
        return f"{key.replace('_', ' ')} ?"
    try:
        return show(value)
    except (TypeError, ValueError):  # a summary written by another version
        return f"{key.replace('_', ' ')} {value}"


# The final figures two runs are compared on: (key in the report, label, which way is better).
FINAL_FIGURES = (
    ("final_loss", "final training loss", "lower"),
    ("test.accuracy", "test accuracy", "higher"),
    ("test.loss", "test loss", "lower"),
    ("samples_per_second", "samples/s", "higher"),
    ("train_seconds", "training time (s)", "lower"),
    ("launch_to_first_step_seconds", "launch to first step (s)", "lower"),
    ("steps", "steps", None),
    ("fault_tolerance.nodes_lost", "nodes lost", "lower"),
    ("fault_tolerance.committed_ratio", "group-steps committed", "higher"),
)


def _dig(report: dict[str, Any], key: str) -> Any:
    value: Any = report
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def compare_figures(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Two runs' final figures side by side (``FINAL_FIGURES``): each with both values, B - A
    and B / A where both are numbers, and which way is better; a figure neither run has is
    left out."""
    figures = []
    for key, label, better in FINAL_FIGURES:
        first, second = _dig(a, key), _dig(b, key)
        if first is None and second is None:
            continue
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool)
                      for v in (first, second))
        delta = second - first if numbers else None
        figures.append({"key": key, "label": label, "a": first, "b": second,
                        "delta": None if delta is None else round(delta, 6),
                        "ratio": round(second / first, 4) if delta is not None and first
                        else None,
                        "better": better})
    return figures


def format_comparison(reports: Sequence[dict[str, Any]]) -> str:
    """What ``sublimate report A B`` prints after the two summaries: the final figures side by
    side, B - A, and whether B is better or worse."""
    labels = run_labels(reports)
    rows = [("", f"A: {labels[0]}", f"B: {labels[1]}", "B - A")]
    for figure in compare_figures(reports[0], reports[1]):
        verdict = ""
        if figure["delta"] and figure["better"]:
            improved = (figure["delta"] > 0) == (figure["better"] == "higher")
            verdict = " (better)" if improved else " (worse)"
        delta = "" if figure["delta"] is None else f"{_shown(figure['delta'], '+')}{verdict}"
        rows.append((figure["label"], _shown(figure["a"]), _shown(figure["b"]), delta))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join("  " + "  ".join(cell.ljust(width) for cell, width in
                                       zip(row[:3], widths, strict=True)) + "  " + row[3]
                     for row in rows).rstrip()


def _shown(value: Any, sign: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, int | float) and abs(value) >= 1000:
        return f"{value:{sign},.0f}"  # 16,384 samples/s, not 1.638e+04
    if isinstance(value, float):
        return f"{value:{sign}.4g}"
    return f"{value:{sign}}" if isinstance(value, int) else str(value)


def run_labels(reports: Sequence[dict[str, Any]]) -> list[str]:
    """One legend label per run: what differs between them, not their (random) run ids.

    One run is named by its algorithm. Runs that nothing recorded tells apart are named by
    their run ids, and the run id is added to a label that two runs would otherwise share.
    """
    if len(reports) == 1:
        return [str(reports[0].get("algorithm") or reports[0]["run"])]
    parts: list[list[str]] = [[] for _ in reports]
    for key, show in DESCRIBED_BY:
        values = [report.get(key) for report in reports]
        if len({json.dumps(value, sort_keys=True) for value in values}) > 1:
            for part, value in zip(parts, values, strict=True):
                part.append(_describe(key, value, show))
    labels = [", ".join(part) for part in parts]
    return [label if label and labels.count(label) == 1
            else f"{label} ({report['run']})" if label else str(report["run"])
            for label, report in zip(labels, reports, strict=True)]


def _shared_description(reports: Sequence[dict[str, Any]]) -> str:
    """What every compared run has in common (for the title)."""
    shared = []
    for key, show in DESCRIBED_BY:
        values = [report.get(key) for report in reports]
        if values[0] is not None and all(value == values[0] for value in values):
            shared.append(_describe(key, values[0], show))
    return ", ".join(shared)


# --- plots ------------------------------------------------------------------------------------

def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on workers, CI or pods
    import matplotlib.pyplot as plt

    return plt


def _draw_loss(ax: Any, reports: Sequence[dict[str, Any]], labels: Sequence[str]) -> None:
    for report, label in zip(reports, labels, strict=True):
        points = [(p["epoch"], p["loss"]) for p in report["epochs_log"] if "loss" in p]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=label)
    ax.set(title="training loss", xlabel="epoch", ylabel="cross-entropy")
    losses = [p["loss"] for r in reports for p in r["epochs_log"] if "loss" in p]
    if losses and min(losses) > 0:  # a log axis would drop a zero loss off the plot
        ax.set_yscale("log")


def _padded(values: Sequence[float], fraction: float, minimum: float) -> tuple[float, float]:
    """Limits that hold every value with room to spare, so no marker is cut by the frame."""
    low, high = min(values), max(values)
    pad = max((high - low) * fraction, minimum)
    return low - pad, high + pad


def _draw_accuracy(ax: Any, reports: Sequence[dict[str, Any]], labels: Sequence[str]) -> None:
    xs: list[float] = []
    ys: list[float] = []
    for index, (report, label) in enumerate(zip(reports, labels, strict=True)):
        color = f"C{index}"
        curve = [(p["epoch"], p["test_accuracy"]) for p in report["epochs_log"]
                 if p.get("test_accuracy") is not None]
        if curve:  # rank 0's (or the ps') evaluation after every epoch
            ax.plot(*zip(*curve, strict=True), color=color, marker="o", markersize=3,
                    label=f"{label} (per epoch)")
            xs += [x for x, _ in curve]
            ys += [y for _, y in curve]
        test = report.get("test") or {}
        if test.get("accuracy") is not None:  # the evaluate step's figure, after the last epoch
            epoch = report.get("epochs") or (report["epochs_log"][-1]["epoch"]
                                             if report["epochs_log"] else 1)
            ax.scatter([epoch], [test["accuracy"]], color=color, marker="*", s=160, zorder=3,
                       edgecolors="black", linewidths=0.5,
                       label=f"{label}: final {test['accuracy']:.4f}")
            xs.append(epoch)
            ys.append(test["accuracy"])
    ax.set(title="test accuracy", xlabel="epoch", ylabel="accuracy")
    if not ys:
        ax.set_xlim(0.5, max((report.get("epochs") or 1 for report in reports), default=1) + 0.5)
        ax.text(0.5, 0.5, "no accuracy yet\n(run the evaluate step)", ha="center",
                va="center", transform=ax.transAxes, color="gray")
        return
    # From epoch 1 (as the other panels) to half an epoch past the last point, and a vertical
    # margin of at least two points of accuracy: a lone final figure, or one at exactly 1.0,
    # is drawn whole, not cut by the frame.
    ax.set_xlim(min(*xs, 1) - 0.5, max(xs) + 0.5)
    ax.set_ylim(*_padded(ys, 0.1, 0.02))


def _draw_throughput(ax: Any, reports: Sequence[dict[str, Any]], labels: Sequence[str]) -> None:
    for report, label in zip(reports, labels, strict=True):
        points = [(p["epoch"], p["samples_per_second"]) for p in report["epochs_log"]
                  if "samples_per_second" in p]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=label)
    ax.set(title="throughput (whole job)", xlabel="epoch", ylabel="samples/s")
    ax.set_ylim(bottom=0)


def _draw_time_split(ax: Any, reports: Sequence[dict[str, Any]], labels: Sequence[str]) -> None:
    rows = [(f"{run_label + ' ' if len(reports) > 1 else ''}{label}", split)
            for report, run_label in zip(reports, labels, strict=True)
            for label, split in report.get("time_split", {}).items()]
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
        ax.legend(fontsize="small")  # loc "best": placed where it hides the fewest points
    ax.grid(alpha=0.3)


def draw_panel(name: str, reports: Sequence[dict[str, Any]]) -> Any:
    """One panel (``loss``, ``accuracy``, ...) as a matplotlib Figure with a single Axes."""
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(6.4, 4.2))
    DRAW[name](ax, reports, run_labels(reports))
    _finish(ax, name)
    # fixed margins: tight_layout would double the time spent on these small plots
    figure.subplots_adjust(left=0.22 if name == "time-split" else 0.13,
                           right=0.97, bottom=0.13, top=0.91)
    return figure


def draw(reports: Sequence[dict[str, Any]], title: str | None = None) -> Any:
    """The four panels for one or more runs as a matplotlib Figure (axes in ``PLOTS`` order)."""
    plt = _pyplot()
    labels = run_labels(reports)
    rows = max(len(r.get("time_split", {})) for r in reports) * len(reports)
    figure, axes = plt.subplots(2, 2, figsize=(12, 8 + max(0, rows - 6) * 0.3))
    for ax, name in zip(axes.flat, PLOTS, strict=True):
        DRAW[name](ax, reports, labels)
        _finish(ax, name)
    figure.suptitle(title or _title(reports))
    figure.tight_layout()
    return figure


def plot(reports: Sequence[dict[str, Any]], output: Path, title: str | None = None) -> Path:
    """The four panels for one or more runs in one PNG."""
    plt = _pyplot()
    figure = draw(reports, title)
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=100)
    plt.close(figure)
    return output


PANEL_MARGIN_PX = 8  # white kept around a panel cut out of the overview


def write_plots(report: dict[str, Any], folder: Path) -> dict[str, str]:
    """``overview.png`` and each panel's PNG (``PLOTS``) for one run; returns name -> file.

    The overview is drawn once and each panel is cut out of its pixels (the panel's axes with
    its title, labels and legend, and a margin): drawing the four panels as figures of their
    own as well took most of the evaluate step's time after importing torch (0.6 s of 1.4 s
    for the report)."""
    import numpy as np
    from PIL import Image

    plt = _pyplot()
    figure = draw([report])
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    pixels = np.asarray(figure.canvas.buffer_rgba())
    height, width = pixels.shape[:2]
    written = {}
    boxes = [ax.get_tightbbox(renderer) for ax in figure.axes]  # display pixels, origin at
    for name, box in zip(PLOTS, boxes, strict=True):  # the bottom left
        left, right = box.x0 - PANEL_MARGIN_PX, box.x1 + PANEL_MARGIN_PX
        low, high = box.y0 - PANEL_MARGIN_PX, box.y1 + PANEL_MARGIN_PX
        for other in boxes:  # a margin stops halfway to a neighbour: no cut takes another's
            if other.x0 >= box.x1:
                right = min(right, (box.x1 + other.x0) / 2)
            if other.x1 <= box.x0:
                left = max(left, (other.x1 + box.x0) / 2)
            if other.y0 >= box.y1:
                high = min(high, (box.y1 + other.y0) / 2)
            if other.y1 <= box.y0:
                low = max(low, (other.y1 + box.y0) / 2)
        # whole pixels inside those limits (a pixel on a shared limit goes to neither)
        rows = slice(max(0, math.ceil(height - high)), min(height, math.floor(height - low)))
        columns = slice(max(0, math.ceil(left)), min(width, math.floor(right)))
        Image.fromarray(pixels[rows, columns]).save(folder / f"{name}.png")
        written[name] = f"{name}.png"
    Image.fromarray(pixels).save(folder / "overview.png")
    written["overview"] = "overview.png"
    plt.close(figure)
    return written


def write_report(run_dir: Path, plots: bool = True) -> dict[str, Any]:
    """Build the report and write ``report/report.json`` and the PNGs; returns the report."""
    run_dir = Path(run_dir)
    report = build_report(run_dir)
    folder = run_dir / REPORT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    report["plots"] = {}
    if plots:
        try:
            _pyplot()
        except ImportError:
            report["plots_skipped"] = "matplotlib is not installed"
        else:
            report["plots"].update(write_plots(report, folder))
            if (report.get("fault_tolerance") or {}).get("timeline"):
                plot_recovery(report, folder / "recovery.png")
                report["plots"]["recovery"] = "recovery.png"
    temporary = folder / ".report.json.tmp"
    temporary.write_text(json.dumps(report, indent=2) + "\n")
    temporary.replace(folder / "report.json")
    return report


def plot_recovery(report: dict[str, Any], output: Path) -> Path:
    """Per-step recovery's timeline: which node took part in which steps (a bar per process
    that ran on it), and where each was lost."""
    plt = _pyplot()
    recovery = report["fault_tolerance"]
    figure, ax = plt.subplots(figsize=(8, 1.2 + 0.45 * (1 + max(
        (span["node"] for span in recovery["timeline"]), default=0))))
    for span in recovery["timeline"]:
        ax.barh(span["node"], span["to_step"] - span["from_step"] + 1, left=span["from_step"],
                height=0.6, color="tab:orange" if span.get("replacement") else "tab:blue")
    for failure in recovery.get("failures", []):
        if failure.get("step") is not None:
            ax.plot(failure["step"], failure["node"], marker="x", color="tab:red",
                    markersize=9)
    ax.set_yticks(sorted({span["node"] for span in recovery["timeline"]}))
    ax.set_yticklabels([f"node{node}" for node in ax.get_yticks()])
    ax.invert_yaxis()
    ax.set_xlabel("step")
    ax.set_title(f"{report['run']}: steps each node took part in (x: lost; orange: replacement)")
    ax.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=100)
    plt.close(figure)
    return output


def _title(reports: Sequence[dict[str, Any]]) -> str:
    if len(reports) == 1:
        report = reports[0]
        return f"{report['run']}: {describe(report)}"
    shared = _shared_description(reports)
    return " vs ".join(run_labels(reports)) + (f" ({shared})" if shared else "")


def compare(run_dirs: Sequence[Path], output: Path) -> Path:
    """One PNG with every run's loss, accuracy, throughput and time split side by side."""
    reports = [build_report(run_dir) for run_dir in run_dirs]
    return plot(reports, output)


