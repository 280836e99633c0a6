"""The training process that ``torchrun`` starts on every worker (sync, bmuf, easgd).

It joins the process group, reads its slice of every global batch from the staged dataset, runs
the chosen paradigm's step loop, checkpoints to the shared volume and, on rank 0, writes the final
model. Every worker walks the same seeded permutation of the training set and takes its own
contiguous slice of each global batch, so N workers with batch b see exactly what one process with
batch N*b would, and a resumed run continues the same sequence from its step count.
"""

# The start mark below must precede the imports it measures:
# ruff: noqa: E402
from __future__ import annotations

import time

# When this module's code began: the start-up report splits the interpreter's start from the
# imports (torch's dominates). In a worker forked by the agent (see :func:`agent`), the module
# runs again in the child, so this is the child's start.
STARTED = time.time()

import argparse
import contextlib
import importlib
import multiprocessing
import os
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

from sublimate.components import training
from sublimate.components.base import run_files
from sublimate.components.base.elastic_errors import recorded
from sublimate.components.base.replica_groups import RECOVERY_ENV
from sublimate.components.base.runtime import shown_path
from sublimate.components.base.settings import (
    COLLECTIVE_PARADIGMS,
    PER_STEP,
    SettingError,
    add_training_arguments,
    check,
)
from sublimate.components.base.termination import OneLineParser, exit_now, fail
from sublimate.components.data.datasets import data_problem
from sublimate.components.model import checkpoint
from sublimate.components.monitoring import metrics as monitoring
from sublimate.components.processes import forking_agent
from sublimate.components.processes.learning import (
    load_data,
)
from sublimate.components.processes.request import WorkerRequest
from sublimate.components.processes.training_loop import start_loop
from sublimate.components.training import ProcessGroup, log

MODEL_NAME = run_files.MODEL  # kept for callers of the first releases
METRICS_FLUSH_STEPS = training.METRICS_FLUSH_STEPS
STEP = "train"  # the step a refused input is reported for (train: error: ...)
# What a worker imports after this module's own imports, on its way to the first step: DDP's
# constructor imports torch._dynamo (over a second of CPU), monitoring imports TensorBoard.
# They are imported in the background while the process waits for the other nodes (_preload).
PRELOAD = (
    "torch._dynamo", "torch.nn.parallel", "torch.distributed.algorithms.ddp_comm_hooks",
    "sublimate.components.monitoring.tensorboard_log", "torch.utils.tensorboard",
    "sublimate.components.paradigms.sync_sgd", "sublimate.components.paradigms.bmuf",
    "sublimate.components.paradigms.easgd",
    "prometheus_client", "prometheus_client.exposition", "prometheus_client.process_collector",
)
# Under per-step recovery DDP is not used (gradients are averaged through torchft), but torchft
# is: its modules load while the node waits instead (a replacement's start is the time the job
# trains without it).
PER_STEP_PRELOAD = (
    "torchft.manager", "torchft.process_group", "torchft.checkpointing.pg_transport",
    *(name for name in PRELOAD if not name.startswith(("torch._dynamo", "torch.nn.parallel",
                                                        "torch.distributed.algorithms"))),
)


def parse_args(argv: list[str] | None = None) -> WorkerRequest:
    # Refusals read like the launcher's (same step name, same words): see OneLineParser.
    parser = OneLineParser(prog=STEP, description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", choices=COLLECTIVE_PARADIGMS, default="sync")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    add_metrics_arguments(parser)
    add_training_arguments(parser, COLLECTIVE_PARADIGMS)
    return WorkerRequest.from_values(vars(parser.parse_args(argv)))


def add_metrics_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-addr", default=None,
                        help="address the Prometheus endpoint binds (default "
                             "$SUBLIMATE_METRICS_ADDR or 127.0.0.1; 0.0.0.0 in a cluster)")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="base port; each process uses base + local rank, or an OS-chosen "
                             f"port when taken (default $SUBLIMATE_METRICS_PORT or "
                             f"{monitoring.DEFAULT_PORT}; 0: always OS-chosen)")


def train(request: WorkerRequest, startup: monitoring.StartupClock | None = None,
          ) -> dict[str, Any]:
    """Train to the end (resuming from the run's last checkpoint) and return the summary.

    ``startup`` is marked as each start-up phase ends (the first step is the last phase).
    """
    startup = startup or monitoring.StartupClock(time.time())
    group = join_process_group(request, startup)
    if request.recovery == PER_STEP:  # every node its own process group: see per_step_loop
        from sublimate.components.processes import per_step_loop

        return per_step_loop.train(request, startup, group)
    run = start_loop(request, startup, group, load_data(request, group, startup))
    while run.step < run.data.total_steps:
        run.close_epoch(*run.run_epoch())
    return run.finish()


def join_process_group(request: WorkerRequest, startup: monitoring.StartupClock,
                       ) -> ProcessGroup:
    """Join the job's process group (start-up phase ``process_group``)."""
    # DDP's import of torch._dynamo (over a second) loads while this process waits for its
    # peers; the main thread imports nothing meanwhile. A forked worker has it already.
    preloading = _preload()
    group = training.join(request.backend, request.collective_seconds)
    if preloading is not None:
        preloading.join()
    startup.mark("process_group")
    return group


def refusal(request: WorkerRequest) -> str | None:
    """Why these arguments cannot train, in one line (None if they can).

    The launcher asks the same before it starts any worker (:func:`datasets.data_problem`
    words both); this is for a worker run by hand, which should not need a traceback to say
    that its batch does not fit its dataset.
    """
    # torchrun's layout, in the launcher's terms, so that the rules word it the same way.
    procs = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    layout = {"nodes": max(int(os.environ.get("WORLD_SIZE", "1")) // procs, 1),
              "procs_per_node": procs}
    try:
        check({**request.values(), **layout})
    except SettingError as error:
        return str(error)
    return data_problem(request.data_dir, request.global_batch_size, request.eval_every_epoch)


def preload_modules() -> tuple[str, ...]:
    """What this process's workers import on their way to the first step (its recovery's)."""
    return PER_STEP_PRELOAD if os.environ.get(RECOVERY_ENV) == PER_STEP else PRELOAD


def _preload() -> threading.Thread | None:
    """Import :data:`PRELOAD` in a background thread; None when they are all loaded already.

    The process meanwhile waits for its peers (the agent in its rendezvous, a worker in
    init_process_group), so the imports cost little wall time. The caller must not import
    anything itself until it joins the thread: two threads importing overlapping modules can
    deadlock on Python's module locks.
    """
    modules = preload_modules()
    if all(name in sys.modules for name in modules):
        return None

    def load() -> None:
        for name in modules:
            # e.g. no tensorboard: the worker meets (and handles) that itself
            with contextlib.suppress(Exception):
                importlib.import_module(name)

    thread = threading.Thread(target=load, name="sublimate-preload", daemon=True)
    thread.start()
    return thread


@recorded  # torchrun's error file: why this rank failed, for the launcher (launch.failures)
def main(argv: list[str] | None = None) -> int:
    startup = monitoring.StartupClock(STARTED)
    startup.mark("imports")
    request = parse_args(argv)
    problem = refusal(request)
    if problem is not None:
        return fail(STEP, problem)
    try:
        summary = train(request, startup)
    except checkpoint.CheckpointError as error:  # names the file and what to do
        return fail(STEP, str(error))
    log(int(os.environ.get("RANK", "0")),
         f"training finished: {summary['steps']} steps in {summary['train_seconds']:.1f}s, "
         f"{summary['samples_per_second']:.0f} samples/s, "
         f"model at {shown_path(request.run_dir / MODEL_NAME)}")
    return 0


def agent(argv: list[str]) -> NoReturn:
    """This module as a node's torchrun agent whose workers it forks
    (:func:`~sublimate.components.processes.forking_agent.agent`): each child runs this file's
    :func:`main` with this module's imports already in memory."""
    forking_agent.agent(argv, run_path=str(Path(__file__).resolve()), preload=_preload)


if __name__ == "__main__":
    if sys.argv[1:2] == [forking_agent.AGENT]:
        agent(sys.argv[2:])
    code = main()
    if multiprocessing.parent_process() is None:  # a process of its own, not a forked worker
        exit_now(code)
    sys.exit(code)  # a forked worker returns to torchrun's wrapper, which reports and exits
