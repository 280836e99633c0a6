"""Resilience testing: environment variables that make a worker kill or freeze itself on cue.

``SUBLIMATE_FAIL_AT_STEP`` (with ``SUBLIMATE_FAIL_RANK``, default 0) SIGKILLs that rank after
that step; ``SUBLIMATE_FAIL_DURING_CHECKPOINT`` kills it halfway through writing its checkpoint of
that step; ``SUBLIMATE_FREEZE_AT_STEP`` stops it (SIGSTOP) as a hung process would be;
``SUBLIMATE_FAIL_IN_ALLREDUCE_AT_STEP`` (per-step recovery) kills it while the step's all-reduce
between replica groups is in flight (bmuf, easgd, diloco: the round's, at the local step where
it begins); ``SUBLIMATE_STALL_AT_STEP`` (per-step recovery) makes it late by
``SUBLIMATE_STALL_SECONDS``, alive all the while. Only the first start of the launcher's first
attempt is hit, so a restart, a relaunch or a replacement goes on and finishes.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from sublimate.components.base.durable_files import replace_atomically
from sublimate.components.model import checkpoint
from sublimate.components.monitoring.watchdog import ATTEMPT_ENV


def fault_injection_step(rank: int, variable: str = "SUBLIMATE_FAIL_AT_STEP") -> int | None:
    """Resilience testing: the step at which to SIGKILL this worker (first launch only).

    ``variable`` names the fault (see the module's docstring); ``SUBLIMATE_FAIL_RANK`` the rank,
    or several separated by commas, hit at the same step (under per-step recovery: the slot,
    node x procs-per-node + local rank).
    """
    at_step = os.environ.get(variable)
    ranks = os.environ.get("SUBLIMATE_FAIL_RANK", "0").split(",")
    if (at_step is None or str(rank) not in ranks
            or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
            or launcher_attempt() > 0):
        return None
    return int(at_step)


def launcher_attempt() -> int:
    """Which of the launcher's attempts this process belongs to (0: the first; relaunches
    after a stall or a lost node count up). The attempt id is ``<pid>-<attempt>-<time>``."""
    parts = os.environ.get(ATTEMPT_ENV, "").split("-")
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else 0


def kill_self(rank: int, step: int) -> None:
    print(f"fault injection: killing rank {rank} at step {step}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def freeze_self(rank: int, step: int) -> None:
    print(f"fault injection: freezing rank {rank} (pid {os.getpid()}) at step {step}",
          flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)


def stall_self(rank: int, step: int) -> None:
    """Fault injection (``SUBLIMATE_STALL_AT_STEP``): this rank is late, not dead, for
    ``SUBLIMATE_STALL_SECONDS`` (default 3): a straggler, whose torchft heartbeats go on."""
    seconds = float(os.environ.get("SUBLIMATE_STALL_SECONDS", "3"))
    print(f"fault injection: stalling rank {rank} for {seconds:g}s after step {step}",
          flush=True)
    time.sleep(seconds)


def die_writing_checkpoint(run_dir: Path, step: int, rank: int, state: dict[str, Any]) -> None:
    """Fault injection: write half of this rank's checkpoint file of ``step``, as a process
    killed mid-write leaves it, and SIGKILL this process before the file is renamed."""
    import io

    encoded = io.BytesIO()
    torch.save(state, encoded)

    def write_half_and_die(stream: Any) -> None:
        stream.write(encoded.getvalue()[:len(encoded.getvalue()) // 2])
        stream.flush()
        os.fsync(stream.fileno())
        print(f"fault injection: killing rank {rank} while it writes its checkpoint of step "
              f"{step}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    replace_atomically(checkpoint.step_path(run_dir, step, rank), write_half_and_die)


def kill_in_allreduce(manager: Any, parameters: list[torch.nn.Parameter], slot: int,
                      step: int, record: Callable[..., None] | None = None) -> None:
    """Fault injection (per-step recovery): SIGKILL this process once it is in this step's
    quorum, where its peers' all-reduce of the step waits for its share
    (``SUBLIMATE_FAIL_IN_ALLREDUCE_AT_STEP``): their collective fails mid-way, on the
    connection the dead process closes.

    It sends nothing. Its share sent first, the peers' all-reduce could complete before the
    kill landed (when they were already waiting in it: CI, once), and they would go on as if
    nothing had happened; a share of another size than the step's flat gradient (the
    paradigm's ``averaged_parameters``) is worse, a collective mismatch that gloo does not
    report as an error but aborts the receiving process with. ``parameters`` is kept for
    that reason: what the step would all-reduce, for the message. ``record``: the replica
    group's event record, which dates the kill (what the survivors' stall is measured from)."""
    manager.wait_quorum()  # this process is in the step's collective from here on
    size = sum(parameter.numel() for parameter in parameters)
    if record is not None:
        record("killed", step=step, fault="in the all-reduce")
    print(f"fault injection: killing slot {slot} during the all-reduce of step {step} "
          f"({size} values that it will not send)", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
