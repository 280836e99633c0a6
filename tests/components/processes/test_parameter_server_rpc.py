"""Asynchronous SGD as it really runs: a parameter server and two trainers, each its own process,
talking over ``torch.distributed.rpc`` (TensorPipe on 127.0.0.1).

tests/components/paradigms/test_paradigms.py checks :class:`ParameterServer`'s bookkeeping in one
process with threads; this checks what only the real processes show: every push a trainer made over
RPC was applied exactly once (no lost or repeated round trip), and the staleness bound held while
one trainer was frozen and the other kept going.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sublimate.components.base import run_files
from sublimate.components.base.ports import free_port
from sublimate.components.data.datasets import build_builtin
from sublimate.components.model import checkpoint
from tests.conftest import REPO

TRAINERS = 2
EPOCHS = 10
GLOBAL_BATCH = 32
BOUND = 2
PAUSE_SECONDS = 1.0  # trainer 1 frozen this long: hundreds of trainer 0's steps, were it free
TIMEOUT = 120  # for the whole job; it takes about 7 s on 2 busy cores


@pytest.fixture
def processes() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """The job's processes by role; whatever the test's outcome, each is stopped at the end."""
    started: dict[str, subprocess.Popen[bytes]] = {}
    yield started
    for process in started.values():
        if process.poll() is None:
            process.send_signal(signal.SIGCONT)  # a frozen process cannot act on SIGTERM
            process.terminate()
    for process in started.values():
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_for(condition: object, timeout: float, what: str,
              job: dict[str, subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        ended = {role: p.returncode for role, p in job.items() if p.poll() is not None}
        if any(code != 0 for code in ended.values()):
            raise AssertionError(f"waiting for {what}, a process failed: {ended}")
        time.sleep(0.01)
    raise AssertionError(f"no {what} within {timeout}s")


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_real_rpc_trainers_have_every_push_applied_once_within_the_staleness_bound(
        tmp_path: Path, processes: dict[str, subprocess.Popen[bytes]]) -> None:
    data = build_builtin("digits", tmp_path / "digits")
    run_dir = tmp_path / "run"
    common = ["--data-dir", str(data), "--run-dir", str(run_dir),
              "--num-trainers", str(TRAINERS), "--rpc-endpoint", f"127.0.0.1:{free_port()}",
              "--rpc-timeout", "60", "--epochs", str(EPOCHS),
              "--global-batch-size", str(GLOBAL_BATCH), "--staleness-bound", str(BOUND),
              "--eval-every-epoch", "false", "--checkpoint-every", "0",
              "--metrics-port", "0"]  # OS-chosen: no clash with anything else on the machine
    # What the TorchX app gives these processes (components/launch/apps.py: parameter_server,
    # _worker_env)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    module = [sys.executable, "-m", "sublimate.components.processes.async_sgd"]
    roles = {"ps": ["ps"], **{f"trainer{i}": ["trainer", "--trainer-id", str(i)]
                              for i in range(TRAINERS)}}
    for role, args in roles.items():
        with (tmp_path / f"{role}.log").open("wb") as log:
            processes[role] = subprocess.Popen([*module, *args, *common], cwd=REPO, env=env,
                                               stdout=log, stderr=subprocess.STDOUT)

    def logs() -> str:
        return "\n".join(f"--- {role}\n" + (tmp_path / f"{role}.log").read_text()[-2000:]
                         for role in roles)

    # Freeze trainer 1 once it has finished its first epoch (it is then pushing for real):
    # trainer 0 may run at most BOUND pushes ahead of it, then must wait at the server.
    trainer1_log = run_dir / "metrics" / "trainer-1.jsonl"
    _wait_for(lambda: _records(trainer1_log), 60, "first epoch of trainer 1", processes)
    processes["trainer1"].send_signal(signal.SIGSTOP)
    try:
        time.sleep(PAUSE_SECONDS)
        assert processes["trainer1"].poll() is None, \
            "trainer 1 finished before it was frozen: the run is too short to test the bound"
    finally:
        processes["trainer1"].send_signal(signal.SIGCONT)

    for role, process in processes.items():
        try:
            code = process.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{role} still running after {TIMEOUT}s\n{logs()}") from None
        assert code == 0, f"{role} exited with {code}\n{logs()}"

    summary = json.loads((run_dir / "train-summary.json").read_text())
    examples = json.loads((data / "metadata.json").read_text())["splits"]["train"]["examples"]
    steps = examples // GLOBAL_BATCH * EPOCHS  # each trainer's pushes over the run
    # The trainers' own count of round trips that returned (their last epoch record), against
    # the server's: a push lost or applied twice on the way makes these differ.
    trainer_pushes = [_records(run_dir / "metrics" / f"trainer-{i}.jsonl")[-1]["step"]
                      for i in range(TRAINERS)]
    assert trainer_pushes == [steps] * TRAINERS
    assert summary["pushes_per_trainer"] == trainer_pushes
    assert summary["updates_applied"] == sum(trainer_pushes)
    histogram = {int(k): v for k, v in summary["staleness_histogram"].items()}
    assert sum(histogram.values()) == summary["updates_applied"]
    assert max(histogram) == summary["staleness_max"]

    # The bound was exercised (trainer 0 waited while trainer 1 was frozen) and held: between a
    # trainer's pull and its next push, each other trainer moves from at least BOUND behind it
    # to at most BOUND ahead, so no push is staler than 2 x BOUND per other trainer. Unbounded,
    # the frozen trainer's next push would be hundreds of updates stale.
    assert summary["bound_waits"] >= 1, summary
    assert summary["staleness_max"] <= 2 * BOUND * (TRAINERS - 1), summary
    # The server's last checkpoint (what a re-submitted run resumes from) holds the same count.
    saved = checkpoint.load(run_dir / run_files.SERVER_CHECKPOINT)
    assert saved is not None
    assert saved["version"] == summary["updates_applied"]
    assert saved["clocks"] == trainer_pushes


IDLE_SECONDS = 2.0
# CPU an idle role may spend per second: TensorPipe's shared-memory transport spun a core
# (1.0 CPU-s a second); over TCP an idle role sleeps (0.001 measured).
IDLE_CPU_PER_SECOND = 0.1


def _idle_role(rank: int, port: int) -> None:
    import resource

    import torch
    from torch.distributed import rpc

    from sublimate.components.processes.async_sgd import init_rpc, shutdown_rpc

    init_rpc(f"127.0.0.1:{port}", f"role{rank}", rank, 2, 60)
    if rank == 0:  # a round trip: the two roles are connected, as in training
        assert rpc.rpc_sync("role1", torch.add, args=(torch.ones(2), 1)).tolist() == [2.0, 2.0]
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    time.sleep(IDLE_SECONDS)
    after = resource.getrusage(resource.RUSAGE_SELF)
    spent = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    per_second = spent / (time.monotonic() - started)
    shutdown_rpc(rank, 2, 60)
    assert per_second < IDLE_CPU_PER_SECOND, f"role {rank} idle at {per_second:.2f} CPU-s a second"


def test_an_idle_role_spends_no_cpu_waiting_for_rpcs() -> None:
    """The parameter server waits for pushes and a trainer for its answer: neither may spin a
    core meanwhile, on a machine whose nodes share its cores."""
    from tests.ranks import run_ranks

    run_ranks(_idle_role, (free_port(),), world=2)


LATE_SECONDS = 0.5


def _late_leaver(rank: int, port: int, out: str) -> None:
    from torch.distributed import rpc

    from sublimate.components.processes.async_sgd import LEFT_KEY, init_rpc, shutdown_rpc

    init_rpc(f"127.0.0.1:{port}", f"role{rank}", rank, 2, 60)
    if rank == 0:  # the parameter server, host of the store
        shutdown_rpc(0, 2, 60)
        Path(out, "server").write_text(json.dumps(time.time()))
        return  # and its process ends
    # A trainer whose last read of the shutdown's count comes late, as on a busy core: the
    # store must still answer (rank 0 destroyed it with its agent: "Connection reset by peer").
    store = rpc.api._get_current_rpc_agent().store
    rpc.shutdown()
    time.sleep(LATE_SECONDS)
    Path(out, "trainer").write_text(json.dumps(time.time()))
    store.add(LEFT_KEY, 1)


def test_the_servers_store_outlives_every_roles_rpc_shutdown(tmp_path: Path) -> None:
    """The parameter server's process hosts the RPC group's store, whose last reads end every
    role's shutdown: it keeps it until each role has left, however late."""
    from tests.ranks import run_ranks

    run_ranks(_late_leaver, (free_port(), str(tmp_path)), world=2)
    server_left = json.loads((tmp_path / "server").read_text())
    trainer_left = json.loads((tmp_path / "trainer").read_text())
    assert server_left >= trainer_left  # it waited for the trainer (one machine: one clock)
