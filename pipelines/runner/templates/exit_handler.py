"""The exit handler (``spec.onExit`` or ``spec.hooks.exit``): a template that runs after the
workflow, whatever its end.

It sees ``{{workflow.status}}`` and ``{{workflow.failures}}`` (every failed or errored node, as
Argo's operator.go lists and quotes them), runs as node ``onExit`` outside the workflow's
deadline, and turns a workflow that succeeded into a failed one when it fails itself. A stopped
run (``argo stop``, Ctrl-C) runs it too, with ``workflow.status`` Failed; a terminated one (a
second Ctrl-C) does not. Its arguments
are the hook's, else the workflow's (``WorkflowSpec.GetExitHook(spec.arguments)`` in Argo's
``workflow_types.go``: ``onExit`` gets the workflow's arguments, a hook without any gets them too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sublimate.pipelines.argo_terms import NodePhase, NodeType

from ..errors import NodeError

if TYPE_CHECKING:
    from .context import RunContext
    from .hooks import Hook


def run_exit_handler(run: RunContext, hook: Hook, phase: NodePhase, message: str
                     ) -> tuple[NodePhase, str]:
    """The workflow's phase and message once the handler has run."""
    failures = run.record.failures()  # every Failed/Error node, quoted as Argo does
    with run.lock:
        run.globals["workflow.status"] = phase
        run.globals["workflow.failures"] = failures
    # The workflow's deadline and a stop do not cover the exit handler, as in Argo: it runs
    # in a scope of its own, which only terminating the run stops.
    name = f"{run.name}.onExit"
    try:
        arguments = hook.resolve_arguments(run.live_globals(), "onExit")
    except NodeError as exc:
        handler = run.record.add_node(name, "onExit", hook.template, NodeType.POD, None)
        handler = run.record.finish(handler, NodePhase.ERROR, str(exc))
    else:
        handler = run.execute(hook.template, arguments, name, "onExit", None, run.exit_scope)
    if handler.phase.failed and phase == NodePhase.SUCCEEDED:
        return NodePhase.FAILED, f"exit handler failed: {handler.message}"
    return phase, message
