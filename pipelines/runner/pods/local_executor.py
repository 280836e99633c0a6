"""The default executor: a pod runs as a local process group, the way Argo's executor runs a
container, except that the image is not used (the local Python environment stands in for it).
A pod of several containers runs through ``container_set``."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from .environment import pod_environment
from .executor import PodHooks, PodOutcome, await_pod
from .local_process import LocalProcess
from .mounts import namespace_cleanup, namespace_setup

if TYPE_CHECKING:
    from .plan import Container, PodRequest
    from .resource_limits import PodGroups
    from .views import View


class LocalExecutor:
    """Runs a pod as a local process group, with its log in ``request.log``."""

    def run(self, request: PodRequest, hooks: PodHooks) -> PodOutcome:
        if request.containers:  # init containers, sidecars or a containerSet
            from .container_set import run_containers  # deferred: only such pods pay for it

            return run_containers(request, hooks, start_container)
        argv = list(request.argv)
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable  # so that the runner's venv is used
        # what the manifest declares and the runner's short list, never this shell's whole
        # environment (``environment``)
        env = pod_environment(request.env, request.runner_env,
                              from_environment=request.from_environment,
                              passed=request.passed_env)
        request.termination_log.unlink(missing_ok=True)
        if request.mounts_note:
            hooks.on_line(f"note: {request.mounts_note}")
        setup, cleanup = _isolation(request)
        groups = None
        if request.limits is not None:
            from . import resource_limits  # deferred: only pods with limits pay for it

            groups = resource_limits.make_groups(request.limits, _group_name(request))
            if groups.unavailable:
                hooks.on_line(f"note: limits not applied: {groups.unavailable}")
            setup = _joining(groups, setup)
            cleanup = _then_remove(groups, cleanup, oom := [])
        process = LocalProcess(argv, request.cwd, env, request.log, hooks.on_line, setup=setup,
                               masked=request.masked, pid_namespace=_contained(request.view))
        try:
            process.start()
        except OSError as exc:
            cleanup()
            return PodOutcome(exit_code=None,
                              error=f"failed to start {argv[0]!r}: {exc.strerror or exc}")
        outcome = await_pod(process, request, hooks, cleanup=cleanup)
        if groups is not None and oom and outcome.exit_code == 137 and not outcome.stopped:
            outcome.reason = "OOMKilled"  # what the kubelet reports, with exit code 137
        return outcome


def _contained(view: View | None) -> bool:
    """Whether the pod's process is its own PID namespace's init (``sandbox``)."""
    return view is not None and view.sandbox is not None


def _group_name(request: PodRequest) -> str:
    """The pod's cgroup name: unique to this runner and node, in the characters a cgroup's
    name may hold."""
    node = "".join(c if c.isalnum() or c in "-_." else "-" for c in request.node_id)[-64:]
    return f"sublimate-{os.getpid()}-{node}"


def _joining(groups: PodGroups, setup: Callable[[], None] | None) -> Callable[[], None]:
    """The child joins the pod's cgroups first, while this machine's /sys is in sight; one
    that cannot fails the pod (exit 126, saying why) rather than run it unlimited."""
    from .mounts import SETUP_FAILED
    from .resource_limits import join, join_step

    files = join_step(groups)[1]

    def child() -> None:
        try:
            join(files)
        except OSError as exc:
            os.write(2, f"resource limits: {exc}\n".encode())
            os._exit(SETUP_FAILED)
        if setup is not None:
            setup()

    return child


def _then_remove(groups: PodGroups, cleanup: Callable[[], None], oom: list[bool]
                 ) -> Callable[[], None]:
    """The pod's cleanup, then its groups' removal; ``oom`` gets True first when the kernel's
    OOM killer ended one of its processes (read before the group goes)."""
    from .resource_limits import oom_killed, remove_groups

    def both() -> None:
        cleanup()
        if oom_killed(groups):
            oom.append(True)
        remove_groups(groups)

    return both


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
    env = pod_environment(container.env, {
        **request.runner_env, "SUBLIMATE_TERMINATION_LOG": str(container.termination_log)},
        from_environment=container.from_environment, passed=request.passed_env)
    if not append:
        container.termination_log.unlink(missing_ok=True)
    setup = None
    if container.view is not None:
        from .views import setup as view_setup

        setup = view_setup(container.view, container.termination_log)
    process = LocalProcess(argv, container.cwd, env, container.log, on_line, append=append,
                           setup=setup, masked=request.masked,
                           pid_namespace=_contained(container.view))
    process.start()
    return process
