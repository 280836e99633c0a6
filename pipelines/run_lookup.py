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
    "ReportError",
    "build_report",
    "compare",
    "draw",
    "draw_panel",
    "format_summary",
    "plot",
    "resolve_run",
    "run_labels",
    "write_report",
]

# Where run ids live: the shared volume of the local runner.
RUNS_UNDER = Path("volumes") / "sublimate-data" / "runs"


def home() -> Path:
    return Path(os.environ.get("SUBLIMATE_HOME") or Path.home() / ".sublimate")


def _holds_results(folder: Path) -> bool:
    """A run's results folder on the shared volume: what the train step writes first and last."""
    return holds_results(folder)


def _is_runner_folder(folder: Path) -> bool:
    """A run folder of the local runner (``$SUBLIMATE_HOME/runs/<workflow-name>``)."""
    return (folder / "status.json").is_file() or (folder / "outputs").is_dir()


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
    raise ReportError(f"{folder}: a `sublimate run` folder, but no training results found: "
                      f"looked in {linked} and in {candidate} for train-summary.json or "
                      "metrics/ (has this run trained yet?)")


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
