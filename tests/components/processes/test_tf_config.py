"""TF_CONFIG from sublimate's launch: the address exchange across real processes, no TensorFlow.

The multi-process tests start real torchrun jobs (one node with three workers; two torchrun
agents as two simulated nodes) and, for the store rank 0 hosts, plain processes with torchrun's
variables set by hand. Each process runs this module as ``__main__`` (:func:`_worker_main`),
which exchanges, checks its reservation and writes what it saw to ``OUT/rank<N>.json``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sublimate.components.base.ports import free_port
from sublimate.components.processes import tf_config
from tests.conftest import REPO

TIMEOUT = 120  # seconds for a whole job: torch's import on 2 busy cores is the slow part


def _sockets() -> int:
    """How many sockets this process has open."""
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        try:
            count += os.readlink(fd).startswith("socket:")
        except OSError:  # the fd of the listing itself, closed meanwhile
            continue
    return count


def _can_bind(port: int) -> bool:
    """Whether a listener (as TensorFlow's gRPC server: every interface) could bind ``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


def _worker_main(out: Path) -> None:
    """One rank: exchange, check the held port, record everything for the test."""
    import torch.distributed  # noqa: F401  (its sockets, if any, are not the exchange's)

    before = _sockets()
    reservation = tf_config.exchange(timeout=60)
    held_blocks = not _can_bind(reservation.port)
    held = reservation.held
    reservation.release()
    record = {
        "rank": int(os.environ["RANK"]),
        "tf_config": json.loads(reservation.tf_config),
        "port": reservation.port,
        "address": reservation.address,
        "held": held,
        "held_blocks_others": held_blocks,
        "free_after_release": _can_bind(reservation.port),
        "sockets_left": _sockets() - before,
    }
    (out / f"rank{record['rank']}.json").write_text(json.dumps(record))


def _run(commands: list[list[str]], envs: list[dict[str, str]]) -> None:
    """Start the processes together, wait for all (killing all on timeout), check each."""
    procs = [subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for cmd, env in zip(commands, envs, strict=True)]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=TIMEOUT)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, output in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, output[-3000:]


def _records(out: Path, world: int) -> list[dict]:
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    workers = records[0]["tf_config"]["cluster"]["worker"]
    assert len(workers) == world
    assert len(set(workers)) == world, workers  # distinct host:port per worker
    for rank, record in enumerate(records):
        assert record["tf_config"] == {"cluster": {"worker": workers},
                                       "task": {"type": "worker", "index": rank}}
        assert workers[rank] == f"{record['address']}:{record['port']}"
        assert record["held"] and record["held_blocks_others"], record
        assert record["free_after_release"], record
        assert record["sockets_left"] == 0, record  # the store connection did not linger
    return records


def _torchrun(nnodes: int, nproc: int, rdzv_port: int, out: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
            "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{rdzv_port}", "--rdzv-id", "tf-config-test",
            "--monitor-interval", "0.1", "-m", "tests.components.processes.test_tf_config",
            str(out)]


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in (*tf_config.REQUIRED, tf_config.NODE_ADDR_ENV, "TF_CONFIG")
           and not k.startswith("TORCHELASTIC_")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def test_one_node_three_workers(tmp_path: Path) -> None:
    _run([_torchrun(1, 3, free_port(), tmp_path)], [_clean_env()])
    records = _records(tmp_path, 3)
    assert {r["address"] for r in records} == {"127.0.0.1"}  # the master is on loopback


def test_two_simulated_nodes(tmp_path: Path) -> None:
    """Two torchrun agents meeting at one rendezvous, as ``sublimate run`` simulates nodes."""
    port = free_port()
    _run([_torchrun(2, 1, port, tmp_path)] * 2, [_clean_env()] * 2)
    records = _records(tmp_path, 2)
    assert {r["address"] for r in records} == {"127.0.0.1"}


def test_rank0_hosted_store_and_node_addr(tmp_path: Path) -> None:
    """Without torchrun's agent store, rank 0 hosts it (and outlives every read).

    ``SUBLIMATE_NODE_ADDR`` is what is published when set (here one loopback alias per node).
    """
    port = free_port()
    envs = [_clean_env(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), SUBLIMATE_NODE_ADDR=f"127.0.0.{r + 1}")
            for r in range(2)]
    command = [sys.executable, "-m", "tests.components.processes.test_tf_config", str(tmp_path)]
    _run([command] * 2, envs)
    records = _records(tmp_path, 2)
    assert [r["address"] for r in records] == ["127.0.0.1", "127.0.0.2"]


def test_single_worker_needs_no_store() -> None:
    """WORLD_SIZE=1: nothing to exchange (no store is contacted: the port below is closed)."""
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    with tf_config.exchange(env) as reservation:
        assert reservation.held
        config = json.loads(reservation.tf_config)
    assert not reservation.held
    assert config == {"cluster": {"worker": [f"127.0.0.1:{reservation.port}"]},
                      "task": {"type": "worker", "index": 0}}
    assert json.loads(tf_config.tf_config(env))["task"] == {"type": "worker", "index": 0}


def test_outside_torchrun_is_refused_with_the_reason() -> None:
    with pytest.raises(tf_config.TFConfigError, match="RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT"):
        tf_config.tf_config({})
    with pytest.raises(tf_config.TFConfigError, match="RANK=2"):
        tf_config.tf_config({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "x",
                             "MASTER_PORT": "1"})


def test_unreachable_store_is_one_clear_error() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    with pytest.raises(tf_config.TFConfigError, match="cannot reach torchrun's store"):
        tf_config.exchange(env, timeout=1)


def test_node_address() -> None:
    assert tf_config.node_address({"SUBLIMATE_NODE_ADDR": "10.1.2.3"}, "127.0.0.1") == "10.1.2.3"
    assert tf_config.node_address({}, "localhost") == "127.0.0.1"
    assert tf_config.node_address({}, "127.0.0.1") == "127.0.0.1"
    assert tf_config.node_address({}, "no-such-host.invalid") == "127.0.0.1"


def test_join_host_port() -> None:
    assert tf_config.join_host_port("10.0.0.5", 40211) == "10.0.0.5:40211"
    assert tf_config.join_host_port("fd00::5", 40211) == "[fd00::5]:40211"
    assert tf_config.join_host_port("node-0.svc", 1) == "node-0.svc:1"


def test_module_imports_neither_tensorflow_nor_torch() -> None:
    code = ("import sys; import sublimate.components.processes.tf_config; "
            "print(sorted(m for m in ('tensorflow', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True, cwd=REPO)
    assert done.stdout.strip() == "[]"


if __name__ == "__main__":
    _worker_main(Path(sys.argv[1]))
