"""A test's process group: its ranks forked from one server per test process, torch loaded.

``torch.multiprocessing.spawn`` starts every rank as a new interpreter that imports torch and
the project again: about 2 CPU-s a rank, most of what a two-rank update-rule test costs.
multiprocessing's fork server imports :data:`PRELOAD` once per test process (each xdist worker)
and forks every rank of every test from it. The server only imports, never computes, so a fork
copies no OpenMP thread pool (forking a process that has run torch ops can hang its child).

A rank sees the environment and working directory the server started with (the test process's
at its first call), so a test passes what its ranks need as arguments, not by ``monkeypatch``.
"""

from __future__ import annotations

import multiprocessing.forkserver
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

PRELOAD = [
    "torch", "torch.distributed", "torch.nn.parallel", "pytest",
    "sublimate.components.paradigms", "sublimate.components.training",
]


def run_ranks(function: Callable[..., None], args: tuple[Any, ...], world: int) -> None:
    """Run ``function(rank, *args)`` in ``world`` processes and wait for all of them; a rank's
    exception is raised here with its traceback, as ``mp.spawn`` does."""
    multiprocessing.forkserver.set_forkserver_preload(PRELOAD)  # read when the server starts
    mp.start_processes(function, args=args, nprocs=world, join=True, start_method="forkserver")
