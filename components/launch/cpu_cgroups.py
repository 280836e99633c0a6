"""CPU groups for ``local_netns`` nodes, on cgroup v1 or cgroup v2: where they go, and a quota.

Every node's PID 1 goes in a cpu group of its own before it starts anything, so that a quota on
that group (``sublimate fault slow --cpu``) holds every process of the node, present and future.
The two cgroup versions differ in where such a group can be made and in the quota's file:

* **cgroup v1** (a ``cgroup`` mount with the ``cpu`` controller, ``/sys/fs/cgroup/cpu`` or
  ``/sys/fs/cgroup/cpu,cpuacct``): the nodes' groups go under the launcher's own cpu group, so
  they stay within whatever limits the launcher has. The quota is ``cpu.cfs_period_us`` and
  ``cpu.cfs_quota_us`` (``-1``: none).
* **cgroup v2** (the ``cgroup2`` mount, ``/sys/fs/cgroup`` on current hosts): a group has
  ``cpu.max`` only when its parent delegates the controller (``cpu`` in the parent's
  ``cgroup.subtree_control``), and a group other than the root that delegates controllers
  may hold no processes itself (the "no internal processes" rule). The launcher's own group
  holds the launcher, so the nodes' groups go under the deepest group of the launcher's
  ancestry that already delegates ``cpu``: within its limits, if not within the launcher's
  own. Nothing here turns a controller on (that would change how the whole machine shares its
  CPUs); where none delegates ``cpu``, ``echo +cpu > <group>/cgroup.subtree_control`` does.
  The quota is ``cpu.max``: ``"<quota> <period>"`` in microseconds, ``"max <period>"`` for none.

On a hybrid host (both mounted, as systemd's "hybrid" mode does), the controller is where the
kernel bound it: v1 when a v1 mount has it, else v2 when the v2 root lists it. Without either,
a job still runs; only ``slow --cpu`` is refused.

Standard library only: ``sublimate fault`` and the cleanup supervisor import it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CFS_PERIOD_US = 100_000
MIN_QUOTA_US = 1000  # the kernel's smallest quota (1 ms per period)
V2_QUOTA = "cpu.max"
V1_PERIOD, V1_QUOTA = "cpu.cfs_period_us", "cpu.cfs_quota_us"


@dataclass(frozen=True)
class Mount:
    """One cgroup mount from ``/proc/self/mountinfo``."""

    version: int  # 1 or 2
    root: str  # the hierarchy's path mounted here ("/" unless a cgroup namespace hides more)
    point: Path
    controllers: frozenset[str]  # v1: the mount's controllers; v2: empty (read from the tree)


def cgroup_mounts(mountinfo: str) -> list[Mount]:
    """The cgroup v1 and v2 mounts listed in ``mountinfo`` (the text of /proc/self/mountinfo)."""
    mounts = []
    for line in mountinfo.splitlines():
        mine, separator, theirs = line.partition(" - ")
        fields, tail = mine.split(), theirs.split()
        if not separator or len(fields) < 5 or len(tail) < 3:
            continue
        point = Path(fields[4].replace("\\040", " "))
        if tail[0] == "cgroup2":
            mounts.append(Mount(2, fields[3], point, frozenset()))
        elif tail[0] == "cgroup":
            mounts.append(Mount(1, fields[3], point, frozenset(tail[2].split(","))))
    return mounts


def _group_path(mount: Mount, path: str) -> Path | None:
    """Where the group ``path`` (as /proc/<pid>/cgroup names it) is under ``mount``; None
    when that mount does not show it (a namespace's mount of another part of the tree)."""
    if mount.root != "/" and not (path == mount.root or path.startswith(mount.root + "/")):
        return None
    relative = path[len(mount.root):] if mount.root != "/" else path
    return mount.point / relative.lstrip("/")


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def _usable(group: Path) -> bool:
    return (group / "cgroup.procs").is_file() and os.access(group, os.W_OK)


def node_parent(mountinfo: str | None = None, proc_cgroup: str | None = None) -> Path | None:
    """The group the nodes' cpu groups go in (the module docstring says which), or None
    without a cpu controller this process can use. The arguments default to this process's
    /proc/self/mountinfo and /proc/self/cgroup (a test passes others)."""
    mounts = cgroup_mounts(Path("/proc/self/mountinfo").read_text()
                           if mountinfo is None else mountinfo)
    lines = (Path("/proc/self/cgroup").read_text() if proc_cgroup is None
             else proc_cgroup).splitlines()
    memberships = {}  # controllers ("" for v2) -> this process's group path
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        memberships[controllers if hierarchy != "0" else ""] = path
    for mount in (m for m in mounts if m.version == 1 and "cpu" in m.controllers):
        for controllers, path in memberships.items():
            if "cpu" in controllers.split(","):
                group = _group_path(mount, path)
                if group is not None and _usable(group):
                    return group
    for mount in (m for m in mounts if m.version == 2):
        if "cpu" not in _words(mount.point / "cgroup.controllers") or "" not in memberships:
            continue
        group = _group_path(mount, memberships[""])
        while group is not None and (group == mount.point or mount.point in group.parents):
            if "cpu" in _words(group / "cgroup.subtree_control") and _usable(group):
                return group
            group = group.parent if group != mount.point else None
    return None


def set_quota(group: Path, cores: float | None) -> None:
    """Give the processes of ``group`` at most ``cores`` CPUs (None: no limit), through
    ``cpu.max`` (v2) or the CFS files (v1), whichever the group has."""
    quota = None if cores is None else max(MIN_QUOTA_US, int(cores * CFS_PERIOD_US))
    if (group / V2_QUOTA).is_file():
        (group / V2_QUOTA).write_text(f"{'max' if quota is None else quota} {CFS_PERIOD_US}")
        return
    if quota is not None:
        (group / V1_PERIOD).write_text(str(CFS_PERIOD_US))
    (group / V1_QUOTA).write_text(str(-1 if quota is None else quota))


def quota_cores(group: Path) -> float | None:
    """The group's CPU limit in cores (None: none), as :func:`set_quota` wrote it."""
    if (group / V2_QUOTA).is_file():
        quota, period = (group / V2_QUOTA).read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    quota_us = int((group / V1_QUOTA).read_text())
    return None if quota_us < 0 else quota_us / int((group / V1_PERIOD).read_text())
