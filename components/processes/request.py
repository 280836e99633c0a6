"""What a training process is told on its command line, typed: :class:`WorkerRequest` for the
built-in loop's workers (``processes.worker``), :class:`ParameterServerRequest` for async's
server and trainers (``processes.async_sgd``).

Both are the train step's settings (:class:`~sublimate.components.base.train_settings.
TrainSettings`; those the launcher does not pass keep their defaults) plus where the data and
the run live and where the process serves its metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sublimate.components.base.settings import collective_timeout
from sublimate.components.base.train_settings import TrainSettings


@dataclass(frozen=True, kw_only=True)
class WorkerRequest(TrainSettings):
    data_dir: Path
    run_dir: Path
    # the Prometheus endpoint's address and base port (None: $SUBLIMATE_METRICS_ADDR/PORT)
    metrics_addr: str | None = None
    metrics_port: int | None = None

    @property
    def collective_seconds(self) -> float:
        """``collective-timeout`` as it applies: the value given, or the recovery mode's."""
        return collective_timeout(self.values())


@dataclass(frozen=True, kw_only=True)
class ParameterServerRequest(WorkerRequest):
    role: Literal["ps", "trainer"]
    num_trainers: int
    # host:port of the parameter server's RPC endpoint
    rpc_endpoint: str
    trainer_id: int = 0
    rpc_timeout: float = 300.0
