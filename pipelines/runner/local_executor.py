"""The default executor: a pod runs as a local process group, the way Argo's executor runs a
container, except that the image is not used (the local Python environment stands in for it).
A pod of several containers runs through ``container_set``."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
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
        process = LocalProcess(argv, request.cwd, env, request.log, hooks.on_line,
                               setup=namespace_setup(request), masked=request.masked)
        try:
            process.start()
        except OSError as exc:
            return PodOutcome(exit_code=None,
                              error=f"failed to start {argv[0]!r}: {exc.strerror or exc}")
        return await_pod(process, request, hooks, cleanup=lambda: namespace_cleanup(request))


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
    process = LocalProcess(argv, container.cwd, env, container.log, on_line, append=append,
                           masked=request.masked)
    process.start()
    return process
