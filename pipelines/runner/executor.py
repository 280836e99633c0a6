"""Executors: what runs a planned pod (``plan.PodRequest``) and reports how it ended.

The engine decides what runs, when, and what a pod's end means for its node; an executor only
runs one request. ``LocalExecutor`` (the default) starts it as a local process group, the way
Argo's executor runs a container: the image is not used, the local Python environment stands in
for it. ``in_images.ImageExecutor`` runs each pod in its template's image instead
(``sublimate run --containers``). Tests pass a fake executor that returns scripted outcomes, so
DAG and steps semantics are checked without starting processes.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from .mounts import namespace_cleanup, namespace_setup
from .plan import PodRequest
from .process import LocalProcess
from .scope import Stoppable

if TYPE_CHECKING:
    from .containers import ContainerEnd
    from .plan import Container


@dataclass
class PodOutcome:
    """How a pod ended. ``exit_code`` is None when it never started (``error`` says why)."""

    exit_code: int | None = 0
    stdout: str = ""
    message: str = ""  # the container's termination message (read when it failed)
    error: str = ""  # could not start: "failed to start 'x': No such file or directory"
    stopped: bool = False  # stopped by a deadline or Ctrl-C before it ended on its own
    # A pod of several containers (init containers, sidecars, a containerSet): each one's end.
    containers: list[ContainerEnd] = field(default_factory=list)


class PodHooks(Protocol):
    """What the engine hands an executor for one pod."""

    def on_line(self, line: str) -> None:
        """A line of the pod's output (stdout or stderr), for live progress."""

    def on_start(self, handle: Stoppable) -> None:
        """The pod is running: the node turns Running, and a deadline or Ctrl-C stopping its
        scope calls ``handle.stop()`` from now on."""

    def on_exit(self, handle: Stoppable) -> None:
        """The pod has ended: its handle is no longer stopped with its scope."""


class Executor(Protocol):
    def run(self, request: PodRequest, hooks: PodHooks) -> PodOutcome:
        """Run a staged request (its folders, script and input artifacts are in place) to
        its end; may be called from several threads at once."""
        ...


class LocalExecutor:
    """Runs a pod as a local process group, with its log in ``request.log``."""

    def run(self, request: PodRequest, hooks: PodHooks) -> PodOutcome:
        if request.containers:  # init containers, sidecars or a containerSet
            from .containers import run_containers  # deferred: only such pods pay for it

            return run_containers(request, hooks, start_container)
        argv = list(request.argv)
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable  # so that the runner's venv is used
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")  # lets follow_logs stream lines as they come
        env.update(request.env)
        env.update(request.runner_env)
        request.termination_log.unlink(missing_ok=True)
        if request.mounts_note:
            hooks.on_line(f"note: {request.mounts_note}")
        process = LocalProcess(argv, request.cwd, env, request.log, hooks.on_line,
                               setup=namespace_setup(request))
        try:
            process.start()
        except OSError as exc:
            return PodOutcome(exit_code=None,
                              error=f"failed to start {argv[0]!r}: {exc.strerror or exc}")
        return await_pod(process, request, hooks, cleanup=lambda: namespace_cleanup(request))


def await_pod(process: LocalProcess, request: PodRequest, hooks: PodHooks,
              cleanup: Callable[[], None] | None = None) -> PodOutcome:
    """A pod's only process, started: hand it to the scope, wait for its end, run ``cleanup``
    whatever happens, and read its termination message when it failed on its own. The same
    for every executor (a local process, a container through its engine)."""
    hooks.on_start(process)
    try:
        code, stdout = process.wait()
    finally:
        hooks.on_exit(process)
        if cleanup is not None:
            cleanup()
    message = ""
    if code != 0 and not process.stopped:
        message = _termination_message(request)
    return PodOutcome(exit_code=code, stdout=stdout, message=message,
                      stopped=process.stopped)


def start_container(request: PodRequest, container: Container,
                    on_line: Callable[[str], None], append: bool = False) -> LocalProcess:
    """Start one container of a pod of several (``containers``) as ``LocalExecutor.run``
    starts a pod's only one: same environment, its own log and termination log."""
    argv = list(container.argv)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(container.env)
    env.update(request.runner_env)
    env["SUBLIMATE_TERMINATION_LOG"] = str(container.termination_log)
    if not append:
        container.termination_log.unlink(missing_ok=True)
    process = LocalProcess(argv, container.cwd, env, container.log, on_line, append=append)
    process.start()
    return process


def _termination_message(request: PodRequest) -> str:
    with contextlib.suppress(OSError):
        return " ".join(request.termination_log.read_text(errors="replace").split())
    return ""

