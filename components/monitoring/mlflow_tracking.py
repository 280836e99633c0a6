"""A training run in MLflow: its settings, its per-epoch metrics as they happen, its results.

The training loop is not touched. The train step's launcher (not a worker) starts a
:class:`TrainingTracker` beside the job: a thread that imports MLflow's client, finds or creates
the run's MLflow run, logs every setting as a parameter and the run's tags, then follows the
per-epoch records the loop already writes (``metrics/rank-0.jsonl``; ``ps.jsonl`` for async)
and logs each new epoch in one ``log_batch``, with the epoch as the step. When the job ends it
logs the training summary, the model and a per-step run's failures (each lost node a point of
``recovery_node_lost`` at the last step its counters recorded, timed when it was lost). The
evaluate step then logs the test metrics, ``metrics.json`` and the report into the same run and
ends it (:func:`log_evaluation`), found through ``mlflow-run.json`` in the run folder.

Nothing is logged twice when a step is retried. The MLflow run is the one tagged with the
workflow's name and the run folder's (``sublimate.workflow``, ``sublimate.run-id``): a retried
train step resumes it; epochs are logged only where ``loss`` has no point at that step yet
(each epoch's metrics go in one batch, so ``loss`` marks a whole epoch); evaluate's metrics only
where they have no point; artifacts are files by name, replaced when logged again.

A sweep is a parent run (:func:`start_sweep`, from the sweep-grid step) with one child per
point: a point's train step finds the parent by the workflow's name and tags its run with
``mlflow.parentRunId``; the compare step logs the sweep's report into the parent and ends it.

Failures: a server that does not answer ``/health`` is found before the job starts, in one line
naming the setting (:meth:`TrainingTracker.start`); with ``tracking-required false`` that line
is a warning and the step goes on without tracking. A request that fails later is a warning at
once and, with ``tracking-required``, fails the step when its work is done.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from sublimate.components.base import run_files
from sublimate.components.base.durable_files import write_json
from sublimate.components.base.mlflow_connection import (
    TRACKING_URI_ENV,
    TrackingError,
    client,
    connected,
    problem_line,
    public_uri,
    short_error,
    tracking_uri,
    usable,
)

SETTING = "tracking"
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
DEFAULT_EXPERIMENT = "sublimate"
# The tags that identify a run across retries, and what else a run is tagged with.
WORKFLOW_TAG = "sublimate.workflow"
RUN_ID_TAG = "sublimate.run-id"
KIND_TAG = "sublimate.kind"  # "train" or "sweep"
PARENT_TAG = "mlflow.parentRunId"
GIT_COMMIT_ENV = "SUBLIMATE_GIT_COMMIT"  # set by an image build that has no .git to ask
# Seconds between looks at the epoch log: an epoch of the default run takes ~60 ms, so several
# epochs go in one pass, one request each.
FOLLOW_EVERY = 1.0
# Per-epoch fields logged as metrics, under the same names; the phases' seconds become the
# compute/communication split, as fractions (the live line's percentages).
EPOCH_METRICS = ("loss", "test_accuracy", "samples_per_second", "local_samples_per_second",
                 "learning_rate", "seconds", "net_sent_bytes", "staleness")
PHASES = ("compute", "comm", "data")
# Settings that say where to log, not how to train: not parameters (a URI may hold a user).
NOT_PARAMETERS = frozenset({"tracking", "tracking_required", "run_id"})
_MAX_BATCH = 1000  # MLflow's log_batch takes at most 1000 metrics
_MAX_PARAMS = 100  # and 100 parameters


def _warn(line: str) -> None:
    print(f"tracking: warning: {line}", file=sys.stderr, flush=True)


def _experiment_id(mlflow: Any) -> str:
    """The experiment runs go in: ``$MLFLOW_EXPERIMENT_NAME`` or ``sublimate``, created by
    whichever step needs it first (two at once: the loser reads the winner's)."""
    name = os.environ.get(EXPERIMENT_ENV) or DEFAULT_EXPERIMENT
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    try:
        return str(mlflow.create_experiment(name))
    except Exception:  # created meanwhile by a concurrent step
        found = mlflow.get_experiment_by_name(name)
        if found is None:
            raise
        return str(found.experiment_id)


def _log_params(mlflow: Any, run_id: str, params: list[Any],
                tags: Sequence[Any] = ()) -> None:
    """``params`` in requests of at most 100 (MLflow's limit), ``tags`` with the first."""
    for start in range(0, max(len(params), 1), _MAX_PARAMS):
        mlflow.log_batch(run_id, params=params[start:start + _MAX_PARAMS],
                         tags=list(tags) if start == 0 else [])


def _find_run(mlflow: Any, experiment: str, **tags: str) -> Any | None:
    """The oldest run of ``experiment`` with all ``tags`` (deleted ones excluded), or None."""
    query = " and ".join(f"tags.`{key}` = '{value}'" for key, value in tags.items())
    runs = mlflow.search_runs([experiment], filter_string=query, max_results=10,
                              order_by=["attributes.start_time ASC"])
    return runs[0] if runs else None


def code_version(folder: Path | None = None) -> str | None:
    """The user's code version: ``$SUBLIMATE_GIT_COMMIT`` (an image build), else the git commit
    of ``folder``, by default where ``sublimate run`` started (``$SUBLIMATE_LOCAL_CWD``, where
    a user's entry point is found), else None."""
    from sublimate.components.base.contract import LOCAL_CWD_ENV

    commit = os.environ.get(GIT_COMMIT_ENV)
    if commit:
        return commit
    folder = folder or Path(os.environ.get(LOCAL_CWD_ENV) or Path.cwd())
    try:
        done = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def dataset_digest(data_dir: Path) -> tuple[str | None, str | None]:
    """The staged dataset's name and the SHA-256 of its ``metadata.json`` (which holds every
    shard's digest, so it pins the content), or None for what cannot be read."""
    path = Path(data_dir) / "metadata.json"
    try:
        data = path.read_bytes()
    except OSError:
        return None, None
    try:
        name = json.loads(data).get("name")
    except (ValueError, AttributeError):
        name = None
    return name, hashlib.sha256(data).hexdigest()


def _package_version() -> str | None:
    try:
        return version("sublimate")
    except PackageNotFoundError:
        return None


@dataclass(frozen=True)
class RunRecord:
    """``mlflow-run.json``: which MLflow run a run folder logs to. The URI is kept without
    credentials; a step reading it takes the credentials from its own environment."""

    uri: str
    run_id: str
    experiment_id: str
    required: bool

    def write(self, path: Path) -> None:
        write_json({"uri": self.uri, "run_id": self.run_id,
                    "experiment_id": self.experiment_id, "required": self.required}, path)

    @classmethod
    def read(cls, path: Path) -> RunRecord | None:
        try:
            data = json.loads(Path(path).read_text())
            return cls(str(data["uri"]), str(data["run_id"]), str(data["experiment_id"]),
                       bool(data.get("required", True)))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def server(self) -> str:
        """The URI to reach it with: the environment's when it is the same server (it may
        carry credentials the record left out), else the record's."""
        given = os.environ.get(TRACKING_URI_ENV, "")
        return given if given and public_uri(given) == self.uri else self.uri


def checked_uri(setting: str, required: bool, name: str = SETTING) -> str | None:
    """The tracking server for ``setting``, checked to answer now; None when tracking is off,
    or (``required`` False) when the server does not answer: then a warning says so. Raises
    :class:`TrackingError` (one line naming the setting) when it must answer and does not."""
    uri = tracking_uri(setting)
    if uri is None:
        return None
    problem = usable(uri)
    if problem is None:
        return uri
    line = problem_line(name, uri, problem)
    if required:
        raise TrackingError(f"{line} (set -p tracking-required=false to train without it)")
    _warn(f"{line}; training goes on without tracking (tracking-required false)")
    return None


# --------------------------------------------------------------------------------------------
# The train step's side


class TrainingTracker:
    """Logs one training run to MLflow from a thread of the launcher (see the module's text).

    ``params``: every setting by name, as text; ``tags``: what identifies and describes the run.
    """

    def __init__(self, uri: str, required: bool, run_dir: Path, workflow: str,
                 params: dict[str, str], tags: dict[str, str]) -> None:
        self.uri, self.required, self.run_dir = uri, required, Path(run_dir)
        self.workflow, self.params, self.tags = workflow, params, tags
        self.error: str | None = None  # the first failure, one line
        self.run_id: str | None = None
        self._mlflow: Any = None
        self._logged: set[int] = set()  # epochs with their metrics in MLflow
        self._offset = 0  # bytes of the epoch log already read
        self._pending = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="mlflow-tracking",
                                        daemon=True)

    @classmethod
    def start(cls, settings: Any, run_dir: Path, data_dir: Path,
              workflow: str) -> TrainingTracker | None:
        """Check the server and start following (None: tracking is off, or optional and the
        server is down); :class:`TrackingError` when a required server does not answer.
        ``settings``: the train step's typed settings (``TrainSettings`` or a request)."""
        uri = checked_uri(settings.tracking, settings.tracking_required)
        if uri is None:
            return None
        from sublimate.components.base import settings as declared

        params = {setting.name: setting.text(getattr(settings, setting.attribute))
                  for setting in declared.settings(step="train")
                  if setting.attribute not in NOT_PARAMETERS
                  and hasattr(settings, setting.attribute)}
        name, digest = dataset_digest(data_dir)
        tags = {WORKFLOW_TAG: workflow, RUN_ID_TAG: Path(run_dir).name, KIND_TAG: "train",
                "mlflow.runName": Path(run_dir).name, "sublimate.nodes": str(settings.nodes),
                "sublimate.algorithm": str(settings.algorithm)}
        optional = {"sublimate.dataset": name, "sublimate.dataset-digest": digest,
                    "mlflow.source.git.commit": code_version(),
                    "sublimate.version": _package_version()}
        tags.update({key: value for key, value in optional.items() if value})
        tracker = cls(uri, settings.tracking_required, run_dir, workflow, params, tags)
        tracker._thread.start()
        return tracker

    # ---- in the thread -------------------------------------------------------------------

    def _follow(self) -> None:
        try:
            self._open()
            while not self._stop.wait(FOLLOW_EVERY):
                self._log_new_epochs()
        except Exception as error:
            self._failed(error)

    def _open(self) -> None:
        """Find this run's MLflow run (a retried step's) or create it; log params and tags."""
        from mlflow.entities import Param, RunTag

        mlflow = self._mlflow = client(self.uri)
        self.run_dir.mkdir(parents=True, exist_ok=True)  # before the launcher makes it
        experiment = _experiment_id(mlflow)
        found = _find_run(mlflow, experiment, **{WORKFLOW_TAG: self.workflow,
                                                 RUN_ID_TAG: self.tags[RUN_ID_TAG]})
        parent = _find_run(mlflow, experiment, **{WORKFLOW_TAG: self.workflow,
                                                  KIND_TAG: "sweep"})
        tags = dict(self.tags)
        if parent is not None:
            tags[PARENT_TAG] = parent.info.run_id
        if found is None:
            run = mlflow.create_run(experiment, tags=tags, run_name=tags["mlflow.runName"])
            self.run_id = run.info.run_id
        else:
            self.run_id = found.info.run_id
            mlflow.update_run(self.run_id, status="RUNNING")
            self._logged = {m.step for m in mlflow.get_metric_history(self.run_id, "loss")}
        # A parameter logged again with the same value is accepted (a retried step's).
        _log_params(mlflow, self.run_id,
                    [Param(key, value) for key, value in sorted(self.params.items())],
                    [RunTag(key, value) for key, value in tags.items()])
        RunRecord(public_uri(self.uri), self.run_id, experiment, self.required).write(
            self.run_dir / run_files.MLFLOW_RUN)
        print(f"tracking: MLflow run {self.run_id} on {public_uri(self.uri)} "
              f"(experiment {experiment})", flush=True)

    def _epoch_log(self) -> Path | None:
        folder = self.run_dir / run_files.EPOCH_LOGS
        for label in ("rank-0", "ps"):  # rank 0 holds the job's view; async's server
            path = folder / f"{label}.jsonl"
            if path.is_file():
                return path
        return None

    def _new_records(self) -> list[dict[str, Any]]:
        """Whole lines appended to the epoch log since the last look."""
        path = self._epoch_log()
        if path is None:
            return []
        with path.open("rb") as log:
            log.seek(self._offset)
            data = log.read()
        self._offset += len(data)
        data = self._pending + data
        complete, _, self._pending = data.rpartition(b"\n")
        records = []
        for line in complete.splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:  # a line cut short by a crash
                continue
        return records

    def _log_new_epochs(self) -> None:
        from mlflow.entities import Metric

        metrics: list[Any] = []
        for record in self._new_records():
            epoch = record.get("epoch")
            if not isinstance(epoch, int) or epoch in self._logged:
                continue
            stamp = int(float(record.get("time", time.time())) * 1000)
            metrics += [Metric(key, float(value), stamp, epoch)
                        for key, value in epoch_metrics(record).items()]
            self._logged.add(epoch)
        for start in range(0, len(metrics), _MAX_BATCH):
            self._mlflow.log_batch(self.run_id, metrics=metrics[start:start + _MAX_BATCH])

    def _failed(self, error: BaseException) -> None:
        if self.error is None:
            self.error = problem_line(SETTING, self.uri, short_error(error))
            _warn(self.error)

    # ---- at the end ----------------------------------------------------------------------

    def finish(self, exit_code: int) -> str | None:
        """Log what is left and the results; None, or the line the step must fail with
        (``tracking-required`` and a request failed)."""
        self._stop.set()
        self._thread.join()
        if self.error is None and self.run_id is not None:
            try:
                self._log_new_epochs()
                self._log_results(exit_code)
            except Exception as error:
                self._failed(error)
        if self.error is not None and self.required:
            return self.error
        return None

    def _log_results(self, exit_code: int) -> None:
        mlflow = self._mlflow
        summary_path = self.run_dir / run_files.SUMMARY
        for name in (run_files.SUMMARY, run_files.MODEL):
            if (self.run_dir / name).is_file():
                mlflow.log_artifact(self.run_id, str(self.run_dir / name))
        try:
            summary = json.loads(summary_path.read_text())
        except (OSError, ValueError):
            summary = {}
        self._log_failures(summary.get("fault_tolerance") or {})
        if exit_code:
            mlflow.set_terminated(self.run_id, status="FAILED")

    def _log_failures(self, section: dict[str, Any]) -> None:
        """A per-step run's lost nodes as events: a point of ``recovery_node_lost`` (the node)
        at the step and time it was lost, and the totals; its details are the summary's."""
        from mlflow.entities import Metric

        if not section:
            return
        existing = {(m.step, m.value) for m in
                    self._mlflow.get_metric_history(self.run_id, "recovery_node_lost")}
        metrics = [Metric("recovery_node_lost", float(failure["node"]),
                          int(float(failure.get("time") or 0) * 1000),
                          int(failure.get("step") or 0))
                   for failure in section.get("failures", [])
                   if (int(failure.get("step") or 0), float(failure["node"])) not in existing]
        now = int(time.time() * 1000)
        done = set(self._mlflow.get_run(self.run_id).data.metrics)
        for key in ("nodes_lost", "committed_ratio", "dropped_steps", "job_restarts"):
            value = section.get(key)
            if isinstance(value, int | float) and f"recovery_{key}" not in done:
                metrics.append(Metric(f"recovery_{key}", float(value), now, 0))
        if metrics:
            self._mlflow.log_batch(self.run_id, metrics=metrics)


def epoch_metrics(record: dict[str, Any]) -> dict[str, float]:
    """One epoch record's metrics: its numbers by name, and the time split as fractions."""
    found = {key: float(record[key]) for key in EPOCH_METRICS
             if isinstance(record.get(key), int | float) and not isinstance(record[key], bool)}
    phases = {phase: record.get(f"{phase}_seconds") for phase in PHASES}
    if all(isinstance(value, int | float) for value in phases.values()):
        total = sum(phases.values())  # type: ignore[arg-type]
        if total > 0:
            found.update({f"{phase}_fraction": float(value) / total  # type: ignore[arg-type]
                          for phase, value in phases.items()})
    return found


# --------------------------------------------------------------------------------------------
# The evaluate step's side


def log_evaluation(run_dir: Path, metrics: dict[str, Any], params: dict[str, str]) -> str | None:
    """Log the evaluation into the run's MLflow run (if the train step tracked it) and end it:
    its numbers as ``eval_<name>`` (once: a retried step finds them), ``metrics.json`` and the
    report as artifacts, the evaluate step's settings as parameters. None, or the line the step
    must fail with (the run's ``tracking-required``); an optional server's failure is a
    warning."""
    record = RunRecord.read(Path(run_dir) / run_files.MLFLOW_RUN)
    if record is None:
        return None
    try:
        _log_evaluation(record, Path(run_dir), metrics, params)
    except Exception as error:
        return _failed_or_warned(record, error)
    return None


def _failed_or_warned(record: RunRecord, error: Exception) -> str | None:
    """A request of a step's that failed: the line the step fails with when the run's tracking
    is required, else None after a warning that says it."""
    line = problem_line(SETTING, record.uri, short_error(error))
    if record.required:
        return line
    _warn(line)
    return None


def _last_epoch(run_dir: Path) -> int:
    """The run's last epoch (the step of its per-epoch points), from its training summary; 0
    when there is none (an entry point of the user's that writes none)."""
    try:
        summary = json.loads((run_dir / run_files.SUMMARY).read_text())
        return int(summary.get("epochs") or 0)
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def _log_evaluation(record: RunRecord, run_dir: Path, metrics: dict[str, Any],
                    params: dict[str, str]) -> None:
    from mlflow.entities import Metric, Param

    mlflow = connected(record.server())
    done = set(mlflow.get_run(record.run_id).data.metrics)
    now = int(time.time() * 1000)
    step = _last_epoch(run_dir)  # beside the epochs' points, on the same axis
    new = [Metric(f"eval_{key}", float(value), now, step) for key, value in metrics.items()
           if isinstance(value, int | float) and not isinstance(value, bool)
           and f"eval_{key}" not in done]
    mlflow.log_batch(record.run_id, metrics=new,
                     params=[Param(key, value) for key, value in sorted(params.items())])
    if (run_dir / run_files.EVALUATION).is_file():
        mlflow.log_artifact(record.run_id, str(run_dir / run_files.EVALUATION))
    if (run_dir / run_files.REPORT).is_dir():
        mlflow.log_artifacts(record.run_id, str(run_dir / run_files.REPORT), run_files.REPORT)
    mlflow.set_terminated(record.run_id, status="FINISHED")
    print(f"evaluate: logged to MLflow run {record.run_id} on {record.uri}", flush=True)


# --------------------------------------------------------------------------------------------
# A sweep: the sweep-grid step opens the parent, compare ends it


def start_sweep(setting: str, required: bool, workflow: str, sweep_id: str,
                params: dict[str, str], sweep_dir: Path) -> str | None:
    """Find or create the sweep's parent run (tags ``sublimate.workflow`` and ``sublimate.kind
    sweep``), log the grid and the fixed settings as its parameters and write
    ``mlflow-run.json`` into ``sweep_dir``; its run id, or None when tracking is off (or
    optional and down). Raises :class:`TrackingError` (one line) when required."""
    uri = checked_uri(setting, required)
    if uri is None:
        return None
    try:
        mlflow = client(uri)
        from mlflow.entities import Param

        experiment = _experiment_id(mlflow)
        found = _find_run(mlflow, experiment, **{WORKFLOW_TAG: workflow, KIND_TAG: "sweep"})
        if found is None:
            run_id = mlflow.create_run(experiment, run_name=sweep_id, tags={
                WORKFLOW_TAG: workflow, KIND_TAG: "sweep", RUN_ID_TAG: sweep_id,
                "mlflow.runName": sweep_id}).info.run_id
        else:
            run_id = found.info.run_id
        _log_params(mlflow, run_id,
                    [Param(key, value[:6000]) for key, value in sorted(params.items())])
    except TrackingError:
        raise
    except Exception as error:
        line = problem_line(SETTING, uri, short_error(error))
        if required:
            raise TrackingError(line) from None
        _warn(line)
        return None
    sweep_dir.mkdir(parents=True, exist_ok=True)
    RunRecord(public_uri(uri), run_id, experiment, required).write(
        sweep_dir / run_files.MLFLOW_RUN)
    print(f"tracking: MLflow sweep run {run_id} on {public_uri(uri)} (experiment "
          f"{experiment}); a child run per point", flush=True)
    return run_id


def finish_sweep(sweep_dir: Path, best: dict[str, Any] | None, metric: str) -> str | None:
    """Log the sweep's report folder and its best point into the parent run and end it; None,
    or the line to fail with (required, and MLflow failed)."""
    record = RunRecord.read(sweep_dir / run_files.MLFLOW_RUN)
    if record is None:
        return None
    try:
        mlflow = connected(record.server())
        for path in sorted(sweep_dir.iterdir()):
            if path.name == run_files.MLFLOW_RUN:
                continue
            if path.is_file():
                mlflow.log_artifact(record.run_id, str(path))
            elif path.is_dir():
                mlflow.log_artifacts(record.run_id, str(path), path.name)
        if best is not None:
            mlflow.set_tag(record.run_id, "sublimate.best-point", str(best.get("run-id")))
            done = set(mlflow.get_run(record.run_id).data.metrics)
            if f"best_{metric}" not in done and isinstance(best.get("metric"), int | float):
                mlflow.log_metric(record.run_id, f"best_{metric}", float(best["metric"]))
        mlflow.set_terminated(record.run_id, status="FINISHED" if best else "FAILED")
    except Exception as error:
        return _failed_or_warned(record, error)
    return None
