"""What a manifest's size would cost on a cluster: checks that need no schema, only arithmetic.

- **The object itself.** Argo keeps every Workflow (and template) in etcd, which takes objects
  under 1 MB (Argo's docs/offloading-large-workflows.md); a Volcano Job is sent to the API server
  in one request, which etcd caps at 1.5 MiB by default (``--max-request-bytes``,
  https://etcd.io/docs/v3.4/dev-guide/limit/). Over that, the cluster refuses it: an error.
- **The status it would grow.** A loop of a fixed size (``withItems``, ``withSequence``) makes
  that many nodes in the Workflow's status, about 1.9 KB each as measured on the sweep's
  (docs/scale.md). Past 1 MB Argo compresses the status (``status.compressedNodes``) and past
  that it needs ``persistence.nodeStatusOffLoad`` in the controller's ConfigMap: a warning
  naming it. The same for the workflow as a whole, counted from its entrypoint through every
  call: a DAG of 4,096 plain tasks outgrows it with no loop at all.
- **The controller's rate.** Without ``parallelism`` every item starts at once, and the
  controller creates their pods at its client's default 20 requests per second (``--qps 20``,
  ``--burst 30``, Argo's docs/scaling.md), its other work queued behind them: past 30 s of that
  budget (600 items), a warning naming ``parallelism``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from .problems import LintProblem, as_dict, as_list

WORKFLOW_LIMIT_BYTES = 1_000_000
ETCD_REQUEST_LIMIT_BYTES = 1_572_864  # 1.5 MiB
STATUS_BYTES_PER_NODE = 1_900
CONTROLLER_QPS, CONTROLLER_BURST = 20, 30
# Warn when starting a loop's items alone would take the controller this long at its rate.
RATE_WARNING_SECONDS = 30


def is_volcano_job(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("kind") == "Job" \
        and str(doc.get("apiVersion", "")).startswith("batch.volcano.sh/")


def scale_problems(doc: Mapping[str, Any], source: str, document: str) -> list[LintProblem]:
    """The size checks of one Argo document or Volcano Job (see the module's docstring)."""
    size = len(json.dumps(doc, separators=(",", ":"), default=str).encode())
    if is_volcano_job(doc):
        tasks = as_list(as_dict(doc.get("spec")).get("tasks"))
        if size > ETCD_REQUEST_LIMIT_BYTES:
            return [LintProblem(source, document, "", (
                f"{size:,} bytes in {len(tasks)} task(s): over etcd's default request limit of "
                f"1.5 MiB (--max-request-bytes), so the API server refuses the Job; render a "
                "role as one task with replicas: N (as sublimate's launcher does) rather than "
                "one task per replica"))]
        return []
    kind = doc.get("kind", "Workflow")
    if size > WORKFLOW_LIMIT_BYTES:
        return [LintProblem(source, document, "", (
            f"{size:,} bytes: Argo stores a {kind} in etcd, which takes objects under 1 MB; "
            "move large values out of the manifest (an artifact, a ConfigMap, a file on the "
            "shared volume)"))]
    return list(_fan_out_warnings(doc, source, document))


def _fan_out_warnings(doc: Mapping[str, Any], source: str,
                      document: str) -> Iterator[LintProblem]:
    spec = as_dict(doc.get("spec"))
    base = "spec"
    if doc.get("kind") == "CronWorkflow":
        spec, base = as_dict(spec.get("workflowSpec")), "spec.workflowSpec"
    templates = {template.get("name"): template for template in as_list(spec.get("templates"))
                 if isinstance(template, dict)}
    loops = list(_loop_warnings(spec, base, templates, source, document))
    yield from loops
    if not any(STATUS_WARNING in problem.message for problem in loops):
        yield from _workflow_warning(spec, base, templates, source, document)


# What both status warnings end with: what Argo does past 1 MB, and what keeps a workflow under.
STATUS_WARNING = "over etcd's 1 MB"
STATUS_ADVICE = ("Argo compresses it (status.compressedNodes), and past that the controller "
                 "needs persistence.nodeStatusOffLoad (a database)")


def _workflow_warning(spec: Mapping[str, Any], base: str, templates: Mapping[Any, Any],
                      source: str, document: str) -> Iterator[LintProblem]:
    """The whole workflow's status, from its entrypoint (a WorkflowTemplate without one: from
    its largest template), when no loop alone outgrows it."""
    names = [spec["entrypoint"]] if spec.get("entrypoint") in templates else list(templates)
    if not names:
        return
    nodes, root = max((1 + _nodes_per_call(templates[name], templates), name)
                      for name in names)
    status = nodes * STATUS_BYTES_PER_NODE
    if status <= WORKFLOW_LIMIT_BYTES:
        return
    index = next(i for i, template in enumerate(as_list(spec.get("templates")))
                 if isinstance(template, dict) and template.get("name") == root)
    yield LintProblem(source, document, f"{base}.templates[{index}]", (
        f"the workflow makes about {nodes:,} nodes from template {root!r}, "
        f"{status / 1e6:.1f} MB of workflow status, {STATUS_WARNING}: {STATUS_ADVICE}; "
        "fewer nodes (fewer, larger steps, or the calls split into child workflows) keep it "
        "under"), warning=True)


def _loop_warnings(spec: Mapping[str, Any], base: str, templates: Mapping[Any, Any],
                   source: str, document: str) -> Iterator[LintProblem]:
    for index, template in enumerate(as_list(spec.get("templates"))):
        if not isinstance(template, dict):
            continue
        limited = template.get("parallelism") or spec.get("parallelism")
        for where, calls in (("dag.tasks", as_list(as_dict(template.get("dag")).get("tasks"))),
                             ("steps", [step for group in as_list(template.get("steps"))
                                        for step in as_list(group)])):
            for position, call in enumerate(calls):
                items = _loop_size(call) if isinstance(call, dict) else None
                if not items:
                    continue
                path = f"{base}.templates[{index}].{where}[{position}]"
                nodes = items * (1 + _nodes_per_call(templates.get(call.get("template")),
                                                     templates))
                status = nodes * STATUS_BYTES_PER_NODE
                if status > WORKFLOW_LIMIT_BYTES:
                    yield LintProblem(source, document, path, (
                        f"{items:,} items make about {nodes:,} nodes, {status / 1e6:.1f} MB of "
                        f"workflow status, {STATUS_WARNING}: {STATUS_ADVICE} or the loop split "
                        "into child workflows"), warning=True)
                if not limited and items / CONTROLLER_QPS > RATE_WARNING_SECONDS:
                    yield LintProblem(source, document, path, (
                        f"{items:,} items start at once without parallelism: the controller "
                        f"creates their pods at its default {CONTROLLER_QPS} requests/s "
                        f"(--qps, --burst {CONTROLLER_BURST}), about "
                        f"{items / CONTROLLER_QPS:.0f} s with its other work queued behind; "
                        "set parallelism on the template or the workflow"), warning=True)


def _loop_size(call: Mapping[str, Any]) -> int | None:
    """The number of items of a loop known from the manifest alone (None: none, or only known
    when it runs, as withParam)."""
    if isinstance(call.get("withItems"), list):
        return len(call["withItems"])
    sequence = as_dict(call.get("withSequence"))
    count, start, end = (_number(sequence.get(key)) for key in ("count", "start", "end"))
    if count is not None:
        return count
    if end is not None and "count" not in sequence:  # start..end, both ends included
        return abs(end - (start or 0)) + 1
    return None


def _number(value: Any) -> int | None:
    """A literal whole number (an int, or a string of digits); None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _nodes_per_call(template: Mapping[str, Any] | None, templates: Mapping[Any, Any],
                    depth: int = 0, memo: dict[tuple[Any, int], int] | None = None) -> int:
    """The status nodes one call of ``template`` adds below its own (a retried pod: one more).
    ``memo``: each template at each depth counted once, so a template that calls itself, or
    calls of many calls, cost lint their number of templates, not their product."""
    if not template or depth > 10:
        return 0
    memo = {} if memo is None else memo
    key = (template.get("name"), depth)
    if key not in memo:
        memo[key] = _count_below(template, templates, depth, memo)
    return memo[key]


def _count_below(template: Mapping[str, Any], templates: Mapping[Any, Any], depth: int,
                 memo: dict[tuple[Any, int], int]) -> int:
    nodes = 1 if template.get("retryStrategy") else 0
    nodes += len(as_list(template.get("steps")))  # a StepGroup node per group
    calls = as_list(as_dict(template.get("dag")).get("tasks")) + [
        step for group in as_list(template.get("steps")) for step in as_list(group)]
    for call in calls:
        if isinstance(call, dict):
            nodes += (_loop_size(call) or 1) * (1 + _nodes_per_call(
                templates.get(call.get("template")), templates, depth + 1, memo))
    return nodes
