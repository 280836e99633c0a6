"""The engine: drives a workflow from its entrypoint, dispatching each template to its kind.

Split along Argo's controller's own seams: ``dag``, ``steps``, ``loops`` (withItems, withParam,
withSequence), ``retry``, ``exit_handler``, ``pod``, ``suspend``, ``daemons``, ``data_template``
and ``http_template`` hold one template kind each, ``calls``
a task or step invoked once, ``outputs`` what a node passes on, and ``run_folder`` the run's
nodes, phases and ``status.json``. A pod is planned as plain data (``plan.PodRequest``) and
run by the executor the options name (``executor`` is the interface; ``local_executor``, a local
process group, is the default). The per-kind modules see the run through ``context.RunContext``,
which :class:`Run` implements: they never import this module.

Each running task or step is a thread; pods' processes run in their own process groups under
cancel scopes (``scope``) that deadlines and Ctrl-C stop. Node naming, phases and variable
scopes follow Argo, so manifests behave here as on a cluster, for the features supported.

Interruption follows ``argo stop`` and ``argo terminate``. The first SIGINT (Ctrl-C), SIGTERM
or SIGHUP stops the run: every running pod gets SIGTERM (SIGKILL after ``KILL_GRACE_S``), nothing
new starts, the exit handler (``spec.onExit``) runs with ``workflow.status`` Failed, and the run
ends Failed with the message ``stopped``. A second one terminates it at once: every process of
the run, the exit handler's included, is killed and the run ends Failed, ``terminated``. Either
way ``run_workflow`` then raises ``RunInterrupted``. The signals are only recorded by their
handler and acted on by the main thread between its own steps, so a signal never lands in the
middle of the stopping itself.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sublimate.pipelines.argo_terms import NodePhase, NodeType

from .errors import ManifestError, NodeError, RunInterrupted
from .expressions.substitution import Vars
from .manifest.library import ANNOTATION_SCHEDULED_TIME
from .manifest.load import check_workflow, normalise_workflow
from .manifest.parameter_resolution import resolve_parameters
from .pods.artifacts import workflow_artifacts
from .pods.executor import Executor
from .pods.local_executor import LocalExecutor
from .pods.mount_modes import Mode, resolve_soon
from .pods.plan import PENDING_TIMEOUT, Layout, pending_limit, template_deadline, template_kind
from .pods.scope import CancelScope
from .records.run_folder import RunRecord, make_run_dir
from .records.run_types import (
    DEFAULT_MAX_NODES,
    NodeResult,
    RunEvent,
    RunOptions,
    RunResult,
    iso,
    now,
)
from .templates.calls import Slots, call_one
from .templates.daemons import Daemons
from .templates.dag import run_dag
from .templates.exit_handler import run_exit_handler
from .templates.inputs import resolve_inputs
from .templates.loops import cap_reached, check_loop_sizes, loop_items, run_loop
from .templates.pod import run_pod
from .templates.retry import retry_strategy, run_with_retries
from .templates.steps import run_steps

if TYPE_CHECKING:
    from .records.control import ControlChannel, Suspensions
    from .templates.hooks import Hook, WorkflowHooks
    from .templates.synchronization import Synchronizer


def prepare_workflow(workflow: dict, parameters: dict[str, str], images: bool = False,
                     max_nodes: int = DEFAULT_MAX_NODES) -> tuple[dict, dict[str, str]]:
    """The workflow as run (a template or cron workflow as submitted), checked, and its
    parameters resolved; ``ManifestError``/``ParameterError`` before anything exists.
    ``images``: pods run in their images, whose entrypoint stands for a missing command;
    ``max_nodes``: a loop whose known size passes it is refused (``loops``)."""
    if workflow.get("kind", "Workflow") != "Workflow" or "workflowTemplateRef" in workflow.get(
        "spec", {}
    ):
        workflow = normalise_workflow(workflow)
    check_workflow(workflow, images=images)
    resolved = resolve_parameters(workflow, parameters)
    check_loop_sizes(workflow["spec"], resolved, max_nodes)
    return workflow, resolved


def run_workflow(workflow: dict, parameters: dict[str, str], options: RunOptions) -> RunResult:
    """Validate, then run a workflow to completion; see the package docstring."""
    workflow, resolved = prepare_workflow(workflow, parameters,
                                          images=options.containers is not None,
                                          max_nodes=options.max_nodes)
    return Run(workflow, resolved, options).run()


def workflow_globals(workflow: dict, name: str, params: dict[str, str], created: datetime
                     ) -> Vars:
    """The ``workflow.*`` variables every template sees."""
    spec = workflow["spec"]
    values: Vars = {
        "workflow.name": name,
        "workflow.namespace": (workflow.get("metadata") or {}).get("namespace") or "default",
        "workflow.uid": _uuid4(),
        "workflow.creationTimestamp": iso(created) or "",
        "workflow.mainEntrypoint": spec["entrypoint"],
        "workflow.parameters": json.dumps([{"name": k, "value": v} for k, v in params.items()]),
    }
    # Set on a workflow a CronWorkflow started (the annotation Argo's controller reads).
    scheduled = ((workflow.get("metadata") or {}).get("annotations") or {}).get(
        ANNOTATION_SCHEDULED_TIME)
    if scheduled:
        values["workflow.scheduledTime"] = str(scheduled)
    for key, value in params.items():
        values[f"workflow.parameters.{key}"] = value
    return values


def _uuid4() -> str:
    # os.urandom rather than uuid: that import costs more than the whole run setup.
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) % 4]}{h[17:20]}-{h[20:32]}"


def seconds(value: object) -> str:
    return f"{float(value):g}s"  # type: ignore[arg-type]


# Argo's maxAllowedStackDepth and its error (workflow/controller): a template that calls itself
# without end stops here instead of growing the run until the machine gives out.
MAX_STACK_DEPTH = 100
MAX_DEPTH_EXCEEDED = ("Maximum recursion depth exceeded. See https://argo-workflows.readthedocs.io"
                      "/en/latest/scaling/#maximum-recursion-depth")


class Run:
    """One run: the state every template kind shares, and the dispatch between them."""

    def __init__(self, workflow: dict, params: dict[str, str], options: RunOptions) -> None:
        self.workflow = workflow
        self.spec: dict = workflow["spec"]
        self.templates = {t["name"]: t for t in self.spec["templates"]}
        self.params = params
        self.sync: Synchronizer | None = None  # before anything exists: it may refuse the run
        if self.spec.get("synchronization") or any(t.get("synchronization")
                                                   for t in self.spec["templates"]):
            from .templates.synchronization import (  # only such a workflow
                Synchronizer,
                configmap_limits,
            )

            limits = options.semaphores  # --semaphore first, then the ConfigMap manifests
            if options.objects is not None:
                limits = {**configmap_limits(options.objects), **limits}
            self.sync = Synchronizer(workflow, limits)
        self.executor: Executor = (LocalExecutor() if options.executor is None
                                   else options.executor)
        mounts = None
        if options.containers is not None:  # before anything exists: an image may be missing
            from .pods.images.executor import (
                image_executor,  # deferred: only container mode pays for it
            )

            self.executor = image_executor(workflow, params, options.containers)
            mounts = "image"
        home = Path(options.home)
        if options.run_folder is not None:  # a retry: the run's own folder and name
            self.name, self.run_dir = options.run_folder.name, options.run_folder
        else:
            self.name, self.run_dir = make_run_dir(home, workflow.get("metadata") or {})
        self.carried = options.carried
        # Cleared while the workflow is suspended (``argo suspend``: the server's PUT
        # .../suspend): nothing new starts until it is set again; what runs goes on.
        self.resumed = threading.Event()
        self.resumed.set()
        if options.reporter is not None:
            reporter = options.reporter
        else:
            from .records.display import console_reporter

            reporter = console_reporter(follow_logs=options.follow_logs)
        self.record = RunRecord(self.name, self.run_dir, params, reporter)
        self.lock = self.record.lock
        self.root_scope = CancelScope(self.lock)
        # A full disk under the run's own files stops the run, saying which (``run_folder``).
        self.record.on_disk_full = self.root_scope.stop
        # The exit handler runs outside the workflow's scope (a stop must not stop it), but a
        # second signal terminates it too.
        self.exit_scope = CancelScope(self.lock)
        limit = options.parallelism or self.spec.get("parallelism")
        # a stop frees its waiters (``calls.Slots``)
        self.pod_slots: threading.Semaphore | None = Slots(int(limit)) if limit else None
        self.max_nodes = options.max_nodes  # the node cap (``loops``)
        self.globals = workflow_globals(workflow, self.name, params, self.record.started_at)
        # How deep each template invocation is nested (the entrypoint's is 1): Argo's
        # currentStackDepth, which stops a template that calls itself (MAX_STACK_DEPTH).
        self.depths: dict[str, int] = {}
        self._mode = (resolve_soon(options.mounts, options.executor is None, self.run_dir, home)
                      if mounts is None else lambda: Mode(mounts))
        self._layout: Layout | None = None
        self._home = home
        self._objects = options.objects
        self._privileged_allowed = options.allow_privileged
        if options.objects is not None:  # every value of a Secret it names is masked from now
            from .pods.k8s_objects import referenced_secrets, secret_values

            names = referenced_secrets(self.spec)
            if names:
                self.record.remember_secrets(secret_values(options.objects, names))
        # `sublimate run --env`: what the user passed to every pod, masked as a secret from
        # now on, in the console, the logs, status.json and -o json (``pods.environment``)
        self.passed_env = dict(options.env)
        if self.passed_env:
            from .pods.k8s_objects import masked_forms

            self.record.remember_secrets({form for value in self.passed_env.values()
                                          for form in masked_forms(value)})
        # Daemons by the steps or DAG whose end ends them (``daemons``); the suspend nodes
        # waiting for `sublimate resume` and the channel it reaches them by (``control``).
        self.daemons = Daemons()
        self.suspensions: Suspensions | None = None
        self._control: ControlChannel | None = None
        if any("suspend" in t for t in self.spec["templates"]):
            from .records.control import ControlChannel, Suspensions

            self.suspensions = Suspensions(options.answers)
            self._control = ControlChannel(self.run_dir, self.suspensions)
        # Lifecycle hooks watch nodes' phase changes (``hooks``): the reporter is wrapped only
        # once something watches, so a workflow without hooks pays nothing for them.
        self._node_watchers: dict[str, Callable[[RunEvent], None]] | None = None
        self._all_watcher: Callable[[RunEvent], None] | None = None

    @property
    def layout(self) -> Layout:
        """Where the run's files live, and how pods see them: known once the mounts probe
        (started with the run) has answered; what it found that the user should know is said
        once, here."""
        if self._layout is None:
            with self.lock:
                if self._layout is None:
                    mode = self._mode()
                    if mode.note:
                        self.record.note("mounts", mode.note)
                    self._layout = Layout.of(self._home, self.run_dir, self.spec, mode.name,
                                             self._objects, self._privileged_allowed)
        return self._layout

    # ------------------------------------------------------------------------ watchers

    def watch_node(self, name: str, callback: Callable[[RunEvent], None]) -> None:
        """Call ``callback`` on every phase change of the node named ``name``."""
        with self.lock:
            self._watch()[name] = callback

    def unwatch_node(self, name: str) -> None:
        with self.lock:
            self._watch().pop(name, None)

    def watch_all(self, callback: Callable[[RunEvent], None] | None) -> None:
        """Call ``callback`` on every node's phase changes (None: no longer)."""
        with self.lock:
            self._watch()
            self._all_watcher = callback

    def _watch(self) -> dict[str, Callable[[RunEvent], None]]:
        if self._node_watchers is None:
            self._node_watchers = {}
            report = self.record.reporter

            def dispatch(event: RunEvent) -> None:
                report(event)
                if event.kind != "node" or event.node is None:
                    return
                assert self._node_watchers is not None
                watcher = self._node_watchers.get(event.node.name)
                if watcher is not None:
                    watcher(event)
                if self._all_watcher is not None:
                    self._all_watcher(event)

            self.record.reporter = dispatch
        return self._node_watchers

    # ------------------------------------------------------------------------ driver

    def run(self) -> RunResult:
        try:
            self.record.dump_manifest(self.workflow)
        except OSError as exc:  # a full disk: nothing started, the run ends here, saying which
            full = self.record.write_failed(exc)
            if full is None:
                raise
            self._mode()  # the mounts probe is done with the run folder before it may go
            self.record.not_started(full)
            return self.record.result()
        if self._control is not None:
            self._control.start()
        self.record.started()
        deadline = self.spec.get("activeDeadlineSeconds")
        if deadline is not None:
            self.root_scope.deadline(
                float(deadline), f"workflow exceeded its deadline of {seconds(deadline)}"
            )
        done, wake = threading.Event(), threading.Event()
        worker = threading.Thread(target=self._drive, args=(done, wake), daemon=True)
        try:
            if threading.current_thread() is not threading.main_thread():
                worker.start()  # signals reach the main thread only: whoever owns it stops us
                done.wait()
                return self.record.result()
            with _StopSignals(wake) as signals:
                worker.start()
                stopped_by = self._follow(done, signals)
        finally:
            self.root_scope.close()
            self.daemons.end_all()  # a terminated run's, killed already: their threads end
            if self._control is not None:
                self._control.close()
            close = getattr(self.executor, "close", None)  # container mode: the run's keeper
            if close is not None:
                close()
            if self._objects is not None:  # (not the layout: it may wait for the probe)
                from .pods.k8s_objects import remove_secret_root

                remove_secret_root(self.run_dir)
        if stopped_by is not None:
            raise RunInterrupted(stopped_by, self.exit_scope.reason == TERMINATED,
                                 self.record.result())
        return self.record.result()

    def _follow(self, done: threading.Event, signals: _StopSignals) -> int | None:
        """Wait for the run's end, stopping it on the first signal, terminating it on the
        second; the signal that stopped it, or None if it ended on its own (a signal that
        comes once the run is over changes nothing)."""
        stopped_by = None
        while not done.is_set():
            # A timeout, not a plain wait: the kernel may hand the signal to any other thread
            # (a step's, a daemon's); its Python handler then runs only once this thread wakes.
            signals.wake.wait(SIGNAL_CHECK_S)
            signals.wake.clear()
            if signals.received and stopped_by is None:
                stopped_by = signals.received[0]
                self.root_scope.stop(STOPPED)  # the driver goes on: the exit handler, conclude
            if len(signals.received) >= 2:
                self.terminate()
                break
        return stopped_by

    def terminate(self) -> None:
        """End the run now: kill every process (the exit handler's too) and conclude it."""
        self.exit_scope.terminate(TERMINATED)
        self.root_scope.terminate(TERMINATED)
        self.record.conclude(NodePhase.FAILED, TERMINATED)

    def _drive(self, done: threading.Event, wake: threading.Event) -> None:
        try:
            hooks: WorkflowHooks | None = None
            handler: Hook | None = None
            if self.spec.get("hooks") or self.spec.get("onExit"):
                # Imported here: a workflow without hooks does not pay for the module.
                from .templates.hooks import (
                    WorkflowHooks,
                    exit_hook,
                    named_hooks,
                    workflow_arguments,
                )

                handler = exit_hook(self.spec, workflow_arguments(self))
                if named_hooks(self.spec):
                    hooks = WorkflowHooks(self, named_hooks(self.spec))
                    hooks.start()
            entry_args = {"parameters": dict(self.params),
                          "artifacts": workflow_artifacts(self.spec, self.globals)}
            root = self.execute(self.spec["entrypoint"], entry_args,
                                self.name, self.name, None, self.root_scope)
            self.daemons.end_all()  # killDaemonedChildren(""): the workflow's own ones
            phase, message = root.phase, root.message
            stop = self.root_scope.reason
            if stop is not None:  # a deadline or a stop signal
                phase, message = NodePhase.FAILED, stop
            if hooks is not None:
                # operator.go: hooks are evaluated with the final status, and every fired
                # hook ends, before the exit handler starts; an expression error is the
                # entrypoint node's error there, the workflow's here.
                error = hooks.finish(phase)
                if error:
                    phase, message = NodePhase.ERROR, error
            if handler is not None and self.exit_scope.reason is None:
                phase, message = run_exit_handler(self, handler, phase, message)
            self.record.conclude(phase, message)
        except Exception as exc:  # an engine bug must still leave a readable status
            full = self.record.write_failed(exc)  # not a bug: a full disk, said in one line
            self.record.conclude(NodePhase.ERROR if full is None else NodePhase.FAILED,
                                 full or f"internal error: {exc!r}")
        finally:
            done.set()
            wake.set()

    # --------------------------------------------------------------------- templates

    def execute(self, template_name: str, arguments: dict, name: str, display: str,
                parent: NodeResult | None, scope: CancelScope, extra: Vars | None = None
                ) -> NodeResult:
        """Run a template invocation (with retries); ``arguments`` are already substituted."""
        if self.carried is not None:  # a retry or a resubmit: what the earlier run did
            earlier = self.carried.take(self.name, name)
            if earlier is not None:
                from .templates.rerun import carry

                return carry(self, earlier, name, parent, self.carried)
        while not self.resumed.wait(SIGNAL_CHECK_S) and scope.stop_reason() is None:
            pass  # suspended: no new node until resumed (or stopped)
        template = self.templates[template_name]
        kind = template_kind(template)
        strategy = retry_strategy(template, self.spec)
        node = self.record.add_node(name, display, template_name,
                                    NodeType.RETRY if strategy else kind, parent)
        made = len(self.record.nodes)  # the node cap (``loops``); the limit only past it
        if made > self.max_nodes and made > self.node_limit(scope):
            return self._stop_at_cap(node, template_name, scope)
        depth = self.depths[node.id] = self._caller_depth(parent) + 1
        if depth >= MAX_STACK_DEPTH:  # operator.go executeTemplate: ErrMaxDepthExceeded
            return self.record.finish(node, NodePhase.ERROR, MAX_DEPTH_EXCEEDED)
        try:
            inputs = resolve_inputs(template, arguments, node.id, self.live_globals())
        except NodeError as exc:
            return self.record.finish(node, NodePhase.ERROR, str(exc))
        if template.get("inputs"):  # shown as Argo shows a node's inputs
            node.inputs = {key[len(_INPUT_PARAMETER):]: value for key, value in inputs.items()
                           if key.startswith(_INPUT_PARAMETER)}
        inputs.update(extra or {})
        art_args = arguments.get("artifacts") or {}
        locks: list[str] | None = []
        if self.sync is not None:  # operator.go executeTemplate: TryAcquire before it starts
            try:
                limit = pending_limit(template, {**self.live_globals(), **inputs})
            except NodeError as exc:
                return self.record.finish(node, NodePhase.ERROR, str(exc))
            give_up = None if limit is None else time.monotonic() + limit

            def stopped() -> str | None:
                if give_up is not None and time.monotonic() >= give_up:
                    return PENDING_TIMEOUT  # still Pending past pendingTimeout
                return scope.stop_reason()

            locks = self.sync.acquire(
                template_name, lambda message: self.record.transition(node, NodePhase.PENDING,
                                                                      message),
                stopped)
            if locks is None:
                return self.record.finish(node, NodePhase.FAILED, stopped() or "")
            if locks and node.message.startswith("Waiting for "):
                node.message = ""  # acquired: Argo clears the waiting status
        try:
            memo = None
            if "memoize" in template:  # operator.go: after the lock, before the retry node
                from .templates.memoize import look_up, save  # only memoized templates load it

                memo = look_up(self, template, {**self.live_globals(), **inputs}, node, kind)
                if memo.done:
                    return node
            if strategy:
                result = run_with_retries(self, template, kind, inputs, node, scope, art_args,
                                          strategy)
            else:
                result = self.attempt(template, kind, inputs, node, scope, 0, art_args)
            if memo is not None:
                save(self, memo, template, result, kind)
            return result
        finally:
            if self.sync is not None:
                self.sync.release(locks or [])

    def _caller_depth(self, parent: NodeResult | None) -> int:
        """The nesting depth of the invocation ``parent`` belongs to (a step group, a task
        group and a retry's attempts are nodes of the invocation that holds them)."""
        nodes = self.record.nodes
        while parent is not None:
            depth = self.depths.get(parent.id)
            if depth is not None:
                return depth
            parent = nodes.get(parent.parent) if parent.parent else None
        return 0

    def attempt(self, template: dict, kind: NodeType, inputs: Vars, node: NodeResult,
                parent_scope: CancelScope, attempt: int, art_args: dict[str, dict]
                ) -> NodeResult:
        """One try of a template, under a scope of its own that its deadline stops."""
        scope = parent_scope.child()
        try:
            local = {**self.live_globals(), **inputs, "retries": str(attempt)}
            limit = template_deadline(template, local)
            if limit is not None:
                scope.deadline(limit, f"{node.display_name!r} exceeded its deadline of "
                                      f"{seconds(limit)}")
            if kind == NodeType.POD and "data" in template:
                from .templates.data_template import run_data  # only a workflow with one loads it

                return run_data(self, template, local, node, scope)
            if kind == NodeType.POD:
                return run_pod(self, template, local, node, scope, art_args)
            if kind == NodeType.SUSPEND:
                from .templates.suspend import run_suspend

                return run_suspend(self, template, local, node, scope)
            if kind == NodeType.HTTP:
                from .templates.http_template import run_http

                return run_http(self, template, local, node, scope)
            if kind == NodeType.DAG:
                return run_dag(self, template, local, node, scope)
            return run_steps(self, template, local, node, scope)
        except NodeError as exc:
            return self.record.finish(node, NodePhase.ERROR, str(exc))
        except OSError as exc:  # a write of the runner's found the disk full: the run stops
            full = self.record.write_failed(exc)
            if full is None:
                raise
            return self.record.finish(node, NodePhase.ERROR, full)
        finally:
            scope.close()
            if kind in (NodeType.DAG, NodeType.STEPS):
                self.daemons.end(node.id)  # its daemons end with it (killDaemonedChildren)

    def live_globals(self) -> Vars:
        """The ``workflow.*`` variables as of now: global outputs set so far (operator.go
        ``addOutputsToGlobalScope``, read by dag.go/steps.go as each call starts),
        ``workflow.status`` (the workflow's phase, Running until the exit handler sets the
        final one) and ``workflow.duration`` (elapsed seconds, Go's ``%f``), as
        ``setGlobalRuntimeParameters`` sets them on every pass of the controller."""
        with self.lock:
            values = dict(self.globals)
        values.setdefault("workflow.status", NodePhase.RUNNING)
        elapsed = (now() - self.record.started_at).total_seconds()
        values["workflow.duration"] = f"{elapsed:f}"
        return values

    def call(self, call: dict, call_vars: Vars, name: str, display: str, parent: NodeResult,
             scope: CancelScope, slots: threading.Semaphore | None, prefix: str) -> NodeResult:
        """Run a DAG task or a step, expanding loops; returns its node (or TaskGroup)."""
        where = f"{prefix}.{call['name']}"
        try:
            limit = self.node_limit(scope)
            items = loop_items(call, call_vars, where, limit - len(self.record.nodes), limit)
        except (NodeError, ValueError) as exc:
            node = self.record.add_node(name, display, call["template"], NodeType.POD, parent)
            return self.record.finish(node, NodePhase.ERROR, str(exc))
        if items is None:
            if "hooks" in call or "onExit" in call:
                from .templates.hooks import (
                    call_with_hooks,  # only a workflow with hooks imports it
                )

                return call_with_hooks(self, call, call_vars, name, display, parent, scope,
                                       slots, where, prefix)
            return call_one(self, call, call_vars, name, display, parent, scope, slots, where)

        def run_item(child: str, child_display: str, item: Vars, group: NodeResult
                     ) -> NodeResult:
            return call_one(self, call, {**call_vars, **item}, child, child_display, group,
                            scope, slots, where)

        return run_loop(self.record, call, items, name, display, parent, run_item,
                        scope.stop_reason)

    def node_limit(self, scope: CancelScope) -> int:
        """The most nodes the run may have while ``scope`` makes one: the cap, and for the
        exit handler as many again, so that a run stopped at the cap still runs it."""
        while scope is not None:
            if scope is self.exit_scope:
                return 2 * self.max_nodes
            scope = scope.parent  # type: ignore[assignment]
        return self.max_nodes

    def _stop_at_cap(self, node: NodeResult, template_name: str, scope: CancelScope
                     ) -> NodeResult:
        """The node that passed the cap errors, and the run stops (its running pods get
        SIGTERM), as Argo errors a workflow too large to store: nothing else grows. Past its
        own cap, the exit handler stops likewise."""
        in_exit_handler = self.node_limit(scope) > self.max_nodes
        message = cap_reached(template_name, self.node_limit(scope))
        self.record.finish(node, NodePhase.ERROR, message)
        (self.exit_scope if in_exit_handler else self.root_scope).stop(message)
        return node


_INPUT_PARAMETER = "inputs.parameters."
STOPPED = "stopped"
TERMINATED = "terminated"
SIGNAL_CHECK_S = 0.25  # how late a stop signal caught by another thread may be acted on
# Ctrl-C, `kill`, and the terminal closing: each stops a run as `argo stop` would.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _StopSignals:
    """While a run is driven from the main thread: records each stop signal and wakes the main
    thread, which acts on it. Raising from the handler (as Python's SIGINT handler does) could
    land anywhere, even inside the stopping; a recorded signal is handled between steps.

    A signal that was ignored when the run began (``nohup`` ignores SIGHUP, a shell's ``&``
    ignores SIGINT) stays ignored, as the user asked.
    """

    def __init__(self, wake: threading.Event) -> None:
        self.wake = wake
        self.received: list[int] = []
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: object) -> None:
        self.received.append(signum)
        self.wake.set()

    def __enter__(self) -> _StopSignals:
        for signum in STOP_SIGNALS:
            if signal.getsignal(signum) == signal.SIG_IGN:
                continue
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]


__all__ = ["ManifestError", "Run", "RunInterrupted", "prepare_workflow", "run_workflow"]
