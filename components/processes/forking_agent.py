"""A node's ``torchrun`` agent whose workers are forked from it instead of started afresh.

The launcher starts a CPU node as ``python -m sublimate.components.processes.worker agent
<torchrun flags> -- <worker arguments>`` (``launch.apps``), or forks that agent from its fork
server (:mod:`.agent_zygote`). The agent imports torch, torchrun and the worker's modules once;
each worker it forks starts with them in memory.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import threading
import time
from collections.abc import Callable
from typing import NoReturn

from sublimate.components.base.termination import exit_now
from sublimate.components.monitoring import metrics as monitoring

# The first argument that makes the worker's module a torchrun agent rather than a worker.
AGENT = "agent"
# Set by agent_zygote in an agent it forked: [["scheduler", t], ["agent_imports", t]].
FORKED_MARKS_ENV = "SUBLIMATE_FORKED_AGENT_MARKS"
# What torchrun's agent imports on its way to forking the workers (rendezvous backend, agent,
# multiprocessing's fork support), imported before the preload starts so that only one thread
# imports at a time: two threads importing overlapping modules can deadlock on module locks.
AGENT_IMPORTS = (
    "torch.distributed.elastic.agent.server.local_elastic_agent",
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
    "torch.distributed.elastic.rendezvous.dynamic_rendezvous",
    "multiprocessing.popen_fork", "multiprocessing.queues", "encodings.idna",
)


def agent(argv: list[str], *, run_path: str,
          preload: Callable[[], threading.Thread | None]) -> NoReturn:
    """``torchrun`` whose workers are forked from this agent instead of started afresh.

    ``argv`` is torchrun's flags, ``--``, then the worker's arguments. The agent has imported
    torch (torchrun needs it) and this module's other imports before its rendezvous, so a
    forked worker starts with them in memory instead of paying the interpreter's start and
    torch's import again (about a second of CPU per worker, at every start and restart). The
    launcher uses this on CPU nodes only: CUDA must never be initialised before a fork, and on
    GPU nodes a fresh interpreter per worker is the safe default. torchrun's ``--run-path``
    re-executes ``run_path`` (the worker's module) as ``__main__`` in each child, which then
    trains; ``preload`` imports the worker's remaining modules in a thread (None: nothing to
    import).
    """
    from torch.distributed import run as torchrun

    # This agent's start-up, for its workers' report (metrics.StartupClock): TorchX started it,
    # it imported torch and torchrun, then it meets the other nodes and forks. An agent forked
    # by the launcher's fork server (agent_zygote) is told when the server did the first two.
    forked = os.environ.pop(FORKED_MARKS_ENV, None)
    marks = [(name, at) for name, at in json.loads(forked)] if forked else \
        [("scheduler", monitoring.process_start_time())]
    for name in AGENT_IMPORTS:
        with contextlib.suppress(ImportError):  # moved in another torch: imported when needed
            importlib.import_module(name)
    if not forked:
        marks.append(("agent_imports", time.time()))
    # The workers' remaining imports load while the agent waits for the other nodes; a fork
    # must not happen while another thread imports (the child would inherit held locks), so
    # every fork waits for the preload to end.
    preloading = preload()

    def before_fork() -> None:  # torchrun forks its workers right after the rendezvous
        rendezvous = time.time()
        if preloading is not None:
            preloading.join()
        os.environ[monitoring.AGENT_MARKS_ENV] = json.dumps(
            [*marks, ("agent_rendezvous", rendezvous), ("preload", time.time())])

    os.register_at_fork(before=before_fork)
    argv = _static_port(argv)
    split = argv.index("--")
    torchrun.main([*argv[:split], "--start-method", "fork", "--run-path",
                   run_path, *argv[split + 1:]])
    exit_now(0)  # a failure raised above, with torchrun's report


def _static_port(argv: list[str]) -> list[str]:
    """A node of its own (per-step recovery) meets no other: torchrun's ``static`` rendezvous,
    with no rendezvous rounds to wait for, on a free port of this node (``localhost:0`` would
    give the workers port 0 for their store)."""
    if "static" not in argv or "localhost:0" not in argv:
        return argv
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return [f"localhost:{port}" if arg == "localhost:0" else arg for arg in argv]
