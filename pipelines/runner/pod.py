"""Pods: a container or script template invocation, from its plan to its node's phase.

``run_pod`` plans the pod (``plan.plan_pod``), stages its node folder (mount folders, output
folders, the script, input artifacts), hands the request to the run's executor, then turns the
outcome into the node's phase as Argo does (a non-zero exit is ``Failed`` with
"Error (exit code N): <termination message>"; a pod that cannot start is ``Error``) and reads
its output parameters and artifacts back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sublimate.pipelines.argo_terms import NodePhase

from . import artifacts
from .errors import NodeError
from .executor import PodOutcome
from .model import NodeResult
from .outputs import set_artifact, set_param
from .plan import PodRequest, plan_pod
from .scope import CancelScope, Stoppable
from .substitution import Vars, as_text

if TYPE_CHECKING:
    from .engine import Run
    from .run_folder import RunRecord


def run_pod(run: Run, template: dict, local: Vars, node: NodeResult, scope: CancelScope,
            art_args: dict[str, dict]) -> NodeResult:
    """``NodeError`` (unresolvable variable, missing input) propagates: the caller makes the
    node Error."""
    record = run.record
    request = plan_pod(template, local, node_id=node.id, node_name=node.name,
                       display_name=node.display_name, layout=run.layout, art_args=art_args)
    stage(request, record)
    node.log = request.log
    slots = run.pod_slots
    if slots is not None:
        slots.acquire()
    try:
        if scope.stop_reason():
            return record.finish(node, NodePhase.FAILED, scope.stop_reason() or "")
        outcome = run.executor.run(request, _Hooks(record, node, scope))
    finally:
        if slots is not None:
            slots.release()
    if outcome.error:
        return record.finish(node, NodePhase.ERROR, outcome.error)
    phase, message = _ending(outcome, request, scope)
    node.exit_code = outcome.exit_code
    node.result = request.paths.restore(outcome.stdout.strip())
    problem = _collect_outputs(run, request, node)
    if problem and phase == NodePhase.SUCCEEDED:
        phase, message = NodePhase.ERROR, problem
    return record.finish(node, phase, message)


def stage(request: PodRequest, record: RunRecord) -> None:
    """Create what the pod expects before it starts: its folders, script and input artifacts."""
    request.folder.mkdir(parents=True, exist_ok=True)
    for mount in request.mounts:
        if mount.volume:
            mount.local.mkdir(parents=True, exist_ok=True)
        if mount.shared:  # outlives the pod: workflow outputs may point here
            with record.lock:
                record.shared_mounts.mount(mount.path, mount.local)
    for local in [*request.output_files().values(), *request.artifact_paths().values()]:
        local.parent.mkdir(parents=True, exist_ok=True)
    for art in request.inputs:
        if art.raw is not None:
            artifacts.place_raw(art.raw, art.target)
        elif art.source is not None:
            if not art.source.exists():
                if art.optional:
                    continue
                raise NodeError(f"input artifact {art.name!r}: {art.source} not found")
            artifacts.place(art.source, art.target)
    request.cwd.mkdir(parents=True, exist_ok=True)
    if request.script is not None:
        request.script_path.write_text(request.script)


class _Hooks:
    """The executor's view of the node: log lines, Running, and the stop of its scope."""

    def __init__(self, record: RunRecord, node: NodeResult, scope: CancelScope) -> None:
        self.record = record
        self.node = node
        self.scope = scope

    def on_line(self, line: str) -> None:
        self.record.log_line(self.node, line)

    def on_start(self, handle: Stoppable) -> None:
        self.scope.add(handle)
        self.record.transition(self.node, NodePhase.RUNNING)

    def on_exit(self, handle: Stoppable) -> None:
        self.scope.discard(handle)


def _ending(outcome: PodOutcome, request: PodRequest, scope: CancelScope
            ) -> tuple[NodePhase, str]:
    if outcome.stopped:
        return NodePhase.FAILED, scope.stop_reason() or "stopped"
    if outcome.exit_code != 0:
        message = f"Error (exit code {outcome.exit_code})"
        if outcome.message:  # Argo: "<reason> (exit code N): <termination message>"
            message = f"{message}: {request.paths.restore(outcome.message)}"
        return NodePhase.FAILED, message
    return NodePhase.SUCCEEDED, ""


def _collect_outputs(run: Run, request: PodRequest, node: NodeResult) -> str:
    """Read the pod's output parameters and store its artifacts; the first problem, or ``""``."""
    problem = ""
    for param in request.outputs.get("parameters") or []:
        source = param.get("valueFrom") or {}
        if "path" not in source:
            continue
        try:
            value = request.paths.restore(request.local(source["path"]).read_text().rstrip())
        except OSError:
            if "default" not in source:
                problem = problem or (f"output parameter {param['name']!r}: "
                                      f"{source['path']} not found")
                continue
            value = as_text(source["default"])
        set_param(run, node, param, value)
    for art in request.outputs.get("artifacts") or []:
        local = request.local(art["path"])
        if not local.exists():
            if not art.get("optional"):
                problem = problem or f"output artifact {art['name']!r}: {art['path']} not found"
            continue
        stored = artifacts.save(local, request.run_dir / "artifacts" / node.id / art["name"])
        set_artifact(run, node, art, str(stored))
    return problem
