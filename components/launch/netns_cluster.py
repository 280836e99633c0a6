"""A running ``local_netns`` cluster's state: its ``cluster.json``, and its teardown.

The ``local_netns`` TorchX scheduler (:mod:`sublimate.components.launch.netns_scheduler`) runs
every node of a job in its own network, mount and PID namespaces on one machine, and describes
the cluster in ``cluster.json`` beside TorchX's logs::

    <log_dir>/<session>/<app_id>/cluster.json          (CLUSTER_FILE)

A train step's ``log_dir`` is ``<run folder>/logs``, so :func:`find_cluster` finds a job's file
from its run folder; :mod:`.faults` acts on the cluster it describes. :func:`teardown` removes
everything a job created (the scheduler calls it when the job ends, and a small supervisor
process, :func:`supervise`, calls it when the launcher was killed). Processes are addressed by
pid *and* start time (:mod:`sublimate.components.base.process_identity`), so a recycled pid is
never signalled. Standard library only besides that and :mod:`.cpu_cgroups`: the supervisor and
``sublimate fault`` start in milliseconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sublimate.components.base.process_identity import start_ticks
from sublimate.components.base.replica_groups import LIGHTHOUSE_ROLE

CLUSTER_FILE = "cluster.json"
FORMAT_VERSION = 1
# Cluster states: "starting" while the scheduler builds it, "running", then "ended" for good.
STARTING, RUNNING, ENDED = "starting", "running", "ended"
# How long teardown waits for the kernel to reap killed processes before removing their cgroups.
REAP_SECONDS = 10.0


class FaultError(Exception):
    """Bad input or an impossible fault: one line saying what to fix."""


# ---------------------------------------------------------------------------------------------
# The state file


@dataclass
class Node:
    """One node (a TorchX replica) of a ``local_netns`` cluster, as ``cluster.json`` stores it."""

    index: int  # position in the job: roles in order, replicas in order (node 0 is rendezvous host)
    role: str
    replica: int
    addr: str
    holder_pid: int  # the `unshare` process TorchX waits on (host PID namespace)
    holder_start: int
    init_pid: int  # PID 1 of the node's PID namespace, seen from the host
    init_start: int
    veth: str = "eth0"  # the node's end of its link, inside the node
    bridge_veth: str = ""  # the other end, on the bridge (in the bridge's namespace)
    cgroup: str | None = None  # cpu group (cgroup v1 or v2) holding every process of the node
    state: str = RUNNING  # running | killed | ended
    faults: dict[str, Any] = field(default_factory=dict)  # cut: bool, cpu: float, delay: str

    def alive(self) -> bool:
        return start_ticks(self.init_pid) == self.init_start


@dataclass
class Cluster:
    """The whole ``cluster.json``; :meth:`load` / :meth:`save` keep it on disk."""

    path: Path
    app_id: str
    state: str = STARTING
    started: float = 0.0
    ended: float | None = None
    subnet: str = ""
    host_addr: str = ""
    host_veth: str = ""
    bridge_pid: int = 0
    bridge_start: int = 0
    link: dict[str, str | None] = field(default_factory=dict)  # rate, delay, loss (tc syntax)
    volume: str | None = None
    supervisor_pid: int = 0
    nodes: list[Node] = field(default_factory=list)
    version: int = FORMAT_VERSION

    @classmethod
    def load(cls, path: Path | str) -> Cluster:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as error:
            raise FaultError(f"{path}: no such cluster file") from error
        except (OSError, ValueError) as error:
            raise FaultError(f"{path}: unreadable cluster file: {error}") from error
        nodes = [Node(**node) for node in data.pop("nodes", [])]
        data.pop("path", None)
        return cls(path=path, nodes=nodes, **data)

    def save(self) -> None:
        data = asdict(self)
        data["path"] = str(self.path)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, self.path)  # readers never see half a file

    def node(self, index: int) -> Node:
        if not 0 <= index < len(self.nodes):
            raise FaultError(f"--node {index}: the job {self.app_id} has {self.described()}")
        return self.nodes[index]

    def services(self) -> list[Node]:
        """The nodes that serve the job rather than train (per-step recovery's Lighthouse):
        a namespace each like a training node, so faults reach them by index too, but counted
        apart: a 3-node job is 3 nodes, not 4."""
        return [node for node in self.nodes if node.role == LIGHTHOUSE_ROLE]

    def described(self) -> str:
        """``nodes 0..2 (and its lighthouse, 3)``: the indices a ``--node`` may take."""
        services = self.services()
        training = [node.index for node in self.nodes if node not in services]
        said = (f"nodes {training[0]}..{training[-1]}" if len(training) > 1 else
                f"node {training[0]}" if training else "no training node")
        if services:
            said += " (and its " + ", ".join(f"{node.role}, {node.index}"
                                             for node in services) + ")"
        return said

    def bridge_alive(self) -> bool:
        return start_ticks(self.bridge_pid) == self.bridge_start


@contextlib.contextmanager
def updating(path: Path | str) -> Iterator[Cluster]:
    """Read-modify-write ``cluster.json`` under an exclusive lock on its folder.

    The launcher, its supervisor and ``sublimate fault`` may all write the file; the lock is on
    the directory (flock works on directory descriptors), so no lock file is left behind.
    """
    path = Path(path)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        cluster = Cluster.load(path)
        yield cluster
        cluster.save()
    finally:
        os.close(fd)  # closing releases the lock


def find_cluster(run: Path | str, app_id: str | None = None) -> Path:
    """The ``cluster.json`` of the job in ``run``.

    ``run`` may be the file itself, a job's log folder (``<log_dir>/<session>/<app_id>``), a
    TorchX ``log_dir``, or a run folder whose ``logs/`` is the log_dir. Among several jobs the
    one still running is chosen (``app_id`` picks one by name); none running: the newest.
    """
    path = Path(run).expanduser()
    if path.is_file():
        return path
    if not path.is_dir():
        raise FaultError(f"{path}: no such run folder")
    candidates = [
        found
        for pattern in (CLUSTER_FILE, f"*/{CLUSTER_FILE}", f"*/*/{CLUSTER_FILE}",
                        f"logs/*/*/{CLUSTER_FILE}")
        for found in path.glob(pattern)
    ]
    if app_id:
        candidates = [c for c in candidates if c.parent.name == app_id]
    if not candidates:
        which = f"job {app_id}" if app_id else "local_netns job"
        raise FaultError(f"{path}: no {which} here (looked for {CLUSTER_FILE} in it, in its "
                         "logs/<session>/<app_id>/ and below; was the job run with "
                         "-s local_netns and a log_dir?)")
    running = [c for c in candidates if Cluster.load(c).state != ENDED]
    if len(running) > 1:
        names = ", ".join(sorted(c.parent.name for c in running))
        raise FaultError(f"{path}: {len(running)} jobs running ({names}); pick one with --app")
    if running:
        return running[0]
    return max(candidates, key=lambda c: c.stat().st_mtime)


def load_running(run: Path | str, app_id: str | None = None) -> Cluster:
    """The cluster of ``run`` (see :func:`find_cluster`), refusing one that has ended."""
    cluster = Cluster.load(find_cluster(run, app_id))
    if cluster.state != RUNNING:
        raise FaultError(f"job {cluster.app_id} is {cluster.state}: no faults to inject")
    return cluster


def signal_process(pid: int, start: int, signum: int = signal.SIGKILL) -> bool:
    """Send ``signum`` to ``pid`` if it is still the process that started at ``start``."""
    if not pid or start_ticks(pid) != start:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)
        return True
    return False


# ---------------------------------------------------------------------------------------------
# Teardown


def _wait_gone(pids: list[tuple[int, int]], seconds: float) -> None:
    end = time.monotonic() + seconds
    while any(start_ticks(pid) == start for pid, start in pids) and time.monotonic() < end:
        time.sleep(0.02)


def _remove_cgroup(path: str, seconds: float) -> None:
    """rmdir a cgroup once its processes are gone (EBUSY until then)."""
    end = time.monotonic() + seconds
    while Path(path).is_dir():
        try:
            os.rmdir(path)
            return
        except OSError:
            if time.monotonic() > end:
                raise
            # a process of the node may have forked after the kill: kill what is left
            with contextlib.suppress(OSError):
                for pid in Path(path, "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.02)


def teardown(path: Path | str) -> None:
    """Remove everything the job of ``path`` (its ``cluster.json``) created; safe to repeat.

    Kills each node's init (its PID namespace takes every process of the node along) and its
    holder, and the bridge's holder (the bridge's namespace, and with it every veth pair,
    including the host's, disappears); deletes the host's veth first so it is gone before this
    returns; removes the nodes' cgroups once empty; marks the file ``ended``.
    """
    path = Path(path)
    if not path.is_file():
        return
    with updating(path) as cluster:
        if cluster.state == ENDED:
            return
        pids = [(cluster.bridge_pid, cluster.bridge_start)]
        for node in cluster.nodes:
            pids += [(node.init_pid, node.init_start), (node.holder_pid, node.holder_start)]
        for pid, start in pids:
            signal_process(pid, start, signal.SIGKILL)
        if cluster.host_veth and shutil.which("ip"):
            subprocess.run(["ip", "link", "del", cluster.host_veth], capture_output=True,
                           check=False)
        _wait_gone(pids, REAP_SECONDS)
        errors = []
        for node in cluster.nodes:
            if node.cgroup:
                try:
                    _remove_cgroup(node.cgroup, REAP_SECONDS)
                except OSError as error:
                    errors.append(f"{node.cgroup}: {error.strerror}")
            if node.state == RUNNING:
                node.state = ENDED
        cluster.state = ENDED
        cluster.ended = time.time()
    if errors:
        raise FaultError(f"job {cluster.app_id}: could not remove {', '.join(errors)}")


def supervise(path: Path | str) -> None:
    """The supervisor's life: wait for the launcher to go, then :func:`teardown`.

    The launcher holds the write end of this process's stdin and never writes; stdin reaches
    EOF when the launcher closes it (the job ended) or dies, however it dies (SIGKILL
    included). The supervisor runs in its own session and ignores SIGINT/SIGHUP, so the Ctrl-C
    or hang-up that stops a launcher still leaves it to clean up.
    """
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):
        pass
    teardown(path)


# the supervisor: python -m sublimate.components.launch.netns_cluster supervise FILE
if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "supervise":
        sys.exit("usage: python -m sublimate.components.launch.netns_cluster supervise FILE")
    supervise(sys.argv[2])
