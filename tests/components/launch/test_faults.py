"""Faults on a running ``local_netns`` job (kill, cut, slow) and ``sublimate fault``.

The jobs are real (namespaces, links, cgroups): like
tests/components/launch/test_netns_scheduler.py, these need root; outside CI a missing prerequisite
skips them, in CI it fails them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sublimate.components.launch import faults, netns_cluster
from sublimate.components.launch.cpu_cgroups import quota_cores
from sublimate.pipelines.cli import main
from sublimate.pipelines.cli.fault import duration
from tests.components.launch.test_netns_scheduler import (
    REPO,
    app_of,
    assert_no_leaks,
    cluster_file,
    log_of,
    netns,
    python_role,
    runner,
    snapshot,
    wait_for,
    without_netem,
)

__all__ = ["netns"]  # the fixture, imported for the tests below


# Node 0 runs until the test creates `done` on the shared volume (an event, not a sleep that a
# loaded machine could outlast); node 1 would sleep a minute, but is killed long before.
UNTIL_DONE = """
import os, pathlib, time
done, end = pathlib.Path("/mnt/sublimate-test/done"), time.monotonic() + 120
if os.environ["SUBLIMATE_NODE_ADDR"].endswith(".1"):
    while not done.exists() and time.monotonic() < end:
        time.sleep(0.01)
else:
    time.sleep(60)
"""
# A node that runs until the test cancels its job (ten minutes: never the end of a test).
UNTIL_CANCELLED = "import time; time.sleep(600)"
# How long a test waits for what an event will bring (a replica seen failed): only a cap on a
# failure's wait, generous because a loaded machine is slow, never how long it takes.
EVENT_SECONDS = 60


def test_kill_a_node_fails_its_replica(netns: None, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    before = snapshot()
    with runner() as r:
        handle = r.run(app_of(python_role(UNTIL_DONE, 2)), "local_netns", cfg={
            "log_dir": str(tmp_path), "volume": f"{shared}:/mnt/sublimate-test"})
        cluster = netns_cluster.load_running(tmp_path)  # found from the run folder (log_dir = it)
        faults.kill_node(cluster, 1)
        wait_for(lambda: r.status(handle).roles[0].replicas[1].state.name == "FAILED",
                 EVENT_SECONDS, "the killed node's replica to fail")
        assert r.status(handle).roles[0].replicas[0].state.name == "RUNNING"
        assert [n.state for n in faults.list_nodes(netns_cluster.Cluster.load(cluster.path))] == [
            "running", "killed"]
        (shared / "done").touch()  # node 0 may end now, well
        status = r.wait(handle, wait_interval=0.05)
    assert status.state.name == "FAILED"
    success = json.loads((cluster.path.parent / "SUCCESS").read_text())
    assert [replica["exitcode"] != 0 for replica in success["roles"]["node"]] == [False, True]
    assert [n.state for n in faults.list_nodes(netns_cluster.Cluster.load(cluster.path))] == [
        "ended", "killed"]
    assert_no_leaks(before)


# Node 1 streams 1 KB every 20 ms to node 0 for 4 s; node 0 reports the longest silence.
STREAM = """
import os, socket, time
rank0, me = os.environ["TORCHX_RANK0_HOST"], os.environ["SUBLIMATE_NODE_ADDR"]
COUNT, SIZE = 200, 1024
if me == rank0:
    conn, _ = socket.create_server((me, 7002)).accept()
    print("CONNECTED", flush=True)
    received, last, longest = 0, time.monotonic(), 0.0
    while chunk := conn.recv(1 << 16):
        now = time.monotonic()
        longest, last = max(longest, now - last), now
        received += len(chunk)
    print(f"STREAM {received} bytes, longest silence {longest:.2f} s", flush=True)
else:
    for _ in range(200):
        try:
            conn = socket.create_connection((rank0, 7002))
            break
        except OSError:
            time.sleep(0.02)
    for _ in range(COUNT):
        conn.sendall(b"x" * SIZE)
        time.sleep(0.02)
    conn.close()
"""


def test_cut_stalls_a_stream_which_then_resumes(netns: None, tmp_path: Path) -> None:
    before = snapshot()
    with runner() as r:
        handle = r.run(app_of(python_role(STREAM, 2)), "local_netns",
                       cfg={"log_dir": str(tmp_path)})
        wait_for(lambda: "CONNECTED" in log_of(tmp_path, handle, "node", 0), 10, "the stream")
        time.sleep(0.3)
        cluster = netns_cluster.load_running(tmp_path)
        ticks: list[float] = []
        started = time.monotonic()
        faults.cut_link(cluster, 1, 2.0, progress=ticks.append)  # blocks for the cut
        blocked = time.monotonic() - started
        assert netns_cluster.Cluster.load(cluster.path).nodes[1].faults == {"cut": False}
        status = r.wait(handle, wait_interval=0.05)
    log = log_of(tmp_path, handle, "node", 0)
    assert status.state.name == "SUCCEEDED", log
    match = re.search(r"STREAM (\d+) bytes, longest silence (\S+) s", log)
    assert match, log
    received, silence = int(match.group(1)), float(match.group(2))
    print(f"2 s cut: the stream stalled {silence:.2f} s, then resumed; all {received} bytes")
    # cut_link blocks for the cut at least (a monotonic clock's sleep); how much longer it takes
    # to bring the link up (a process started by nsenter) is up to the machine's load, and what
    # shows the link came back is the stream's end, below. Progress came at the start, with the
    # whole cut left, and then about once a second.
    assert blocked >= 2.0 and ticks and ticks[0] <= 2.0 and ticks == sorted(ticks, reverse=True)
    assert received == 200 * 1024  # resumed: nothing lost
    # Stalled for the cut (the receiver heard nothing while the link was down; 1.8: its clock
    # starts at the last chunk before the cut, up to one 20 ms send earlier), then resumed by
    # TCP's own recovery (2.1 s of silence measured here; at the latest its retransmission
    # timer, doubling from 200 ms, fires 3.0 s after the cut began). The upper bound only rules
    # out a stream that did not come back by itself, with room for a loaded machine.
    assert 1.8 <= silence < 30
    assert_no_leaks(before)


# Each node waits for a file on the shared volume, then runs a fixed CPU-bound loop in a *new*
# child process (which must inherit the node's cgroup) and reports its wall time.
SPIN = """
import os, pathlib, resource, subprocess, sys, time
go = pathlib.Path("/mnt/sublimate-test/go")
while not go.exists():
    time.sleep(0.01)
started = time.perf_counter()
subprocess.run([sys.executable, "-c", "for i in range(8_000_000): pass"], check=True)
wall = time.perf_counter() - started
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"SPIN {wall:.3f} s, cpu share {(usage.ru_utime + usage.ru_stime) / wall:.2f}", flush=True)
"""


def test_slow_caps_the_cpu_of_every_process_of_a_node(netns: None, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    before = snapshot()
    with runner() as r:
        handle = r.run(app_of(python_role(SPIN, 2)), "local_netns", cfg={
            "log_dir": str(tmp_path / "logs"), "volume": f"{shared}:/mnt/sublimate-test"})
        cluster = netns_cluster.load_running(tmp_path)
        faults.slow_node(cluster, 1, cpu=0.1)
        group = Path(netns_cluster.Cluster.load(cluster.path).nodes[1].cgroup or "")
        assert quota_cores(group) == pytest.approx(0.1)  # cgroup v1 or v2
        (shared / "go").touch()
        status = r.wait(handle, wait_interval=0.05)
    logs = [log_of(tmp_path / "logs", handle, "node", k) for k in range(2)]
    assert status.state.name == "SUCCEEDED", logs
    (fast, fast_share), (slow, slow_share) = (
        map(float, re.search(r"SPIN (\S+) s, cpu share (\S+)", log).groups())  # type: ignore[union-attr]
        for log in logs)
    print(f"cpu=0.1: the same loop took {slow:.2f} s on the slowed node ({slow_share:.2f} of a "
          f"core), {fast:.2f} s on the other ({fast_share:.2f}): {slow / fast:.1f}x")
    # The quota holds the new child process too: a tenth of a core at most, whatever else runs
    # (a busy machine can only give it less; the slack covers the 10 ms ticks CPU time is
    # counted in). How much faster the other node was depends on what else runs on this
    # machine's shared cores, so it is printed, not asserted.
    assert slow_share <= 0.15
    assert not group.exists()  # the job's end removed the cgroup (and the quota with it)
    assert_no_leaks(before)


def test_restore_undoes_slow_and_cut(netns: None, tmp_path: Path) -> None:
    with runner() as r:
        handle = r.run(app_of(python_role(UNTIL_CANCELLED, 2)), "local_netns",
                       cfg={"log_dir": str(tmp_path)})
        cluster = netns_cluster.load_running(tmp_path)
        faults.slow_node(cluster, 0, cpu=0.5)
        faults.link_down(cluster, 0)
        node = netns_cluster.Cluster.load(cluster.path).nodes[0]
        assert node.faults == {"cpu": 0.5, "cut": True}
        bridge = faults.in_netns(cluster.bridge_pid, "ip -br link show n0", "reading")
        assert "DOWN" in bridge
        faults.restore_node(cluster, 0)
        assert quota_cores(Path(node.cgroup or "")) is None
        assert "DOWN" not in faults.in_netns(cluster.bridge_pid, "ip -br link show n0", "r")
        assert netns_cluster.Cluster.load(cluster.path).nodes[0].faults == {}
        r.cancel(handle)


def test_delay_needs_netem(netns: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    without_netem(monkeypatch)
    with runner() as r:
        handle = r.run(app_of(python_role(UNTIL_CANCELLED, 1)), "local_netns",
                       cfg={"log_dir": str(tmp_path)})
        cluster = netns_cluster.load_running(tmp_path)
        with pytest.raises(netns_cluster.FaultError, match="--delay=50ms needs the netem qdisc"):
            faults.slow_node(cluster, 0, delay="50ms")
        r.cancel(handle)


def sublimate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sublimate.pipelines", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)


def test_cli_list_slow_and_kill(netns: None, tmp_path: Path) -> None:
    """``sublimate fault ...`` against a run folder whose logs/ is the job's log_dir."""
    run = tmp_path / "run"
    before = snapshot()
    # two training nodes and a per-step job's Lighthouse, which is a node of the cluster (a
    # namespace) but not a training node: the list counts it apart
    with runner() as r:
        handle = r.run(app_of(python_role(UNTIL_CANCELLED, 2),
                              python_role(UNTIL_CANCELLED, 1, name="lighthouse")),
                       "local_netns", cfg={"log_dir": str(run / "logs")})
        listed = sublimate("fault", "list", str(run))
        assert listed.returncode == 0, listed.stderr
        cluster = netns_cluster.Cluster.load(cluster_file(run / "logs", handle))
        assert f"{cluster.app_id}: running, subnet {cluster.subnet}, host " \
               f"{cluster.host_addr}; 2 training nodes and its lighthouse\n" in listed.stdout
        assert re.search(rf"1\s+node/1\s+{re.escape(cluster.nodes[1].addr)}\s+running\s+-\n",
                         listed.stdout), listed.stdout
        assert re.search(rf"2\s+lighthouse/0\s+{re.escape(cluster.nodes[2].addr)}\s+running"
                         r"\s+-\s+\(serves the job; not a training node\)", listed.stdout)

        slowed = sublimate("fault", "slow", str(run), "--node", "1", "--cpu", "0.25",
                           "--for", "300ms")
        assert slowed.returncode == 0, slowed.stderr
        assert "slowed to 0.25 cores for 0.3 s" in slowed.stdout and "restored" in slowed.stdout

        bad_node = sublimate("fault", "kill", str(run), "--node", "5")
        assert bad_node.returncode == 2
        assert bad_node.stderr.strip() == f"error: --node 5: the job {cluster.app_id} has " \
                                          "nodes 0..1 (and its lighthouse, 2)"
        killed = sublimate("fault", "kill", str(run), "--node", "1")
        assert killed.returncode == 0, killed.stderr
        wait_for(lambda: r.status(handle).roles[0].replicas[1].state.name == "FAILED",
                 EVENT_SECONDS, "the kill")
        listed = json.loads(sublimate("fault", "list", str(run), "--json").stdout)
        assert [(n["state"], n["training"]) for n in listed["nodes"]] == [
            ("running", True), ("killed", True), ("running", False)]
        r.cancel(handle)
    ended = sublimate("fault", "cut", str(run), "--node", "0", "--for", "1s")
    assert ended.returncode == 2
    assert ended.stderr.strip() == f"error: job {cluster.app_id} is ended: no faults to inject"
    assert_no_leaks(before)


def test_cli_bad_input_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    assert main(["fault", "list", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path}: no local_netns job here")
    assert main(["fault", "slow", str(tmp_path), "--node", "0"]) == 2
    assert "give --cpu CORES (e.g. 0.25) and/or --delay TIME" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["fault", "cut", str(tmp_path), "--node", "0", "--for", "soon"])
    assert exit_.value.code == 2
    assert "argument --for: 'soon' is not a duration" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["fault", "slow", str(tmp_path), "--node", "0", "--cpu", "-1"])
    assert "'-1' is not a CPU share" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "seconds"), [("20s", 20), ("500ms", 0.5), ("2m", 120),
                                               ("3", 3), ("1.5s", 1.5)])
def test_durations(text: str, seconds: float) -> None:
    assert duration(text) == pytest.approx(seconds)


def test_qdisc_scripts() -> None:
    assert faults.qdisc_script("eth0", "50mbit", None, None) == \
        "tc qdisc replace dev eth0 root tbf rate 50mbit burst 25000 latency 50ms\n"
    assert faults.qdisc_script("n1", "100kbit", "2ms", "1%") == (
        "tc qdisc replace dev n1 root handle 1: netem delay 2ms loss 1%\n"
        "tc qdisc replace dev n1 parent 1:1 handle 10: tbf rate 100kbit burst 4096 latency 50ms\n")
    assert "qdisc del" in faults.qdisc_script("eth0", None, None, None)
    assert faults.rate_bits("1gbit") == 1e9 and faults.rate_bits("10mbps") == 80e6


def test_find_cluster_prefers_the_running_job(tmp_path: Path) -> None:
    for app, state in (("a-1", netns_cluster.ENDED), ("b-2", netns_cluster.RUNNING)):
        folder = tmp_path / "logs" / "torchx" / app
        folder.mkdir(parents=True)
        netns_cluster.Cluster(path=folder / netns_cluster.CLUSTER_FILE, app_id=app,
                              state=state).save()
    assert netns_cluster.find_cluster(tmp_path).parent.name == "b-2"
    assert netns_cluster.find_cluster(tmp_path, "a-1").parent.name == "a-1"
    assert netns_cluster.find_cluster(tmp_path / "logs").parent.name == "b-2"
    with pytest.raises(netns_cluster.FaultError, match="no job c-3 here"):
        netns_cluster.find_cluster(tmp_path, "c-3")


def test_a_cut_returns_the_link_even_when_interrupted(netns: None, tmp_path: Path) -> None:
    with runner() as r:
        handle = r.run(app_of(python_role(UNTIL_CANCELLED, 1)), "local_netns",
                       cfg={"log_dir": str(tmp_path)})
        cluster = netns_cluster.load_running(tmp_path)

        def interrupt(left: float) -> None:
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            faults.cut_link(cluster, 0, 10, progress=interrupt)
        assert "DOWN" not in faults.in_netns(cluster.bridge_pid, "ip -br link show n0", "r")
        r.cancel(handle)


def test_the_supervisor_alone_tears_a_cluster_down(netns: None, tmp_path: Path) -> None:
    """What runs when the launcher dies: EOF on the supervisor's stdin, then teardown."""
    with runner() as r:
        handle = r.run(app_of(python_role(UNTIL_CANCELLED, 1)), "local_netns",
                       cfg={"log_dir": str(tmp_path)})
        path = cluster_file(tmp_path, handle)
        done = threading.Event()
        supervisor = subprocess.Popen(
            [sys.executable, "-m", "sublimate.components.launch.netns_cluster", "supervise",
             str(path)], stdin=subprocess.PIPE, cwd=REPO)
        supervisor.stdin.close()  # type: ignore[union-attr]
        assert supervisor.wait(timeout=20) == 0
        done.set()
        assert netns_cluster.Cluster.load(path).state == netns_cluster.ENDED
        wait_for(lambda: r.status(handle).is_terminal(), EVENT_SECONDS, "the job to notice")
