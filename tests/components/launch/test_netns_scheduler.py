"""The ``local_netns`` TorchX scheduler, on real namespaces, links and processes.

These tests need root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2/util-linux: outside CI a
missing prerequisite skips them with the reason; in CI (``CI`` set) it fails them. Each test ends
by checking that its job left nothing behind: no namespace, link, cgroup or process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sublimate.components.base.process_identity import start_ticks
from sublimate.components.launch import faults, netns_cluster
from sublimate.components.launch.netns_scheduler import (
    NODE_INIT,
    TOOLS,
    NetnsError,
    _own_cpu_cgroup,
    check_privileges,
    create_scheduler,
)
from tests.conftest import REPO, require

SESSION = "torchx"  # the session name get_runner() uses, so the log layout is the usual one


def missing_prerequisite() -> str | None:
    if os.geteuid() != 0:
        return "local_netns needs root"
    try:
        check_privileges()
    except NetnsError as error:
        return str(error)
    missing = [tool for tool in TOOLS if not any(
        Path(folder, tool).exists() for folder in os.environ.get("PATH", "").split(":"))]
    return f"missing commands: {', '.join(missing)}" if missing else None


@pytest.fixture
def netns() -> None:
    """Skip outside CI without root and the tools; fail in CI, where they must be there."""
    reason = missing_prerequisite()
    require(reason is None, f"{reason} (CI runs these tests as root)")


def without_netem(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make a test of the no-netem fallback run on every kernel.

    This is not a prerequisite, so not :func:`require`: a kernel *with* netem is fine (CI's may
    have it), and a skip there would leave the refusal path untested without anyone noticing.
    On a kernel without netem (this project's machines) the real probe says so and nothing is
    changed; on one with it, the probe is made to answer "no", since what these tests check is
    what the scheduler and ``sublimate fault`` do with that answer (the probe itself still runs
    for real, here).
    """
    if faults.kernel_has_netem():
        monkeypatch.setattr(faults, "kernel_has_netem", lambda: False)


# ---------------------------------------------------------------------------------------------
# Leak checks


def _processes() -> Iterator[tuple[int, bytes, str]]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
                netns = os.readlink(f"{entry.path}/ns/net")
            except OSError:
                continue
            if start_ticks(int(entry.name)) is not None:  # zombies are gone
                yield int(entry.name), cmdline, netns


def snapshot() -> dict[str, set[Any]]:
    """What a local_netns job could leave behind, on the whole machine."""
    host = os.readlink("/proc/self/ns/net")
    procs, namespaces = set(), set()
    marker = NODE_INIT.strip().splitlines()[0].encode()
    for pid, cmdline, netns in _processes():
        namespaces.add(netns)
        ours = (marker in cmdline or b"sublimate.components.launch.netns_cluster" in cmdline
                or (cmdline == b"sleep\0infinity\0" and netns != host)
                # an agent forked into a node (launch.forked_agents), or one of its workers
                or (b"processes.agent_zygote" in cmdline and netns != host))
        if ours:
            procs.add((pid, cmdline[:60]))
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    cgroup = _own_cpu_cgroup()
    return {
        "netns": namespaces,
        "processes": procs,
        "links": {line.split()[0] for line in links.splitlines() if line.startswith("sbl-")},
        "cgroups": {p.name for p in cgroup.glob("sublimate-*")} if cgroup else set(),
    }


def assert_no_leaks(before: dict[str, set[Any]], seconds: float = 10.0) -> None:
    """Nothing new since ``before`` (polling briefly: the kernel reaps asynchronously)."""
    end = time.monotonic() + seconds
    while True:
        after = snapshot()
        new = {kind: after[kind] - before[kind] for kind in after}
        if not any(new.values()):
            return
        if time.monotonic() > end:
            pytest.fail(f"left behind: { {k: v for k, v in new.items() if v} }")
        time.sleep(0.1)


def assert_cluster_gone(cluster_file: Path) -> None:
    cluster = netns_cluster.Cluster.load(cluster_file)
    assert cluster.state == netns_cluster.ENDED
    pids = [(cluster.bridge_pid, cluster.bridge_start)] + [
        (n.init_pid, n.init_start) for n in cluster.nodes] + [
        (n.holder_pid, n.holder_start) for n in cluster.nodes]
    assert not [pid for pid, start in pids if start_ticks(pid) == start]
    assert not any(n.cgroup and Path(n.cgroup).exists() for n in cluster.nodes)


# ---------------------------------------------------------------------------------------------
# Running jobs


def python_role(code: str, replicas: int, name: str = "node", env: dict[str, str] | None = None
                ) -> Any:
    from torchx import specs

    return specs.Role(name, image="", entrypoint=sys.executable,
                      args=["-c", textwrap.dedent(code)], num_replicas=replicas,
                      env={"PYTHONUNBUFFERED": "1", **(env or {})})


def app_of(*roles: Any, name: str = "netns-test") -> Any:
    from torchx import specs

    return specs.AppDef(name, roles=list(roles))


def runner() -> Any:
    from torchx.runner import Runner

    return Runner(SESSION, {"local_netns": create_scheduler})


def cluster_file(log_dir: Path, handle: str) -> Path:
    return log_dir / SESSION / handle.rsplit("/", 1)[-1] / netns_cluster.CLUSTER_FILE


def log_of(log_dir: Path, handle: str, role: str, replica: int) -> str:
    path = log_dir / SESSION / handle.rsplit("/", 1)[-1] / role / str(replica) / "combined.log"
    return path.read_text() if path.exists() else ""


def stdout_of(log_dir: Path, handle: str, role: str, replica: int) -> str:
    path = log_dir / SESSION / handle.rsplit("/", 1)[-1] / role / str(replica) / "stdout.log"
    return path.read_text() if path.exists() else ""


def wait_for(predicate: Any, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def run_to_end(app: Any, log_dir: Path, cfg: dict[str, str] | None = None,
               timeout: float = 60) -> tuple[Any, str]:
    """Run ``app`` on local_netns to its end; returns (final status, handle)."""
    with runner() as r:
        handle = r.run(app, "local_netns", cfg={"log_dir": str(log_dir), **(cfg or {})})
        end = time.monotonic() + timeout
        while True:
            status = r.status(handle)
            if status.is_terminal():
                return status, handle
            if time.monotonic() > end:
                r.cancel(handle)
                pytest.fail(f"{handle} did not end within {timeout} s:\n"
                            + log_of(log_dir, handle, app.roles[0].name, 0))
            time.sleep(0.05)


# Replica 0 serves TCP on its address; the others connect to TORCHX_RANK0_HOST and say who
# they are (address, network namespace, hostname-independent).
TALK = """
import os, socket, time
rank0, me = os.environ["TORCHX_RANK0_HOST"], os.environ["SUBLIMATE_NODE_ADDR"]
netns = os.readlink("/proc/self/ns/net")
others = int(os.environ["OTHERS"])
if me == rank0:
    server = socket.create_server((me, 7000))
    for _ in range(others):
        conn, peer = server.accept()
        print("HEARD", conn.recv(200).decode(), "FROM", peer[0], flush=True)
    print("SELF", me, netns, os.environ["PET_RDZV_CONF"], os.environ["PET_LOCAL_ADDR"],
          os.environ["SUBLIMATE_METRICS_ADDR"], flush=True)
else:
    for _ in range(200):
        try:
            conn = socket.create_connection((rank0, 7000))
            break
        except OSError:
            time.sleep(0.02)
    conn.sendall(f"{me} {netns} {os.environ['PET_RDZV_CONF']}".encode())
"""


def test_three_nodes_talk_by_address(netns: None, tmp_path: Path) -> None:
    before = snapshot()
    started = time.monotonic()
    status, handle = run_to_end(app_of(python_role(TALK, 3, env={"OTHERS": "2"})), tmp_path)
    elapsed = time.monotonic() - started
    log = log_of(tmp_path, handle, "node", 0)
    assert status.state.name == "SUCCEEDED", log
    heard = re.findall(r"HEARD (\S+) (\S+) (\S+) FROM (\S+)", log)
    self_line = re.search(r"SELF (\S+) (\S+) (\S+) (\S+) (\S+)", log)
    assert self_line and len(heard) == 2, log
    rank0, rank0_ns, rdzv, local_addr, metrics_addr = self_line.groups()
    assert (rdzv, local_addr, metrics_addr) == ("is_host=1", rank0, rank0)
    addresses = {rank0} | {addr for addr, *_ in heard}
    namespaces = {rank0_ns} | {ns for _, ns, *_ in heard}
    assert len(addresses) == 3 and len(namespaces) == 3  # each node: own address, own netns
    assert os.readlink("/proc/self/ns/net") not in namespaces
    for addr, _, conf, peer in heard:
        assert addr == peer and conf == "is_host=0"  # the packets came from the node's address
    # every node is 10.213.y.N of one /24, node 0 first
    assert rank0.endswith(".1") and {a.rsplit(".", 1)[0] for a in addresses} == {
        rank0.rsplit(".", 1)[0]}
    replicas = status.roles[0].replicas
    assert [r.hostname for r in replicas] == sorted(addresses, key=lambda a: int(a.split(".")[3]))
    assert_cluster_gone(cluster_file(tmp_path, handle))
    assert_no_leaks(before)
    print(f"3-node job: {elapsed:.2f} s from submit to end")


def test_host_reaches_a_node_and_the_volume_is_bound(netns: None, tmp_path: Path) -> None:
    """The launcher's namespace has an address on the bridge (metrics endpoints are reachable);
    ``volume`` bind-mounts a host folder at the same path in every node."""
    import urllib.request

    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "hello.txt").write_text("from the host")
    serve = """
    import http.server, os, pathlib
    addr = os.environ["SUBLIMATE_METRICS_ADDR"]
    text = pathlib.Path("/mnt/sublimate-test/hello.txt").read_text()
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"{text} at {addr}".encode()
            self.send_response(200); self.end_headers(); self.wfile.write(body)
            raise SystemExit(0)
    http.server.HTTPServer((addr, 9100), Handler).handle_request()
    """
    before = snapshot()
    with runner() as r:
        handle = r.run(app_of(python_role(serve, 1)), "local_netns", cfg={
            "log_dir": str(tmp_path / "logs"), "volume": f"{shared}:/mnt/sublimate-test"})
        node = netns_cluster.Cluster.load(cluster_file(tmp_path / "logs", handle)).nodes[0]
        body = ""
        for _ in range(100):
            try:
                body = urllib.request.urlopen(f"http://{node.addr}:9100/", timeout=2).read()
                break
            except OSError:
                time.sleep(0.05)
        status = r.wait(handle, wait_interval=0.05)
    assert body == f"from the host at {node.addr}".encode()
    assert status.state.name == "SUCCEEDED"
    assert_no_leaks(before)


THROUGHPUT = """
import os, socket, time
rank0, me = os.environ["TORCHX_RANK0_HOST"], os.environ["SUBLIMATE_NODE_ADDR"]
SIZE = 4 * 1024 * 1024
if me == rank0:
    server = socket.create_server((me, 7001))
    conn, _ = server.accept()
    received, first = 0, None
    while chunk := conn.recv(1 << 16):
        first = first or time.perf_counter()
        received += len(chunk)
    seconds = time.perf_counter() - first
    print(f"RATE {received * 8 / seconds / 1e6:.1f} Mbit/s {received} bytes", flush=True)
else:
    for _ in range(200):
        try:
            conn = socket.create_connection((rank0, 7001))
            break
        except OSError:
            time.sleep(0.02)
    conn.sendall(b"x" * SIZE)
    conn.close()
"""


def measured_rate(log_dir: Path, cfg: dict[str, str]) -> float:
    status, handle = run_to_end(app_of(python_role(THROUGHPUT, 2)), log_dir, cfg)
    log = log_of(log_dir, handle, "node", 0)
    assert status.state.name == "SUCCEEDED", log
    match = re.search(r"RATE (\S+) Mbit/s (\d+) bytes", log)
    assert match and int(match.group(2)) == 4 * 1024 * 1024, log
    return float(match.group(1))


def test_link_rate_shapes_both_directions(netns: None, tmp_path: Path) -> None:
    before = snapshot()
    shaped = measured_rate(tmp_path / "shaped", {"link_rate": "50mbit"})
    unshaped = measured_rate(tmp_path / "unshaped", {})
    print(f"4 MB node to node: link_rate=50mbit {shaped:.1f} Mbit/s, unshaped {unshaped:.0f}")
    # tbf never lets more than the rate through (10% over: its 4 ms burst, and the clock starts
    # at the first chunk received); less is what a loaded machine's starved receiver reads, so
    # the floor only rules out a rate set in the wrong unit (5mbit, 6.25 MB/s) by a wide margin.
    assert 15 <= shaped <= 55
    # Unshaped, a veth pair moves GB/s; even a starved receiver is far above the 50 Mbit/s cap.
    assert unshaped > 2 * 55
    assert_no_leaks(before)


ALL_REDUCE = """
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(f"ALLREDUCE rank {dist.get_rank()} of {dist.get_world_size()} sum {value.item():g} "
      f"on {os.environ['SUBLIMATE_NODE_ADDR']}", flush=True)
dist.destroy_process_group()
"""


def test_torchrun_gloo_all_reduce_across_namespaces(netns: None, tmp_path: Path) -> None:
    """A real 2-node torchrun job: c10d rendezvous on node 0's address, gloo all_reduce."""
    from torchx import specs

    script = tmp_path / "all_reduce.py"
    script.write_text(ALL_REDUCE)
    command = (f"exec {sys.executable} -m torch.distributed.run --nnodes 2 --nproc-per-node 1 "
               "--rdzv-backend c10d --rdzv-endpoint ${TORCHX_RANK0_HOST}:29400 --rdzv-id job "
               f"--monitor-interval 0.1 {script}")
    role = specs.Role("trainer", image="", entrypoint="bash", args=["-c", command],
                      num_replicas=2, env={"OMP_NUM_THREADS": "1", "LOGLEVEL": "WARNING"})
    before = snapshot()
    status, handle = run_to_end(app_of(role), tmp_path, timeout=120)
    logs = [log_of(tmp_path, handle, "trainer", k) for k in range(2)]
    assert status.state.name == "SUCCEEDED", "\n".join(logs)
    lines = re.findall(r"ALLREDUCE rank (\d) of 2 sum (\S+) on (\S+)", "\n".join(logs))
    assert sorted(rank for rank, *_ in lines) == ["0", "1"], logs
    assert {total for _, total, _ in lines} == {"3"}
    assert len({addr for *_, addr in lines}) == 2
    assert_no_leaks(before)


# ---------------------------------------------------------------------------------------------
# Nothing left behind


def test_nothing_left_after_a_failure(netns: None, tmp_path: Path) -> None:
    # Node 0 runs until the test creates `done` (an event: a sleep could be over before a
    # loaded machine gets to look); node 1 fails at once.
    code = """
    import os, pathlib, sys, time
    if os.environ["SUBLIMATE_NODE_ADDR"].endswith(".2"):
        sys.exit(3)
    done, end = pathlib.Path("/mnt/sublimate-test/done"), time.monotonic() + 120
    while not done.exists() and time.monotonic() < end:
        time.sleep(0.01)
    """
    shared = tmp_path / "shared"
    shared.mkdir()
    before = snapshot()
    with runner() as r:
        handle = r.run(app_of(python_role(code, 2)), "local_netns", cfg={
            "log_dir": str(tmp_path / "logs"), "volume": f"{shared}:/mnt/sublimate-test"})
        wait_for(lambda: r.status(handle).roles[0].replicas[1].state.name == "FAILED", 60,
                 "node 1 to fail")
        assert r.status(handle).roles[0].replicas[0].state.name == "RUNNING"
        (shared / "done").touch()
        status = r.wait(handle, wait_interval=0.05)
        assert status.state.name == "FAILED"
        # at the job's end, not the runner's
        assert_cluster_gone(cluster_file(tmp_path / "logs", handle))
    assert_no_leaks(before)
    success = json.loads((cluster_file(tmp_path / "logs", handle).parent / "SUCCESS").read_text())
    assert [r["exitcode"] for r in success["roles"]["node"]] == [0, 3]


def test_nothing_left_when_the_runner_closes_mid_job(netns: None, tmp_path: Path) -> None:
    before = snapshot()
    with runner() as r:
        handle = r.run(app_of(python_role("import time; time.sleep(60)", 2)), "local_netns",
                       cfg={"log_dir": str(tmp_path)})
    assert_cluster_gone(cluster_file(tmp_path, handle))
    assert_no_leaks(before)


def test_nothing_left_after_cancel(netns: None, tmp_path: Path) -> None:
    before = snapshot()
    with runner() as r:
        handle = r.run(app_of(python_role("import time; time.sleep(60)", 2)), "local_netns",
                       cfg={"log_dir": str(tmp_path)})
        path = cluster_file(tmp_path, handle)
        assert netns_cluster.Cluster.load(path).state == netns_cluster.RUNNING
        during = snapshot()  # the leak check sees every kind of thing a job creates
        assert len(during["netns"] - before["netns"]) == 3  # the bridge's and two nodes'
        # holder and init per node, the bridge's holder, the supervisor (and, for an instant,
        # an init's child before it execs the command)
        assert len(during["processes"] - before["processes"]) >= 6
        assert len(during["links"] - before["links"]) == 1  # the host's veth
        assert len(during["cgroups"] - before["cgroups"]) == 2
        r.cancel(handle)
        assert r.status(handle).state.name == "CANCELLED"
        assert_cluster_gone(path)
    # The nodes ended by the cancel's SIGTERM, which each node's init forwards to its command
    # (exit 128 + 15), not by TorchX's SIGKILL fallback 10 s later (the holder killed: -9).
    success = json.loads((path.parent / "SUCCESS").read_text())
    assert [r["exitcode"] for r in success["roles"]["node"]] == [128 + signal.SIGTERM] * 2
    assert_no_leaks(before)


def test_an_immediate_exit_and_a_missing_command(netns: None, tmp_path: Path) -> None:
    from torchx import specs

    role = specs.Role("node", image="", entrypoint="/no/such/program", args=[], num_replicas=1)
    before = snapshot()
    status, handle = run_to_end(app_of(role), tmp_path)
    assert status.state.name == "FAILED"
    assert "local_netns: cannot run /no/such/program" in log_of(tmp_path, handle, "node", 0)
    assert_no_leaks(before)


LAUNCHER = """
import sys, time
from torchx import specs
from torchx.runner import Runner
from sublimate.components.launch.netns_scheduler import create_scheduler

role = specs.Role("node", image="", entrypoint="sleep", args=["60"], num_replicas=2)
runner = Runner("torchx", {"local_netns": create_scheduler})
handle = runner.run(specs.AppDef("killed-launcher", roles=[role]), "local_netns",
                    cfg={"log_dir": sys.argv[1]})
print(handle, flush=True)
time.sleep(60)
"""


def test_nothing_left_after_the_launcher_is_killed(netns: None, tmp_path: Path) -> None:
    """SIGKILL of the launcher: PDEATHSIG takes the namespaces' holders (and with them every
    node process, namespace and veth) and the supervisor removes the cgroups."""
    before = snapshot()
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)],
                                stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        handle = launcher.stdout.readline().strip()  # type: ignore[union-attr]
        assert handle.startswith("local_netns://"), handle
        path = cluster_file(tmp_path, handle)
        cluster = netns_cluster.Cluster.load(path)
        assert cluster.state == netns_cluster.RUNNING and all(n.alive() for n in cluster.nodes)
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    killed = time.monotonic()
    assert_no_leaks(before)
    print(f"cleaned up {time.monotonic() - killed:.2f} s after the launcher's SIGKILL")
    wait_for(lambda: netns_cluster.Cluster.load(path).state == netns_cluster.ENDED, 10,
             "the supervisor")
    assert_cluster_gone(path)


# ---------------------------------------------------------------------------------------------
# Refusals


def test_without_root_or_the_capability_one_clear_error() -> None:
    with pytest.raises(NetnsError, match=r"local_netns needs root or CAP_NET_ADMIN: running as "
                                         r"uid 1000 without CAP_NET_ADMIN and CAP_SYS_ADMIN"):
        check_privileges(uid=1000, capabilities=0)
    check_privileges(uid=1000, capabilities=(1 << 12) | (1 << 21))  # capabilities suffice


def test_without_root_a_submission_fails_with_the_error(netns: None, tmp_path: Path) -> None:
    """A real unprivileged launcher (setpriv to nobody, no capabilities) gets the one error."""
    tmp_path.chmod(0o777)
    code = textwrap.dedent(f"""
    import sys
    from torchx import specs
    from torchx.runner import Runner
    from sublimate.components.launch.netns_scheduler import create_scheduler
    role = specs.Role("node", image="", entrypoint="true", args=[], num_replicas=2)
    with Runner("torchx", {{"local_netns": create_scheduler}}) as runner:
        runner.run(specs.AppDef("x", roles=[role]), "local_netns", cfg={{"log_dir": "{tmp_path}"}})
    """)
    # Only CAP_DAC_READ_SEARCH is kept (ambient, so it survives exec): nobody must still read
    # the interpreter's environment, which CI builds in a root-only temporary folder.
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           "--inh-caps=-all,+dac_read_search",
                           "--ambient-caps=+dac_read_search", sys.executable, "-c", code],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode != 0
    assert ("NetnsError: local_netns needs root or CAP_NET_ADMIN: running as uid 65534 "
            "without CAP_NET_ADMIN and CAP_SYS_ADMIN") in done.stderr, done.stderr


def test_delay_without_netem_is_one_clear_error(netns: None, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    without_netem(monkeypatch)
    before = snapshot()
    with runner() as r, pytest.raises(NetnsError) as error:
        r.run(app_of(python_role("pass", 2)), "local_netns",
              cfg={"log_dir": str(tmp_path), "link_delay": "2ms"})
    assert str(error.value).startswith("local_netns: link_delay=2ms needs the netem qdisc, "
                                       "which this kernel does not have")
    assert not list(tmp_path.rglob(netns_cluster.CLUSTER_FILE))  # refused before anything started
    assert_no_leaks(before)


@pytest.mark.parametrize(("option", "value", "message"), [
    ("link_rate", "fast", "link rate 'fast': expected a number and a tc unit"),
    ("link_delay", "2 parsecs", "link delay '2 parsecs': expected a number and us, ms or s"),
    ("link_loss", "1", "link loss '1': expected a percentage"),
    ("volume", "/tmp", "volume '/tmp': expected HOST_PATH:CLUSTER_PATH"),
    ("volume", "/no/such:/mnt/x", "volume '/no/such:/mnt/x': /no/such is not a folder"),
])
def test_bad_options_are_refused_at_submission(tmp_path: Path, option: str, value: str,
                                               message: str) -> None:
    with runner() as r, pytest.raises(NetnsError, match=re.escape(message)):
        r.dryrun(app_of(python_role("pass", 1)), "local_netns",
                 cfg={"log_dir": str(tmp_path), option: value})


def test_dry_run_shows_each_nodes_environment(tmp_path: Path) -> None:
    with runner() as r:
        info = r.dryrun(app_of(python_role("pass", 2)), "local_netns",
                        cfg={"log_dir": str(tmp_path), "link_rate": "1gbit"})
    params = info.request.role_params["node"]
    assert [p.env["SUBLIMATE_NODE_ADDR"] for p in params] == ["10.213.0.1", "10.213.0.2"]
    assert {p.env["TORCHX_RANK0_HOST"] for p in params} == {"10.213.0.1"}
    assert [p.env["PET_RDZV_CONF"] for p in params] == ["is_host=1", "is_host=0"]
    assert info.request.link.rate == "1gbit"
    assert not list(tmp_path.iterdir())  # a dry run starts nothing


def test_existing_rdzv_conf_is_kept(tmp_path: Path) -> None:
    with runner() as r:
        info = r.dryrun(app_of(python_role("pass", 2, env={"PET_RDZV_CONF": "timeout=30"})),
                        "local_netns", cfg={"log_dir": str(tmp_path)})
    assert [p.env["PET_RDZV_CONF"] for p in info.request.role_params["node"]] == [
        "timeout=30,is_host=1", "timeout=30,is_host=0"]


def test_two_jobs_at_once_get_different_subnets(netns: None, tmp_path: Path) -> None:
    before = snapshot()
    with runner() as r:
        handles = [r.run(app_of(python_role("import time; time.sleep(30)", 1)), "local_netns",
                         cfg={"log_dir": str(tmp_path)}) for _ in range(2)]
        subnets = {netns_cluster.Cluster.load(cluster_file(tmp_path, h)).subnet for h in handles}
        assert len(subnets) == 2
        for handle in handles:
            r.cancel(handle)
    assert_no_leaks(before)
