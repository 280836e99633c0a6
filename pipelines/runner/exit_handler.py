"""The exit handler (``spec.onExit``): a template that runs after the workflow, whatever its end.

It sees ``{{workflow.status}}`` and ``{{workflow.failures}}`` (the failed pods, as Argo lists
them), runs as node ``onExit`` outside the workflow's deadline, and turns a workflow that
succeeded into a failed one when it fails itself. A stopped run (``argo stop``, Ctrl-C) runs it
too, with ``workflow.status`` Failed; a terminated one (a second Ctrl-C) does not.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from sublimate.pipelines.argo_terms import NodePhase, NodeType

from .model import iso

if TYPE_CHECKING:
    from .engine import Run


def run_exit_handler(run: Run, template: str, phase: NodePhase, message: str
                     ) -> tuple[NodePhase, str]:
    """The workflow's phase and message once the handler has run."""
    failures = [
        {
            "displayName": n.display_name,
            "message": n.message,
            "templateName": n.template,
            "phase": n.phase,
            "podName": n.id,
            "finishedAt": iso(n.finished_at),
        }
        for n in list(run.record.nodes.values())
        if n.phase.failed and n.type == NodeType.POD
    ]
    with run.lock:
        run.globals["workflow.status"] = phase
        run.globals["workflow.failures"] = json.dumps(failures)
    # The workflow's deadline and a stop do not cover the exit handler, as in Argo: it runs
    # in a scope of its own, which only terminating the run stops.
    handler = run.execute(template, {}, f"{run.name}.onExit", "onExit", None, run.exit_scope)
    if handler.phase.failed and phase == NodePhase.SUCCEEDED:
        return NodePhase.FAILED, f"exit handler failed: {handler.message}"
    return phase, message
