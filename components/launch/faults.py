"""Faults injected into a running ``local_netns`` cluster (:mod:`.netns_cluster` holds its state).

The ``local_netns`` TorchX scheduler (:mod:`sublimate.components.launch.netns_scheduler`) runs every
node of a job in its own network, mount and PID namespaces on one machine, and describes the cluster
in ``cluster.json`` beside TorchX's logs::

    <log_dir>/<session>/<app_id>/cluster.json          (CLUSTER_FILE)

A train step's ``log_dir`` is ``<run folder>/logs``, so :func:`find_cluster` finds a job's file
from its run folder. This module reads that file and acts on the cluster it describes:

* :func:`kill_node` -- SIGKILL a node's PID-namespace init, which takes every process of the
  node with it (the replica fails);
* :func:`cut_link` (blocks) or :func:`link_down` / :func:`link_up` -- take a node's link down on
  the bridge side, so nothing reaches the node and nothing leaves it, then bring it back;
* :func:`slow_node` / :func:`restore_node` -- a CPU quota (cgroup v1 or v2:
  :mod:`.cpu_cgroups`) on every process of the node, present and future, or extra delay on its
  link where the kernel has ``netem``; :func:`restore_node` undoes both, and the job's end
  always does;
* :func:`list_nodes` -- each node's address, liveness and active faults.

Everything here needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN). Processes are addressed by pid
*and* start time (:mod:`sublimate.components.base.process_identity`), so a recycled pid is never
signalled. This module imports only the standard library besides that and :mod:`.cpu_cgroups`
(standard library only too): the supervisor and ``sublimate fault`` start in milliseconds.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sublimate.components.launch import cpu_cgroups
from sublimate.components.launch.netns_cluster import (
    ENDED,
    RUNNING,
    Cluster,
    FaultError,
    Node,
    find_cluster,
    load_running,
    signal_process,
    updating,
)

# The faults, and the cluster's lookup a caller starts from (docs/local-cluster.md: "Faults").
__all__ = ["Cluster", "FaultError", "NodeStatus", "check_link_options", "cut_link",
           "find_cluster", "in_netns", "kernel_has_netem", "kill_node", "link_down", "link_up",
           "list_nodes", "load_running", "netem_missing", "qdisc_script", "rate_bits",
           "restore_node", "run", "slow_node"]

# ---------------------------------------------------------------------------------------------
# Processes and commands


def run(argv: list[str], what: str) -> str:
    """Run a command to completion; a failure becomes one FaultError naming ``what``."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise FaultError(f"{what}: {' '.join(argv)}: {detail[-1] if detail else done.returncode}")
    return done.stdout


def in_netns(pid: int, script: str, what: str) -> str:
    """Run a shell script in the network namespace ``pid`` is in (``set -e``: stops at the
    first failing command)."""
    return run(["nsenter", "-t", str(pid), "-n", "sh", "-ec", script], what)


# ---------------------------------------------------------------------------------------------
# Links (tc)

_RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)", re.I)
_TIME = re.compile(r"\d+(?:\.\d+)?(us|usec|ms|msec|s|sec)", re.I)
_PERCENT = re.compile(r"\d+(?:\.\d+)?%")
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}


def rate_bits(rate: str) -> float:
    """``"50mbit"`` -> 50e6 bits per second (tc's units: ``bit`` are bits, ``bps`` bytes)."""
    match = _RATE.fullmatch(rate.strip())
    if not match:
        raise ValueError(f"link rate '{rate}': expected a number and a tc unit, e.g. 100mbit, "
                         "1gbit, 500kbit (or kbps/mbps for bytes per second)")
    return float(match.group(1)) * _RATE_UNITS[match.group(2).lower()]


def check_link_options(rate: str | None, delay: str | None, loss: str | None) -> None:
    """Refuse a malformed ``link_rate`` / ``link_delay`` / ``link_loss`` in one line."""
    if rate:
        rate_bits(rate)
    if delay and not _TIME.fullmatch(delay.strip()):
        raise ValueError(f"link delay '{delay}': expected a number and us, ms or s, e.g. 2ms")
    if loss and not _PERCENT.fullmatch(loss.strip()):
        raise ValueError(f"link loss '{loss}': expected a percentage, e.g. 1%")


def qdisc_script(dev: str, rate: str | None, delay: str | None, loss: str | None) -> str:
    """Shell commands that give ``dev``'s egress exactly this shaping (replacing any other).

    Rate is a token bucket (``tbf``); delay and loss need ``netem`` (with the ``tbf`` as its
    child when there is a rate too). The bucket holds 4 ms of traffic, at least 4 kB: enough
    that the timer's granularity does not cap fast links, small enough that a transfer of a few
    MB is held to the rate.
    """
    tbf = ""
    if rate:
        burst = max(4096, int(rate_bits(rate) / 8 * 0.004))
        tbf = f"tbf rate {rate} burst {burst} latency 50ms"
    if delay or loss:
        netem = " ".join(filter(None, ["netem", f"delay {delay}" if delay else "",
                                       f"loss {loss}" if loss else ""]))
        script = f"tc qdisc replace dev {dev} root handle 1: {netem}\n"
        if tbf:
            script += f"tc qdisc replace dev {dev} parent 1:1 handle 10: {tbf}\n"
        return script
    if tbf:
        return f"tc qdisc replace dev {dev} root {tbf}\n"
    # back to the default qdisc; `del` fails when there is nothing to delete, which is fine
    return f"tc qdisc del dev {dev} root 2>/dev/null || true\n"


_NETEM: bool | None = None


def kernel_has_netem() -> bool:
    """Whether this kernel has the ``netem`` qdisc: tried once, on loopback in a throwaway
    network namespace (which vanishes with the ``unshare`` process), then remembered."""
    global _NETEM
    if _NETEM is None:
        probe = subprocess.run(
            ["unshare", "--net", "--", "tc", "qdisc", "add", "dev", "lo", "root", "netem",
             "delay", "1ms"], capture_output=True, text=True, check=False)
        _NETEM = probe.returncode == 0
    return _NETEM


def netem_missing(option: str, value: str) -> str:
    return (f"local_netns: {option}={value} needs the netem qdisc, which this kernel does not "
            "have (tc: 'Specified qdisc kind is unknown'); drop the option, or use a kernel "
            "with sch_netem (link_rate works without it: it uses tbf)")


# ---------------------------------------------------------------------------------------------
# Faults


def _running_node(cluster: Cluster, index: int) -> Node:
    node = cluster.node(index)
    if not node.alive():
        raise FaultError(f"node {index} ({node.role}/{node.replica}) is not running "
                         f"(it is {node.state if node.state != RUNNING else 'gone'})")
    return node


def kill_node(cluster: Cluster, index: int) -> None:
    """SIGKILL node ``index``'s PID-namespace init: every process of the node dies at once.

    TorchX sees the replica fail (its ``unshare`` process exits non-zero); ``cluster.json``
    marks the node ``killed``. Returns once the signal is sent.
    """
    node = _running_node(cluster, index)
    signal_process(node.init_pid, node.init_start, signal.SIGKILL)
    with updating(cluster.path) as current:
        current.nodes[index].state = "killed"
    node.state = "killed"


def _bridge_link(cluster: Cluster, index: int, up: bool) -> None:
    node = _running_node(cluster, index)
    if not cluster.bridge_alive():
        raise FaultError(f"job {cluster.app_id}: its bridge is gone (has the job ended?)")
    in_netns(cluster.bridge_pid, f"ip link set {node.bridge_veth} {'up' if up else 'down'}",
             f"{'restoring' if up else 'cutting'} node {index}'s link")
    with updating(cluster.path) as current:
        current.nodes[index].faults["cut"] = not up


def link_down(cluster: Cluster, index: int) -> None:
    """Take node ``index``'s link down (bridge side) and return; :func:`link_up` undoes it."""
    _bridge_link(cluster, index, up=False)


def link_up(cluster: Cluster, index: int) -> None:
    _bridge_link(cluster, index, up=True)


def cut_link(cluster: Cluster, index: int, seconds: float,
             progress: Callable[[float], None] | None = None) -> None:
    """Cut node ``index``'s link for ``seconds``, **blocking** until it is back up.

    The link comes back up even if the wait is interrupted (Ctrl-C). TCP connections survive a
    short cut (their retransmissions resume them, after up to one retransmission timeout); a
    collective with a process-group timeout shorter than the cut fails. ``progress`` is called
    about once a second with the seconds left.
    """
    if seconds <= 0:
        raise FaultError(f"--for {seconds:g}s: the cut needs a positive duration")
    link_down(cluster, index)
    try:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if progress:
                progress(left)
            time.sleep(min(1.0, left))
    finally:
        link_up(cluster, index)


def slow_node(cluster: Cluster, index: int, cpu: float | None = None,
              delay: str | None = None) -> None:
    """Slow node ``index`` down, and return (undo with :func:`restore_node`).

    ``cpu``: a CFS quota of ``cpu`` cores (0.25 = a quarter of one core) shared by every process
    of the node, present and future (they all live in the node's cgroup). ``delay``: extra
    one-way delay on the node's egress (``netem``; refused where the kernel lacks it).
    """
    if cpu is None and delay is None:
        raise FaultError("slow: give --cpu CORES and/or --delay TIME")
    node = _running_node(cluster, index)
    if cpu is not None:
        if not 0.01 <= cpu <= os.cpu_count():  # type: ignore[operator]
            raise FaultError(f"--cpu {cpu:g}: expected cores between 0.01 and {os.cpu_count()}")
        if not node.cgroup or not Path(node.cgroup).is_dir():
            raise FaultError(f"node {index} has no cpu cgroup: the launcher found no cpu "
                             "controller it could use (cgroup v1's cpu mount, or a cgroup v2 "
                             "group of its ancestry with cpu in cgroup.subtree_control; "
                             "docs/local-cluster.md)")
        cpu_cgroups.set_quota(Path(node.cgroup), cpu)
    if delay is not None:
        try:
            check_link_options(None, delay, None)
        except ValueError as error:
            raise FaultError(str(error)) from error
        if not kernel_has_netem():
            raise FaultError(netem_missing("--delay", delay))
        link = cluster.link
        in_netns(node.init_pid, qdisc_script(node.veth, link.get("rate"), delay,
                                              link.get("loss")), f"delaying node {index}")
    with updating(cluster.path) as current:
        faults = current.nodes[index].faults
        if cpu is not None:
            faults["cpu"] = cpu
        if delay is not None:
            faults["delay"] = delay


def restore_node(cluster: Cluster, index: int) -> None:
    """Undo :func:`slow_node` and a cut on node ``index``: no quota, the job's own link shaping,
    link up."""
    node = _running_node(cluster, index)
    if node.cgroup and Path(node.cgroup).is_dir():
        cpu_cgroups.set_quota(Path(node.cgroup), None)
    if node.faults.get("delay"):
        link = cluster.link
        in_netns(node.init_pid, qdisc_script(node.veth, link.get("rate"), link.get("delay"),
                                              link.get("loss")), f"restoring node {index}'s link")
    if cluster.bridge_alive():
        in_netns(cluster.bridge_pid, f"ip link set {node.bridge_veth} up",
                 f"restoring node {index}'s link")
    with updating(cluster.path) as current:
        current.nodes[index].faults = {}


@dataclass
class NodeStatus:
    index: int
    role: str
    replica: int
    addr: str
    state: str  # running, killed, exited (gone without a fault), ended (the job ended)
    faults: dict[str, Any]


def list_nodes(cluster: Cluster) -> list[NodeStatus]:
    """Every node's address, state and active faults."""
    statuses = []
    for node in cluster.nodes:
        if cluster.state == ENDED:
            state = node.state if node.state == "killed" else ENDED
        elif node.alive():
            state = RUNNING
        else:
            state = node.state if node.state != RUNNING else "exited"
        faults = {k: v for k, v in node.faults.items() if v} if state == RUNNING else {}
        statuses.append(NodeStatus(node.index, node.role, node.replica, node.addr, state, faults))
    return statuses
