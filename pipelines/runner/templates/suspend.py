"""Suspend templates: an approval gate that waits for a person, or a timed wait.

As Argo's ``executeSuspend`` (operator.go): the node is a ``Suspend`` node, Running while it
waits. With ``suspend.duration`` (a Go duration or a number of seconds, as
``ParseStringToDuration`` reads it; it may come from a parameter) it resumes by itself once the
duration has passed, each supplied output parameter taking its default (one without a default
is the node's error). Without one it waits for ``sublimate resume`` or ``sublimate stop`` from
another terminal, or for an answer given up front (the harness's ``answers=``): ``control``
holds Argo's rules for both. A deadline or a stop of the run ends the wait: the node Fails with
its reason. Its supplied output parameters are then ``steps.<name>.outputs.parameters.<p>``
like any node's, and a ``globalName`` makes one a workflow output.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from sublimate.pipelines.argo_terms import NodePhase

from ..errors import NodeError
from ..expressions.substitution import Vars, substitute
from ..manifest.durations import parse_duration
from ..pods.scope import CancelScope
from ..records.control import WAITING, ControlError, Suspensions, Waiting, node_fields
from ..records.run_types import NodeResult
from .outputs import set_param

if TYPE_CHECKING:
    from .context import RunContext

INPUT_PREFIX = "inputs.parameters."


def resume_hint(run_name: str, node: NodeResult, outputs: list[dict], inputs: list[dict],
                seconds: float | None) -> str:
    """What a person waits on a suspend node with: the command that resumes it (its supplied
    output parameters, with their enum's values: the output's, else the input's of the same
    name, as ``control.Waiting`` checks them), as the live output and the node's message say
    it while it waits."""
    enums = {param.get("name"): param.get("enum") for param in inputs if param.get("enum")}
    supplied = []
    for param in outputs:
        if "supplied" in (param.get("valueFrom") or {}):
            enum = param.get("enum") or enums.get(param["name"]) or []
            values = "|".join(str(v) for v in enum) or "VALUE"
            supplied.append(f" -p {param['name']}={values}")
    selector = f" --node-field-selector displayName={node.display_name}"
    command = f"sublimate resume {run_name}{selector}{''.join(supplied)}"
    after = f"; resumes by itself after {seconds:g}s" if seconds is not None else ""
    return f"{WAITING}{command} (or sublimate stop {run_name}{selector}){after}"


def run_suspend(run: RunContext, template: dict, local: Vars, node: NodeResult,
                scope: CancelScope) -> NodeResult:
    """``NodeError`` (an unresolvable variable, a bad duration) propagates: the node errs."""
    record = run.record
    where = f"templates.{template['name']}"
    tmpl: dict = substitute({key: template.get(key) or {}  # type: ignore[assignment]
                             for key in ("suspend", "inputs", "outputs")}, local, where)
    duration = tmpl["suspend"].get("duration")
    try:
        seconds = parse_duration(duration) if duration not in (None, "") else None
    except ValueError as exc:
        raise NodeError(f"{where}.suspend.duration: {exc}") from None
    outputs = tmpl["outputs"].get("parameters") or []
    record.transition(node, NodePhase.RUNNING, resume_hint(
        run.name, node, outputs, tmpl["inputs"].get("parameters") or [], seconds))
    inputs = {k.removeprefix(INPUT_PREFIX): v for k, v in local.items()
              if k.startswith(INPUT_PREFIX) and "." not in k.removeprefix(INPUT_PREFIX)}
    waiting = Waiting(node, node_fields(node, inputs), outputs,
                      tmpl["inputs"].get("parameters") or [])
    suspensions = run.suspensions or Suspensions()
    if not scope.add(waiting):
        return record.finish(node, NodePhase.FAILED, scope.stop_reason() or "stopped")
    suspensions.enter(waiting)
    try:
        ends = None if seconds is None else time.monotonic() + seconds
        answered = waiting.event.wait(None if ends is None else max(ends - time.monotonic(), 0))
        with record.lock:
            node.message = ""  # no longer waiting: the hint goes (its end says what happened)
        if not answered and scope.stop_reason() is None:
            try:
                suspensions.expire(waiting)
            except ControlError as exc:
                return record.finish(node, NodePhase.ERROR, str(exc))
    finally:
        suspensions.leave(waiting)
        scope.discard(waiting)
    verdict = waiting.verdict
    if verdict is None:  # the scope stopped it
        return record.finish(node, NodePhase.FAILED, scope.stop_reason() or "stopped")
    declared = {p["name"]: p for p in outputs}
    for name, value in verdict.outputs.items():
        set_param(run, node, declared[name], value)
    return record.finish(node, verdict.phase, verdict.message)
