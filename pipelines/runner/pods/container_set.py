"""Pods of several containers: init containers, sidecars and ``containerSet`` templates.

Argo runs them in one pod; the local runner runs each as a local process group, with its own
log (``<name>.log`` in the node folder, as Argo keeps one log per container), sharing the pod's
volumes (``plan.plan_containers`` resolves each one like the main container). The order and the
endings follow Argo:

- Init containers run one after another, before anything else (Kubernetes); one that fails
  fails the pod, and nothing after it runs.
- Sidecars start next, then the main container (or the set's containers): Kubernetes starts a
  pod's containers together, with no readiness wait, so a main container that needs its sidecar
  must wait for it (as on a cluster).
- A set's container waits for each of its ``dependencies`` to end and, when one exited non-zero,
  exits with that code without running (``cmd/argoexec/commands/emissary.go``,
  ``waitForDependencyExitCode``). With ``containerSet.retryStrategy`` a failing command runs
  again in place, ``retries`` attempts in all, its log appended (``retry.OnError``; see
  ``plan.set_retry``); a command that cannot be started is not retried.
- Once a main container has exited non-zero, or all have exited, the controller terminates the
  pod's other containers (``operator.go``: ``podHasContainerNeedingTermination``,
  ``cleanUpPod``); a sidecar's emissary also kills it when the main containers are done. Each
  gets SIGTERM, then SIGKILL after the pod's grace period (``GRACE_S``: Kubernetes'
  ``terminationGracePeriodSeconds`` default, ``argoexec``'s ``TerminationGracePeriodDuration``).

The node's phase is decided in ``pod`` from the ``ContainerEnd`` records (``inferFailedReason``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from sublimate.pipelines.argo_terms import NodePhase

from .executor import ContainerEnd, PodHooks, PodOutcome, termination_message

if TYPE_CHECKING:
    from .local_process import LocalProcess
    from .plan import Container, PodRequest

GRACE_S = 30.0
MAIN = "main"


class Start(Protocol):
    def __call__(self, request: PodRequest, container: Container,
                 on_line: Callable[[str], None], append: bool) -> LocalProcess:
        """Start one container's process (``OSError`` when it cannot start)."""
        ...


class _Pod:
    """The handle a scope stops: every process of the pod, and nothing new after a stop."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.processes: set[LocalProcess] = set()
        self.stopped = threading.Event()  # a deadline or Ctrl-C: argo stop / terminate
        self.ending = threading.Event()  # the pod is being terminated (a main container failed)
        self.wake = threading.Condition(self.lock)

    def add(self, process: LocalProcess) -> bool:
        """Count a started process in; False when the pod is stopping or being terminated
        already (it started while the others were being ended: it is ended too)."""
        with self.lock:
            if self.stopped.is_set() or self.ending.is_set():
                return False
            self.processes.add(process)
            return True

    def discard(self, process: LocalProcess) -> None:
        with self.lock:
            self.processes.discard(process)

    def stop(self) -> None:
        with self.lock:
            self.stopped.set()
            victims = list(self.processes)
            self.wake.notify_all()
        for process in victims:
            process.stop()

    def kill(self) -> None:
        with self.lock:
            self.stopped.set()
            victims = list(self.processes)
            self.wake.notify_all()
        for process in victims:
            process.kill()

    def terminate(self, keep: LocalProcess | None = None) -> None:
        """The controller's TerminateContainers: SIGTERM, SIGKILL after ``GRACE_S``."""
        with self.lock:
            self.ending.set()
            victims = [p for p in self.processes if p is not keep]
            self.wake.notify_all()
        for process in victims:
            process.stop(grace_s=GRACE_S)

    def pause(self, seconds: float) -> None:
        """A retry's pause, cut short by a stop or the pod's termination."""
        with self.lock:
            if not (self.stopped.is_set() or self.ending.is_set()):
                self.wake.wait(seconds)


def kubernetes_code(code: int) -> int:
    """Popen's ``-N`` for a process ended by signal N is 128 + N in a container's status."""
    return 128 - code if code < 0 else code


def run_containers(request: PodRequest, hooks: PodHooks, start: Start) -> PodOutcome:
    """Run a pod of several containers to its end (see the module docstring)."""
    pod = _Pod()
    ends: dict[str, ContainerEnd] = {}
    stdout: dict[str, str] = {}
    inits = [c for c in request.containers if c.role == "init"]
    members = [c for c in request.containers if c.role == "set"]
    sidecars = [c for c in request.containers if c.role == "sidecar"]
    hooks.on_start(pod)
    try:
        for container in inits:
            end = _run(request, container, pod, hooks, start, stdout)
            ends[container.name] = end
            if end.error or end.exit_code != 0 or pod.stopped.is_set():
                return _outcome(ends, stdout, pod)
        running = [_Sidecar(request, c, pod, hooks, start, ends) for c in sidecars]
        for sidecar in running:
            sidecar.begin()
        if members:
            _run_set(request, members, pod, hooks, start, ends, stdout)
        else:
            ends[MAIN] = _run(request, main_container(request), pod, hooks, start, stdout)
        # The main containers are done: the sidecars' emissaries kill them (emissary.go:
        # em.Kill(..., TerminationGracePeriodDuration())).
        for sidecar in running:
            sidecar.end()
        return _outcome(ends, stdout, pod)
    finally:
        hooks.on_exit(pod)


def main_container(request: PodRequest) -> Container:
    """The pod's own container, for a plain container or script template."""
    from .plan import Container  # the type, for a plain container/script with init/sidecars

    return Container(MAIN, "main", list(request.argv), dict(request.env), request.cwd,
                     request.folder, tuple(request.mounts), tuple(request.from_environment),
                     in_image=request.in_image, view=request.view)


def _outcome(ends: dict[str, ContainerEnd], stdout: dict[str, str], pod: _Pod) -> PodOutcome:
    main = ends.get(MAIN)
    errors = [e.error for e in ends.values() if e.error]
    return PodOutcome(
        # outputs.exitCode is the container named main's (operator.go getExitCode)
        exit_code=main.exit_code if main else None,
        stdout=stdout.get(MAIN, ""),
        message=main.message if main else "",
        error=errors[0] if errors else "",
        stopped=pod.stopped.is_set(),
        containers=list(ends.values()),
    )


def _run(request: PodRequest, container: Container, pod: _Pod, hooks: PodHooks, start: Start,
         stdout: dict[str, str], attempts: int = 1, pause_s: float = 0.0) -> ContainerEnd:
    """Run one container to its end, ``attempts`` times at most while it fails."""
    on_line = hooks.on_line if container.name == MAIN else \
        (lambda line, prefix=f"{container.name}: ": hooks.on_line(prefix + line))
    notify = getattr(hooks, "on_container", None)
    if callable(notify):
        notify(container.name, None)
    end = ContainerEnd(container.name, container.role, None)
    out: list[str] = []
    for attempt in range(attempts):
        if pod.stopped.is_set() or (attempt and pod.ending.is_set()):
            break
        try:
            process = start(request, container, on_line, append=attempt > 0)
        except OSError as exc:  # not found: the emissary does not retry (LookPath first)
            end = end._replace(error=f"{container.name}: failed to start "
                                     f"{container.argv[0]!r}: {exc.strerror or exc}")
            break
        if not pod.add(process) and pod.stopped.is_set():
            process.stop()  # a stop (a deadline, Ctrl-C) came as it started
        elif pod.ending.is_set() and process not in pod.processes:
            process.stop(grace_s=GRACE_S)  # the pod is being terminated: as the others
        code, text = process.wait()
        pod.discard(process)
        out.append(text)
        end = end._replace(exit_code=kubernetes_code(code))
        if end.exit_code == 0 or pod.stopped.is_set():
            break
        if attempt + 1 < attempts:
            pod.pause(pause_s)
    if end.exit_code not in (None, 0):
        end = end._replace(message=termination_message(container.termination_log,
                                                       request.masked))
    stdout[container.name] = "".join(out)
    if callable(notify):
        notify(container.name, end)
    return end


def _run_set(request: PodRequest, members: list[Container], pod: _Pod, hooks: PodHooks,
             start: Start, ends: dict[str, ContainerEnd], stdout: dict[str, str]) -> None:
    """A containerSet's containers, each in a thread once its dependencies have ended."""
    retry = request.set_retry
    attempts, pause_s = (retry.attempts, retry.pause_s) if retry else (1, 0.0)
    done = {c.name: threading.Event() for c in members}

    def member(container: Container) -> None:
        try:
            for dependency in container.dependencies:
                done[dependency].wait()
                code = ends[dependency].exit_code
                if code != 0:
                    # emissary.go: "dependency %q exited with non-zero code" and its code;
                    # a dependency that never ran (the pod stopped) counts as a SIGTERM.
                    ends[container.name] = _skipped(container, hooks, 143 if code is None
                                                    else code)
                    return
            if pod.stopped.is_set() or pod.ending.is_set():
                # Terminated while waiting: waitForDependencyExitCode exits 143 on SIGTERM.
                ends[container.name] = _skipped(container, hooks, 143)
                return
            end = _run(request, container, pod, hooks, start, stdout, attempts, pause_s)
            ends[container.name] = end
            if end.error or end.exit_code != 0:
                pod.terminate()  # podHasContainerNeedingTermination: a main container failed
        finally:
            done[container.name].set()

    threads = [threading.Thread(target=member, args=(c,), daemon=True,
                                name=f"container-{c.name}") for c in members]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _skipped(container: Container, hooks: PodHooks, code: int) -> ContainerEnd:
    end = ContainerEnd(container.name, container.role, code)
    notify = getattr(hooks, "on_container", None)
    if callable(notify):
        notify(container.name, end)
    return end


class _Sidecar:
    """A sidecar: started before the main containers, stopped once they have ended."""

    def __init__(self, request: PodRequest, container: Container, pod: _Pod, hooks: PodHooks,
                 start: Start, ends: dict[str, ContainerEnd]) -> None:
        self.request = request
        self.container = container
        self.pod = pod
        self.hooks = hooks
        self.start = start
        self.ends = ends
        self.process: LocalProcess | None = None
        self.thread: threading.Thread | None = None
        self.started = threading.Event()

    def begin(self) -> None:
        self.thread = threading.Thread(target=self._main, daemon=True,
                                       name=f"sidecar-{self.container.name}")
        self.thread.start()
        self.started.wait()  # started before the main containers, as the brief of a pod says

    def _main(self) -> None:
        start = self.start

        def recorded(request: PodRequest, container: Container,
                     on_line: Callable[[str], None], append: bool) -> LocalProcess:
            try:
                self.process = start(request, container, on_line, append)
                return self.process
            finally:
                self.started.set()

        try:
            self.ends[self.container.name] = _run(self.request, self.container, self.pod,
                                                  self.hooks, recorded, {})
        finally:
            self.started.set()

    def end(self) -> None:
        process = self.process
        if process is not None and process.proc is not None and process.proc.poll() is None:
            process.stop(grace_s=GRACE_S)
        if self.thread is not None:
            self.thread.join()




# ----------------------------------------------------------------------------- phases

STOPPED_WHILE_RUNNING = "Pod Failed whilst container running"


def _failure(end: ContainerEnd) -> str:
    """inferFailedReason's message: ``<container>: <reason> (exit code N): <message>``."""
    text = f"{end.name}: Error (exit code {end.exit_code})"
    return f"{text}: {end.message}" if end.message else text


def container_phase(end: ContainerEnd) -> tuple[NodePhase, str]:
    """A containerSet container's node (operator.go assessNodeStatus): exit 0 Succeeded, 64
    (the emissary's own failure) Error, any other code Failed."""
    if end.error:
        return NodePhase.ERROR, end.error
    if end.exit_code is None:
        return NodePhase.FAILED, STOPPED_WHILE_RUNNING
    if end.exit_code == 0:
        return NodePhase.SUCCEEDED, ""
    return (NodePhase.ERROR if end.exit_code == 64 else NodePhase.FAILED), _failure(end)


def pod_ending(outcome: PodOutcome, stop_reason: str) -> tuple[NodePhase, str]:
    """The pod node's phase from its containers' ends, as operator.go ``inferFailedReason``
    decides it for a failed pod: init containers first (in order), then the main containers
    (a containerSet's are all main: ``GetMainContainerNames``), then the others (sidecars), each
    group by name (the kubelet lists container statuses sorted by name); the first non-zero
    exit fails the node, except a sidecar's 137 or 143 (killed by argoexec: ignored)."""
    if outcome.stopped:
        return NodePhase.FAILED, stop_reason
    ends = outcome.containers
    ranked = [e for e in ends if e.role == "init"]
    ranked += sorted((e for e in ends if e.role in ("set", "main")), key=lambda e: e.name)
    ranked += sorted((e for e in ends if e.role == "sidecar"), key=lambda e: e.name)
    for end in ranked:
        if end.exit_code in (None, 0):
            continue
        if end.role == "sidecar" and end.exit_code in (137, 143):
            continue
        return NodePhase.FAILED, _failure(end)
    return NodePhase.SUCCEEDED, ""
