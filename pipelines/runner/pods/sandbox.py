"""A pod's processes, contained as a container runtime contains them (``--mounts overlay``, the
default where the runner is root).

A pod's view (``views``) already gives it a private copy-on-write root; on its own that is a
``chroot`` of a process that keeps every capability of the runner's root, sees every process
of this machine and its ``/proc/<pid>/root``, and can write the host's devices. What a pod gets
here, unless its ``securityContext`` asks for more (``privileged: true``,
``capabilities.add``):

- **its root pivoted** (``pivot_root``, the old root detached), not a ``chroot``: there is no
  way back to this machine's tree from inside;
- **its own PID and IPC namespaces** and a fresh ``/proc`` that shows them only (a pod cannot
  see, signal or enter this machine's processes), with ``/proc/sys``, ``/proc/sysrq-trigger``
  and the like read-only, as runc mounts them; ``/sys`` read-only without its submounts;
- **a minimal ``/dev``**: ``null``, ``zero``, ``full``, ``random``, ``urandom``, ``tty``, its
  own ``pts`` and ``shm`` (so the run's secret files on this machine's ``/dev/shm`` are out of
  sight), and this machine's GPUs (``nvidia*``, ``dri``, ``kfd``), which stand for the node's;
- **a container runtime's default capabilities** in its bounding set (containerd's list, less
  ``MKNOD`` and ``NET_RAW``: a pod here shares this machine's network and has no device
  cgroup), ``capabilities.add``/``drop`` applied, and ``no_new_privs`` (a setuid program of
  this machine's tree gains nothing) unless ``allowPrivilegeEscalation: true``.

A privileged pod keeps the runner's capabilities, devices and PID namespace (Kubernetes'
``privileged`` plus ``hostPID``): ``local_netns``' nodes are found by this machine's pids, from
the train step and from a second shell's ``sublimate fault``. The local runner reads one
annotation of its own, ``sublimate.dev/local-privileged: "true"``, for a pod that needs that
here but not on a cluster (the built-in train step on ``local_netns``; ``pipelines``).

How the PID namespace is entered: ``unshare(CLONE_NEWPID)`` moves only the caller's children,
so the pod's thread in the runner unshares for itself just before it starts the pod
(``children_in_new_pid_namespace``), and the process it forks, the one the runner waits for and
signals, is the namespace's init, as Argo's emissary is a container's PID 1. It builds the view,
mounts ``/proc``, forks the command's process (which drops its capabilities and ``exec``s the
command) and reaps. Signals travel down: the runner signals the init's process group, which
holds the init alone, and the init passes each signal to the command's process group, so the
command gets each signal once, as a ``killpg`` from the runner would give it. When the command
ends, the init exits with its status (a signal N as 128+N, as Kubernetes reports it), which
ends every process left in the namespace, as a container's end does. A runner killed outright
still reaches the pod: the init's ``PR_SET_PDEATHSIG`` SIGTERM is passed on like any other.

Like ``mounts`` and ``views``, everything is decided in the runner; the forked processes make
system calls through functions resolved beforehand, and ``os``/``signal`` calls.
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import stat
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from sublimate.pipelines.argo_terms import CAPABILITIES, capability

from ..errors import NodeError

# containerd's defaultUnixCaps (oci/spec_opts.go) less MKNOD (containerd pairs it with a device
# cgroup that refuses the host's disks; here a node made in the pod's layer would open them)
# and NET_RAW (a raw socket on this machine's network, which pods share, would see its traffic).
DEFAULT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "SETGID", "SETUID",
                        "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL",
                        "AUDIT_WRITE")
PRIVILEGED_ANNOTATION = "sublimate.dev/local-privileged"
# Devices every container has (runc's default devices), bound from this machine's /dev.
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
# The node's accelerators: what a GPU pod would be given by its device plugin.
ACCELERATORS = ("nvidia*", "nvidia-caps", "dri", "kfd")
# runc's readonlyPaths under /proc, and a path it masks.
PROC_READ_ONLY = ("bus", "fs", "irq", "sys", "sysrq-trigger")
PROC_MASKED = ("kcore", "keys", "timer_list")
FORWARDED = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
                       signal.SIGUSR1, signal.SIGUSR2})

_CLONE_NEWNS = 0x00020000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 24, 38
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}
_SYS_CAPGET = {"x86_64": 125, "aarch64": 90, "ppc64le": 183, "s390x": 184}
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91, "ppc64le": 184, "s390x": 185}
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class Sandbox(NamedTuple):
    """What contains one container's processes; None in a ``PodRequest`` where the pod is not
    contained (a privileged one, or a mode without a private view)."""

    keep: frozenset[int]  # the capabilities left in the bounding set
    no_new_privs: bool
    devices: tuple[str, ...]  # this machine's device paths bound into the pod's /dev


def _truthy(value: object) -> bool:
    return value is True or str(value).strip().lower() == "true"


def _capability(name: object, where: str) -> int | None:
    """A capability's number (None for ALL); ``NodeError`` naming the field for an unknown
    (one a parameter named: the literal ones were refused with the manifest)."""
    try:
        return capability(name)
    except ValueError as exc:
        raise NodeError(f"{where}: {exc}") from None


def plan_sandbox(body: dict, annotations: dict | None, where: str) -> Sandbox | None:
    """The sandbox of a container from its (substituted) body's ``securityContext`` and the
    template's annotations; None for a privileged one (``privileged: true``, or the local
    runner's own annotation)."""
    context = body.get("securityContext") or {}
    if not isinstance(context, dict):
        raise NodeError(f"{where}.securityContext: must be an object")
    if _truthy(context.get("privileged")) or _truthy(
            (annotations or {}).get(PRIVILEGED_ANNOTATION)):
        return None
    keep = {CAPABILITIES[name] for name in DEFAULT_CAPABILITIES}
    asked = context.get("capabilities") or {}
    for key in ("drop", "add"):  # Kubernetes applies drop first (ALL then a few back)
        for name in asked.get(key) or ():
            number = _capability(name, f"{where}.securityContext.capabilities.{key}")
            every = set(CAPABILITIES.values()) if number is None else {number}
            keep = keep - every if key == "drop" else keep | every
    escalation = context.get("allowPrivilegeEscalation")
    return Sandbox(frozenset(keep), not _truthy(escalation) if escalation is not None else True,
                   machine_devices())


def privilege_requests(template: dict, annotations: dict | None = None) -> list[str]:
    """Each field of a template that asks for more than a contained pod (``privileged``,
    ``allowPrivilegeEscalation``, ``capabilities.add``, the local runner's annotation), by its
    path in the template; ``annotations``: the pod's, substituted (else the template's own).
    A value that a parameter fills (``{{...}}``) is left for the pod's start, when it is
    known: the run checks again there (``plan.plan_pod``)."""
    if annotations is None:
        annotations = (template.get("metadata") or {}).get("annotations") or {}
    found = []
    if _asks((annotations or {}).get(PRIVILEGED_ANNOTATION)):
        found.append(f"metadata.annotations.{PRIVILEGED_ANNOTATION}")
    bodies = [(key, template[key]) for key in ("container", "script")
              if isinstance(template.get(key), dict)]
    for key in ("initContainers", "sidecars"):
        bodies += [(f"{key}[{i}]", b) for i, b in enumerate(template.get(key) or [])]
    bodies += [(f"containerSet.containers[{i}]", b) for i, b in
               enumerate((template.get("containerSet") or {}).get("containers") or [])]
    for field, body in bodies:
        context = body.get("securityContext") if isinstance(body, dict) else None
        if not isinstance(context, dict):
            continue
        for key in ("privileged", "allowPrivilegeEscalation"):
            if _asks(context.get(key)):
                found.append(f"{field}.securityContext.{key}")
        added = (context.get("capabilities") or {}).get("add") if isinstance(
            context.get("capabilities"), dict) else None
        if added and "{{" not in str(added):
            found.append(f"{field}.securityContext.capabilities.add")
    return found


def _asks(value: object) -> bool:
    """Whether a field's value asks for the privilege: anything but absent or false (a value
    left to a parameter is decided at the pod's start)."""
    if value is None or value is False:
        return False
    text = str(value).strip().lower()
    return text != "false" and "{{" not in text


_devices: tuple[str, ...] | None = None


def machine_devices() -> tuple[str, ...]:
    """This machine's devices a pod gets: the default ones and its accelerators (listed once
    per process: devices do not come and go during a run)."""
    global _devices
    if _devices is None:
        found = [f"/dev/{name}" for name in DEVICES if os.path.exists(f"/dev/{name}")]
        for pattern in ACCELERATORS:
            found += sorted(glob.glob(f"/dev/{pattern}"))
        _devices = tuple(dict.fromkeys(found))
    return _devices


# ------------------------------------------------------------------- the view's system calls


def hidden_host_mount(point: str) -> bool:
    """Whether a host mount is left out of a contained pod's view: its /proc, /dev and /sys
    are its own (``view_steps``)."""
    return any(point == top or point.startswith(top + "/") for top in ("/proc", "/dev", "/sys"))


def view_steps(root: bytes, sandbox: Sandbox) -> list[tuple]:
    """The steps, before the pivot, that give a contained pod its /sys and /dev (its /proc is
    mounted by its namespace's init)."""
    steps: list[tuple] = [("sys", root + b"/sys"),
                          ("dev-tmpfs", root + b"/dev")]
    for device in sandbox.devices:
        target = root + os.fsencode(device)
        info = os.stat(device)
        if stat.S_ISCHR(info.st_mode):  # made, as runc makes them: no mount to set up and tear down
            steps.append(("mknod", target, info.st_mode, info.st_rdev))
            continue
        steps.append(("mkdirs" if os.path.isdir(device) else "touch-path", target))
        steps.append(("bind", os.fsencode(device), target))
    steps += [("devpts", root + b"/dev/pts"), ("dev-shm", root + b"/dev/shm")]
    for name, target in (("ptmx", b"pts/ptmx"), ("fd", b"/proc/self/fd"),
                         ("stdin", b"/proc/self/fd/0"), ("stdout", b"/proc/self/fd/1"),
                         ("stderr", b"/proc/self/fd/2")):
        steps.append(("symlink", target, root + b"/dev/" + name.encode()))
    return steps


class Calls(NamedTuple):
    """libc functions the forked processes call, resolved in the runner."""

    mount: object
    umount2: object
    unshare: object
    setns: object
    prctl: object
    syscall: object
    get_errno: object
    pivot_root: int
    capget: int
    capset: int
    last_capability: int


_calls: Calls | None = None


def calls() -> Calls:
    global _calls
    if _calls is None:
        import ctypes  # deferred: only a run with contained pods pays for it

        libc = ctypes.CDLL(None, use_errno=True)
        machine = os.uname().machine
        if machine not in _SYS_PIVOT_ROOT:
            raise OSError(f"no pivot_root system call number known for {machine}")
        with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as last:
            last_capability = int(last.read())
        _calls = Calls(libc.mount, libc.umount2, libc.unshare, libc.setns, libc.prctl,
                       libc.syscall, ctypes.get_errno, _SYS_PIVOT_ROOT[machine],
                       _SYS_CAPGET[machine], _SYS_CAPSET[machine], last_capability)
    return _calls


def _check(c: Calls, result: int, what: str) -> None:
    if result != 0:
        errno = c.get_errno()  # type: ignore[operator]
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


SANDBOX_STEPS = frozenset({"sys", "dev-tmpfs", "mknod", "devpts", "dev-shm", "pivot", "enter"})


def run_step(c: Calls, step: tuple) -> None:
    """One of ``SANDBOX_STEPS`` in the child."""
    kind = step[0]
    if kind == "sys":  # this machine's /sys, without its submounts (cgroups), read-only
        _check(c, c.mount(b"/sys", step[1], None, 4096, None), "bind /sys")  # type: ignore[operator]
        _check(c, c.mount(None, step[1], None, 4096 | 32 | 1 | _MS_NOSUID | _MS_NODEV  # type: ignore[operator]
                          | _MS_NOEXEC, None), "read-only /sys")
    elif kind == "dev-tmpfs":
        _check(c, c.mount(b"tmpfs", step[1], b"tmpfs", _MS_NOSUID | _MS_NOEXEC,  # type: ignore[operator]
                          b"mode=755,size=65536k"), "tmpfs on /dev")
    elif kind == "devpts":
        os.makedirs(step[1], 0o755, exist_ok=True)
        _check(c, c.mount(b"devpts", step[1], b"devpts", _MS_NOSUID | _MS_NOEXEC,  # type: ignore[operator]
                          b"newinstance,ptmxmode=0666,mode=0620"), "devpts on /dev/pts")
    elif kind == "dev-shm":
        os.makedirs(step[1], 0o755, exist_ok=True)
        _check(c, c.mount(b"shm", step[1], b"tmpfs", _MS_NOSUID | _MS_NODEV,  # type: ignore[operator]
                          b"mode=1777"), "tmpfs on /dev/shm")
    elif kind == "mknod":
        os.mknod(step[1], step[2], step[3])
        os.chmod(step[1], step[2] & 0o7777)  # the host's mode, not the umask's
    elif kind == "pivot":
        # pivot_root(".", ".") stacks the old root under the new one; detaching it leaves
        # nothing of this machine's tree reachable (a chroot could be left by a second one).
        os.chdir(step[1])
        _check(c, c.syscall(c.pivot_root, b".", b"."), "pivot_root")  # type: ignore[operator]
        _check(c, c.umount2(b".", 2), "detach the old root")  # type: ignore[operator]
        os.chdir("/")
    elif kind == "enter":
        enter(c, step[1])


def joining(pid: int, cwd: str, sandbox: Sandbox | None) -> Callable[[], None]:
    """What a process run in a pod from outside (an ``exec`` readiness probe, as the kubelet
    runs one in the container) does before ``exec``: enter the mount namespace of the pod's
    process ``pid`` (its pivoted root with it) and the namespace its children get, go to
    ``cwd``, and drop what the pod's own command dropped."""
    c = calls()
    mount_ns, pid_ns = f"/proc/{pid}/ns/mnt", f"/proc/{pid}/ns/pid_for_children"

    def join() -> None:
        for path, kind in ((pid_ns, _CLONE_NEWPID), (mount_ns, _CLONE_NEWNS)):
            fd = os.open(path, os.O_RDONLY)
            try:
                _check(c, c.setns(fd, kind), f"setns {path}")  # type: ignore[operator]
            finally:
                os.close(fd)
        os.chdir(cwd)
        if sandbox is not None:
            _drop_privileges(c, sandbox)

    return join


# ------------------------------------------------------------------- the PID namespace


@contextlib.contextmanager
def children_in_new_pid_namespace() -> Iterator[None]:
    """While it holds, the calling thread's next child is PID 1 of a new PID namespace: the
    pod's first process is its namespace's init, with no process between it and the runner.
    ``unshare(CLONE_NEWPID)`` moves only the caller's children, and only this thread's (each
    pod starts from a thread of its own; others go on forking into this machine's namespace);
    the thread's own is restored after."""
    c = calls()
    saved = os.open("/proc/thread-self/ns/pid_for_children", os.O_RDONLY)
    try:
        _check(c, c.unshare(_CLONE_NEWPID), "unshare(CLONE_NEWPID)")  # type: ignore[operator]
        yield
    finally:
        try:
            _check(c, c.setns(saved, _CLONE_NEWPID), "setns back")  # type: ignore[operator]
        finally:
            os.close(saved)


def enter(c: Calls, sandbox: Sandbox) -> None:
    """The last step, in the pod's first process, which the runner started as PID 1 of a new
    PID namespace (``children_in_new_pid_namespace``): mount its ``/proc``, fork the command
    and be its init. Returns in the command only (which then ``exec``s); the init exits with
    the command's status."""
    if os.getpid() != 1:
        raise OSError(22, "the pod's first process is not its PID namespace's init")
    _check(c, c.unshare(_CLONE_NEWIPC), "unshare(CLONE_NEWIPC)")  # type: ignore[operator]
    # Blocked, the signals queue for sigwaitinfo (an init ignores those it has no handler for).
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED | {signal.SIGCHLD})
    _mount_proc(c)
    command = os.fork()
    if command:
        # Both sides set the group, so that no signal passed on finds the command outside it;
        # the runner signals the init's group, which then holds the init alone.
        with contextlib.suppress(OSError):
            os.setpgid(command, command)
        os.closerange(0, 1 << 20)  # the init holds nothing of the pod's (its pipes, the exec check)
        _wait_for(command, lambda number: os.killpg(command, number), reap_all=True)
    os.setpgid(0, 0)
    _drop_privileges(c, sandbox)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def _wait_for(child: int, forward: object, reap_all: bool = False) -> None:
    """Pass the forwarded signals on, reap, and exit with ``child``'s status when it ends."""
    watched = FORWARDED | {signal.SIGCHLD}
    while True:
        number = signal.sigwaitinfo(watched).si_signo
        if number != signal.SIGCHLD:
            with contextlib.suppress(ProcessLookupError):
                forward(number)  # type: ignore[operator]
            continue
        while True:
            try:
                pid, status = os.waitpid(-1 if reap_all else child, os.WNOHANG)
            except ChildProcessError:
                os._exit(1)
            if pid == 0:
                break
            if pid == child:
                code = os.waitstatus_to_exitcode(status)
                os._exit(128 - code if code < 0 else code)


def _mount_proc(c: Calls) -> None:
    _check(c, c.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None),  # type: ignore[operator]
           "mount /proc")
    for name in PROC_READ_ONLY:
        path = b"/proc/" + name.encode()
        if os.path.exists(path):
            _check(c, c.mount(path, path, None, 4096 | 16384, None), f"bind /proc/{name}")  # type: ignore[operator]
            _check(c, c.mount(None, path, None, 4096 | 16384 | 32 | 1, None),  # type: ignore[operator]
                   f"read-only /proc/{name}")
    for name in PROC_MASKED:
        path = b"/proc/" + name.encode()
        if os.path.exists(path):
            _check(c, c.mount(b"/dev/null", path, None, 4096, None), f"mask /proc/{name}")  # type: ignore[operator]


def _drop_privileges(c: Calls, sandbox: Sandbox) -> None:
    """Leave only ``sandbox.keep`` in the bounding set (what the command's ``exec`` as root
    can have), clear the inheritable and ambient sets, and set ``no_new_privs``."""
    for number in range(c.last_capability + 1):
        if number not in sandbox.keep:
            _check(c, c.prctl(_PR_CAPBSET_DROP, number, 0, 0, 0), "drop a capability")  # type: ignore[operator]
    c.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # type: ignore[operator]
    _clear_inheritable(c, sandbox.keep)
    if sandbox.no_new_privs:
        _check(c, c.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")  # type: ignore[operator]


def _clear_inheritable(c: Calls, keep: Iterable[int]) -> None:
    """capset: permitted and effective limited to ``keep``, inheritable empty (root's ``exec``
    adds the inheritable set to the bounding set's)."""
    import ctypes

    mask = sum(1 << n for n in keep)
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    _check(c, c.syscall(c.capget, header, data), "capget")  # type: ignore[operator]
    for word in range(2):
        part = (mask >> (32 * word)) & 0xFFFFFFFF
        data[3 * word] &= part  # effective
        data[3 * word + 1] &= part  # permitted
        data[3 * word + 2] = 0  # inheritable
    _check(c, c.syscall(c.capset, header, data), "capset")  # type: ignore[operator]
