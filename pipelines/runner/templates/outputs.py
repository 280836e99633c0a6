"""Outputs: what a finished node exposes to the nodes after it, and to the workflow.

``result_vars`` gives the ``tasks.<name>.*`` / ``steps.<name>.*`` variables of a finished call
(a loop's children aggregated as Argo does); ``template_outputs`` sets a DAG/steps template's
own outputs from its tasks (``valueFrom.parameter`` or ``.expression``, ``from`` or
``fromExpression``); ``set_param``/``set_artifact`` record a
node's output, and a ``globalName`` makes it a workflow output too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sublimate.pipelines.argo_terms import NodeType

from ..errors import NodeError
from ..expressions.substitution import Vars, as_text, substitute_text
from ..records.run_types import NodeResult, iso
from .loops import group_vars

if TYPE_CHECKING:
    from .context import RunContext


def result_vars(prefix: str, name: str, node: NodeResult, nodes: dict[str, NodeResult]) -> Vars:
    base = f"{prefix}.{name}"
    out: Vars = {f"{base}.status": node.phase, f"{base}.id": node.id}
    if node.started_at:
        out[f"{base}.startedAt"] = iso(node.started_at) or ""
    if node.finished_at:
        out[f"{base}.finishedAt"] = iso(node.finished_at) or ""
    if node.type == NodeType.TASK_GROUP:
        out.update(group_vars(base, [nodes[c] for c in node.children]))
        return out
    for pname, value in node.parameters.items():
        out[f"{base}.outputs.parameters.{pname}"] = value
    for aname, path in node.artifacts.items():
        out[f"{base}.outputs.artifacts.{aname}"] = path
    if node.result is not None:
        out[f"{base}.outputs.result"] = node.result
    if node.exit_code is not None:
        out[f"{base}.exitCode"] = str(node.exit_code)
    if node.pod_ip:  # a daemon's address (controller/scope.go buildLocalScope)
        out[f"{base}.ip"] = node.pod_ip
    return out


def template_outputs(run: RunContext, template: dict, scope_vars: Vars, node: NodeResult) -> str:
    """Outputs of a DAG/steps template, taken from its tasks; a problem, or ``""``."""
    outputs = template.get("outputs") or {}
    where = f"templates.{template['name']}.outputs"
    for param in outputs.get("parameters") or []:
        if "valueFrom" not in param and "value" in param:
            # operator.go getTemplateOutputsFromScope: a DAG's or steps' outputs come from its
            # children; a static value passes validate.go but fails the node here.
            return "output parameters must have a valueFrom specified"
        source = param.get("valueFrom") or {}
        if "parameter" not in source and "expression" not in source:
            continue
        try:
            if "expression" in source:
                value = _expression_value(str(source["expression"]), scope_vars,
                                          f"{where}.parameters.{param['name']}")
            else:
                value = substitute_text(str(source["parameter"]), scope_vars, where)
        except NodeError as exc:
            # operator.go getTemplateOutputsFromScope: an error falls back to valueFrom.default.
            if "default" not in source:
                return str(exc)
            value = as_text(source["default"])
        set_param(run, node, param, value)
    for art in outputs.get("artifacts") or []:
        if art.get("from") or art.get("fromExpression"):
            try:
                path = artifact_source(art, scope_vars, f"{where}.artifacts.{art['name']}")
            except NodeError as exc:
                if art.get("optional"):
                    continue
                return str(exc)
            set_artifact(run, node, art, path)
    return ""


def _expression_value(source: str, scope_vars: Vars, where: str) -> str:
    """``valueFrom.expression`` (controller/scope.go resolveParameter); expr loads lazily."""
    from ..expressions.conditions import ExpressionError
    from ..expressions.expr_lang import output_parameter

    try:
        return output_parameter(source, scope_vars)
    except ExpressionError as exc:
        raise NodeError(f"{where}.valueFrom.expression: {exc}") from None


def artifact_source(art: dict, scope_vars: Vars, where: str) -> str:
    """The stored path an artifact's ``from`` or ``fromExpression`` names (scope.go
    resolveArtifact); used for a DAG/steps template's outputs and for call arguments."""
    if not art.get("fromExpression"):
        return substitute_text(str(art["from"]), scope_vars, where)
    from ..expressions.conditions import ExpressionError
    from ..expressions.expr_lang import artifact_path

    try:
        return artifact_path(str(art["fromExpression"]), scope_vars)
    except ExpressionError as exc:
        raise NodeError(f"{where}.fromExpression: {exc}") from None


def set_param(run: RunContext, node: NodeResult, param: dict, value: str) -> None:
    node.parameters[param["name"]] = value
    if param.get("globalName"):
        with run.lock:
            run.record.set_output("parameters", param["globalName"], value)
            run.globals[f"workflow.outputs.parameters.{param['globalName']}"] = value


def set_artifact(run: RunContext, node: NodeResult, art: dict, path: str) -> None:
    node.artifacts[art["name"]] = path
    if art.get("globalName"):
        with run.lock:
            run.record.set_output("artifacts", art["globalName"], path)
            run.globals[f"workflow.outputs.artifacts.{art['globalName']}"] = path
