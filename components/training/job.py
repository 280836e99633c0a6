"""The job as one training process sees it: :func:`start` joins it and returns a :class:`Job`
(its contract, process group, paradigm, checkpoints and reporter)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from sublimate.components.base import run_files
from sublimate.components.base.contract import Contract
from sublimate.components.base.durable_files import write_json
from sublimate.components.base.runtime import shown_path
from sublimate.components.base.settings import collective_timeout
from sublimate.components.model import checkpoint
from sublimate.components.monitoring import watchdog
from sublimate.components.paradigms import Paradigm, Replicas, paradigm_class
from sublimate.components.training.checkpointer import checkpointer
from sublimate.components.training.process_group import ProcessGroup, join
from sublimate.components.training.reporter import Reporter


def make_paradigm(name: str, model: nn.Module, optimizer: torch.optim.Optimizer,
                  settings: Mapping[str, Any] | None = None,
                  replicas: Replicas | None = None) -> Paradigm:
    """The paradigm ``name`` (sync, bmuf, easgd) around ``model`` and ``optimizer``.

    ``settings`` are by attribute (``sync_period=8``); each is checked against its declaration in
    :mod:`sublimate.components.base.settings` (a bad value raises naming the setting), missing ones
    take defaults. ``replicas``: the replica groups of per-step recovery
    (:class:`~sublimate.components.training.fault_tolerance.FaultTolerance`).
    """
    return paradigm_class(name)(model, optimizer, dict(settings or {}), replicas)


def save_model(run_dir: Path, model: nn.Module, **info: Any) -> Path:
    """Rank 0's final model: ``model.pt`` in the run folder, the state dict plus ``info``
    (``architecture`` and ``config`` let the built-in evaluation rebuild it)."""
    path = Path(run_dir) / run_files.MODEL
    checkpoint.save({**info, "state_dict": model.state_dict()}, path,
                    f"saving the model to {shown_path(path)}")
    return path


class Job:
    """One training process of a sublimate job: its contract, process group and helpers."""

    def __init__(self, contract: Contract, group: ProcessGroup) -> None:
        self.contract, self.group = contract, group
        self.run_dir, self.data_dir, self.settings = (contract.run_dir, contract.data_dir,
                                                      dict(contract.settings))
        self.rank, self.world, self.device = group.rank, group.world, group.device
        self.checkpoints = checkpointer(str(self.settings.get("checkpoint_format", "files")),
                                        self.run_dir, group.rank, group.world,
                                        str(self.settings.get("algorithm", "own")))
        self._reporter: Reporter | None = None
        self._paradigm: Paradigm | None = None  # the last one made: its traffic is counted

    def paradigm(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 name: str | None = None, **settings: Any) -> Paradigm:
        """The paradigm (default: the job's ``algorithm`` setting) with the job's settings,
        overridden by ``settings``."""
        name = name or str(self.settings.get("algorithm", "sync"))
        self.checkpoints.kind = name
        self._paradigm = make_paradigm(name, model, optimizer, {**self.settings, **settings})
        return self._paradigm

    def reporter(self, training_model: nn.Module | None, total_steps: int,
                 samples_per_step: int) -> Reporter:
        """Start monitoring this process (``samples_per_step``: this rank's batch)."""
        self._reporter = Reporter(self.run_dir, self.group, total_steps, samples_per_step,
                                  training_model,
                                  progress_every=float(self.settings.get(
                                      "progress_every", watchdog.EVERY_SECONDS)),
                                  # DDP's buckets join the paradigm's count of bytes sent
                                  traffic=self._paradigm.traffic if self._paradigm else None)
        self.checkpoints.progress = self._reporter.progress
        return self._reporter

    def write_metrics(self, metrics: Mapping[str, Any]) -> Path | None:
        """Rank 0 writes ``metrics.json`` into the run folder: the named metrics (``accuracy``,
        ``loss``, any others) that the evaluate step reports and ``-p metric=`` picks from, for
        a model the built-in evaluation cannot rebuild. Its path on rank 0, None elsewhere."""
        if self.rank != 0:
            return None
        path = self.run_dir / run_files.EVALUATION
        # a tensor or NumPy scalar (a loss straight from the loop) as the number it holds
        write_json({name: value.item() if hasattr(value, "item") else value
                    for name, value in metrics.items()}, path)
        return path

    def finish(self, model: nn.Module | None = None, step: int | None = None,
               **info: Any) -> None:
        """Rank 0 saves ``model`` as the run's model; every rank leaves the process group
        (``step``: where this process ended, for the watchdog)."""
        self.checkpoints.wait()  # checkpoint-format dcp: the last save is committed first
        if model is not None and self.rank == 0:
            save_model(self.run_dir, model, **info)
        dist.barrier()
        dist.destroy_process_group()
        if self._reporter is not None:
            self._reporter.close(step if step is not None else self._reporter.total_steps)


def start(backend: str | None = None, timeout_seconds: float | None = None) -> Job:
    """Join the job this process was started in (under ``sublimate run`` or torchrun).

    The backend and the collective timeout default to the job's ``backend`` and
    ``collective_timeout`` settings.
    """
    contract = Contract.from_env()
    settings = contract.settings
    contract.run_dir.mkdir(parents=True, exist_ok=True)
    group = join(backend or str(settings.get("backend", "auto")),
                 timeout_seconds if timeout_seconds is not None
                 else collective_timeout(settings))
    torch.manual_seed(int(settings.get("seed", 0)))  # the same initial model on every rank
    return Job(contract, group)
