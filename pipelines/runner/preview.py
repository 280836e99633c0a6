"""The dry run (``sublimate run --dry-run``): the plan of what a run starts first, and what
decides the rest, with nothing started and no run folder created.

The first wave is what the engine would start at once: the DAG tasks that wait for nothing,
the first group of a steps template, nested DAG/steps templates' own first waves, and every
item of a loop whose items are known. Each is planned exactly as the engine plans it
(``plan.plan_pod``: resolved command line, env, working dir, mounts, deadline). The rest is
told in words from the DAG dependencies and step groups, with their conditions as written.

A loop shows its first items planned and counts the rest, planned alike; a loop or a first wave
that would pass the run's node cap (``--max-nodes``, ``loops``) is refused with the run's own
line, so the dry run of a million items answers at once, as the run would refuse it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from sublimate.pipelines.argo_terms import NodeType

from .engine import prepare_workflow, seconds, workflow_globals
from .errors import ManifestError, NodeError
from .expressions.conditions import ExpressionError, evaluate_when
from .expressions.substitution import Vars, as_text
from .pods.artifacts import workflow_artifacts
from .pods.plan import Layout, PodRequest, plan_pod, template_kind
from .records.run_folder import draw_name, node_id
from .records.run_types import DEFAULT_MAX_NODES
from .templates.calls import call_arguments, when_text
from .templates.dag import DagPlan, describe_depends
from .templates.inputs import resolve_inputs
from .templates.loops import cap_reached, item_display, item_vars, loop_items
from .templates.retry import retry_policy, retry_strategy

if TYPE_CHECKING:
    from .pods.k8s_objects import ObjectLibrary

_MAX_DEPTH = 20  # templates may call themselves (recursion ends on a condition at run time)
_SCRIPT_LINES = 12
_LOOP_SHOWN = 8  # a loop's items planned one by one; the rest are counted


@dataclass
class PlannedNode:
    """A node of the first wave: its plan, or why it has none (skipped, or an error)."""

    label: str  # its path from the entrypoint: "stage-data", "inner/produce", "fan(0:a)"
    template: str
    request: PodRequest | None = None
    notes: list[str] = field(default_factory=list)
    skipped: str = ""
    error: str = ""
    runs: str = ""  # what a node that runs no pod does (suspend, http, data)


@dataclass
class Preview:
    name: str
    run_dir: Path
    parameters: dict[str, str]
    first: list[PlannedNode] = field(default_factory=list)
    then: list[str] = field(default_factory=list)
    on_exit: str | None = None
    deadline_s: float | None = None
    passed_env: list[str] = field(default_factory=list)  # --env's names: never their values


def preview_workflow(workflow: dict, parameters: dict[str, str], home: Path,
                     objects: ObjectLibrary | None = None,
                     passed_env: list[str] | None = None,
                     max_nodes: int = DEFAULT_MAX_NODES) -> Preview:
    """``ManifestError``/``ParameterError`` as ``run_workflow`` would raise them (a first
    wave past ``max_nodes`` too); reads the manifest (and the Secret and ConfigMap manifests
    of ``objects``) only: no folder is created, no process started."""
    workflow, params = prepare_workflow(workflow, parameters, max_nodes=max_nodes)
    spec = workflow["spec"]
    name = draw_name(workflow.get("metadata") or {})
    run_dir = Path(home) / "runs" / name
    preview = Preview(name, run_dir, params, on_exit=spec.get("onExit"),
                      deadline_s=spec.get("activeDeadlineSeconds"),
                      passed_env=list(passed_env or []))
    globals_ = workflow_globals(workflow, name, params, datetime.now(UTC))
    planner = _Planner(preview, spec, Layout.of(Path(home), run_dir, spec, objects=objects),
                       globals_, max_nodes)
    entry_args = {"parameters": dict(params), "artifacts": workflow_artifacts(spec, globals_)}
    planner.template(spec["entrypoint"], entry_args, name, name, "", 0, [])
    return preview


class _Planner:
    def __init__(self, preview: Preview, spec: dict, layout: Layout, globals_: Vars,
                 max_nodes: int) -> None:
        self.preview = preview
        self.templates = {t["name"]: t for t in spec["templates"]}
        self.spec = spec
        self.layout = layout
        self.globals = globals_
        self.max_nodes = max_nodes
        self.nodes = 0  # the first wave's invocations and loop items, planned or counted

    def count(self, nodes: int, template_name: str) -> None:
        """``nodes`` more of the first wave: past the cap, the run would stop there (a
        template that calls itself twice at each level: 2^20 plans at the depth shown)."""
        self.nodes += nodes
        if self.nodes > self.max_nodes:
            raise ManifestError(cap_reached(template_name, self.max_nodes))

    def template(self, template_name: str, arguments: dict, name: str, display: str,
                 label: str, depth: int, notes: list[str]) -> None:
        """Plan one template invocation as ``Run.execute`` would run it."""
        template = self.templates[template_name]
        self.count(1, template_name)
        label = label or display
        if depth > _MAX_DEPTH:
            self.preview.then.append(f"{label}: nested deeper than {_MAX_DEPTH} templates")
            return
        wf = self.preview.name
        try:
            inputs = resolve_inputs(template, arguments, node_id(wf, name), self.globals)
            strategy = retry_strategy(template, self.spec)
            if strategy:
                policy = retry_policy(strategy, {**self.globals, **inputs}, template_name)
                notes = [*notes, policy.describe()]
                name, display = f"{name}(0)", f"{display}(0)"  # the first attempt
        except (NodeError, ValueError) as exc:
            self.preview.first.append(PlannedNode(label, template_name, error=str(exc)))
            return
        local = {**self.globals, **inputs, "retries": "0"}
        if "memoize" in template:
            from .templates.memoize import describe  # only a memoized template loads it

            notes = [*notes, describe(template, local, self.layout.home)]
        kind = template_kind(template)
        runs = _runs_no_pod(template)
        if runs:
            self.preview.first.append(PlannedNode(label, template_name, notes=notes, runs=runs))
            return
        if template.get("daemon") in (True, "true"):
            notes = [*notes, "daemon: serves until its steps or DAG end"]
        if kind == NodeType.POD:
            try:
                request = plan_pod(template, local, node_id=node_id(wf, name), node_name=name,
                                   display_name=display, layout=self.layout,
                                   art_args=arguments.get("artifacts") or {})
            except NodeError as exc:
                self.preview.first.append(PlannedNode(label, template_name, error=str(exc)))
                return
            self.preview.first.append(PlannedNode(label, template_name, request, notes))
            return
        if notes:
            self.preview.then.append(f"{label}: {'; '.join(notes)}")
        prefix = "" if depth == 0 else f"{label}/"
        if kind == NodeType.DAG:
            self._dag(template, local, name, prefix, depth)
        else:
            self._steps(template, local, name, prefix, depth)

    def _dag(self, template: dict, local: Vars, name: str, prefix: str, depth: int) -> None:
        plan = DagPlan(template["dag"])
        roots = plan.roots()
        for task_name, task in plan.tasks.items():
            if task_name in roots:
                self._call(task, local, f"{name}.{task_name}", task_name, name,
                           prefix, "tasks", depth)
            else:
                condition = describe_depends(plan.logic[task_name])
                self.preview.then.append(f"{prefix}{task_name} after {condition}"
                                         f"{_call_notes(task)}")

    def _steps(self, template: dict, local: Vars, name: str, prefix: str, depth: int) -> None:
        groups = template["steps"]
        group = f"{name}[0]"
        for step in groups[0] if groups else []:
            self._call(step, local, f"{group}.{step['name']}", step["name"], group, prefix,
                       "steps", depth)
        for index, later in enumerate(groups[1:], start=1):
            steps = ", ".join(f"{step['name']}{_call_notes(step)}" for step in later)
            self.preview.then.append(f"{prefix}[{index}] after [{index - 1}] succeeds: {steps}")

    def _call(self, call: dict, call_vars: Vars, name: str, display: str, parent: str,
              prefix: str, kind: str, depth: int) -> None:
        """A task or step of the first wave, as ``Run.call`` expands it."""
        where = f"{kind}.{call['name']}"
        try:
            items = loop_items(call, call_vars, where, self.max_nodes - self.nodes,
                               self.max_nodes)
        except (NodeError, ValueError) as exc:
            self.preview.first.append(PlannedNode(prefix + display, call["template"],
                                                  error=str(exc)))
            return
        if items is None:
            self._call_one(call, call_vars, name, display, prefix, where, depth)
            return
        if not items:
            self.preview.first.append(PlannedNode(prefix + display, call["template"],
                                                  skipped="empty loop items"))
        for index, item in enumerate(items[:_LOOP_SHOWN]):
            child = item_display(display, index, item)
            self._call_one(call, {**call_vars, **item_vars(item)}, f"{parent}.{child}", child,
                           prefix, where, depth)
        rest = len(items) - _LOOP_SHOWN
        if rest > 0:
            self.count(rest, call["template"])
            self.preview.first.append(PlannedNode(
                f"{prefix}{display}({_LOOP_SHOWN}..{len(items) - 1})", call["template"],
                runs=f"{rest:,} more items ({len(items):,} in all), each planned as those "
                     "above with its own item"))

    def _call_one(self, call: dict, call_vars: Vars, name: str, display: str, prefix: str,
                  where: str, depth: int) -> None:
        label = prefix + display
        try:
            condition = when_text(call, call_vars, where)
            if condition is not None and not evaluate_when(condition):
                self.preview.first.append(PlannedNode(
                    label, call["template"], skipped=f"when {condition!r} is false"))
                return
            arguments = call_arguments(call, call_vars, where)
        except (NodeError, ExpressionError) as exc:
            self.preview.first.append(PlannedNode(label, call["template"], error=str(exc)))
            return
        notes = [f"when {condition!r} holds"] if condition is not None else []
        self.template(call["template"], arguments, name, display, label, depth + 1, notes)


def _runs_no_pod(template: dict) -> str:
    """What a suspend, http or data template does, in words ("" for any other)."""
    if "suspend" in template:
        duration = (template["suspend"] or {}).get("duration")
        seconds = "s" if as_text(duration).strip().isdigit() else ""  # a number: seconds
        return f"suspend: waits {as_text(duration)}{seconds}" if duration else \
            "suspend: waits for `sublimate resume` (or `sublimate stop`)"
    if "http" in template:
        http = template["http"] or {}
        return f"http: {http.get('method') or 'GET'} {as_text(http.get('url'))}"
    if "data" in template:
        return "data: lists artifact keys and transforms them"
    return ""


def _call_notes(call: dict) -> str:
    """A later call's loop and condition, as written (their variables are not known yet)."""
    notes = []
    if "withItems" in call:
        notes.append(f"for each of {as_text(call['withItems'])}")
    elif "withParam" in call:
        notes.append(f"for each item of {as_text(call['withParam'])}")
    elif "withSequence" in call:
        notes.append(f"for each number of {as_text(call['withSequence'])}")
    if call.get("when") is not None:
        notes.append(f"if {as_text(call['when'])}")
    return f" ({'; '.join(notes)})" if notes else ""


def format_preview(preview: Preview) -> str:
    import shlex  # only the dry run quotes command lines

    lines = [
        f"dry run of {preview.name}: nothing is started and no run folder is created",
        f"run folder: {preview.run_dir} (a run draws its own name)",
        *([f"passed to every step (--env, values masked): {', '.join(preview.passed_env)}"]
          if preview.passed_env else []),
        "",
        "first:" if preview.first else "first: nothing",
    ]
    for planned in preview.first:
        head = f"  {planned.label} (template {planned.template})"
        if planned.error:
            lines.append(f"{head}: cannot start: {planned.error}")
            continue
        if planned.skipped:
            lines.append(f"{head}: skipped, {planned.skipped}")
            continue
        lines.append(head + "".join(f"; {note}" for note in planned.notes))
        if planned.runs:
            lines.append(f"    {planned.runs}")
            continue
        request = planned.request
        assert request is not None
        lines.append(f"    command: {shlex.join(request.argv)}")
        if request.script is not None:
            source = request.script.splitlines()
            lines.append(f"    script ({request.script_path}):")
            lines += [f"      | {line}" for line in source[:_SCRIPT_LINES]]
            if len(source) > _SCRIPT_LINES:
                lines.append(f"      | ... ({len(source) - _SCRIPT_LINES} more lines)")
        env = [f"{key}=<secret {request.secret_env[key]}>" if key in request.secret_env
               else f"{key}={value}" for key, value in request.env.items()]
        lines.append(f"    env: {', '.join(env) if env else 'none set by the template'}")
        if request.from_environment:
            lines.append("    from this environment if set (optional secrets): "
                         + ", ".join(request.from_environment))
        for mount in request.mounts:
            kind = mount.kind or "private to the pod"
            lines.append(f"    mount: {mount.path} -> {mount.local} ({kind})")
        lines.append(f"    working dir: {request.cwd}")
        deadline = "none" if request.deadline_s is None else seconds(request.deadline_s)
        lines.append(f"    deadline: {deadline}")
    if preview.then:
        lines.append("then:")
        lines += [f"  {line}" for line in preview.then]
    if preview.on_exit:
        lines.append(f"on exit: {preview.on_exit} (sees workflow.status and workflow.failures)")
    if preview.deadline_s is not None:
        lines.append(f"workflow deadline: {seconds(preview.deadline_s)}")
    return "\n".join(lines)
