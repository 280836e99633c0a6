"""Joining the job's process group: this worker's device, backend, rank and world."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


def log(rank: int, message: str) -> None:
    """Print on rank 0 only: one line per event for the whole job, not one per worker."""
    if rank == 0:
        print(message, flush=True)


# ---------------------------------------------------------------------------- process group


@dataclass(slots=True)
class ProcessGroup:
    """Where this worker trains: its device, the collective backend, its rank and the world.

    Under per-step recovery the process group is one node's (a replica group's):
    ``replica_group`` is that node among ``replica_groups``, and :attr:`slot` / :attr:`slots`
    place this process among every process of the job (its share of each global batch, its
    name in the run folder), as ``rank`` / ``world`` do otherwise.
    """

    device: torch.device
    backend: str
    rank: int
    world: int
    replica_group: int | None = None
    replica_groups: int = 1

    @property
    def slot(self) -> int:
        """This process among all of the job's (its rank, or its node's first slot plus its
        rank on the node)."""
        return self.rank if self.replica_group is None \
            else self.replica_group * self.world + self.rank

    @property
    def slots(self) -> int:
        """Every process of the job, alive or not."""
        return self.world * self.replica_groups

    @property
    def node(self) -> int:
        """The node this process runs on (torchrun's GROUP_RANK, or its replica group)."""
        return int(os.environ.get("GROUP_RANK", "0")) if self.replica_group is None \
            else self.replica_group


def device_and_backend(requested: str = "auto") -> tuple[torch.device, str]:
    """The device this process trains on (its LOCAL_RANK's GPU, else the CPU) and the backend."""
    use_cuda = torch.cuda.is_available() and requested != "gloo"
    if requested == "nccl" and not use_cuda:
        raise RuntimeError("backend 'nccl' needs a GPU, and none is visible to this worker")
    if use_cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def wait_for_store(timeout: float = 60.0) -> None:
    """Wait until rank 0's process-group store listens, probing every 10 ms.

    Rank 0 starts the store that init_process_group meets at; torch's client retries a refused
    connection only after half a second, so a worker that arrives a few milliseconds before
    rank 0 would lose that half second at every start. A probe that finds nothing within
    ``timeout`` leaves the matter (and the error) to init_process_group.
    """
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port or os.environ.get("RANK", "0") == "0":
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return
        except OSError:
            time.sleep(0.01)


def join(backend: str = "auto", timeout_seconds: float | None = None) -> ProcessGroup:
    """Join the job's process group (torchrun's environment says where and who).

    ``timeout_seconds`` bounds every collective: a peer that is gone or cut off raises an error
    after it instead of hanging for torch's default half hour (``collective-timeout``).
    """
    device, backend = device_and_backend(backend)
    wait_for_store()
    options: dict[str, Any] = {}
    if timeout_seconds:
        options["timeout"] = timedelta(seconds=timeout_seconds)
    dist.init_process_group(backend=backend, **options)
    return ProcessGroup(device, backend, dist.get_rank(), dist.get_world_size())
