"""Per-epoch records of one training process: a JSONL file and TensorBoard event files.

Layout in the run folder on the shared volume::

    metrics/<label>.jsonl          one JSON object per epoch (what the run report is built from)
    tensorboard/<label>/           the same scalars as TensorBoard events (one run per process)
    tensorboard/aggregate/         rank 0's view of the whole job (global loss, throughput, ...)

``<label>`` is ``rank-N`` for collective workers, ``ps`` and ``trainer-N`` for async SGD, so
``tensorboard --logdir <run>/tensorboard`` shows every rank and the aggregate side by side.
Every record gets ``net_sent_bytes``: what this process's network namespace sent (loopback
excluded) since the log was opened, as training began (see ``metrics.NetworkCounter``).
TensorBoard is written only when the ``tensorboard`` package is importable and metrics are on;
the JSONL is always written (a few hundred bytes per epoch). Resumed runs append: readers keep the
last record of each epoch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sublimate.components.base import run_files
from sublimate.components.monitoring.metrics import NetworkCounter, enabled

AGGREGATE = "aggregate"


def _without_tensorflow() -> None:
    """Make TensorBoard's writer use its TensorFlow stub even where TensorFlow is installed.

    TensorBoard imports all of TensorFlow to write event files when it can (seconds of start-up
    and a screen of log lines per process); its ``no_tensorflow`` build marks this by the module
    ``tensorboard.compat.notf`` existing, which is what this does. Event files are the same.
    """
    import sys
    import types

    sys.modules.setdefault("tensorboard.compat.notf",
                           types.ModuleType("tensorboard.compat.notf"))


_without_tensorflow()  # before anything imports torch.utils.tensorboard


def _summary_writer(log_dir: Path) -> Any:
    if not enabled():
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # tensorboard not installed: the JSONL and the report still work
        return None
    return SummaryWriter(log_dir=str(log_dir), flush_secs=10)


class EpochLog:
    """Writes one process's per-epoch scalars; rank 0 also writes the aggregate view."""

    def __init__(self, run_dir: Path, label: str, aggregate: bool = False) -> None:
        run_dir = Path(run_dir)
        self.path = run_dir / "metrics" / f"{label}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.writer = _summary_writer(run_dir / run_files.TENSORBOARD / label)
        self.aggregate = _summary_writer(run_dir / run_files.TENSORBOARD / AGGREGATE) \
            if aggregate else None
        # Here, because every kind of training process opens its log just before its first
        # step and writes every epoch's record through it.
        self.network = NetworkCounter()

    def write(self, record: dict[str, Any], step: int, scalars: dict[str, float],
              aggregate: dict[str, float] | None = None) -> None:
        sent = self.network.sent()
        if sent is not None:
            record = {**record, "net_sent_bytes": sent}
            scalars = {**scalars, "net/sent_bytes": float(sent)}
        with self.path.open("a") as log:
            log.write(json.dumps(record) + "\n")
        for writer, values in ((self.writer, scalars), (self.aggregate, aggregate)):
            if writer is not None and values:
                for tag, value in values.items():
                    writer.add_scalar(tag, value, step)
                writer.flush()  # once per epoch: the events are on the volume as training goes

    def close(self) -> None:
        for writer in (self.writer, self.aggregate):
            if writer is not None:
                writer.close()


def write_scalars(run_dir: Path, label: str, step: int, scalars: dict[str, float]) -> bool:
    """One-off scalars (e.g. the evaluate step's test accuracy) under ``tensorboard/<label>``."""
    writer = _summary_writer(Path(run_dir) / run_files.TENSORBOARD / label)
    if writer is None:
        return False
    for tag, value in scalars.items():
        writer.add_scalar(tag, value, step)
    writer.close()
    return True
