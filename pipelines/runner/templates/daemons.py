"""Daemon templates (``daemon: true``): a pod that serves the steps after it (a database, a model
server) and lives until the steps or DAG that started it ends.

Argo's rules (operator.go ``podReconciliation``/``assessNodeStatus``, exec_control.go
``killDaemonedChildren``, workflow_types.go ``Fulfilled``):

- The node stays Pending until the pod runs and its container is Ready: its readiness probe
  passed (``probes``), or, with none, once started. It is then Running and *daemoned*: its
  step group moves on and its DAG dependants start (``depends: a`` holds for a daemoned ``a``,
  as ``a.Daemoned``), and ``{{steps.<name>.ip}}`` / ``{{tasks.<name>.ip}}`` is its address,
  127.0.0.1 here (pods share this machine's network: two daemons on one port collide, as they
  would not on Kubernetes).
- When its boundary ends, the steps or DAG node whose call started it, the daemon gets SIGTERM
  (SIGKILL ``KILL_GRACE_S`` later) and ends Succeeded, whatever its exit code; the boundary
  waits for it to be gone. What is left when the workflow ends goes the same way.
- A daemon that exits by itself before that is Failed, exit code 0 included ("daemon pods
  should run indefinitely"), and one that fails before it is ready fails like any pod; a
  retryStrategy retries it then, not once it is daemoned.
- A stop or a deadline of the run stops it like any pod; a runner killed outright takes it
  along (``PR_SET_PDEATHSIG``, see ``local_process``: its pod thread lives as long as it does).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from sublimate.pipelines.argo_terms import NodePhase, NodeType

from ..pods.executor import PodOutcome
from ..pods.scope import CancelScope, Stoppable
from ..records.run_types import NodeResult

if TYPE_CHECKING:
    from ..pods.executor import Executor, PodHooks
    from ..pods.plan import PodRequest
    from ..records.run_folder import RunRecord
    from .probes import Probe

# How a daemon's pod ended becomes its node's phase: (outcome, retired by its boundary).
Finish = Callable[[PodOutcome, bool], NodeResult]


class Daemon:
    """A daemoned node, its pod's process and the thread that waits for it."""

    def __init__(self, node: NodeResult, thread: threading.Thread) -> None:
        self.node = node
        self.thread = thread
        self.handle: Stoppable | None = None
        self.retired = False  # ended by its boundary: Succeeded

    def retire(self) -> None:
        """Its boundary ended: stop it (unless a stop of the run already did: then it failed)."""
        if self.handle is not None and not getattr(self.handle, "stopped", False):
            self.retired = True
            self.handle.stop()


class Daemons:
    """The run's daemons by boundary (the steps or DAG node id whose end ends them; "" for
    none: they end with the workflow)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_boundary: dict[str, list[Daemon]] = {}

    def add(self, boundary: str, daemon: Daemon) -> None:
        with self.lock:
            self.by_boundary.setdefault(boundary, []).append(daemon)

    def end(self, boundary: str) -> None:
        """The boundary has ended: its daemons are stopped, and gone when this returns."""
        with self.lock:
            daemons = self.by_boundary.pop(boundary, [])
        for daemon in daemons:
            daemon.retire()
        for daemon in daemons:
            daemon.thread.join()

    def end_all(self) -> None:
        while self.by_boundary:
            self.end(next(iter(self.by_boundary)))


def boundary_of(record: RunRecord, node: NodeResult) -> str:
    """The id of the steps or DAG node a call's node runs under (Argo's ``BoundaryID``)."""
    parent = record.nodes.get(node.parent or "")
    while parent is not None and parent.type not in (NodeType.STEPS, NodeType.DAG):
        parent = record.nodes.get(parent.parent or "")
    return parent.id if parent is not None else ""


class _DaemonHooks:
    """The pod's hooks but for Running: the node turns Running once it is ready. Its process
    is stopped with the run (the root scope) too, since it outlives its node's own scope."""

    def __init__(self, hooks: PodHooks, scope: CancelScope, root: CancelScope) -> None:
        self.hooks = hooks
        self.scope = scope
        self.root = root
        self.started = threading.Event()
        self.handle: Stoppable | None = None

    def on_line(self, line: str) -> None:
        self.hooks.on_line(line)

    def on_start(self, handle: Stoppable) -> None:
        self.handle = handle
        self.scope.add(handle)
        self.root.add(handle)
        self.started.set()

    def on_exit(self, handle: Stoppable) -> None:
        self.scope.discard(handle)
        self.root.discard(handle)

    def on_container(self, name: str, end: object) -> None:
        on_container = getattr(self.hooks, "on_container", None)
        if on_container is not None:
            on_container(name, end)


def start_daemon(record: RunRecord, executor: Executor, registry: Daemons,
                 root_scope: CancelScope, slots: threading.Semaphore | None,
                 request: PodRequest, node: NodeResult, scope: CancelScope, hooks: PodHooks,
                 make_probe: Callable[[Callable[[], int | None]], Probe | None],
                 finish: Finish) -> NodeResult:
    """Start a daemon's pod and return its node once it is ready (Running, daemoned), or ended
    if it never got there. ``make_probe``: its readiness probe, given how to find the pod's
    pid (``NodeError`` for one that cannot run: raised before the pod starts)."""
    daemon_hooks = _DaemonHooks(hooks, scope, root_scope)
    probe = make_probe(lambda: getattr(getattr(daemon_hooks.handle, "proc", None), "pid", None))
    lock = threading.Lock()  # the pod's end and its becoming a daemon, one at a time
    ended = threading.Event()
    daemon = Daemon(node, threading.Thread(name=f"daemon {node.display_name}", daemon=True,
                                           target=lambda: serve()))
    registered: list[bool] = []

    def serve() -> None:  # the pod's thread: lives as long as the pod (PR_SET_PDEATHSIG)
        try:
            outcome = executor.run(request, daemon_hooks)
        except Exception as exc:  # an executor bug ends the daemon, not the run
            outcome = PodOutcome(exit_code=None, error=f"internal error: {exc!r}")
        with lock:
            ended.set()
            node.daemoned = False
            finish(outcome, daemon.retired)
            parent = record.nodes.get(node.parent or "")
            if registered and parent is not None and parent.type == NodeType.RETRY \
                    and not parent.done:
                record.finish(parent, node.phase, node.message)  # it took the daemon's phase

    if slots is not None:
        slots.acquire()  # released once ready: a daemon holds no slot while it serves
    try:
        if scope.stop_reason():
            return record.finish(node, NodePhase.FAILED, scope.stop_reason() or "")
        daemon.thread.start()
        ready = _wait_ready(daemon_hooks, ended, scope, probe)
    finally:
        if slots is not None:
            slots.release()
    from .probes import POD_IP  # only a run with a daemon loads it

    with lock:
        if ready and not ended.is_set():
            daemon.handle = daemon_hooks.handle
            node.daemoned, node.pod_ip = True, POD_IP
            record.transition(node, NodePhase.RUNNING)
            registry.add(boundary_of(record, node), daemon)
            registered.append(True)
            return node
    if daemon_hooks.handle is not None:  # stopped before it was ready
        daemon_hooks.handle.stop()
    daemon.thread.join()
    return node


def _wait_ready(hooks: _DaemonHooks, ended: threading.Event, scope: CancelScope,
                probe: Probe | None) -> bool:
    """Whether the pod became ready before it ended or its scope stopped."""

    def waited(seconds: float) -> bool:
        """Wait; False when the pod ended or the scope stopped meanwhile."""
        ended.wait(seconds)
        return not ended.is_set() and scope.stop_reason() is None

    while not hooks.started.is_set():
        if not waited(0.02):
            return False
    if probe is None:
        return waited(0)
    if probe.initial_delay_s and not waited(probe.initial_delay_s):
        return False
    successes = 0
    while waited(0):
        successes = successes + 1 if probe.check() else 0
        if successes >= probe.success_threshold:
            return waited(0)
        if not waited(probe.period_s):
            return False
    return False
