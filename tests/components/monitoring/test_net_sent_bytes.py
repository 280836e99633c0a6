"""Bytes sent on the network, per training process: the kernel's counters of its namespace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sublimate.components.monitoring import metrics as monitoring
from sublimate.components.monitoring.tensorboard_log import EpochLog
from tests.components.launch.test_netns_scheduler import netns
from tests.conftest import REPO

__all__ = ["netns"]


def _sent_by_interface(text: str) -> dict[str, int]:
    """The oracle: /proc/net/dev's transmit-bytes column, found by its header, not by position."""
    lines = text.splitlines()
    receive, transmit = lines[1].split("|")[1:3]
    column = len(receive.split()) + transmit.split().index("bytes")
    return {name.strip(): int(numbers.split()[column])
            for name, numbers in (line.split(":", 1) for line in lines[2:])}


def test_real_counters_are_read_and_loopback_is_left_out(tmp_path: Path) -> None:
    text = Path(monitoring.NET_DEV).read_text()
    snapshot = tmp_path / "dev"  # a copy: the live counters move between two reads
    snapshot.write_text(text)
    sent = _sent_by_interface(text)
    assert monitoring.LOOPBACK in sent
    assert {name: tx for name, (_, tx) in monitoring.parse_net_dev(text).items()} == sent
    assert monitoring.network_bytes_sent(str(snapshot)) == \
        sum(tx for name, tx in sent.items() if name != "lo")
    assert monitoring.network_bytes_sent(str(tmp_path / "absent")) is None


def test_every_epoch_record_carries_the_bytes_sent_since_the_log_opened(tmp_path: Path) -> None:
    log = EpochLog(tmp_path, "rank-0")
    log.network.path = str(tmp_path / "dev")  # counters we control, with the real layout
    header = "\n".join(Path(monitoring.NET_DEV).read_text().splitlines()[:2])

    def counters(lo: int, eth: int) -> None:
        (tmp_path / "dev").write_text(
            f"{header}\n    lo: {lo} 1 0 0 0 0 0 0 {lo} 1 0 0 0 0 0 0\n"
            f"  eth0: 5 1 0 0 0 0 0 0 {eth} 1 0 0 0 0 0 0\n")

    counters(lo=1000, eth=4000)
    log.network.start = monitoring.network_bytes_sent(log.network.path)
    counters(lo=9_000_000, eth=4000 + 123_456)
    log.write({"epoch": 1}, 10, {})
    log.close()
    record = json.loads((tmp_path / "metrics" / "rank-0.jsonl").read_text())
    assert record == {"epoch": 1, "net_sent_bytes": 123_456}


# Run inside the namespace: loopback traffic first (not counted), then UDP to the peer.
SENDER = """
import json, socket, sys
from sublimate.components.monitoring.metrics import NetworkCounter
peer, count, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:  # resolve the peer's MAC first: datagrams sent before that may be dropped uncounted
    socket.create_connection((peer, 9), timeout=5).close()
except OSError:
    pass
counter = NetworkCounter()
server = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(server.getsockname())
accepted, _ = server.accept()
client.sendall(b"l" * 1_000_000)
received = 0
while received < 1_000_000:
    received += len(accepted.recv(1 << 16))
after_loopback = counter.sent()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(count):
    udp.sendto(b"u" * size, (peer, 9))
print(json.dumps({"after_loopback": after_loopback, "after_udp": counter.sent()}))
"""


# `netns` (root and the tools): also what puts these tests with the others that make network
# namespaces, on one xdist worker, away from their whole-machine leak checks.
def test_bytes_sent_over_a_veth_are_counted_and_loopback_is_not(netns: None) -> None:
    tag = f"snb{os.getpid() % 100000}"
    sender, peer = f"{tag}a", f"{tag}b"
    ip = ["ip"]
    try:
        for name in (sender, peer):
            subprocess.run([*ip, "netns", "add", name], check=True)
        subprocess.run([*ip, "link", "add", f"{tag}x", "netns", sender, "type", "veth", "peer",
                        "name", f"{tag}y", "netns", peer], check=True)
        for name, device, address in ((sender, f"{tag}x", "10.213.0.1/24"),
                                      (peer, f"{tag}y", "10.213.0.2/24")):
            subprocess.run([*ip, "-n", name, "addr", "add", address, "dev", device], check=True)
            subprocess.run([*ip, "-n", name, "link", "set", device, "up"], check=True)
            subprocess.run([*ip, "-n", name, "link", "set", "lo", "up"], check=True)
        count, size = 300, 1000
        completed = subprocess.run(
            [*ip, "netns", "exec", sender, sys.executable, "-c", SENDER, "10.213.0.2",
             str(count), str(size)], capture_output=True, text=True, timeout=60, cwd=REPO,
            check=False)
        assert completed.returncode == 0, completed.stderr
        figures = json.loads(completed.stdout)
    finally:
        for name in (sender, peer):  # deleting a namespace deletes its end of the veth
            subprocess.run([*ip, "netns", "delete", name], capture_output=True, check=False)
    # a megabyte over loopback: at most a stray IPv6 neighbour packet on the veth
    assert figures["after_loopback"] < 2_000
    # each datagram: payload + UDP (8) + IPv4 (20) + Ethernet (14) headers
    on_the_wire = figures["after_udp"] - figures["after_loopback"]
    assert count * (size + 28) <= on_the_wire <= count * (size + 42) + 2_000


def test_a_local_netns_run_records_its_all_reduce_traffic(tmp_path: Path, netns: None) -> None:
    """Each node of a 2-node sync run sends, per step, about one copy of the gradients: ring
    all-reduce sends 2(n-1)/n of the buffer per rank, which is 1x for n = 2."""
    from sublimate.components.data.datasets import build_builtin

    data = build_builtin("digits", tmp_path / "digits")
    completed = subprocess.run(
        [sys.executable, "-m", "sublimate.components.steps.train", "--data-dir", str(data),
         "--runs-root", str(tmp_path / "runs"), "--run-id", "wire", "--scheduler", "local_netns",
         "--nodes", "2", "--epochs", "2", "--global-batch-size", "64", "--checkpoint-every", "0",
         "--eval-every-epoch", "false"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert completed.returncode == 0, completed.stderr
    summary = json.loads((tmp_path / "runs" / "wire" / "train-summary.json").read_text())
    steps_per_epoch = summary["steps"] // summary["epochs"]
    gradient_bytes = 4 * (64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10)  # the mlp, float32
    for rank in (0, 1):
        lines = (tmp_path / "runs" / "wire" / "metrics" / f"rank-{rank}.jsonl").read_text()
        sent = [json.loads(line)["net_sent_bytes"] for line in lines.splitlines()]
        per_epoch = [sent[0], sent[1] - sent[0]]
        for figure in per_epoch:  # payload plus TCP/IP headers and gloo's framing: < 10%
            assert steps_per_epoch * gradient_bytes <= figure \
                <= 1.1 * steps_per_epoch * gradient_bytes, (rank, per_epoch)
