"""``sublimate report``: find a run by any of its names, print its report, compare runs.

A RUN is the results folder on the shared volume, the run folder ``sublimate run`` printed (its
``outputs/results`` link leads to the results), or either name. The report itself (JSON, plots,
comparisons) is :mod:`sublimate.components.monitoring.run_report`, which the evaluate step also
writes; its names are re-exported here, where the first releases documented them.
"""

from __future__ import annotations

import os
from pathlib import Path

from sublimate.components.base.run_files import holds_results
from sublimate.components.monitoring.run_report import (
    PLOTS,
    REPORT_DIR,
    SUMMARY_KEYS,
    ReportError,
    build_report,
    compare,
    draw,
    draw_panel,
    format_summary,
    plot,
    read_json,
    run_labels,
    write_report,
)

__all__ = [
    "PLOTS",
    "REPORT_DIR",
    "RUNS_UNDER",
    "SUMMARY_KEYS",
    "SWEEPS_UNDER",
    "ReportError",
    "build_report",
    "compare",
    "draw",
    "draw_panel",
    "format_summary",
    "is_sweep_folder",
    "plot",
    "resolve_run",
    "resolve_sweep",
    "results_of_runner_folder",
    "run_labels",
    "write_report",
]

# Where run ids live: the shared volume of the local runner; and sweeps' reports.
RUNS_UNDER = Path("volumes") / "sublimate-data" / "runs"
SWEEPS_UNDER = Path("volumes") / "sublimate-data" / "sweeps"


def home() -> Path:
    return Path(os.environ.get("SUBLIMATE_HOME") or Path.home() / ".sublimate")


def _holds_results(folder: Path) -> bool:
    """A run's results folder on the shared volume: what the train step writes first and last."""
    return holds_results(folder)


def _is_runner_folder(folder: Path) -> bool:
    """A run folder of the local runner (``$SUBLIMATE_HOME/runs/<workflow-name>``)."""
    return (folder / "status.json").is_file() or (folder / "outputs").is_dir()


def is_sweep_folder(folder: Path) -> bool:
    """A sweep's report folder (the compare step's report.json, with its points)."""
    document = read_json(folder / "report.json")
    return isinstance(document, dict) and "sweep" in document and "points" in document


def resolve_sweep(reference: str, sublimate_home: Path | None = None) -> Path | None:
    """The report folder of a sweep, from whatever names it: that folder, its report.md, the
    run folder ``sublimate run sweep`` printed (its ``outputs/report``), or the sweep's name;
    None when ``reference`` is not a sweep."""
    sublimate_home = sublimate_home or home()
    path = Path(reference).expanduser()
    candidates = [path, path.parent, path / "outputs" / "report"]
    if "/" not in reference and reference not in (".", ".."):
        candidates += [sublimate_home / SWEEPS_UNDER / reference,
                       sublimate_home / "runs" / reference / "outputs" / "report"]
    for candidate in candidates:
        folder = candidate.resolve().parent if candidate.is_file() else candidate
        if folder.is_dir() and is_sweep_folder(folder):
            return folder.resolve()
    return None


def results_of_runner_folder(folder: Path, require_results: bool = True) -> Path:
    """The run's folder on the volume for a ``sublimate run`` folder; with
    ``require_results`` false, also while the run has written nothing yet (``sublimate
    fault`` acts on a running job)."""
    if require_results:
        return _results_of_runner_folder(folder)
    status = read_json(folder / "status.json") or {}
    run_id = (status.get("parameters") or {}).get("run-id") or status.get("name") or folder.name
    return (folder.parent.parent / RUNS_UNDER / str(run_id)).resolve()


def _results_of_runner_folder(folder: Path) -> Path:
    """The results a ``sublimate run`` folder points to.

    The runner links every workflow output that names a folder on a volume as
    ``outputs/<name>``; the train pipeline's is ``outputs/results``, tried first. A run that
    failed before its outputs were set has no link, so the run id in ``status.json`` (the
    workflow name unless ``-p run-id`` changed it) is looked up on the volume beside it.
    """
    outputs = folder / "outputs"
    links = sorted(outputs.iterdir(), key=lambda p: (p.name != "results", p.name)) \
        if outputs.is_dir() else []
    for link in links:
        if link.is_dir() and _holds_results(link):
            return link.resolve()
    status = read_json(folder / "status.json") or {}
    run_id = (status.get("parameters") or {}).get("run-id") or status.get("name") or folder.name
    # the runner folder is <home>/runs/<workflow>: its volume is in the same home
    candidate = folder.parent.parent / RUNS_UNDER / str(run_id)
    if "/" not in str(run_id) and _holds_results(candidate):
        return candidate.resolve()
    linked = ", ".join(f"outputs/{link.name}" for link in links) or "no outputs/ links"
    ended = f" (it {status['phase']}: {status['message']})" \
        if status.get("phase") in ("Failed", "Error") and status.get("message") else ""
    raise ReportError(f"{folder}: a `sublimate run` folder, but no training results found{ended}: "
                      f"looked in {linked} and in {candidate} for train-summary.json, "
                      "metrics/ or metrics.json (has this run trained yet?)")


def resolve_run(reference: str, sublimate_home: Path | None = None) -> Path:
    """The results folder of a run, from whatever a user has at hand.

    ``reference`` is one of: the results folder on the volume
    (``$SUBLIMATE_HOME/volumes/sublimate-data/runs/<run-id>``), the run folder that
    ``sublimate run`` printed (``$SUBLIMATE_HOME/runs/<workflow-name>``), or either name
    alone: a run id, looked up on the volume first, then a workflow name.
    """
    sublimate_home = sublimate_home or home()
    path = Path(reference).expanduser()
    if path.is_dir() and _holds_results(path):
        return path.resolve()  # through a link such as outputs/results: the run id's folder
    if path.is_dir() and _is_runner_folder(path):
        return _results_of_runner_folder(path)
    by_id = sublimate_home / RUNS_UNDER / reference
    by_workflow = sublimate_home / "runs" / reference
    if "/" not in reference and reference not in (".", ".."):
        if by_id.is_dir():
            return by_id  # may not hold results yet: build_report says so
        if by_workflow.is_dir():
            return _results_of_runner_folder(by_workflow)
    if path.is_dir():
        raise ReportError(f"{path}: not a run folder: it holds no train-summary.json or "
                          "metrics/ (a run's results on the shared volume) and no status.json "
                          "or outputs/ (a run folder of `sublimate run`)")
    raise ReportError(f"run '{reference}': no such run folder (looked for the folder {path}, "
                      f"the run id {by_id} and the workflow run {by_workflow})")
