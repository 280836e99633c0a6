"""Nodes' CPU groups on cgroup v1 and v2 (``components/launch/cpu_cgroups.py``).

Where the group goes and the quota's file protocol are checked against fake trees of both
versions (this machine cannot mount a cgroup v2 hierarchy with the cpu controller: its kernel
binds cpu to the v1 mount); the quota itself is checked for real on whichever version holds
the cpu controller here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sublimate.components.base.process_identity import start_ticks
from sublimate.components.launch import cpu_cgroups, faults, netns_cluster
from sublimate.components.launch.cpu_cgroups import node_parent, quota_cores, set_quota
from tests.conftest import require

V2_MOUNT = "41 23 0:38 {root} {point} rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw\n"
V1_CPU_MOUNT = ("32 31 0:29 / {point} rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
                "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n")


def _group(path: Path, controllers: str = "", subtree: str = "") -> Path:
    """A cgroup v2 folder as the kernel shows it (the files this module reads)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "cgroup.procs").write_text("")
    (path / "cgroup.controllers").write_text(controllers + "\n")
    (path / "cgroup.subtree_control").write_text(subtree + "\n")
    return path


def test_on_cgroup_v2_the_nodes_go_under_the_deepest_group_that_delegates_cpu(
        tmp_path: Path) -> None:
    root = _group(tmp_path / "cgroup", "cpuset cpu io memory pids", "cpu memory pids")
    user = _group(root / "user.slice", "cpu memory pids", "memory pids")  # no cpu below it
    _group(user / "session-4.scope", "memory pids")
    mountinfo = V2_MOUNT.format(root="/", point=root)
    launcher = "0::/user.slice/session-4.scope\n"
    # The launcher's own group holds the launcher: never a parent of groups with controllers.
    assert node_parent(mountinfo, launcher) == root
    (user / "cgroup.subtree_control").write_text("cpu memory pids\n")  # delegated to the user
    assert node_parent(mountinfo, launcher) == user
    # The root is the one group that may both hold processes and delegate controllers.
    assert node_parent(mountinfo, "0::/\n") == root
    # No cpu controller on the v2 hierarchy (bound to v1, or not compiled in): none to use.
    (root / "cgroup.controllers").write_text("memory pids\n")
    assert node_parent(mountinfo, launcher) is None


def test_a_cgroup_namespace_mount_shows_only_its_part_of_the_tree(tmp_path: Path) -> None:
    # A container's /sys/fs/cgroup is the host's /kubepods/pod1/ctr; its group paths are
    # relative to that (as /proc/self/cgroup says inside a cgroup namespace).
    inside = _group(tmp_path / "cgroup", "cpu memory", "cpu")
    _group(inside / "job", "cpu")
    mountinfo = V2_MOUNT.format(root="/kubepods/pod1/ctr", point=inside)
    assert node_parent(mountinfo, "0::/kubepods/pod1/ctr/job\n") == inside
    assert node_parent(mountinfo, "0::/elsewhere\n") is None


def test_on_a_hybrid_host_the_controller_is_where_the_kernel_bound_it(tmp_path: Path) -> None:
    v1 = tmp_path / "cpu,cpuacct"
    (v1 / "batch").mkdir(parents=True)
    (v1 / "batch" / "cgroup.procs").write_text("")
    unified = _group(tmp_path / "unified", "hugetlb")  # systemd's hybrid mode: no cpu on v2
    mountinfo = V1_CPU_MOUNT.format(point=v1) + V2_MOUNT.format(root="/", point=unified)
    membership = "4:memory:/\n2:cpu,cpuacct:/batch\n0::/\n"
    assert node_parent(mountinfo, membership) == v1 / "batch"


def test_the_quota_files_of_both_versions(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("max 100000\n")  # as the kernel creates it
    set_quota(v2, 0.25)
    assert (v2 / "cpu.max").read_text() == "25000 100000" and quota_cores(v2) == 0.25
    set_quota(v2, 0.001)  # below the kernel's 1 ms per period
    assert (v2 / "cpu.max").read_text() == "1000 100000"
    set_quota(v2, None)
    assert (v2 / "cpu.max").read_text() == "max 100000" and quota_cores(v2) is None
    assert not (v2 / "cpu.cfs_quota_us").exists()
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    set_quota(v1, 1.5)
    assert (v1 / "cpu.cfs_quota_us").read_text() == "150000" and quota_cores(v1) == 1.5
    set_quota(v1, None)
    assert (v1 / "cpu.cfs_quota_us").read_text() == "-1" and quota_cores(v1) is None


def test_fault_slow_and_restore_write_cpu_max_on_a_cgroup_v2_node(tmp_path: Path) -> None:
    group = tmp_path / "cgroup" / "sublimate-app-n0"
    group.mkdir(parents=True)
    (group / "cpu.max").write_text("max 100000\n")
    me = os.getpid()  # stands for the node's PID 1: alive, with its start time
    cluster = netns_cluster.Cluster(path=tmp_path / netns_cluster.CLUSTER_FILE, app_id="app",
                             state=netns_cluster.RUNNING, nodes=[netns_cluster.Node(
                                 index=0, role="worker", replica=0, addr="10.213.0.1",
                                 holder_pid=me, holder_start=start_ticks(me) or 0, init_pid=me,
                                 init_start=start_ticks(me) or 0, cgroup=str(group))])
    cluster.save()
    faults.slow_node(cluster, 0, cpu=0.25)
    assert (group / "cpu.max").read_text() == "25000 100000"
    assert netns_cluster.Cluster.load(cluster.path).nodes[0].faults == {"cpu": 0.25}
    faults.restore_node(netns_cluster.Cluster.load(cluster.path), 0)
    assert (group / "cpu.max").read_text() == "max 100000"
    assert sorted(p.name for p in group.iterdir()) == ["cpu.max"]  # no v1 file written


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_a_quota_holds_a_busy_process_on_this_machines_cgroups(tmp_path: Path) -> None:
    """For real, on the cgroup version that holds this machine's cpu controller (v1 here)."""
    require(os.geteuid() == 0, "creating cgroups needs root")
    parent = node_parent()
    require(parent is not None, "no cpu cgroup controller is writable here")
    assert parent is not None
    group = parent / f"sublimate-test-{os.getpid()}"
    group.mkdir()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        (group / "cgroup.procs").write_text(str(busy.pid))
        set_quota(group, 0.1)
        assert quota_cores(group) == pytest.approx(0.1)
        start, used = time.monotonic(), _cpu_seconds(busy.pid)
        time.sleep(1.0)
        share = (_cpu_seconds(busy.pid) - used) / (time.monotonic() - start)
        version = 2 if (group / cpu_cgroups.V2_QUOTA).exists() else 1
        print(f"cgroup v{version}: a busy loop under a 0.1-core quota used {share:.2f} of a core")
        # A loaded machine can only give it less: the quota is an upper bound, whatever else runs
        # (the slack: CPU time is counted in 10 ms ticks, and the first period may be whole).
        assert share <= 0.2
    finally:
        busy.kill()
        busy.wait()
        group.rmdir()
