"""The names of everything a run leaves in its folder on the shared volume, in one place.

``<volume>/runs/<run-id>/`` is written by the train step (launcher and workers), the evaluate
step and the report, and read by all of them, ``sublimate report`` and the notebook::

    model.pt                       MODEL              the final model (rank 0 or the server)
    train-summary.json             SUMMARY            figures of the training (the workers)
    metrics.json                   EVALUATION         test loss and accuracy (evaluate)
    metrics/<label>.jsonl          EPOCH_LOGS         one record per epoch from every process
    metrics-endpoints.json         ENDPOINTS          the workers' Prometheus addresses
    progress/rank-R.json           PROGRESS           each process's heartbeat (the watchdog)
    tensorboard/<label>/           TENSORBOARD        event files
    checkpoints/step-N/rank-R.pt   CHECKPOINTS        per-rank state; latest.json commits a step
    checkpoints/parameter-server.pt  SERVER_CHECKPOINT  the async server's state
    logs/                          LOGS               TorchX's per-replica logs (local runs)
    fault-tolerance/               FAULT_TOLERANCE    per-step recovery: each node's events
                                                      and step counters, per process start
    report/                        REPORT             report.json and the plots
    mlflow-run.json                MLFLOW_RUN         the MLflow run the train step logs to
                                                      (tracking on): evaluate ends it
    etcd/                          ETCD               rendezvous etcd-v2 on one machine: the
                                                      etcd server's data, while the job runs
"""

from __future__ import annotations

from pathlib import Path

MODEL = "model.pt"
SUMMARY = "train-summary.json"
EVALUATION = "metrics.json"
EPOCH_LOGS = "metrics"
ENDPOINTS = "metrics-endpoints.json"
PROGRESS = "progress"  # rank-<r>.json per process: the step it reached, and when (watchdog)
TENSORBOARD = "tensorboard"
CHECKPOINTS = "checkpoints"
LATEST = "latest.json"
SERVER_CHECKPOINT = f"{CHECKPOINTS}/parameter-server.pt"
LOGS = "logs"
FAULT_TOLERANCE = "fault-tolerance"
REPORT = "report"
ETCD = "etcd"
MLFLOW_RUN = "mlflow-run.json"  # the run's MLflow run (tracking): server, run id
LAUNCHER_LOCK = "launcher.lock"  # the launcher training in this folder (one at a time)


def holds_results(folder: Path) -> bool:
    """Whether ``folder`` is a run's results folder: what the built-in loop and the library
    write first and last, the metrics of own code that wrote nothing else, or the logs of a job
    that failed before either."""
    return (folder / SUMMARY).is_file() or (folder / EPOCH_LOGS).is_dir() \
        or (folder / EVALUATION).is_file() or (folder / LOGS).is_dir()
