"""Steps templates: groups run one after another, the steps of a group in parallel.

Each group is a ``StepGroup`` node ``[i]``; a step that fails (without ``continueOn``) fails
its group, and no later group starts. Later groups see earlier steps' outputs as
``steps.<name>.*``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sublimate.pipelines.argo_terms import NodePhase, NodeType

from ..expressions.substitution import Vars
from ..pods.scope import CancelScope
from ..records.run_types import NodeResult
from .calls import FAIL_FAST, continues, parallelism_slots
from .loops import run_concurrently
from .outputs import result_vars, template_outputs

if TYPE_CHECKING:
    from .context import RunContext


def run_steps(run: RunContext, template: dict, local: Vars, node: NodeResult, scope: CancelScope
              ) -> NodeResult:
    record = run.record
    record.transition(node, NodePhase.RUNNING)
    step_vars: Vars = {}
    slots = parallelism_slots(template, local)
    failure = ""
    for index, group in enumerate(template["steps"]):
        if scope.stop_reason():
            break
        group_node = record.add_node(f"{node.name}[{index}]", f"[{index}]", template["name"],
                                     NodeType.STEP_GROUP, node)
        record.transition(group_node, NodePhase.RUNNING)
        # steps.go: a group's steps see the global scope as of the group's start (workflow
        # outputs of earlier groups, status, duration).
        call_vars = {**local, **run.live_globals(), **step_vars}
        results: list[NodeResult | None] = [None] * len(group)

        def run_step(i: int, step: dict, gn: NodeResult = group_node, v: Vars = call_vars,
                     out: list[NodeResult | None] = results) -> None:
            out[i] = run.call(step, v, f"{gn.name}.{step['name']}", step["name"], gn, scope,
                              slots, "steps")

        def omit_step(i: int, step: dict, reason: str, gn: NodeResult = group_node,
                      out: list[NodeResult | None] = results) -> None:
            # as call_one omits a step the stop finds waiting, without a thread of its own
            node = record.add_node(f"{gn.name}.{step['name']}", step["name"],
                                   step.get("template", ""), NodeType.SKIPPED, gn)
            out[i] = record.finish(node, NodePhase.OMITTED, f"not started: {reason}")

        run_concurrently(run_step, group, scope.stop_reason, omit_step)
        for step, result in zip(group, results, strict=True):
            assert result is not None
            step_vars.update(result_vars("steps", step["name"], result, record.nodes))
            if result.phase.failed and not continues(step, result.phase) and not failure:
                failure = f"step {step['name']!r} {result.phase.lower()}: {result.message}"
        if slots is not None and slots.halted:
            # operator.go checkParallelism: failFast fails the leaf step group and the template.
            failure = FAIL_FAST
        record.finish(group_node, NodePhase.FAILED if failure else NodePhase.SUCCEEDED, failure)
        if failure:
            break
    problem = template_outputs(run, template, {**local, **step_vars}, node)
    if scope.stop_reason():
        return record.finish(node, NodePhase.FAILED, scope.stop_reason() or "")
    if failure:
        return record.finish(node, NodePhase.FAILED, failure)
    if problem:
        return record.finish(node, NodePhase.ERROR, problem)
    return record.finish(node, NodePhase.SUCCEEDED)
