"""Pods: a container or script template invocation, from its plan to its node's phase.

``run_pod`` plans the pod (``plan.plan_pod``), stages its node folder (mount folders, output
folders, the script, input artifacts), hands the request to the run's executor, then turns the
outcome into the node's phase as Argo does (a non-zero exit is ``Failed`` with
"Error (exit code N): <termination message>"; a pod that cannot start is ``Error``) and reads
its output parameters and artifacts back.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from sublimate.pipelines.argo_terms import NodePhase, NodeType

from ..errors import NodeError
from ..expressions.substitution import Vars, as_text, substitute
from ..pods import artifacts
from ..pods.executor import ContainerEnd, PodOutcome
from ..pods.plan import PodRequest, declared_outputs, plan_pod
from ..pods.scope import CancelScope, Stoppable
from ..records.run_types import NodeResult
from .calls import acquire_slot
from .outputs import set_artifact, set_param

if TYPE_CHECKING:
    from ..records.run_folder import RunRecord
    from .context import RunContext


def run_pod(run: RunContext, template: dict, local: Vars, node: NodeResult, scope: CancelScope,
            art_args: dict[str, dict]) -> NodeResult:
    """``NodeError`` (unresolvable variable, missing input) propagates: the caller makes the
    node Error."""
    record = run.record
    request = plan_pod(template, local, node_id=node.id, node_name=node.name,
                       display_name=node.display_name, layout=run.layout, art_args=art_args)
    request.passed_env = run.passed_env  # masked already: the run knows them as secrets
    _guard_secrets(record, request)
    stage(request, record)
    node.log = request.log
    hooks = _Hooks(record, node, scope, _container_nodes(record, node, request))
    if template.get("daemon") in (True, "true"):
        return _start_daemon(run, template, local, request, node, scope, hooks)
    slots = run.pod_slots
    if slots is not None and not acquire_slot(slots, scope):  # stopped while it waited
        _remove_secret_files(request)
        return record.finish(node, NodePhase.FAILED, scope.stop_reason() or "")
    try:
        if scope.stop_reason():
            return record.finish(node, NodePhase.FAILED, scope.stop_reason() or "")
        try:
            outcome = run.executor.run(request, hooks)
        except Exception as exc:  # a bug of the executor's: the node says so, the run ends
            outcome = PodOutcome(exit_code=None, error=f"the pod could not run: {exc!r}")
    finally:
        if slots is not None:
            slots.release()
        _remove_secret_files(request)
    return _conclude(run, request, node, scope, hooks, outcome)


def _conclude(run: RunContext, request: PodRequest, node: NodeResult, scope: CancelScope,
              hooks: _Hooks, outcome: PodOutcome, daemon: str = "") -> NodeResult:
    """The node's phase from how its pod ended, and its outputs. ``daemon``: "retired" for a
    daemon its boundary ended (Succeeded, whatever its exit code), "serving" for one that
    ended by itself (Failed, even with exit code 0)."""
    record = run.record
    if outcome.error:
        return record.finish(node, NodePhase.ERROR, outcome.error)
    phase, message = _ending(outcome, request, scope)
    if outcome.containers:
        from ..pods.container_set import (  # deferred: only such pods
            STOPPED_WHILE_RUNNING,
            pod_ending,
        )

        phase, message = pod_ending(outcome, scope.stop_reason() or "stopped")
        for child in hooks.containers.values():
            if not child.done:  # the pod failed first (assessNodeStatus)
                record.finish(child, NodePhase.FAILED, STOPPED_WHILE_RUNNING)
    if daemon == "retired":  # exec_control.go killDaemonedChildren
        phase, message = NodePhase.SUCCEEDED, ""
    elif daemon and phase == NodePhase.SUCCEEDED:  # operator.go: "daemon pods should run
        phase, message = NodePhase.FAILED, "daemon exited (exit code 0) before its steps or " \
            "DAG ended"  # indefinitely"
    node.exit_code = outcome.exit_code
    node.result = request.paths.restore(script_result(outcome.stdout))
    problem = _collect_outputs(run, request, node)
    if problem and phase == NodePhase.SUCCEEDED:
        phase, message = NodePhase.ERROR, problem
    return record.finish(node, phase, message)


def _start_daemon(run: RunContext, template: dict, local: Vars, request: PodRequest,
                  node: NodeResult, scope: CancelScope, hooks: _Hooks) -> NodeResult:
    """A ``daemon: true`` pod: its node returns once the pod is ready (``daemons``)."""
    from .daemons import start_daemon
    from .probes import readiness

    body = template.get("container") or template.get("script") or {}
    spec = substitute(body.get("readinessProbe"), local,
                      f"templates.{template['name']}.readinessProbe")

    def finish(outcome: PodOutcome, retired: bool) -> NodeResult:
        _remove_secret_files(request)
        return _conclude(run, request, node, scope, hooks, outcome,
                         "retired" if retired else "serving")

    return start_daemon(run.record, run.executor, run.daemons, run.root_scope, run.pod_slots,
                        request, node, scope, hooks,
                        lambda pid: readiness(spec, body, request, pid),  # type: ignore[arg-type]
                        finish)


def _remove_secret_files(request: PodRequest) -> None:
    if request.projections:
        from ..pods.k8s_objects import remove_projections

        remove_projections(request.projections)


def _guard_secrets(record: RunRecord, request: PodRequest) -> None:
    """Mask every secret the run knows in this pod's output, and say once which variables of
    optional secrets no manifest provides were taken from this machine's environment (their
    values are secrets too)."""
    taken = [name for container in [request, *request.containers]
             for name in container.from_environment if name in os.environ]
    values = set(request.masked)
    if taken:
        from ..pods.k8s_objects import masked_forms

        for name in dict.fromkeys(taken):
            values |= masked_forms(os.environ[name])
            record.note(f"environment:{name}",
                        f"{name} taken from this machine's environment: an optional "
                        "secretKeyRef that no Secret manifest provides")
    if values or record.secrets:
        request.masked = record.remember_secrets(frozenset(values))


def stage(request: PodRequest, record: RunRecord) -> None:
    """Create what the pod expects before it starts: its folders, script and input artifacts."""
    request.folder.mkdir(parents=True, exist_ok=True)
    for mount in request.mounts:
        if mount.volume:
            mount.local.mkdir(parents=True, exist_ok=True)
        if mount.shared:  # outlives the pod: workflow outputs may point here
            with record.lock:
                record.shared_mounts.mount(mount.path, mount.local)
    if request.view is None:  # in a view the pod's own layer holds them, made as it runs
        for path in declared_outputs({"outputs": request.outputs}):
            # inside the output's volume or the node's fs/: never through a link a pod left
            artifacts.make_parent(request.locate(path))
    for art in request.inputs:
        if request.view is not None and art.target.is_relative_to(request.view.upper):
            from ..pods.views import load_into_layer  # deferred: only overlay mode pays for it

            load_into_layer(request.view, art)
        else:
            artifacts.load_input(art)
    request.cwd.mkdir(parents=True, exist_ok=True)
    for container in request.containers:  # init containers, sidecars, a containerSet's
        for mount in container.mounts:
            if mount.volume:
                mount.local.mkdir(parents=True, exist_ok=True)
        container.cwd.mkdir(parents=True, exist_ok=True)
    if request.script is not None:
        request.script_path.write_text(request.script)
        request.script_path.chmod(0o755)  # executor.go StageFiles: mode 0755, runnable as is
    if request.projections:
        from ..pods.k8s_objects import write_projection  # secret and configMap volumes

        for projection in request.projections:
            write_projection(projection)


class _Hooks:
    """The executor's view of the node: log lines, Running, and the stop of its scope."""

    def __init__(self, record: RunRecord, node: NodeResult, scope: CancelScope,
                 containers: dict[str, NodeResult] | None = None) -> None:
        self.record = record
        self.node = node
        self.scope = scope
        self.containers = containers or {}

    def on_line(self, line: str) -> None:
        self.record.log_line(self.node, line)

    def on_start(self, handle: Stoppable) -> None:
        self.scope.add(handle)
        self.record.transition(self.node, NodePhase.RUNNING)

    def on_exit(self, handle: Stoppable) -> None:
        self.scope.discard(handle)

    def on_container(self, name: str, end: ContainerEnd | None) -> None:
        """A containerSet's container started (``end`` None) or ended: its node follows."""
        child = self.containers.get(name)
        if child is None:
            return
        if end is None:
            self.record.transition(child, NodePhase.RUNNING)
            return
        from ..pods.container_set import container_phase

        child.exit_code = end.exit_code
        self.record.finish(child, *container_phase(end))


def _container_nodes(record: RunRecord, node: NodeResult, request: PodRequest
                     ) -> dict[str, NodeResult]:
    """A containerSet's containers as ``Container`` nodes ``<pod>.<name>``, children of the pod's
    node (container_set_template.go ``executeContainerSet``), each with its own log."""
    found: dict[str, NodeResult] = {}
    for container in request.containers:
        if container.role == "set":
            child = record.add_node(f"{node.name}.{container.name}", container.name,
                                    node.template, NodeType.CONTAINER, node)
            child.log = container.log
            found[container.name] = child
    return found


MAX_RESULT_BYTES = 256 * 1024


def script_result(stdout: str) -> str:
    """``outputs.result`` as executor.go ``CaptureScriptResult`` takes it: one trailing newline
    removed, nothing else trimmed, and only the last 256 KiB (bytes) kept."""
    if stdout.endswith("\n"):
        stdout = stdout[:-1]
    data = stdout.encode()
    if len(data) > MAX_RESULT_BYTES:
        stdout = data[-MAX_RESULT_BYTES:].decode("utf-8", "replace")
    return stdout


def _ending(outcome: PodOutcome, request: PodRequest, scope: CancelScope
            ) -> tuple[NodePhase, str]:
    if outcome.stopped:
        return NodePhase.FAILED, scope.stop_reason() or "stopped"
    if outcome.exit_code != 0:
        message = f"{outcome.reason or 'Error'} (exit code {outcome.exit_code})"
        if outcome.message:  # Argo: "<reason> (exit code N): <termination message>"
            message = f"{message}: {request.message_paths().restore(outcome.message)}"
        return NodePhase.FAILED, message
    return NodePhase.SUCCEEDED, ""


def _collect_outputs(run: RunContext, request: PodRequest, node: NodeResult) -> str:
    """Read the pod's output parameters and store its artifacts; the first problem, or ``""``."""
    problem = ""
    for param in request.outputs.get("parameters") or []:
        source = param.get("valueFrom") or {}
        if "valueFrom" not in param and "value" in param:
            # A static output: executor.go's SaveParameters skips it, and ReportOutputs reports
            # the outputs as substituted when the pod was made, so its value is the output.
            set_param(run, node, param, as_text(param["value"]))
            continue
        if "path" not in source:
            continue
        try:
            # read inside the pod's volume or layer: a link it left is never followed out
            text = artifacts.read_parameter(request.locate(source["path"]))
            value = request.paths.restore(text.rstrip())
        except OSError:
            if "default" not in source:
                problem = problem or (f"output parameter {param['name']!r}: "
                                      f"{source['path']} not found")
                continue
            value = as_text(source["default"])
        set_param(run, node, param, value)
    for art in request.outputs.get("artifacts") or []:
        try:
            stored = artifacts.save_output(art, request.locate(art["path"]), run.layout.home,
                                           run.globals["workflow.name"], node.id)
        except NodeError as exc:
            problem = problem or str(exc)
            continue
        if stored is None:
            if not art.get("optional"):
                problem = problem or f"output artifact {art['name']!r}: {art['path']} not found"
            continue
        set_artifact(run, node, art, str(stored.path))
    return problem
