"""What the train step asks of the launcher (:class:`TrainRequest`) and what the launcher decides
from it once, before the first attempt (:class:`LaunchPlan`).

The request is built once where the step parses its arguments and never written to; the plan
holds what depends on where the step runs (the scheduler), on the dataset (the recovery mode) or
on the clock (the launch time), so that every part of the launcher reads the same decisions.
TorchX's typed ``runopts`` are the model: a scheduler's options are declared, typed values.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sublimate.components.base import settings as declared
from sublimate.components.base.settings import PER_STEP
from sublimate.components.base.train_settings import TrainSettings


@dataclass(frozen=True, kw_only=True)
class TrainRequest(TrainSettings):
    """The train step's settings and where its data and run live (its command line, typed)."""

    data_dir: Path
    run_dir: Path
    # the folder holding one folder per run (local_netns mounts its parent as the volume)
    runs_root: Path | None = None
    workflow_name: str = ""
    # files the step writes its Argo outputs to
    run_dir_output: Path | None = None
    model_path_output: Path | None = None
    # TorchX mounts for the workers (kubernetes only)
    mounts: tuple[str, ...] = ()
    dryrun: bool = False
    # GPUs of this host that simulated nodes share (None: as many as nvidia-smi lists)
    host_gpus: int | None = None


def choose_scheduler(requested: str) -> str:
    """The TorchX scheduler for ``scheduler`` (auto: kubernetes in a cluster's pod, else
    local_cwd)."""
    if requested != declared.AUTO:
        return requested
    in_cluster = "KUBERNETES_SERVICE_HOST" in os.environ and "SUBLIMATE_LOCAL_RUN" not in os.environ
    return "kubernetes" if in_cluster else "local_cwd"


@dataclass(frozen=True)
class LaunchPlan:
    """What the launcher decided for a request: made once (:func:`plan_launch`), read by every
    attempt."""

    scheduler: str
    # RESTART or PER_STEP: ``recovery`` with auto resolved (settings.recovery_mode)
    recovery: str
    # ``max-restarts`` with auto resolved: relaunches, or per-step replacements per node
    max_restarts: int
    # the launcher's process start (metrics.process_start_time), where the start-up begins
    launch_time: float | None = None
    # the etcd server this attempt's nodes meet on (a local etcd-v2 job's own server)
    etcd_endpoint: str = ""

    @property
    def per_step(self) -> bool:
        return self.recovery == PER_STEP

    def resolved(self, request: TrainRequest) -> dict[str, Any]:
        """The request's settings by attribute with this plan's decisions in place of auto:
        what the rules of ``settings`` and the workers' flags take."""
        return {**request.values(), "scheduler": self.scheduler, "recovery": self.recovery,
                "max_restarts": self.max_restarts}

    def for_attempt(self, etcd_endpoint: str) -> LaunchPlan:
        return dataclasses.replace(self, etcd_endpoint=etcd_endpoint)


def plan_launch(request: TrainRequest, *, scheduler: str | None = None, streamed: bool = False,
                launch_time: float | None = None) -> LaunchPlan:
    """The launcher's decisions for ``request``: the scheduler (``scheduler`` overrides the
    request's), the recovery mode (``streamed``: data-loading auto streams this dataset, so
    per-step, which holds it in memory, is off) and the restarts that mode gets."""
    values = request.values()
    recovery = declared.recovery_mode(values, streamed=streamed)
    if request.algorithm == "async":  # the parameter server has no per-step recovery
        recovery = declared.RESTART
    restarts = declared.max_restarts({**values, "recovery": recovery})
    return LaunchPlan(scheduler=scheduler or choose_scheduler(request.scheduler),
                      recovery=recovery, max_restarts=restarts, launch_time=launch_time)
