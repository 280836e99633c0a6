"""A pod's files are its own: every pod (every container of a pod) sees the whole tree through a
private, writable layer, as each container on a cluster has its own root filesystem.

On Argo a step may write ``/result.txt`` or ``/tmp/out.txt`` and declare it as an output, and
two pods of a loop may both ``mkdir /mnt/out``. Locally each pod's process starts in a mount
namespace of its own (``--mounts overlay``, the default where the machine allows it) holding:

- the host's filesystems read-only under a writable layer of the pod's own (overlayfs:
  ``lowerdir`` the host's folder, ``upperdir`` the pod's ``fs/`` in its node folder, mount
  option ``volatile``: the layer is disposable, so its unmount never waits for the disk). The
  root filesystem gets one, and so does every other disk or tmpfs filesystem mounted whole on
  the host (``/tmp`` on a tmpfs, ``/home`` on its own disk); anything else (``/proc``, ``/sys``,
  ``/dev``, a folder or file bound from elsewhere) is bound as it is;
- the template's volumes, the script (``/argo/staging/script``) and the termination-message
  file bound at their real paths (a mount point the view lacks is made in the view, so in the
  pod's layer: nothing is created on the host); input artifacts are loaded into the pod's
  layer at their paths (a sidecar sees the main container's through binds);
- a declared output (``outputs.parameters[].valueFrom.path``, ``outputs.artifacts[].path``)
  that exists on the host is masked before the pod starts (a whiteout for a file, an empty
  opaque folder for a folder): a fresh image would not have it, so an output the pod does not
  write is missing, as on Argo, rather than read from the host;
- ``chroot`` into the view, then the working directory: ``workingDir``, else ``/`` as in an
  image that sets none (made in the view if need be).

A pod's writes outside its volumes land in its ``fs/`` (the upper layer, laid out by container
path), and the pod sees nobody else's. The runner reads outputs there afterwards (``find``:
under a bound folder, at its host folder; elsewhere in ``fs/``, a whiteout meaning removed),
and ``fs/`` stays in the node folder for a look at what the pod wrote. The mount point and the
overlay's work folders stay too, in ``.view/``: nothing waits for the kernel to tear a pod's
namespace down (an rmdir of the mount point would, tens of ms on a busy machine).

Nothing about the host's folders is listed when a pod is planned (today's fallback, ``mounts``,
binds each entry of a host folder it mirrors, which races with whoever removes one), so a run
does not depend on what other processes do to ``/tmp``.

Where this cannot be done (not root: an overlay of ``/`` in a user namespace is refused; no
overlayfs; a kernel that refuses the layers) ``probe`` says why once, and the run falls back to
``mounts``' namespaces, then to rewritten paths. As in ``mounts``, every decision is taken in
the runner; the forked child only makes system calls through libc functions resolved
beforehand.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from .artifacts import Input, load_input
from .mounts import (
    SCRIPT_PATH,
    Bind,
    _check,
    _Libc,
    _resolve_libc,
    in_child,
    try_in_child,
)
from .mounts import _run_step as run_mount_step
from .sandbox import SANDBOX_STEPS, Sandbox, hidden_host_mount, view_steps
from .sandbox import calls as sandbox_calls
from .sandbox import run_step as run_sandbox_step

if TYPE_CHECKING:
    from .inside import InRoot

# Filesystems a private layer goes over (a plain tree of folders and files, writable, mounted
# whole); any other mount (proc, sysfs, devtmpfs, cgroup, a read-only, special or bind mount) is
# bound as it is.
_LAYERED = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "f2fs", "jfs", "reiserfs",
                      "zfs", "bcachefs"})
OPAQUE = "trusted.overlay.opaque"


class HostMount(NamedTuple):
    """A mount of the host's tree the view reproduces: ``layered`` gets a private layer of its
    own, otherwise it is bound recursively (its own submounts with it)."""

    point: str
    layered: bool


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...).
    return field.encode().decode("unicode_escape") if "\\" in field else field


def host_mounts(mountinfo: str | None = None) -> tuple[HostMount, ...]:
    """The host's mounts in tree order, from ``/proc/self/mountinfo``: ``/`` first, then each
    filesystem layered or bound; nothing below a bound mount (the bind brings it)."""
    if mountinfo is None:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as rows:
            mountinfo = rows.read()
    children: dict[str, list[tuple[str, str, bool]]] = {}
    root_id = ""
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 10:
            continue
        mount_id, parent, point = fields[0], fields[1], _unescape(fields[4])
        dash = fields.index("-")
        fstype, writable = fields[dash + 1], fields[5].split(",")[0] == "rw"
        if point == "/":
            root_id = mount_id  # the last mount on / is the one seen
            continue
        # Only a whole filesystem gets a layer; a folder or file bound from elsewhere (a
        # container's /etc/hosts, /run/netns) is bound as it is.
        whole = fields[3] == "/"
        children.setdefault(parent, []).append(
            (mount_id, point, fstype in _LAYERED and writable and whole))
    found = [HostMount("/", True)]

    def visit(parent: str) -> None:
        seen: dict[str, tuple[str, bool]] = {}
        for mount_id, point, layered in children.get(parent, []):
            seen[point] = (mount_id, layered)  # a later mount on the same point hides the first
        for point in sorted(seen, key=lambda p: (p.count("/"), p)):
            mount_id, layered = seen[point]
            layered = layered and os.path.isdir(point) and not os.path.islink(point)
            found.append(HostMount(point, layered))
            if layered:
                visit(mount_id)

    visit(root_id)
    return tuple(found)


_host_mounts: tuple[HostMount, ...] | None = None


def run_host_mounts() -> tuple[HostMount, ...]:
    """The host's mounts, read once per process (a run's pods all see the same tree)."""
    global _host_mounts
    if _host_mounts is None:
        _host_mounts = host_mounts()
    return _host_mounts


class View(NamedTuple):
    """One container's private view: its folder (``fs/``, its layer; ``.view/``, the mount
    point and the work folders), what is bound where, the declared outputs (masked where the
    host has them, read from the layer), and the working directory."""

    folder: Path
    binds: tuple[Bind, ...]
    outputs: tuple[str, ...]  # container paths of declared outputs, in the layer
    cwd: str
    sandbox: Sandbox | None = None  # what contains its processes (None: privileged)

    @property
    def upper(self) -> Path:
        return self.folder / "fs"

    @property
    def root(self) -> Path:
        return self.folder / ".view" / "root"

    @property
    def work(self) -> Path:
        return self.folder / ".view" / "work"

    def locate(self, container_path: str) -> InRoot:
        """Where the content of a container path is now that the pod has ended: under a bound
        folder, in its host folder; elsewhere in the pod's layer. Each is a root: the path is
        resolved inside it when read (``inside``), so a link the pod left (``/mnt/vol/out ->
        /etc/shadow``) is followed inside its volume or layer, never to this machine's file.
        Outputs are masked, so the host's copy does not count; a whiteout is a removal."""
        from .inside import InRoot  # a pod with outputs pays for it

        path = os.path.normpath("/" + container_path.lstrip("/"))
        for bind in sorted(self.binds, key=lambda b: len(b.target), reverse=True):
            target = bind.target.rstrip("/") or "/"
            if path == target:
                return InRoot(bind.source)
            if path.startswith(target.rstrip("/") + "/"):
                return InRoot(bind.source, os.path.relpath(path, target))
        return InRoot(self.upper, path.lstrip("/"))

    def find(self, container_path: str) -> Path | None:
        """Where ``locate``'s path lies on this machine (for a look), None when the pod did
        not leave one there."""
        from .inside import find

        return find(self.locate(container_path))


def plan_view(folder: Path, mounts: list, outputs: list[str], working_dir: str,
              termination_log: Path, script: Path | None = None,
              sandbox: Sandbox | None = None) -> View:
    """A container's view, planned from what its template declares (``mounts``:
    ``plan.Mount``s; ``folder`` holds its layer, the node folder for a pod's main container).
    Bound: what lives elsewhere than its layer (volumes, a main container's input artifacts
    seen from a sidecar), the script, and the termination-message file (at its own path, which
    ``$SUBLIMATE_TERMINATION_LOG`` names). The working directory is ``workingDir``, else ``/``,
    as in an image that sets none (Argo's examples write ``result.txt`` there and declare
    ``/result.txt``). Outputs not under a bind are masked where the host has them."""
    upper = folder / "fs"
    binds = [Bind(m.path, m.local, m.read_only) for m in mounts
             if not m.local.is_relative_to(upper)]
    binds.append(Bind(str(termination_log), termination_log))
    if script is not None:
        binds.append(Bind(SCRIPT_PATH, script, read_only=True))
    kept = sorted(binds, key=lambda b: (b.target.rstrip("/").count("/"), b.target))
    outputs = [path for path in outputs if not any(_under(path, b.target) for b in kept)]
    return View(folder, tuple(kept), tuple(dict.fromkeys(outputs)), working_dir or "/",
                sandbox)


def _under(path: str, folder: str) -> bool:
    folder = folder.rstrip("/")
    return path == folder or path.startswith(folder + "/")


# ------------------------------------------------------------------------ probing


_lock = threading.Lock()
_probed: dict[str, str] = {}


def probe(folder: Path, remember: Path | None = None) -> str:
    """Why pods cannot have private views with their layers in ``folder`` ("" when they can):
    a forked child builds a view of the whole tree (every layer this machine's mounts need)
    and exits (~3 ms; tens on a busy machine). Asked once per process and filesystem; a
    success is also remembered in the file ``remember`` for this boot, user, filesystem and
    mount namespace, so the next run on this machine starts without it."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    key = _machine_key(existing)
    with _lock:
        if key not in _probed:
            if remember is not None and _remembered(remember) == key:
                _probed[key] = ""
            else:
                _probed[key] = _probe(folder)
                if not _probed[key] and remember is not None:
                    _remember(remember, key)
        return _probed[key]


def _machine_key(folder: Path) -> str:
    """What a probe's answer holds for: this boot, user, filesystem and mount namespace (a new
    kernel or a changed machine is a new boot; another container, another namespace)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as boot:
            boot_id = boot.read().strip()
        namespace = os.readlink("/proc/self/ns/mnt")
    except OSError:
        boot_id = namespace = "?"
    return (f"{boot_id} {os.uname().release} uid={os.geteuid()} "
            f"dev={os.stat(folder).st_dev} {namespace}")


def _remembered(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def _remember(path: Path, key: str) -> None:
    """Write the key (a temporary file renamed over it; no fsync: a lost one costs a probe)."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}")
        temporary.write_text(key + "\n", encoding="utf-8")
        os.replace(temporary, path)


def _probe(folder: Path) -> str:
    if not hasattr(os, "fork") or not Path("/proc/self/mountinfo").exists():
        return "not Linux"
    if os.geteuid() != 0:
        return "not root: an overlay of / is refused in a user namespace"
    try:
        with open("/proc/filesystems", encoding="utf-8") as known:
            if "overlay" not in known.read().split():
                return "no overlayfs in this kernel"
        _resolve_libc()
        mounts = run_host_mounts()
    except (OSError, AttributeError) as exc:
        return f"cannot read this machine's mounts ({exc})"
    view = View(folder / f".probe-{os.getpid()}", (), (), "/")
    try:
        _prepare(view, mounts)
        steps = _steps(view, mounts, _fresh_work(view))
    except OSError as exc:
        shutil.rmtree(view.folder, ignore_errors=True)
        return f"cannot make a layer in {folder} ({exc.strerror or exc})"
    failed = try_in_child(steps, _run_step, 0, 0)
    _remove_later(view.folder)
    return failed


def _remove_later(folder: Path) -> None:
    """Remove a folder in a thread of its own: an rmdir of a mount point (in a namespace that
    is ending) waits for the kernel to finish tearing that namespace down, tens of ms on a busy
    machine, which nobody needs to wait for."""
    threading.Thread(target=shutil.rmtree, args=(folder,), kwargs={"ignore_errors": True},
                     daemon=True).start()


# ------------------------------------------------------------------- building a view


_works = itertools.count()


def _fresh_work(view: View) -> Path:
    """A new, empty work folder for each start: overlayfs refuses to mount a ``volatile`` one
    used before (and a containerSet's retry keeps its layer but starts again)."""
    work = view.work / str(next(_works))
    work.mkdir(parents=True)
    return work


def _prepare(view: View, mounts: tuple[HostMount, ...]) -> None:
    """In the runner, before the start: the layers, the mount point, the masks."""
    for mount in mounts:
        if mount.layered:
            make_folders(view.upper, mount.point)
    view.root.mkdir(parents=True, exist_ok=True)
    for path in view.outputs:
        if os.path.lexists(path) and not os.path.lexists(view.upper / path.lstrip("/")):
            _mask(view.upper, path, os.path.isdir(path) and not os.path.islink(path))


def make_folders(upper: Path, container_path: str) -> Path:
    """``upper/<container_path>`` and the folders above it, each made as the view would copy
    it up: with the host folder's mode and owner where the host has one (else ``/tmp`` in the
    view would lose its sticky, world-writable mode); returns the folder."""
    current, host = upper, "/"
    for part in ["", *container_path.strip("/").split("/")]:
        if part:
            current, host = current / part, os.path.join(host, part)
        if current.is_dir():
            continue
        current.mkdir(parents=True)
        with contextlib.suppress(OSError):
            info = os.stat(host)
            if stat.S_ISDIR(info.st_mode):
                os.chown(current, info.st_uid, info.st_gid)
                os.chmod(current, stat.S_IMODE(info.st_mode))
    return current


def load_into_layer(view: View, art: Input) -> None:
    """Load an input artifact into the pod's layer, at its container path: the folders above
    it made as the view would copy them up; a folder the host also has is made opaque (an
    artifact's folder holds the artifact alone, as the emptyDir Argo mounts there does)."""
    make_folders(view.upper, os.path.dirname(
        "/" + str(art.target.relative_to(view.upper)).rstrip("/")))
    load_input(art)
    container_path = "/" + str(art.target.relative_to(view.upper))
    if art.target.is_dir() and os.path.isdir(container_path):
        os.setxattr(art.target, OPAQUE, b"y")


def _mask(upper: Path, path: str, folder: bool) -> None:
    """Hide a host path in the view (overlayfs.rst "whiteouts and opaque directories"): an
    opaque empty folder for a folder, a whiteout (a 0/0 character device) for anything else."""
    target = make_folders(upper, os.path.dirname(path.rstrip("/"))) / os.path.basename(
        path.rstrip("/"))
    if folder:
        target.mkdir()
        os.setxattr(target, OPAQUE, b"y")
    else:
        os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(0, 0))


def _steps(view: View, mounts: tuple[HostMount, ...], work: Path) -> list[tuple]:
    """The system calls that build the view, in order (run by ``_run_step`` in the child)."""
    root = os.fsencode(view.root)
    upper = os.fsencode(view.upper)
    steps: list[tuple] = []
    for index, mount in enumerate(mounts):
        if view.sandbox is not None and hidden_host_mount(mount.point):
            continue  # its own /proc, /dev and /sys (``sandbox``)
        point = os.fsencode(mount.point)
        target = root if mount.point == "/" else root + point
        if not mount.layered:
            steps.append(("host-bind", point, target))
            continue
        layer = upper if mount.point == "/" else upper + point
        layer_work = work / str(index)
        layer_work.mkdir()
        steps.append(("overlay" if mount.point == "/" else "host-overlay", target,
                      b"lowerdir=%s,upperdir=%s,workdir=%s,volatile" % (
                          point, layer, os.fsencode(layer_work))))
    if view.sandbox is not None:
        steps += view_steps(root, view.sandbox)
    for bind in view.binds:
        # A link on the way is followed as the view would (the view is the host's tree), but
        # within the view: the system calls run before the chroot.
        resolved = os.path.join(os.path.realpath(os.path.dirname(bind.target.rstrip("/"))),
                                os.path.basename(bind.target.rstrip("/")))
        target = root + os.fsencode(resolved)
        steps.append(("mkdirs" if bind.source.is_dir() else "touch-path", target))
        steps.append(("bind", os.fsencode(bind.source), target))
        if bind.read_only:
            steps.append(("readonly", target))
    steps.append(("pivot", root))
    steps.append(("mkdirs", os.fsencode(view.cwd)))
    steps.append(("chdir", os.fsencode(view.cwd)))
    if view.sandbox is not None:
        steps.append(("enter", view.sandbox))
    return steps


def setup(view: View, termination_log: Path) -> Callable[[], None]:
    """Prepare the view (the layers, the masks) and return what the forked child runs before
    ``exec`` (after ``PR_SET_PDEATHSIG``): it builds the view; on failure it says why on stderr
    and in the termination log and exits with ``SETUP_FAILED``, so the node fails with it."""
    mounts = run_host_mounts()
    _prepare(view, mounts)
    sandbox_calls()  # resolved here, never in the forked child
    termination_log.touch()  # bound in the view: what the pod writes there reaches the host
    return in_child(_steps(view, mounts, _fresh_work(view)), _run_step, termination_log,
                    "private view", 0, 0)


def _run_step(libc: _Libc, step: tuple) -> None:
    """One step in the child; binds, read-only remounts, ``chroot`` and ``chdir`` as the
    mirrored namespaces make them (``mounts``)."""
    kind = step[0]
    if kind in SANDBOX_STEPS:
        run_sandbox_step(sandbox_calls(), step)
    elif kind.startswith("host-"):
        # A mount of the host's listed when the run began: one unmounted since is gone from
        # the view too, as it is from the host (ENOENT), not a reason to fail the pod.
        with contextlib.suppress(FileNotFoundError):
            _run_step(libc, (kind.removeprefix("host-"), *step[1:]))
    elif kind == "overlay":
        _check(libc, libc.mount(b"overlay", step[1], b"overlay", 0, step[2]),
               f"overlay on {os.fsdecode(step[1])}")
    elif kind == "mkdirs":
        os.makedirs(step[1], 0o755, exist_ok=True)
    elif kind == "touch-path":
        os.makedirs(os.path.dirname(step[1]), 0o755, exist_ok=True)
        os.close(os.open(step[1], os.O_WRONLY | os.O_CREAT, 0o644))
    else:
        run_mount_step(libc, step)
