"""Container mode (``sublimate run --containers``): each pod's containers run in their own images.

The run is planned as in process mode (``plan``): the same volumes, emptyDirs, input artifacts,
outputs and script, but with the manifest's paths left as written, since inside the image they
are real. ``ImageExecutor`` then runs each container through a container engine
(``images.engines``) as Argo's emissary and wait container would:

- its volumes (claims, claim templates, emptyDirs: the folders process mode uses) are bound at
  their ``mountPath``s; its input artifacts, loaded as in process mode, are bound at their
  paths (Argo mounts each one there); a script template's source at ``/argo/staging/script``;
- the command is Kubernetes': ``command`` + ``args``; with no ``command``, the image's
  ENTRYPOINT + ``args``, or + its CMD when there are no ``args`` either;
- the environment is the template's ``env`` (and the optional secrets it names, from this
  machine's environment), what ``sublimate run --env`` passed, plus ``SUBLIMATE_LOCAL_RUN`` and
  the termination-message file (``environment.pod_environment``); the runner's own environment
  (``PATH``, ``HOME``, ...) stays outside: the image has its own;
- ``workingDir``, and ``runAsUser``/``runAsGroup``/``runAsNonRoot`` from the container's
  ``securityContext``, else the pod's (the template's, else ``spec.securityContext``); the
  pod's ``fsGroup`` makes its volumes group-owned and group-writable as the kubelet does
  (``fsGroupChangePolicy: OnRootMismatch``), and emptyDirs are world-writable (0777) as
  Kubernetes makes them;
- the termination message: Kubernetes binds a file at ``/dev/termination-log``; buildah's
  chroot isolation shares the host's read-only ``/dev``, so the file is bound at
  ``TERMINATION_PATH`` and ``$SUBLIMATE_TERMINATION_LOG`` names it (``components.termination``
  writes there);
- once the command has ended, output parameters' ``valueFrom.path`` and output artifacts are
  copied out of the container's own filesystem (those on a volume are already local), then the
  container is removed, always: in a ``finally``, and by the run's keeper
  (``images.keeper``) if the runner is killed first;
- a stop (a deadline, Ctrl-C) sends SIGTERM to the step's processes, not to the engine's own
  (buildah kills its command outright when it is signalled), then SIGKILL to them all after
  the grace period, as in process mode.

Before anything starts (``image_executor``), every image the run's templates name, once the
workflow's parameters are substituted, must be present locally: the run is refused with one
error naming each missing image and its templates. An image known only at run time (from a
task's argument) is looked up when its pod starts, and a missing one fails that pod. Nothing
is ever pulled.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from sublimate.components.base.runtime import DEFAULT_IMAGE

from ..environment import pod_environment
from ..executor import PodHooks, PodOutcome, await_pod
from ..local_process import KILL_GRACE_S, LocalProcess
from ..mounts import SCRIPT_PATH, Bind
from ..paths import PathMap
from . import keeper as keeper_script
from .engines import (
    COMMAND_TIMEOUT_S,
    ContainerEngineError,
    Engine,
    ImageConfig,
    RunSpec,
    choose_engine,
    last_line,
)
from .keeper import container_processes
from .spec import InImage, template_images

if TYPE_CHECKING:
    from ..plan import Container, PodRequest

# Where a container finds its termination-message file (see the module docstring).
TERMINATION_PATH = "/argo/termination-log"
_GROUP_MASK = 0o660  # the kubelet's rwMask for a volume's files under fsGroup
_DIR_MASK = 0o660 | 0o110 | stat.S_ISGID  # and for its folders: searchable, setgid


# ----------------------------------------------------------------------------- up front


def image_executor(workflow: dict, parameters: dict[str, str], requested: str = "auto"
                   ) -> ImageExecutor:
    """The executor of a run in container mode, once an engine works here and every image the
    workflow names is present locally; ``ContainerEngineError`` (before anything exists)
    saying what is missing and how to get it."""
    engine = choose_engine(requested)
    images, problems = template_images(workflow, parameters)
    configs: dict[str, ImageConfig] = {}
    missing: dict[str, str] = {}
    for image in images:
        found = engine.inspect(image)
        if isinstance(found, str):
            missing[image] = found
        else:
            configs[image] = found
    if problems:
        raise ContainerEngineError("--containers: " + "; ".join(problems))
    if missing:
        raise ContainerEngineError(missing_images_message(engine, missing, images))
    return ImageExecutor(engine, configs)


def missing_images_message(engine: Engine, missing: dict[str, str],
                           users: dict[str, list[str]]) -> str:
    """One error for every missing image: its templates, what the engine said, and how to get
    it (an image with the same repository name under another registry: how to tag it)."""
    count = len(missing)
    lines = [f"--containers: {count} image{'s are' if count > 1 else ' is'} not present "
             f"locally for {engine.name} (a local run never pulls):"]
    local = engine.local_images()
    for image, why in missing.items():
        templates = users.get(image, [])
        label = "template" if len(templates) == 1 else "templates"
        line = f"  {image} ({label} {', '.join(templates)}): {why}"
        similar = [name for name in local if _repository(name) == _repository(image)]
        if similar:
            line += (f"; present as {', '.join(similar)}: "
                     f"`{engine.name} tag {similar[0]} {image}` gives it this name")
        lines.append(line)
    if DEFAULT_IMAGE in missing:  # sublimate's own pipelines' image: its script builds it
        lines.append(f"{DEFAULT_IMAGE} is sublimate's runtime image: `images/build.sh` (in a "
                     "sublimate checkout) builds it and gives it this name")
    lines.append(f"build it (`{engine.build_hint('NAME')}`) or pull it yourself "
                 f"(`{engine.pull_hint('NAME')}`), then run again")
    return "\n".join(lines)


def _repository(image: str) -> str:
    """``ghcr.io/org/sublimate:0.1.0`` -> ``sublimate:0.1.0`` (the name without registry)."""
    return image.rsplit("/", 1)[-1]


# ----------------------------------------------------------------------------- running


class ImageExecutor:
    """Runs each pod's containers in their images (see the module docstring)."""

    def __init__(self, engine: Engine, configs: dict[str, ImageConfig] | None = None) -> None:
        self.engine = engine
        self.configs = dict(configs or {})
        self.keeper = Keeper(engine)
        self._lock = threading.Lock()
        self._serial = itertools.count(1)

    def run(self, request: PodRequest, hooks: PodHooks) -> PodOutcome:
        if request.containers:  # init containers, sidecars or a containerSet
            from ..container_set import run_containers

            return run_containers(request, hooks, self.start)
        from ..container_set import main_container

        try:
            process = self.start(request, main_container(request), hooks.on_line)
        except OSError as exc:
            return PodOutcome(exit_code=None, error=str(exc))
        return await_pod(process, request, hooks)

    def start(self, request: PodRequest, container: Container,
              on_line: Callable[[str], None], append: bool = False) -> ContainerProcess:
        """Start one container of a pod (``containers.Start``); ``OSError`` saying why it
        cannot start (a missing image, the engine refusing it)."""
        spec = container.in_image
        if spec is None:
            raise OSError(f"{container.name}: not planned for container mode")
        if not spec.image:
            raise OSError(f"{container.name}: no image to run")
        config = self.image_config(spec.image)
        argv = list(spec.command or config.entrypoint)
        argv += list(spec.args) if spec.command or spec.args else list(config.cmd)
        if not argv:
            raise OSError(f"{spec.image}: no command to run (the template sets none, and the "
                          "image has neither ENTRYPOINT nor CMD)")
        user = container_user(spec, config)
        binds = container_binds(request, container)
        termination = container.termination_log
        if not append:
            termination.write_text("")
        termination.chmod(0o666)  # the step may run as any user
        _prepare_volumes(container, spec.fs_group, on_line)
        # as a local pod's (``environment``), but that the image supplies its part: the
        # engine's own environment (below) is this machine's and never reaches the container
        env = pod_environment(
            container.env,
            {"SUBLIMATE_LOCAL_RUN": "1", "SUBLIMATE_TERMINATION_LOG": TERMINATION_PATH},
            from_environment=container.from_environment, passed=request.passed_env,
            in_image=True)
        run = RunSpec(argv, binds, env, spec.working_dir, user,
                      (spec.fs_group,) if spec.fs_group is not None else ())
        outputs = output_paths(request, binds) if container.name == "main" else []
        name = f"sublimate-{os.getpid()}-{next(self._serial)}-{request.node_id}-{container.name}"
        process = ContainerProcess(self.engine, self.keeper, name, spec.image, run, outputs,
                                   container.log, request.folder, on_line, append,
                                   request.masked)
        process.start()
        return process

    def image_config(self, image: str) -> ImageConfig:
        """The image's configuration, looked up once (``OSError`` when it is not present)."""
        with self._lock:
            config = self.configs.get(image)
        if config is not None:
            return config
        found = self.engine.inspect(image)
        if isinstance(found, str):
            raise OSError(f"image {image} is not present locally for {self.engine.name} "
                          f"({found}); a local run never pulls: build it "
                          f"(`{self.engine.build_hint(image)}`) or pull it yourself "
                          f"(`{self.engine.pull_hint(image)}`)")
        with self._lock:
            self.configs[image] = found
        return found

    def close(self) -> None:
        """The run is over: its keeper removes what is left, if anything, and ends."""
        self.keeper.close()


def container_user(spec: InImage, config: ImageConfig) -> str:
    """``--user`` for the engine: runAsUser[:runAsGroup], the image's user with runAsGroup,
    or "" (the image's); ``OSError`` with the kubelet's words when runAsNonRoot cannot hold."""
    image_user = config.user.split(":", 1)[0]
    user = str(spec.run_as_user) if spec.run_as_user is not None else image_user
    if spec.run_as_non_root:
        if user and not user.isdigit():
            raise OSError(f"container has runAsNonRoot and image has non-numeric user ({user}), "
                          "cannot verify user is non-root")
        if not user or int(user) == 0:
            raise OSError("container has runAsNonRoot and image will run as root")
    if spec.run_as_group is not None:
        return f"{user or 0}:{spec.run_as_group}"
    return str(spec.run_as_user) if spec.run_as_user is not None else ""


def container_binds(request: PodRequest, container: Container) -> list[Bind]:
    """What is bound into a container: its volumes, its input artifacts (those not on a
    volume, when loaded), the script (the main container) and its termination-message file;
    shallowest first, so that a bind inside another lands on top of it."""
    volumes = [m for m in container.mounts if m.volume]
    binds = [Bind(m.path, m.local, m.read_only) for m in volumes]
    paths = PathMap(request.folder / "fs")
    for mount in container.mounts:
        paths.mount(mount.path, mount.local)
    spec = container.in_image
    for path in spec.inputs if spec is not None else ():
        if any(_under(path, m.path) for m in volumes):
            continue  # loaded into the volume's folder: the volume brings it
        local = paths.local(path)
        if local.exists():  # an optional artifact that was not supplied is not there
            binds.append(Bind(path, local))
    if container.name == "main" and request.script is not None:
        binds.append(Bind(SCRIPT_PATH, request.script_path, read_only=True))
    binds.append(Bind(TERMINATION_PATH, container.termination_log))
    return sorted(binds, key=lambda b: b.target.rstrip("/").count("/"))


def output_paths(request: PodRequest, binds: list[Bind]) -> list[tuple[str, Path]]:
    """The outputs to copy out of the main container once it has ended (container path,
    local path); those under a bind are already where the runner reads them."""
    found = []
    declared = [(p.get("valueFrom") or {}).get("path")
                for p in request.outputs.get("parameters") or []]
    declared += [a.get("path") for a in request.outputs.get("artifacts") or []]
    for path in declared:
        if path and not any(_under(str(path), b.target) for b in binds):
            found.append((str(path), request.local(str(path))))
    return found


def _under(path: str, folder: str) -> bool:
    folder = folder.rstrip("/") or "/"
    return path == folder or path.startswith(folder + "/") or folder == "/"


def _prepare_volumes(container: Container, fs_group: int | None,
                     on_line: Callable[[str], None]) -> None:
    """What the kubelet does to a pod's volumes before it starts: emptyDirs are 0777, and
    with an fsGroup every volume is owned by that group, group-writable, its folders setgid
    (skipped when the volume's root already is: ``OnRootMismatch``)."""
    for mount in container.mounts:
        if not mount.volume:
            continue
        try:
            if mount.kind == "emptyDir":
                mount.local.chmod(0o777)
            if fs_group is not None and not mount.read_only:
                _own_by_group(mount.local, fs_group)
        except PermissionError as exc:
            on_line(f"note: fsGroup {fs_group} not applied to {mount.path}: {exc}")


def _own_by_group(folder: Path, gid: int) -> None:
    info = folder.stat()
    if info.st_gid == gid and info.st_mode & _DIR_MASK == _DIR_MASK:
        return
    for root, dirs, files in os.walk(folder):  # links are not followed, only re-owned
        _set_group(root, gid, _DIR_MASK)
        for name in [*dirs, *files]:
            path = os.path.join(root, name)
            if os.path.islink(path):
                os.lchown(path, -1, gid)
            elif name in files:
                _set_group(path, gid, _GROUP_MASK)


def _set_group(path: str, gid: int, mask: int) -> None:
    os.chown(path, -1, gid)
    os.chmod(path, os.stat(path).st_mode | mask)


class ContainerProcess(LocalProcess):
    """A container's command through its engine: created, run, its outputs copied out and
    removed; stopped as the step itself would be (see the module docstring)."""

    def __init__(self, engine: Engine, keeper: Keeper, name: str, image: str, spec: RunSpec,
                 outputs: list[tuple[str, Path]], log_path: Path, cwd: Path,
                 on_line: Callable[[str], None] | None, append: bool,
                 masked: frozenset[str] = frozenset()) -> None:
        super().__init__(engine.run(name, image, spec), cwd, dict(os.environ), log_path,
                         on_line, append=append, die_with_runner=False,
                         engine_line=self._engine_line, masked=masked)
        self.engine = engine
        self.keeper = keeper
        self.name = name
        self.image = image
        self.outputs = outputs
        self.ended_by: int | None = None  # the signal that ended the command, if one did

    def start(self) -> None:
        self.keeper.watch(self.name)  # from now on, even a killed runner's container goes
        create = self.engine.create(self.name, self.image)
        if create is not None:
            done = subprocess.run(create, stdin=subprocess.DEVNULL, capture_output=True,
                                  text=True, timeout=COMMAND_TIMEOUT_S, check=False)
            if done.returncode != 0:
                self.keeper.forget(self.name)
                raise OSError(f"{self.engine.name} could not create a container of "
                              f"{self.image}: {last_line(done.stderr)}")
        try:
            super().start()
        except OSError:
            self._remove()
            raise
        assert self.proc is not None
        self.keeper.watch(self.name, self.proc.pid, self.log_path, self.masked)

    def wait(self) -> tuple[int, str]:
        try:
            code, stdout = super().wait()
            if self.ended_by:  # the engine exits 1 for a signal: say it as Kubernetes does
                code = 128 + self.ended_by
            if self.outputs:
                try:
                    self.engine.copy_out(self.name, self.outputs)
                except (OSError, subprocess.SubprocessError) as exc:
                    self._note(f"outputs not copied out of the container: {exc}")
        finally:
            self._remove()
        return code, stdout

    def _remove(self) -> None:
        try:
            done = subprocess.run(self.engine.remove(self.name), stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                                  check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            self._note(f"container {self.name} not removed: {exc}")
            return
        if done.returncode != 0:
            self._note(f"container {self.name} not removed: {last_line(done.stderr)}")
            return  # the keeper tries again when the run ends
        self.keeper.forget(self.name)

    def _note(self, text: str) -> None:
        with contextlib.suppress(OSError), open(self.log_path, "a") as log:
            log.write(f"note: {text}\n")
        if self.on_line is not None:
            self.on_line(f"note: {text}")

    def _engine_line(self, line: str) -> bool:
        ended_by = self.engine.signal_from_line(line)
        if ended_by is None:
            return False
        if ended_by:
            self.ended_by = ended_by
        return True

    def _signal(self, sig: int) -> None:
        # SIGTERM goes to the step's processes: signalled itself, buildah would kill them
        # outright. A process group with none of them yet (still being set up) gets it whole.
        if sig == signal.SIGTERM and self.proc is not None and self.engine.engine_exes:
            targets = container_processes(self.proc.pid, self.engine.engine_exes)
            if targets:
                for pid in targets:
                    with contextlib.suppress(OSError):
                        os.kill(pid, sig)
                return
        super()._signal(sig)


class Keeper:
    """The runner's side of the run's container keeper (``images.keeper``): started with
    the first container, told of each one, closed with the run. A keeper that died is started
    again and told what the last one knew."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self._kept: dict[str, str] = {}  # what the keeper knows: name -> its watch line

    def watch(self, name: str, pgid: int | None = None, log: Path = Path(os.devnull),
              masked: Iterable[bytes] = ()) -> None:
        """Name a container to the keeper; then, once its engine command runs, that command's
        process group, the step's log and the values masked in it (``images.keeper``). Every
        word is one the keeper's ``split()`` keeps: a log hex-encoded as empty would vanish,
        and the first masked value would be read as the log."""
        words = [name]
        if pgid is not None:
            words += [str(pgid), os.fsencode(log).hex(), *(m.hex() for m in masked)]
        with self._lock:
            self._kept[name] = line = "watch " + " ".join(words)
            self._send(line)

    def forget(self, name: str) -> None:
        with self._lock:
            self._kept.pop(name, None)
            self._send(f"forget {name}")

    def _send(self, line: str) -> None:
        for attempt in range(2):
            if self._process is None or self._process.poll() is not None:
                self._process = self._start()
                line = "".join(f"{watch}\n" for watch in self._kept.values()) or "\n"
            assert self._process.stdin is not None
            try:
                self._process.stdin.write(line.rstrip("\n") + "\n")
                self._process.stdin.flush()
                return
            except OSError:  # it died between the poll and the write
                if attempt:
                    raise
                self._process = None

    def _start(self) -> subprocess.Popen[str]:
        config = {"remove": self.engine.removal(), "engine_exes": list(self.engine.engine_exes),
                  "grace_s": KILL_GRACE_S}
        # Its own session: a terminal's signals are for the runner, not for it.
        return subprocess.Popen(
            [sys.executable, "-I", "-S", keeper_script.__file__, json.dumps(config)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            text=True, start_new_session=True)

    def close(self, timeout_s: float = 60.0) -> None:
        """Say the run is over; the keeper removes any container still known, then ends."""
        with self._lock:
            process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None
        with contextlib.suppress(OSError):
            process.stdin.write("close\n")
            process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout_s)


__all__ = ["ContainerEngineError", "ImageExecutor", "image_executor"]
