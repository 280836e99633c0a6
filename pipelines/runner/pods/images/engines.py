"""Container engines for ``sublimate run --containers``: which one works on this machine, what a
local image holds, and the command lines that create, run, read and remove a step's container.

Tried in this order, unless one is named (``--container-engine``), each with a real probe:

- ``docker``: the daemon answers ``docker info``;
- ``podman``: ``podman info`` answers *and* a container really starts (``podman run`` of an
  empty root folder, whose missing command exits 127 once the container is up: on machines
  whose sandbox denies ``setrlimit`` podman answers ``info`` but cannot start anything);
- ``buildah`` with chroot isolation (``buildah run --isolation chroot``): needs no daemon and
  no runtime, so it works where the others do not (a root shell in a sandbox or a CI runner).

None of them ever pulls: an image must be present locally (``inspect``); each engine is asked
with ``--pull never`` as well, so a name missed by the up-front check cannot start a download.

Only buildah runs on the machines this project is developed on; the docker and podman command
lines are built the same way and checked as text by the tests, not run (say so when changing
them). Every engine runs a step's container in the host's network namespace, as buildah's
chroot isolation does, and with the host's name (``hostNetwork: true`` pods have it too): a
pod's containers share ``localhost`` as in Kubernetes, and a name a step looks up (torchrun's
rendezvous host) resolves.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from ...errors import ManifestError
from ..mounts import Bind

ENGINES = ("docker", "podman", "buildah")
PROBE_TIMEOUT_S = 30.0
COMMAND_TIMEOUT_S = 120.0
# An executable that cannot be found: the container started, then the command did not.
_NOT_FOUND = 127


class ContainerEngineError(ManifestError):
    """No container engine works here (or the one named does not), or images are missing."""


class ImageConfig(NamedTuple):
    """What an image's configuration says a container runs (``docker inspect``'s ``Config``)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    working_dir: str = ""
    user: str = ""

    @classmethod
    def of(cls, config: dict | None) -> ImageConfig:
        config = config or {}
        return cls(tuple(config.get("Entrypoint") or ()), tuple(config.get("Cmd") or ()),
                   str(config.get("WorkingDir") or ""), str(config.get("User") or ""))


class RunSpec(NamedTuple):
    """One container's command as an engine is to run it: resolved, with container paths."""

    argv: list[str]  # the whole command: the template's or the image's entrypoint resolved
    binds: list[Bind]  # host file or folder -> container path, shallowest first
    env: dict[str, str]
    working_dir: str = ""  # "": the image's
    user: str = ""  # "uid", "uid:gid" or "": the image's
    groups: tuple[int, ...] = ()  # supplementary groups (the pod's fsGroup)


def _run(argv: Sequence[str], timeout: float = COMMAND_TIMEOUT_S
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, check=False)


def last_line(text: str) -> str:
    """An engine's error, in one line: its last non-empty line of output."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


class Engine:
    """What every engine does; ``Buildah`` and ``DockerLike`` (docker, podman) fill it in."""

    name = ""
    # Executables (prefixes of /proc/PID/exe) of the engine's own processes in a step's process
    # group, which a stop must not SIGTERM (``keeper.container_processes``); empty
    # when the engine's client passes signals on to the container (docker's --sig-proxy).
    engine_exes: tuple[str, ...] = ()

    def __init__(self, program: str | None = None) -> None:
        self.program = program or shutil.which(self.name) or self.name

    def unavailable(self) -> str:
        """Why this engine cannot run containers here; "" when it can."""
        raise NotImplementedError

    def inspect(self, image: str) -> ImageConfig | str:
        """The image's configuration, or why it is not present locally (never pulls)."""
        raise NotImplementedError

    def local_images(self) -> list[str]:
        """The names of the images present locally (for a missing image's hint)."""
        raise NotImplementedError

    def create(self, name: str, image: str) -> list[str] | None:
        """The command that creates the container before it runs (None: ``run`` does)."""
        return None

    def run(self, name: str, image: str, spec: RunSpec) -> list[str]:
        """The command that runs ``spec`` in the container ``name`` and waits for its end."""
        raise NotImplementedError

    def removal(self) -> list[str]:
        """The command that removes a container, but for its name."""
        raise NotImplementedError

    def remove(self, name: str) -> list[str]:
        return [*self.removal(), name]

    def copy_out(self, name: str, paths: list[tuple[str, Path]]) -> list[str]:
        """Copy each container path (after the command has ended) to its local path; the
        container paths that do not exist."""
        raise NotImplementedError

    def signal_from_line(self, line: str) -> int | None:
        """For a line of stderr the engine itself printed about the command's end (not the
        step's output), the signal that ended the command (0 for a plain exit); None for any
        other line."""
        return None

    def pull_hint(self, image: str) -> str:
        return f"{self.name} pull {image}"

    def build_hint(self, image: str) -> str:
        return f"{self.name} build -t {image} ."


class Buildah(Engine):
    """buildah: ``buildah from`` makes a working container, ``buildah run --isolation chroot``
    runs the step in it (no daemon, no OCI runtime), ``buildah mount`` gives its root folder on
    this machine to read outputs from, and ``buildah rm`` removes it."""

    name = "buildah"

    def __init__(self, program: str | None = None) -> None:
        super().__init__(program)
        # buildah re-executes itself from a memfd for its chroot helpers (buildah-chroot-*).
        self.engine_exes = (os.path.realpath(self.program), "/memfd:buildah")

    def unavailable(self) -> str:
        if shutil.which(self.program) is None:
            return "buildah is not installed"
        if os.geteuid() != 0:
            return "buildah's chroot isolation needs root here"
        # `buildah info` opens the store as every later command will; `buildah containers` (the
        # probe before) also reads each container's state, and fails ("container not known")
        # when another run removes one of its containers mid-listing (CI, once).
        try:
            done = _run([self.program, "info"], PROBE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`buildah info` failed: {exc}"
        return "" if done.returncode == 0 else f"buildah: {last_line(done.stderr)}"

    def inspect(self, image: str) -> ImageConfig | str:
        done = _run([self.program, "inspect", "--type", "image", image])
        if done.returncode != 0:
            # "Error: importing settings: NAME: image not known" -> "image not known"
            reason = last_line(done.stderr).removeprefix("Error: ")
            return reason.split(f"{image}: ", 1)[-1] or f"exit status {done.returncode}"
        try:
            config = (json.loads(done.stdout).get("OCIv1") or {}).get("config")
        except ValueError as exc:
            return f"unreadable `buildah inspect` output: {exc}"
        return ImageConfig.of(config)

    def local_images(self) -> list[str]:
        done = _run([self.program, "images", "--format", "{{.Name}}:{{.Tag}}"])
        return [line.strip() for line in done.stdout.splitlines()
                if line.strip() and "<none>" not in line]

    def create(self, name: str, image: str) -> list[str]:
        return [self.program, "from", "--quiet", "--pull=never", "--name", name, image]

    def run(self, name: str, image: str, spec: RunSpec) -> list[str]:
        # The host's UTS namespace with its network: buildah's own would name the container
        # by its id, which resolves nowhere (torchrun's rendezvous looks its hostname up).
        argv = [self.program, "run", "--isolation", "chroot", "--uts", "host",
                *_spec_flags(spec, "--workingdir")]
        # `buildah run` has no supplementary groups: a pod's fsGroup works through the volumes'
        # group ownership when it is the runAsGroup (images.executor says so).
        return [*argv, name, "--", *spec.argv]

    def removal(self) -> list[str]:
        return [self.program, "rm"]

    def copy_out(self, name: str, paths: list[tuple[str, Path]]) -> list[str]:
        if not paths:
            return []
        done = _run([self.program, "mount", name])
        if done.returncode != 0:
            raise OSError(f"buildah mount {name}: {last_line(done.stderr)}")
        root = Path(done.stdout.strip())
        missing = []
        for container_path, local in paths:
            source = path_in_root(root, container_path)
            if not source.exists():
                missing.append(container_path)
                continue
            copy_path(source, local)
        return missing

    # `buildah run` reports the command's end on stderr and exits 1 for a signal:
    # "subprocess exited with status N", "subprocess exited on killed", "Error: exit status N".
    _END = re.compile(r"(?:subprocess exited (?:with status \d+|on (?P<signal>.+))"
                      r"|Error: exit status \d+)")

    def signal_from_line(self, line: str) -> int | None:
        match = self._END.fullmatch(line.strip())
        if match is None:
            return None
        return _SIGNALS_BY_GO_NAME.get(match.group("signal") or "", 0)

    def build_hint(self, image: str) -> str:
        return f"buildah bud --isolation chroot -t {image} ."


class DockerLike(Engine):
    """docker and podman: ``run --name`` (kept after its end, to copy outputs out with ``cp``),
    then ``rm -f``. Not runnable on this project's machines: built and checked as text."""

    def unavailable(self) -> str:
        if shutil.which(self.program) is None:
            return f"{self.name} is not installed"
        try:
            done = _run([self.program, "info"], PROBE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`{self.name} info` failed: {exc}"
        if done.returncode != 0:
            return f"`{self.name} info` failed: {last_line(done.stderr) or done.returncode}"
        return ""

    def inspect(self, image: str) -> ImageConfig | str:
        done = _run([self.program, "image", "inspect", image])
        if done.returncode != 0:
            return last_line(done.stderr) or f"exit status {done.returncode}"
        try:
            found = json.loads(done.stdout)
        except ValueError as exc:
            return f"unreadable `{self.name} image inspect` output: {exc}"
        return ImageConfig.of(found[0].get("Config") if found else None)

    def local_images(self) -> list[str]:
        done = _run([self.program, "images", "--format", "{{.Repository}}:{{.Tag}}"])
        return [line.strip() for line in done.stdout.splitlines()
                if line.strip() and "<none>" not in line]

    def run(self, name: str, image: str, spec: RunSpec) -> list[str]:
        argv = [self.program, "run", "--name", name, "--pull", "never", "--network", "host",
                *_spec_flags(spec, "--workdir")]
        for group in spec.groups:
            argv += ["--group-add", str(group)]
        # --entrypoint takes one executable and clears the image's CMD: the rest of the
        # resolved command follows the image as its arguments, exactly as given.
        argv += ["--entrypoint", spec.argv[0], image] if spec.argv else [image]
        return argv + spec.argv[1:]

    def removal(self) -> list[str]:
        return [self.program, "rm", "--force"]

    def copy_out(self, name: str, paths: list[tuple[str, Path]]) -> list[str]:
        missing = []
        for container_path, local in paths:
            # `cp` into an existing folder would copy *into* it: start from nothing.
            remove_path(local)
            local.parent.mkdir(parents=True, exist_ok=True)
            done = _run([self.program, "cp", f"{name}:{container_path}", str(local)])
            if done.returncode != 0:
                missing.append(container_path)
        return missing


class Docker(DockerLike):
    name = "docker"


class Podman(DockerLike):
    name = "podman"

    def unavailable(self) -> str:
        reason = super().unavailable()
        if reason:
            return reason
        # A container must really start: run an empty root folder's missing command.
        with tempfile.TemporaryDirectory(prefix="sublimate-podman-probe-") as root:
            try:
                done = _run([self.program, "run", "--rm", "--network", "none", "--rootfs", root,
                             "/sublimate-probe"], PROBE_TIMEOUT_S)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return f"podman cannot start a container: {exc}"
        if done.returncode != _NOT_FOUND:
            return f"podman cannot start a container: {last_line(done.stderr)}"
        return ""


ENGINE_CLASSES: dict[str, type[Engine]] = {"docker": Docker, "podman": Podman,
                                           "buildah": Buildah}


def choose_engine(requested: str = "auto") -> Engine:
    """The engine named, if it works here, or the first of ``ENGINES`` that does;
    ``ContainerEngineError`` naming why each one does not."""
    if requested != "auto" and requested not in ENGINE_CLASSES:
        raise ContainerEngineError(f"--container-engine must be one of {', '.join(ENGINES)}, "
                                   f"not {requested!r}")
    names = ENGINES if requested == "auto" else (requested,)
    reasons = []
    for name in names:
        engine = ENGINE_CLASSES[name]()
        reason = engine.unavailable()
        if not reason:
            return engine
        reasons.append(f"{name}: {reason}")
    if requested != "auto":
        raise ContainerEngineError(f"--container-engine {requested} does not work here: "
                                   f"{reasons[0].split(': ', 1)[1]}")
    raise ContainerEngineError("--containers: no container engine works here ("
                               + "; ".join(reasons) + ")")


# ----------------------------------------------------------------------------- files


def path_in_root(root: Path, path: str) -> Path:
    """Where the container path ``path`` lies under the container's root folder ``root`` on
    this machine, symbolic links followed *inside* the root (an absolute link starts again at
    ``root``, ``..`` stops there), as the container would: an image's link can never lead a
    copy out to this machine's own files."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    resolved: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = root.joinpath(*resolved, part)
        if candidate.is_symlink():
            hops += 1
            if hops > 40:  # Linux's own limit (ELOOP)
                raise OSError(f"{path}: too many levels of symbolic links")
            target = os.readlink(candidate)
            if target.startswith("/"):
                resolved = []
            parts = [p for p in target.split("/") if p not in ("", ".")] + parts
            continue
        resolved.append(part)
    return root.joinpath(*resolved)


def copy_path(source: Path, local: Path) -> None:
    """Copy a file or a folder (links inside it kept as links) to ``local``, replacing it."""
    remove_path(local)
    local.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, local, symlinks=True)
    else:
        shutil.copy2(source, local)


def remove_path(local: Path) -> None:
    if local.is_dir() and not local.is_symlink():
        shutil.rmtree(local)
    else:
        with contextlib.suppress(FileNotFoundError):
            local.unlink()


# Go's syscall.Signal.String() for the signals a command commonly ends by (buildah prints it).
_SIGNALS_BY_GO_NAME = {
    "hangup": int(signal.SIGHUP), "interrupt": int(signal.SIGINT), "quit": int(signal.SIGQUIT),
    "illegal instruction": int(signal.SIGILL), "trace/breakpoint trap": int(signal.SIGTRAP),
    "aborted": int(signal.SIGABRT), "bus error": int(signal.SIGBUS),
    "floating point exception": int(signal.SIGFPE), "killed": int(signal.SIGKILL),
    "user defined signal 1": int(signal.SIGUSR1), "segmentation fault": int(signal.SIGSEGV),
    "user defined signal 2": int(signal.SIGUSR2), "broken pipe": int(signal.SIGPIPE),
    "alarm clock": int(signal.SIGALRM), "terminated": int(signal.SIGTERM),
}


def _spec_flags(spec: RunSpec, workdir_flag: str) -> list[str]:
    """The flags every engine's ``run`` shares (binds, env, working dir, user); only the
    working dir's flag is spelled differently (buildah's ``--workingdir``)."""
    argv: list[str] = []
    for bind in spec.binds:
        argv += ["--volume", f"{bind.source}:{bind.target}" + (":ro" if bind.read_only else "")]
    for key, value in spec.env.items():
        argv += ["--env", f"{key}={value}"]
    if spec.working_dir:
        argv += [workdir_flag, spec.working_dir]
    if spec.user:
        argv += ["--user", spec.user]
    return argv
