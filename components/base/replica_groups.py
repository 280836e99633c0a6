"""Per-step recovery's part of the contract: which replica group a training process belongs to,
how many there are, and where the Lighthouse is.

With ``recovery=per-step`` every node is one replica group (torchft's term): its processes form
the node's own process group (a torchrun of one node), and the groups meet only through the
Lighthouse, which forms a quorum of the groups alive before every step. The launcher writes these
variables on every node (:func:`replica_group_env`); the training library reads them
(:meth:`ReplicaGroups.from_env`). No torch here: the launcher imports it.

==================================  ===========================================================
``SUBLIMATE_RECOVERY``              ``per-step`` (absent: the job restarts as a whole on a loss)
``SUBLIMATE_REPLICA_GROUP``         this node's group, 0 .. groups-1 (its TorchX replica id)
``SUBLIMATE_REPLICA_GROUPS``        how many groups the job has
``SUBLIMATE_MIN_REPLICA_GROUPS``    how many must be alive for a step to commit (``nodes=MIN:MAX``)
``SUBLIMATE_LIGHTHOUSE_PORT``       the Lighthouse's port; its host is ``$VC_LIGHTHOUSE_0_HOSTS``
``VC_LIGHTHOUSE_0_HOSTS``           the Lighthouse's host, named as Volcano's svc plugin names
                                    a task's hosts (on Kubernetes the rendered job sets it to
                                    the Lighthouse Service's name; on one machine the launcher
                                    or the ``local_netns`` scheduler sets it)
``SUBLIMATE_NODE_ADDR``             this node's address as the other nodes reach it
                                    (``local_netns``; elsewhere: what the host name resolves to)
==================================  ===========================================================
"""

from __future__ import annotations

import mmap
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sublimate.components.base.settings import PER_STEP

RECOVERY_ENV = "SUBLIMATE_RECOVERY"
GROUP_ENV = "SUBLIMATE_REPLICA_GROUP"
GROUPS_ENV = "SUBLIMATE_REPLICA_GROUPS"
MIN_GROUPS_ENV = "SUBLIMATE_MIN_REPLICA_GROUPS"
LIGHTHOUSE_PORT_ENV = "SUBLIMATE_LIGHTHOUSE_PORT"
NODE_ADDR_ENV = "SUBLIMATE_NODE_ADDR"
# The Lighthouse is the TorchX role of this name, with one replica. Volcano's env plugin gives
# every pod of a job VC_<TASK>_HOSTS for each task (TorchX names a task <role>-<replica>).
LIGHTHOUSE_ROLE = "lighthouse"
LIGHTHOUSE_HOSTS_ENV = "VC_LIGHTHOUSE_0_HOSTS"
# Volcano's env plugin: a pod's index in its task. On Kubernetes the training nodes are one task
# of N pods (launch/volcano_job.py), so a node's group is its index there, not GROUP_ENV.
TASK_INDEX_ENV = "VC_TASK_INDEX"


def volcano_hosts_env(role: str, replica: int) -> str:
    """The variable Volcano's env plugin sets to the hosts of task ``<role>-<replica>``."""
    return f"VC_{role}_{replica}_HOSTS".upper().replace("-", "_")


def replica_group_env(groups: int, min_groups: int, lighthouse_port: int,
                      replica_id_macro: str) -> dict[str, str]:
    """The launcher's side: the variables of every training node of a per-step job
    (``replica_id_macro``: TorchX's ``${replica_id}``, replaced by each replica's index)."""
    return {RECOVERY_ENV: PER_STEP, GROUP_ENV: replica_id_macro, GROUPS_ENV: str(groups),
            MIN_GROUPS_ENV: str(min_groups), LIGHTHOUSE_PORT_ENV: str(lighthouse_port)}


def node_address(env: Mapping[str, str] | None = None) -> str:
    """This node's address as its peers reach it: the ``local_netns`` scheduler names it; in a
    pod (or a plain host) it is the address the host name resolves to."""
    env = os.environ if env is None else env
    named = env.get(NODE_ADDR_ENV)
    if named:
        return named
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


@dataclass(frozen=True)
class ReplicaGroups:
    """This process's place among the replica groups of a per-step job."""

    group: int  # this node's group
    groups: int  # every group of the job
    min_groups: int  # alive groups a step needs to commit
    lighthouse: str  # the Lighthouse's address, http://host:port
    # Started in place of a lost node: heal from a live peer, never from a checkpoint. Not an
    # environment variable: Volcano restarts a pod with the environment it had, so a node
    # knows it by its own start record in this launch (per_step_loop), wherever it runs.
    replacement: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ReplicaGroups | None:
        """The job's replica groups, or None when the job does not recover per step."""
        env = os.environ if env is None else env
        if env.get(RECOVERY_ENV) != PER_STEP:
            return None
        group = env.get(GROUP_ENV) or env.get(TASK_INDEX_ENV) or ""
        missing = [name for name in (GROUPS_ENV, LIGHTHOUSE_PORT_ENV, LIGHTHOUSE_HOSTS_ENV)
                   if not env.get(name)] + ([] if group else [GROUP_ENV])
        if missing:
            raise RuntimeError(f"recovery per-step: {', '.join('$' + m for m in missing)} not "
                               "set (the launcher sets them on every node of a per-step job)")
        host = env[LIGHTHOUSE_HOSTS_ENV].split(",")[0]
        groups = int(env[GROUPS_ENV])
        return cls(group=int(group), groups=groups,
                   min_groups=int(env.get(MIN_GROUPS_ENV, "1")),
                   lighthouse=f"http://{host}:{env[LIGHTHOUSE_PORT_ENV]}")


# What each incarnation of a group's first process records, under <run>/fault-tolerance/:
# an event log (start, healed, first commit, quorum changes, dropped steps, end) and four
# counters in a memory-mapped file, updated every step without a system call and left intact
# when the process is killed: steps attempted, committed and dropped, the last committed step.
COUNTERS = ("attempted", "committed", "last_step", "dropped")


def incarnation_name(group: int, started: float) -> str:
    """One process incarnation's file stem: ``node<g>-<start time in ms>`` (sorts by start)."""
    return f"node{group}-{int(started * 1000)}"


class StepCounters:
    """Counters in a memory-mapped file: written by the group's first process, read by the
    launcher after the fact (a killed process leaves the last values in the page cache)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as file:
            file.write(bytes(8 * len(COUNTERS)))
        self._file = path.open("r+b")
        self._map = mmap.mmap(self._file.fileno(), 8 * len(COUNTERS))
        self.values = memoryview(self._map).cast("q")

    def close(self) -> None:
        self.values.release()
        self._map.close()
        self._file.close()


def read_counters(path: Path) -> dict[str, int]:
    """The counters an incarnation left (see :class:`StepCounters`)."""
    data = memoryview(path.read_bytes()).cast("q")
    return dict(zip(COUNTERS, data.tolist(), strict=False))


def attempt_started(attempt_id: str) -> float | None:
    """When the launch named ``attempt_id`` (``<pid>-<attempt>-<epoch seconds>``, the
    launcher's :data:`~sublimate.components.monitoring.watchdog.ATTEMPT_ENV`) started."""
    try:
        return float(attempt_id.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return None


def steps_committed_since(folder: Path, since: float) -> int:
    """The most steps (rounds, under a periodic paradigm) that any incarnation of any group
    started at or after ``since`` saw committed: how far the job is, from the counters its
    groups left in ``folder`` (a killed group's included)."""
    most = 0
    for path in folder.glob("node*-*.counters"):
        try:
            started_ms = int(path.stem.rsplit("-", 1)[1])
            if started_ms >= since * 1000:
                most = max(most, read_counters(path)["last_step"])
        except (ValueError, KeyError, OSError):  # not an incarnation's, or half written
            continue
    return most
