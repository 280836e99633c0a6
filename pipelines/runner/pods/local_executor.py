"""The default executor: a pod runs as a local process group, the way Argo's executor runs a
container, except that the image is not used (the local Python environment stands in for it).
A pod of several containers runs through ``container_set``."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from .executor import PodHooks, PodOutcome, await_pod
from .local_process import LocalProcess
from .mounts import namespace_cleanup, namespace_setup

if TYPE_CHECKING:
    from .plan import Container, PodRequest


class LocalExecutor:
    """Runs a pod as a local process group, with its log in ``request.log``."""

    def run(self, request: PodRequest, hooks: PodHooks) -> PodOutcome:
        if request.containers:  # init containers, sidecars or a containerSet
            from .container_set import run_containers  # deferred: only such pods pay for it

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
        setup, cleanup = _isolation(request)
        process = LocalProcess(argv, request.cwd, env, request.log, hooks.on_line, setup=setup,
                               masked=request.masked)
        try:
            process.start()
        except OSError as exc:
            cleanup()
            return PodOutcome(exit_code=None,
                              error=f"failed to start {argv[0]!r}: {exc.strerror or exc}")
        return await_pod(process, request, hooks, cleanup=cleanup)


def _isolation(request: PodRequest) -> tuple[Callable[[], None] | None, Callable[[], None]]:
    """What the pod's child runs before ``exec`` to enter its view or namespace (None: it
    shares the runner's), and what the runner does once the pod has ended."""
    if request.view is not None:
        from . import views  # deferred: only overlay mode pays for it

        # Nothing to clean up: the view's mounts end with its namespace, and its mount point
        # and work folders (in .view/) stay; removing them would wait for the kernel to tear
        # the namespace down (see views).
        return views.setup(request.view, request.termination_log), _nothing
    return namespace_setup(request), partial(namespace_cleanup, request)


def _nothing() -> None:
    pass


def start_container(request: PodRequest, container: Container,
                    on_line: Callable[[str], None], append: bool = False) -> LocalProcess:
    """Start one container of a pod of several (``container_set``) as ``LocalExecutor.run``
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
    setup = None
    if container.view is not None:
        from .views import setup as view_setup

        setup = view_setup(container.view, container.termination_log)
    process = LocalProcess(argv, container.cwd, env, container.log, on_line, append=append,
                           setup=setup, masked=request.masked)
    process.start()
    return process
