"""A pod's ``resources.limits`` on this machine: its memory and CPU in a cgroup of its own.

As the kubelet does, a container's ``limits.memory`` becomes its group's memory limit (the
kernel's OOM killer ends it past that: exit code 137, reason ``OOMKilled``) and ``limits.cpu``
a CFS quota (throttled, never killed); requests reserve nothing here (there is one machine, no
scheduler). The groups go under the runner's own (so a pod stays within whatever limits the
runner has), on cgroup v1 (the ``memory`` and ``cpu`` controllers) or v2 (``memory.max``,
``cpu.max``, where the runner's group delegates the controllers). The pod's first process joins
them before it ``exec``s (a write to ``cgroup.procs`` in the forked child), so nothing it starts
escapes them. Where this machine has no such controller the runner says so once and the pod
runs without its limit.

A pod that hosts a job (the built-in train step: locally its nodes run inside it, where a
cluster gives each node a pod and resources of its own) says so with the local runner's
annotation ``sublimate.dev/local-job: "true"``: its limits are its cluster launcher's, not
its nodes', so none is applied here.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import NamedTuple

from sublimate.pipelines.argo_terms import quantity as kube_quantity

from ..errors import NodeError

JOB_ANNOTATION = "sublimate.dev/local-job"
MEMORY_ROOTS = (Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup"))
def quantity(text: object, where: str) -> float:
    """A Kubernetes quantity; ``NodeError`` naming the field (``manifest.kube_values``)."""
    try:
        return kube_quantity(text)
    except ValueError as exc:
        raise NodeError(f"{where}: {exc}") from None


class Limits(NamedTuple):
    memory_bytes: int | None
    cpu_cores: float | None


def plan_limits(body: dict, annotations: dict | None, where: str) -> Limits | None:
    """A container's limits from its (substituted) body; None without any, or for a pod
    that hosts a job (the module docstring)."""
    limits = (body.get("resources") or {}).get("limits") or {}
    if str((annotations or {}).get(JOB_ANNOTATION, "")).strip().lower() == "true":
        return None
    memory = cpu = None
    if limits.get("memory") is not None:
        memory = int(quantity(limits["memory"], f"{where}.resources.limits.memory"))
        if memory <= 0:
            raise NodeError(f"{where}.resources.limits.memory: must be more than 0")
    if limits.get("cpu") is not None:
        cpu = quantity(limits["cpu"], f"{where}.resources.limits.cpu")
        if cpu <= 0:
            raise NodeError(f"{where}.resources.limits.cpu: must be more than 0")
    return Limits(memory, cpu) if memory is not None or cpu is not None else None


def _own_group(controller: str) -> tuple[Path | None, int]:
    """This process's group for ``controller`` (v1) or its v2 group, and the version."""
    with open("/proc/self/cgroup", encoding="utf-8") as rows:
        lines = rows.read().splitlines()
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy != "0" and controller in controllers.split(","):
            for base in (Path("/sys/fs/cgroup") / controllers,
                         Path("/sys/fs/cgroup") / controller):
                group = base / path.lstrip("/")
                if (group / "cgroup.procs").is_file() and os.access(group, os.W_OK):
                    return group, 1
    for line in lines:
        if line.startswith("0::"):
            group = Path("/sys/fs/cgroup") / line[3:].lstrip("/")
            controllers = Path("/sys/fs/cgroup/cgroup.controllers")
            if controllers.is_file() and controller in controllers.read_text().split():
                # v2: the group's parent must delegate the controller to make children
                while group != Path("/sys/fs/cgroup"):
                    subtree = group / "cgroup.subtree_control"
                    if subtree.is_file() and controller in subtree.read_text().split() \
                            and os.access(group, os.W_OK):
                        return group, 2
                    group = group.parent
    return None, 0


class PodGroups(NamedTuple):
    """The groups one pod's processes join, and what could not be limited."""

    paths: tuple[Path, ...]
    memory: Path | None
    version: int
    unavailable: str  # "" when every limit asked for is applied


_swept: set[Path] = set()


def _sweep(parent: Path) -> None:
    """Remove the empty groups that runners no longer running left under ``parent`` (a
    runner killed outright never removes its pods' groups), once per process and parent."""
    if parent in _swept:
        return
    _swept.add(parent)
    for group in parent.glob("sublimate-*-*"):
        pid = group.name.split("-")[1]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(OSError):
                group.rmdir()  # refused while a process is still in it


def make_groups(limits: Limits, name: str) -> PodGroups:
    """Create the pod's groups (``name``: ``sublimate-<runner pid>-<node>``) with their
    limits; a controller this runner may not use (not root, a read-only cgroup tree, as in a
    container) is named in ``unavailable`` and its limit is not applied."""
    try:
        return _make_groups(limits, name)
    except OSError as exc:
        return PodGroups((), None, 0, f"cgroups ({exc.strerror or exc}: {exc.filename})")


def _make_groups(limits: Limits, name: str) -> PodGroups:
    paths: list[Path] = []
    missing: list[str] = []
    memory_group: Path | None = None
    version = 0
    if limits.memory_bytes is not None:
        parent, version = _own_group("memory")
        if parent is None:
            missing.append("memory (no memory cgroup controller this runner can use)")
        else:
            _sweep(parent)
            memory_group = parent / name
            memory_group.mkdir(exist_ok=True)
            if version == 1:
                (memory_group / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
                swap = memory_group / "memory.memsw.limit_in_bytes"
                if swap.is_file():  # swap counts too, or the limit is only on RAM
                    swap.write_text(str(limits.memory_bytes))
            else:
                (memory_group / "memory.max").write_text(str(limits.memory_bytes))
                with contextlib.suppress(OSError):
                    (memory_group / "memory.swap.max").write_text("0")
            paths.append(memory_group)
    if limits.cpu_cores is not None:
        from sublimate.components.launch.cpu_cgroups import node_parent, set_quota

        parent = node_parent()
        if parent is None:
            missing.append("cpu (no cpu cgroup controller this runner can use)")
        elif memory_group is not None and parent == memory_group.parent:
            set_quota(memory_group, limits.cpu_cores)  # v2: one group holds both
        else:
            _sweep(parent)
            group = parent / name
            group.mkdir(exist_ok=True)
            set_quota(group, limits.cpu_cores)
            paths.append(group)
    return PodGroups(tuple(paths), memory_group, version, "; ".join(missing))


def join_step(groups: PodGroups) -> tuple:
    """The child's step (before ``exec``, before anything else): join the pod's groups."""
    return ("cgroup-join", tuple(os.fsencode(p / "cgroup.procs") for p in groups.paths))


def join(procs_files: tuple[bytes, ...]) -> None:
    """In the forked child: move this process into each group ("0": the writer)."""
    for path in procs_files:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)


def oom_killed(groups: PodGroups) -> bool:
    """Whether the kernel's OOM killer ended a process of the pod's memory group."""
    if groups.memory is None:
        return False
    name = "memory.oom_control" if groups.version == 1 else "memory.events"
    with contextlib.suppress(OSError):
        for line in (groups.memory / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip() not in ("", "0"):
                return True
    return False


def remove_groups(groups: PodGroups) -> None:
    """Remove the pod's groups once its processes are gone (a group empties as the kernel
    reaps them, a moment after the pod's end)."""
    for path in groups.paths:
        for _ in range(50):
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)
