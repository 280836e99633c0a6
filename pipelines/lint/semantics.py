"""The semantic layer: what the schema cannot express (template/task references, DAG cycles,
``{{...}}`` variable references). Pure Python: it must not import jsonschema.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sublimate.pipelines.argo_terms import (
    DEPENDS_RESULTS,
    TAG,
    ExpressionError,
    container_setting_problems,
    depends_references,
    object_name_problem,
    parse_depends,
    sub_path_problem,
    unknown_targets,
)

from .problems import (
    ARGO_KINDS,
    LintProblem,
    as_dict,
    as_list,
    did_you_mean,
    document_label,
    names,
)

_TEMPLATE_TYPES = (
    "container",
    "containerSet",
    "script",
    "dag",
    "steps",
    "resource",
    "suspend",
    "data",
    "http",
    "plugin",
)
# Template types whose node has `outputs.result` / `exitCode` (Argo's Template.HasOutput).
_RESULT_TYPES = ("container", "containerSet", "script", "data", "http", "plugin")
_LOOP_KEYS = ("withItems", "withParam", "withSequence")
_NODE_ATTRS = (
    "id",
    "ip",
    "status",
    "exitCode",
    "startedAt",
    "finishedAt",
    "hostNodeName",
    "outputs",
)
_WORKFLOW_VARS = (
    "name",
    "namespace",
    "uid",
    "serviceAccountName",
    "mainEntrypoint",
    "priority",
    "duration",
    "status",
    "failures",
    "scheduledTime",
    "creationTimestamp",
    "labels",
    "annotations",
    "parameters",
    "outputs",
)
# Roots Argo itself checks; tags with other roots (e.g. Jinja in a script) are left alone, as
# Argo's validator does.
_CHECKED_ROOTS = ("workflow", "inputs", "outputs", "item", "tasks", "steps")


@dataclass
class _Report:
    source: str
    document: str
    problems: list[LintProblem] = field(default_factory=list)

    def add(self, path: str, message: str) -> None:
        self.problems.append(LintProblem(self.source, self.document, path, message))


@dataclass
class _Workflow:
    """What the checks need to know about the workflow spec being linted."""

    kind: str
    templates: dict[str, dict[str, Any]]
    params: set[str]
    uses_ref: bool  # spec.workflowTemplateRef: templates and parameters live elsewhere

    def unknown_template(self, name: str) -> str:
        return f"unknown template '{name}'{did_you_mean(name, self.templates)}"


@dataclass(frozen=True)
class _Scope:
    """Variables visible at one place in a template."""

    template: dict[str, Any] | None  # enclosing template; None at workflow level
    node_kind: str | None = None  # "tasks" (DAG) or "steps"
    nodes: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    visible: frozenset[str] | None = None  # referable nodes; None: any node of the template
    node: str | None = None  # the task/step whose fields are being checked
    in_loop: bool = False


def semantic_problems(doc: Mapping[str, Any], source: str = "<string>") -> list[LintProblem]:
    """Checks the schema cannot do: references between templates, DAG structure, variables."""
    return check_semantics(doc, source, document_label(doc, 1))


def check_semantics(doc: Mapping[str, Any], source: str, document: str) -> list[LintProblem]:
    report = _Report(source, document)
    _semantic(doc, report)
    return report.problems


def _semantic(doc: Mapping[str, Any], report: _Report) -> None:
    kind = doc.get("kind")
    metadata = as_dict(doc.get("metadata"))
    for key in ("name", "generateName"):
        if metadata.get(key) is not None:
            problem = object_name_problem(str(metadata[key]), prefix=key == "generateName")
            if problem is not None:
                report.add(f"metadata.{key}", problem)
    spec = as_dict(doc.get("spec"))
    base = "spec"
    if kind == "CronWorkflow":
        spec, base = as_dict(spec.get("workflowSpec")), "spec.workflowSpec"
    if kind in ARGO_KINDS:
        _check_workflow_spec(report, spec, base, kind)


def _check_workflow_spec(report: _Report, spec: dict[str, Any], base: str, kind: str) -> None:
    templates: dict[str, dict[str, Any]] = {}
    for i, tmpl in enumerate(as_list(spec.get("templates"))):
        name = as_dict(tmpl).get("name")
        if not isinstance(name, str):
            continue
        if name in templates:
            report.add(f"{base}.templates[{i}].name", f"duplicate template name '{name}'")
        templates.setdefault(name, tmpl)
    wf = _Workflow(
        kind=kind,
        templates=templates,
        params=set(names(as_dict(spec.get("arguments")).get("parameters"))),
        uses_ref="workflowTemplateRef" in spec,
    )
    _check_entrypoint(report, spec, base, wf)
    _check_exit_and_hooks(report, spec, base, wf)
    for i, tmpl in enumerate(as_list(spec.get("templates"))):
        if isinstance(tmpl, dict):
            _check_template(report, tmpl, f"{base}.templates[{i}]", wf)
    # Workflow-level fields (arguments, podMetadata, volumeClaimTemplates...) see only globals.
    rest = {k: v for k, v in spec.items() if k not in ("templates", "templateDefaults")}
    _check_refs(report, rest, base, wf, _Scope(template=None))


def _check_entrypoint(report: _Report, spec: dict[str, Any], base: str, wf: _Workflow) -> None:
    if wf.uses_ref:
        return
    entry = spec.get("entrypoint")
    if not entry:
        # A WorkflowTemplate may leave the entrypoint to the submitter; a Workflow may not.
        if wf.kind in ("Workflow", "CronWorkflow"):
            report.add(base, "missing entrypoint: set spec.entrypoint to one of the templates")
        return
    if not isinstance(entry, str):
        return
    if entry not in wf.templates:
        report.add(f"{base}.entrypoint", f"entrypoint refers to {wf.unknown_template(entry)}")
    elif wf.kind in ("Workflow", "CronWorkflow"):
        # Workflow arguments feed the entrypoint's inputs by name.
        supplied = wf.params
        for name in _required_inputs(wf.templates[entry]):
            if name not in supplied:
                report.add(
                    f"{base}.arguments",
                    f"entrypoint template '{entry}' needs input parameter '{name}', "
                    "which spec.arguments.parameters does not set",
                )


def _check_exit_and_hooks(report: _Report, spec: dict[str, Any], base: str, wf: _Workflow) -> None:
    if wf.uses_ref:
        return
    on_exit = spec.get("onExit")
    if isinstance(on_exit, str) and on_exit and on_exit not in wf.templates:
        report.add(f"{base}.onExit", f"onExit refers to {wf.unknown_template(on_exit)}")
    _check_hooks(report, spec.get("hooks"), f"{base}.hooks", wf)


def _check_hooks(report: _Report, hooks: Any, path: str, wf: _Workflow) -> None:
    for name, hook in as_dict(hooks).items():
        target = as_dict(hook).get("template")
        if isinstance(target, str) and target not in wf.templates:
            report.add(f"{path}.{name}.template", f"hook refers to {wf.unknown_template(target)}")


def _check_template(report: _Report, tmpl: dict[str, Any], path: str, wf: _Workflow) -> None:
    name = tmpl.get("name", "?")
    types = [t for t in _TEMPLATE_TYPES if tmpl.get(t) is not None]
    if not types:
        report.add(path, f"template '{name}' has no type: set one of {', '.join(_TEMPLATE_TYPES)}")
    elif len(types) > 1:
        report.add(path, f"template '{name}' sets more than one type: {', '.join(types)}")
    _check_mounts(report, tmpl, path)
    body = {k: v for k, v in tmpl.items() if k not in ("dag", "steps")}
    if isinstance(tmpl.get("dag"), dict):
        tasks = _check_dag(report, tmpl, f"{path}.dag", wf)
        _check_refs(report, body, path, wf, _Scope(tmpl, "tasks", tasks))
    elif isinstance(tmpl.get("steps"), list):
        steps = _check_steps(report, tmpl, f"{path}.steps", wf)
        _check_refs(report, body, path, wf, _Scope(tmpl, "steps", steps))
    else:
        _check_refs(report, body, path, wf, _Scope(tmpl))


def _check_mounts(report: _Report, tmpl: dict[str, Any], path: str) -> None:
    """Each container's limits and capabilities, and each volumeMount's ``subPath``, written
    out in the template, as Kubernetes checks a pod (one from a parameter is the runner's to
    check once substituted)."""
    holders: list[tuple[str, Any]] = [(kind, tmpl.get(kind)) for kind in
                                      ("container", "script", "containerSet")]
    container_set = tmpl.get("containerSet")
    if isinstance(container_set, dict):
        holders += [(f"containerSet.containers[{j}]", c)
                    for j, c in enumerate(container_set.get("containers") or [])]
    for kind in ("initContainers", "sidecars"):
        holders += [(f"{kind}[{j}]", c) for j, c in enumerate(tmpl.get(kind) or [])]
    for where, holder in holders:
        if not isinstance(holder, dict):
            continue
        for setting, problem in container_setting_problems(holder):
            report.add(f"{path}.{where}.{setting}", problem)
        for k, mount in enumerate(holder.get("volumeMounts") or []):
            sub_path = mount.get("subPath") if isinstance(mount, dict) else None
            if sub_path and "{{" not in str(sub_path):
                problem = sub_path_problem(str(sub_path))
                if problem is not None:
                    report.add(f"{path}.{where}.volumeMounts[{k}].subPath", problem)


def _required_inputs(tmpl: dict[str, Any]) -> list[str]:
    """Input parameters with no value, default or valueFrom: the caller must pass them."""
    params = as_list(as_dict(tmpl.get("inputs")).get("parameters"))
    return [
        p["name"]
        for p in params
        if isinstance(p, dict)
        and isinstance(p.get("name"), str)
        and not any(k in p for k in ("value", "default", "valueFrom"))
    ]


def _callee(node: dict[str, Any], wf: _Workflow) -> dict[str, Any] | None:
    """The template a task/step runs, when it can be resolved offline."""
    if isinstance(node.get("inline"), dict):
        return node["inline"]
    name = node.get("template")
    return wf.templates.get(name) if isinstance(name, str) else None


def _check_call(report: _Report, node: dict[str, Any], path: str, wf: _Workflow, what: str) -> None:
    """Checks shared by DAG tasks and steps: template, onExit and hooks exist; inputs supplied."""
    target, label = node.get("template"), f"{what} '{node.get('name')}'"
    if not any(node.get(k) for k in ("template", "templateRef", "inline")):
        report.add(path, f"{label} needs one of template, templateRef, inline")
    elif isinstance(target, str) and not wf.uses_ref and target not in wf.templates:
        report.add(f"{path}.template", f"{label} uses {wf.unknown_template(target)}")
    on_exit = node.get("onExit")
    if isinstance(on_exit, str) and on_exit and not wf.uses_ref and on_exit not in wf.templates:
        report.add(f"{path}.onExit", f"onExit refers to {wf.unknown_template(on_exit)}")
    if not wf.uses_ref:
        _check_hooks(report, node.get("hooks"), f"{path}.hooks", wf)
    callee = _callee(node, wf)
    if callee is None:
        return
    supplied = set(names(as_dict(node.get("arguments")).get("parameters")))
    for name in _required_inputs(callee):
        if name not in supplied:
            report.add(
                f"{path}.arguments",
                f"template '{callee.get('name', 'inline')}' needs input parameter '{name}', "
                f"which {what} '{node.get('name')}' does not pass",
            )


def _index_nodes(
    report: _Report, items: Iterable[tuple[str, Any]], what: str
) -> dict[str, tuple[str, dict[str, Any]]]:
    """name -> (path, node); reports duplicate names."""
    nodes: dict[str, tuple[str, dict[str, Any]]] = {}
    for path, node in items:
        name = as_dict(node).get("name")
        if not isinstance(name, str):
            continue
        if name in nodes:
            report.add(f"{path}.name", f"duplicate {what} name '{name}'")
        else:
            nodes[name] = (path, node)
    return nodes


# --- DAG ---------------------------------------------------------------------------------------


def _dag_dependencies(
    report: _Report, task: dict[str, Any], path: str, names: Mapping[str, Any]
) -> list[str]:
    deps: list[str] = []
    dependencies, depends = task.get("dependencies"), task.get("depends")
    if dependencies is not None and depends is not None:
        report.add(path, "use either 'depends' or 'dependencies', not both")
    for j, dep in enumerate(as_list(dependencies)):
        if not isinstance(dep, str):
            continue
        if dep not in names:
            msg = f"dependency '{dep}' is not a task in this DAG{did_you_mean(dep, names)}"
            report.add(f"{path}.dependencies[{j}]", msg)
        else:
            deps.append(dep)
    if isinstance(depends, str):
        try:
            references = depends_references(parse_depends(depends))
        except ExpressionError as error:
            report.add(f"{path}.depends", str(error))
            references = []
        for dep, result in references:
            if dep not in names:
                msg = f"depends refers to unknown task '{dep}'{did_you_mean(dep, names)}"
                report.add(f"{path}.depends", msg)
                continue
            if result is not None and result not in DEPENDS_RESULTS:
                allowed = ", ".join(DEPENDS_RESULTS)
                report.add(f"{path}.depends", f"unknown task result '{dep}.{result}' ({allowed})")
            deps.append(dep)
    return deps


def _find_cycles(graph: Mapping[str, list[str]]) -> list[list[str]]:
    """Distinct dependency cycles, each as [a, b, ..., a] (depth-first search, iterative)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    for root in graph:
        if state.get(root):
            continue
        path: list[str] = [root]
        iters = [iter(graph[root])]
        state[root] = 1
        while iters:
            nxt = next(iters[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                iters.pop()
            elif state.get(nxt) == 1:
                cycle = [*path[path.index(nxt) :], nxt]
                if frozenset(cycle) not in seen:
                    seen.add(frozenset(cycle))
                    cycles.append(cycle)
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                iters.append(iter(graph.get(nxt, [])))
    return cycles


def _ancestors(graph: Mapping[str, list[str]]) -> dict[str, frozenset[str]]:
    out: dict[str, frozenset[str]] = {}
    for task in graph:
        seen: set[str] = set()
        stack = list(graph[task])
        while stack:
            dep = stack.pop()
            if dep not in seen:
                seen.add(dep)
                stack.extend(graph.get(dep, []))
        out[task] = frozenset(seen)
    return out


def _check_dag(
    report: _Report, tmpl: dict[str, Any], path: str, wf: _Workflow
) -> dict[str, dict[str, Any]]:
    dag = tmpl["dag"]
    tasks = as_list(dag.get("tasks"))
    index = _index_nodes(report, ((f"{path}.tasks[{i}]", t) for i, t in enumerate(tasks)), "task")
    graph = {
        name: _dag_dependencies(report, task, tpath, index) for name, (tpath, task) in index.items()
    }
    for cycle in _find_cycles(graph):
        report.add(index[cycle[0]][0], f"dependency cycle: {' -> '.join(cycle)}")
    target = dag.get("target")
    if isinstance(target, str):
        for name in unknown_targets(target, index):
            report.add(f"{path}.target", f"target '{name}' is not a task in this DAG"
                       + ("" if name else " (targets are separated by single spaces)"))
    nodes = {name: task for name, (_, task) in index.items()}
    ancestors = _ancestors(graph)
    for name, (tpath, task) in index.items():
        _check_call(report, task, tpath, wf, "task")
        scope = _Scope(tmpl, "tasks", nodes, ancestors[name], name, _in_loop(task))
        _check_node_refs(report, task, tpath, wf, scope)
    return nodes


def _in_loop(node: dict[str, Any]) -> bool:
    return any(node.get(k) is not None for k in _LOOP_KEYS)


def _check_node_refs(
    report: _Report, node: dict[str, Any], path: str, wf: _Workflow, scope: _Scope
) -> None:
    # `inline` is a template of its own; hooks run alongside the node, so any node of the
    # template may be referenced there.
    fields = {k: v for k, v in node.items() if k not in ("inline", "hooks")}
    _check_refs(report, fields, path, wf, scope)
    if "hooks" in node:
        hook_scope = _Scope(scope.template, scope.node_kind, scope.nodes, None, None, scope.in_loop)
        _check_refs(report, node["hooks"], f"{path}.hooks", wf, hook_scope)


# --- steps -------------------------------------------------------------------------------------


def _check_steps(
    report: _Report, tmpl: dict[str, Any], path: str, wf: _Workflow
) -> dict[str, dict[str, Any]]:
    groups = [as_list(g) for g in tmpl["steps"]]
    located = [
        (f"{path}[{g}][{s}]", step)
        for g, group in enumerate(groups)
        for s, step in enumerate(group)
    ]
    index = _index_nodes(report, located, "step")
    nodes = {name: step for name, (_, step) in index.items()}
    earlier: set[str] = set()
    for g, group in enumerate(groups):
        for s, step in enumerate(group):
            if not isinstance(step, dict):
                continue
            spath = f"{path}[{g}][{s}]"
            _check_call(report, step, spath, wf, "step")
            visible = frozenset(earlier)
            scope = _Scope(tmpl, "steps", nodes, visible, step.get("name"), _in_loop(step))
            _check_node_refs(report, step, spath, wf, scope)
        earlier.update(names(group))
    return nodes


# --- {{...}} references --------------------------------------------------------------------------


def _walk_strings(obj: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(obj, str):
        yield path, obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from _walk_strings(value, f"{path}.{key}" if path else str(key))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _walk_strings(value, f"{path}[{i}]")


def _check_refs(report: _Report, obj: Any, path: str, wf: _Workflow, scope: _Scope) -> None:
    for spath, text in _walk_strings(obj, path):
        if "{{" not in text:
            continue
        # dict.fromkeys: a tag repeated in one string (Hera's script preamble) is reported once.
        for tag in dict.fromkeys(m.group(1).strip() for m in TAG.finditer(text)):
            if tag.startswith("="):  # expression tag: evaluated by expr-lang, not checked here
                continue
            message = _resolve(tag, wf, scope)
            if message:
                report.add(spath, f"unresolved reference '{{{{{tag}}}}}': {message}")


def _resolve(tag: str, wf: _Workflow, scope: _Scope) -> str | None:
    """Why ``tag`` cannot be resolved at this place, or None when it can (or is not checked)."""
    parts = tag.split(".")
    root = parts[0]
    if root not in _CHECKED_ROOTS:
        return None
    if root == "workflow":
        return _resolve_workflow(parts, wf)
    if scope.template is None:
        return None  # workflow-level fields: only workflow.* is checked
    if root == "item":
        if scope.in_loop:
            return None
        return "'item' is only defined in a task or step with withItems, withParam or withSequence"
    if root in ("inputs", "outputs"):
        return _resolve_io(parts, scope.template)
    return _resolve_node(parts, wf, scope)


def _resolve_workflow(parts: list[str], wf: _Workflow) -> str | None:
    if len(parts) < 2 or parts[1] not in _WORKFLOW_VARS:
        return f"unknown workflow variable (known: {', '.join(_WORKFLOW_VARS)})"
    if parts[1] == "parameters" and len(parts) >= 3 and parts[2] != "json" and not wf.uses_ref:
        name = ".".join(parts[2:])
        if name not in wf.params:
            hint = did_you_mean(name, wf.params)
            return f"workflow parameter '{name}' is not declared in spec.arguments.parameters{hint}"
    return None


def _resolve_io(parts: list[str], tmpl: dict[str, Any]) -> str | None:
    direction = parts[0]  # inputs / outputs
    if len(parts) < 3 or parts[1] not in ("parameters", "artifacts"):
        return None  # inputs.parameters (all as JSON), outputs.result, outputs.exitCode
    declared = names(as_dict(tmpl.get(direction)).get(parts[1]))
    name = parts[2]
    if name in declared:
        return None
    kind = parts[1][:-1]  # parameter / artifact
    where = f"{direction}.{parts[1]}"
    return (
        f"template '{tmpl.get('name', '?')}' declares no {direction[:-1]} {kind} '{name}' in "
        f"{where}{did_you_mean(name, declared)}"
    )


def _resolve_node(parts: list[str], wf: _Workflow, scope: _Scope) -> str | None:
    root = parts[0]  # tasks / steps
    what = "task" if root == "tasks" else "step"
    if len(parts) == 2 and parts[1] == "name":
        return None  # tasks.name / steps.name: the current node's name
    if scope.node_kind != root:
        where = "a DAG template" if root == "tasks" else "a steps template"
        return f"'{root}.*' can only be used inside {where}"
    if len(parts) < 3:
        return f"incomplete reference to a {what}"
    name, attr = parts[1], parts[2]
    if name not in scope.nodes:
        return f"'{name}' is not a {what} in this template{did_you_mean(name, scope.nodes)}"
    if scope.visible is not None and name not in scope.visible:
        if root == "tasks":
            return (
                f"task '{name}' is not an ancestor of task '{scope.node}': add it to "
                "'dependencies' or 'depends'"
            )
        return f"step '{name}' is not in an earlier step group than step '{scope.node}'"
    if attr not in _NODE_ATTRS:
        return f"unknown {what} attribute '{attr}' (known: {', '.join(_NODE_ATTRS)})"
    if attr == "outputs" and len(parts) >= 4:
        return _resolve_node_outputs(parts, _callee(scope.nodes[name], wf), what)
    return None


def _resolve_node_outputs(parts: list[str], callee: dict[str, Any] | None, what: str) -> str | None:
    if callee is None:
        return None  # templateRef: defined in another WorkflowTemplate
    name, kind, tname = parts[1], parts[3], callee.get("name", "inline")
    if kind == "result":
        if any(callee.get(t) is not None for t in _RESULT_TYPES):
            return None
        return (
            f"{what} '{name}' runs template '{tname}', which has no outputs.result "
            f"(only {', '.join(_RESULT_TYPES)} templates do)"
        )
    if kind in ("parameters", "artifacts") and len(parts) >= 5:
        declared = names(as_dict(callee.get("outputs")).get(kind))
        if parts[4] not in declared:
            return (
                f"template '{tname}' (run by {what} '{name}') declares no output "
                f"{kind[:-1]} '{parts[4]}'{did_you_mean(parts[4], declared)}"
            )
    return None
