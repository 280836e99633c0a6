"""Offline linter for Argo Workflows manifests: the backend of ``sublimate lint``.

Two layers, like ``argo lint``:

* schema checks against Argo's own JSON Schema (shipped gzipped in ``schema/``, see
  ``schema/SOURCE.md``), strict by default so that misspelled fields are reported;
* semantic checks the schema cannot express: template/task references, DAG cycles and
  ``{{...}}`` variable references.

This module is imported by the CLI on every invocation, so it must stay cheap to import:
jsonschema, PyYAML and difflib are imported inside the functions that need them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ARGO_KINDS",
    "LintProblem",
    "lint_document",
    "lint_files",
    "lint_paths",
    "schema_problems",
    "semantic_problems",
]

ARGO_KINDS = ("Workflow", "WorkflowTemplate", "ClusterWorkflowTemplate", "CronWorkflow")

_SCHEMA_FILE = "schema/argo-workflows.schema.json.gz"
_DEF_PREFIX = "io.argoproj.workflow.v1alpha1."

# --- load-time schema patches (documented in schema/SOURCE.md) -------------------------------

# Argo's Go types accept more JSON types than schema.json says (its CRDs agree with the Go types).
_INT_OR_STRING = {"type": ["integer", "string"]}  # intstr.IntOrString: Hera writes `limit: 3`
_QUANTITY = {"type": ["number", "string"]}  # resource.Quantity: `cpu: 1`, `memory: 2Gi`
_ANY_STRING = {"type": ["string", "number", "boolean"]}  # wfv1.AnyString: `value: 3`
_ANY_STRING_FIELDS = {
    "Parameter": ("value", "default", "description"),
    "ValueFrom": ("default",),
}
# Enums that Argo's CRDs (kubebuilder markers) declare but schema.json does not.
_ENUMS: dict[tuple[str, str], list[str]] = {
    ("ArtifactGC", "strategy"): ["", "OnWorkflowCompletion", "OnWorkflowDeletion", "Never"],
    ("WorkflowLevelArtifactGC", "strategy"): [
        "",
        "OnWorkflowCompletion",
        "OnWorkflowDeletion",
        "Never",
    ],
    ("CronWorkflowSpec", "concurrencyPolicy"): ["Allow", "Forbid", "Replace"],
    ("Gauge", "operation"): ["Set", "Add", "Sub"],
    ("PodGC", "strategy"): [
        "",
        "OnPodCompletion",
        "OnPodSuccess",
        "OnWorkflowCompletion",
        "OnWorkflowSuccess",
    ],
    ("ResourceTemplate", "action"): ["get", "create", "apply", "delete", "replace", "patch"],
    ("ResourceTemplate", "mergeStrategy"): ["strategic", "merge", "json"],
    ("RetryStrategy", "retryPolicy"): ["Always", "OnFailure", "OnError", "OnTransientError"],
    ("S3Artifact", "addressingStyle"): ["", "path", "virtual-hosted"],
    ("S3ArtifactRepository", "addressingStyle"): ["", "path", "virtual-hosted"],
}


@dataclass(frozen=True)
class LintProblem:
    """One finding. ``path`` is a dotted field path ("" for the document root)."""

    source: str
    document: str
    path: str
    message: str

    def __str__(self) -> str:
        parts = [p for p in (self.source, self.document, self.path) if p]
        return ": ".join([*parts, self.message])


# ============================================================================================
# Schema layer
# ============================================================================================


@functools.cache
def _base_definitions() -> Mapping[str, Any]:
    """Upstream definitions with the type widenings and enums applied (shared, never mutated)."""
    import gzip
    import json
    from importlib import resources

    raw = resources.files("sublimate.pipelines").joinpath(_SCHEMA_FILE).read_bytes()
    defs: dict[str, Any] = json.loads(gzip.decompress(raw))["definitions"]
    defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = _INT_OR_STRING
    defs["io.k8s.apimachinery.pkg.api.resource.Quantity"] = _QUANTITY
    for name, fields in _ANY_STRING_FIELDS.items():
        props = defs[_DEF_PREFIX + name]["properties"]
        for fname in fields:
            props[fname] = {**props[fname], **_ANY_STRING}
    params = defs[_DEF_PREFIX + "Parameter"]["properties"]
    params["enum"] = {**params["enum"], "items": _ANY_STRING}
    for (name, fname), values in _ENUMS.items():
        props = defs[_DEF_PREFIX + name]["properties"]
        props[fname] = {**props[fname], "enum": values}
    return defs


@functools.cache
def _definitions(strict: bool) -> Mapping[str, Any]:
    defs = _base_definitions()
    if not strict:
        return defs
    # argo lint decodes strictly and rejects unknown fields. Maps (labels, annotations, resource
    # limits, hooks) are inline `additionalProperties` schemas inside properties, not top-level
    # definitions, so closing every definition that has `properties` leaves them open.
    return {
        name: {**d, "additionalProperties": False} if "properties" in d else d
        for name, d in defs.items()
    }


@functools.cache
def _validator(kind: str, strict: bool) -> Any:
    from jsonschema import Draft202012Validator

    schema = {"$ref": f"#/definitions/{_DEF_PREFIX}{kind}", "definitions": _definitions(strict)}
    return Draft202012Validator(schema)


def _format_path(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _quoted_list(values: Iterable[Any]) -> str:
    return ", ".join(repr(v) for v in values)


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _describe(error: Any) -> list[tuple[str, str]]:
    """Turn one jsonschema error into (path, plain-words message) pairs."""
    path = _format_path(error.absolute_path)
    kind, inst, schema = error.validator, error.instance, error.schema
    if kind == "additionalProperties" and isinstance(inst, dict):
        known = schema.get("properties", {})
        return [
            (path, f"unknown field '{key}'{_did_you_mean(key, known)}")
            for key in inst
            if key not in known
        ]
    if kind == "type":
        types = error.validator_value
        types = [types] if isinstance(types, str) else types
        return [(path, f"{_short(inst)} is not of type {' or '.join(map(repr, types))}")]
    if kind == "enum":
        allowed = _quoted_list(error.validator_value)
        return [(path, f"{_short(inst)} is not one of the allowed values: {allowed}")]
    if kind == "const":
        return [(path, f"{_short(inst)} must be {error.validator_value!r}")]
    if kind == "required":
        missing = [r for r in error.validator_value if isinstance(inst, dict) and r not in inst]
        return [(path, f"missing required field '{name}'") for name in missing]
    return [(path, error.message if len(error.message) <= 200 else error.message[:197] + "...")]


def _path_key(problem: LintProblem) -> tuple[Any, ...]:
    # Sort "templates[10]" after "templates[2]": compare indices numerically.
    return tuple(
        (0, int(tok), "") if tok.isdigit() else (1, 0, tok)
        for tok in re.split(r"[.\[\]]+", problem.path)
        if tok
    )


def schema_problems(
    doc: Mapping[str, Any], source: str = "<string>", strict: bool = True, document: str = ""
) -> list[LintProblem]:
    """Validate ``doc`` against its kind's definition in Argo's JSON Schema."""
    from jsonschema.exceptions import best_match

    document = document or _document_label(doc, 1)
    kind = doc.get("kind")
    if kind not in ARGO_KINDS:
        return [LintProblem(source, document, "kind", _not_argo_message(kind))]
    seen: set[tuple[str, str]] = set()
    problems: list[LintProblem] = []
    for error in _validator(kind, strict).iter_errors(doc):
        # oneOf/anyOf errors say "is not valid under any of the given schemas"; the most
        # relevant sub-error says what is actually wrong.
        specific = best_match([error]) if error.context else error
        for path, message in _describe(specific):
            if (path, message) not in seen:
                seen.add((path, message))
                problems.append(LintProblem(source, document, path, message))
    return sorted(problems, key=_path_key)


def _not_argo_message(kind: Any) -> str:
    return f"not an Argo Workflows document: kind {kind!r} is not one of {_quoted_list(ARGO_KINDS)}"


# ============================================================================================
# Semantic layer (pure Python: must not import jsonschema)
# ============================================================================================

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
# The task results a DAG `depends` expression may test (`task.Succeeded`, ...); the runner's
# evaluator uses the same list.
DEPENDS_RESULTS = (
    "Succeeded",
    "Failed",
    "Errored",
    "Skipped",
    "Omitted",
    "Daemoned",
    "AnySucceeded",
    "AllFailed",
)
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
_TAG_RE = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_DEPENDS_OPERATORS = re.compile(r"&&|\|\||[!()]")


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _names(items: Any) -> list[str]:
    return [
        item["name"]
        for item in _as_list(items)
        if isinstance(item, dict) and isinstance(item.get("name"), str)
    ]


def _document_label(doc: Mapping[str, Any], index: int) -> str:
    meta = _as_dict(doc.get("metadata"))
    name = meta.get("name") or meta.get("generateName")
    kind = doc.get("kind")
    if isinstance(kind, str) and isinstance(name, str) and name:
        return f"{kind}/{name}"
    return f"document {index}"


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
        return f"unknown template '{name}'{_did_you_mean(name, self.templates)}"


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
    report = _Report(source, _document_label(doc, 1))
    _semantic(doc, report)
    return report.problems


def _semantic(doc: Mapping[str, Any], report: _Report) -> None:
    kind = doc.get("kind")
    spec = _as_dict(doc.get("spec"))
    base = "spec"
    if kind == "CronWorkflow":
        spec, base = _as_dict(spec.get("workflowSpec")), "spec.workflowSpec"
    if kind in ARGO_KINDS:
        _check_workflow_spec(report, spec, base, kind)


def _check_workflow_spec(report: _Report, spec: dict[str, Any], base: str, kind: str) -> None:
    templates: dict[str, dict[str, Any]] = {}
    for i, tmpl in enumerate(_as_list(spec.get("templates"))):
        name = _as_dict(tmpl).get("name")
        if not isinstance(name, str):
            continue
        if name in templates:
            report.add(f"{base}.templates[{i}].name", f"duplicate template name '{name}'")
        templates.setdefault(name, tmpl)
    wf = _Workflow(
        kind=kind,
        templates=templates,
        params=set(_names(_as_dict(spec.get("arguments")).get("parameters"))),
        uses_ref="workflowTemplateRef" in spec,
    )
    _check_entrypoint(report, spec, base, wf)
    _check_exit_and_hooks(report, spec, base, wf)
    for i, tmpl in enumerate(_as_list(spec.get("templates"))):
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
    for name, hook in _as_dict(hooks).items():
        target = _as_dict(hook).get("template")
        if isinstance(target, str) and target not in wf.templates:
            report.add(f"{path}.{name}.template", f"hook refers to {wf.unknown_template(target)}")


def _check_template(report: _Report, tmpl: dict[str, Any], path: str, wf: _Workflow) -> None:
    name = tmpl.get("name", "?")
    types = [t for t in _TEMPLATE_TYPES if tmpl.get(t) is not None]
    if not types:
        report.add(path, f"template '{name}' has no type: set one of {', '.join(_TEMPLATE_TYPES)}")
    elif len(types) > 1:
        report.add(path, f"template '{name}' sets more than one type: {', '.join(types)}")
    body = {k: v for k, v in tmpl.items() if k not in ("dag", "steps")}
    if isinstance(tmpl.get("dag"), dict):
        tasks = _check_dag(report, tmpl, f"{path}.dag", wf)
        _check_refs(report, body, path, wf, _Scope(tmpl, "tasks", tasks))
    elif isinstance(tmpl.get("steps"), list):
        steps = _check_steps(report, tmpl, f"{path}.steps", wf)
        _check_refs(report, body, path, wf, _Scope(tmpl, "steps", steps))
    else:
        _check_refs(report, body, path, wf, _Scope(tmpl))


def _required_inputs(tmpl: dict[str, Any]) -> list[str]:
    """Input parameters with no value, default or valueFrom: the caller must pass them."""
    params = _as_list(_as_dict(tmpl.get("inputs")).get("parameters"))
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
    supplied = set(_names(_as_dict(node.get("arguments")).get("parameters")))
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
        name = _as_dict(node).get("name")
        if not isinstance(name, str):
            continue
        if name in nodes:
            report.add(f"{path}.name", f"duplicate {what} name '{name}'")
        else:
            nodes[name] = (path, node)
    return nodes


# --- DAG ---------------------------------------------------------------------------------------


def _parse_depends(expr: str) -> list[tuple[str, str | None]]:
    """Task names (and result suffix) in a `depends` expression like "(a || b.Failed) && !c"."""
    out: list[tuple[str, str | None]] = []
    for token in _DEPENDS_OPERATORS.sub(" ", expr).split():
        name, dot, result = token.partition(".")
        out.append((name, result if dot else None))
    return out


def _dag_dependencies(
    report: _Report, task: dict[str, Any], path: str, names: Mapping[str, Any]
) -> list[str]:
    deps: list[str] = []
    dependencies, depends = task.get("dependencies"), task.get("depends")
    if dependencies is not None and depends is not None:
        report.add(path, "use either 'depends' or 'dependencies', not both")
    for j, dep in enumerate(_as_list(dependencies)):
        if not isinstance(dep, str):
            continue
        if dep not in names:
            msg = f"dependency '{dep}' is not a task in this DAG{_did_you_mean(dep, names)}"
            report.add(f"{path}.dependencies[{j}]", msg)
        else:
            deps.append(dep)
    if isinstance(depends, str):
        for dep, result in _parse_depends(depends):
            if dep not in names:
                msg = f"depends refers to unknown task '{dep}'{_did_you_mean(dep, names)}"
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
    tasks = _as_list(dag.get("tasks"))
    index = _index_nodes(report, ((f"{path}.tasks[{i}]", t) for i, t in enumerate(tasks)), "task")
    graph = {
        name: _dag_dependencies(report, task, tpath, index) for name, (tpath, task) in index.items()
    }
    for cycle in _find_cycles(graph):
        report.add(index[cycle[0]][0], f"dependency cycle: {' -> '.join(cycle)}")
    target = dag.get("target")
    if isinstance(target, str):
        for name in target.split():
            if name not in index:
                report.add(f"{path}.target", f"target '{name}' is not a task in this DAG")
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
    groups = [_as_list(g) for g in tmpl["steps"]]
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
        earlier.update(_names(group))
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
        for tag in dict.fromkeys(m.group(1).strip() for m in _TAG_RE.finditer(text)):
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
            hint = _did_you_mean(name, wf.params)
            return f"workflow parameter '{name}' is not declared in spec.arguments.parameters{hint}"
    return None


def _resolve_io(parts: list[str], tmpl: dict[str, Any]) -> str | None:
    direction = parts[0]  # inputs / outputs
    if len(parts) < 3 or parts[1] not in ("parameters", "artifacts"):
        return None  # inputs.parameters (all as JSON), outputs.result, outputs.exitCode
    declared = _names(_as_dict(tmpl.get(direction)).get(parts[1]))
    name = parts[2]
    if name in declared:
        return None
    kind = parts[1][:-1]  # parameter / artifact
    where = f"{direction}.{parts[1]}"
    return (
        f"template '{tmpl.get('name', '?')}' declares no {direction[:-1]} {kind} '{name}' in "
        f"{where}{_did_you_mean(name, declared)}"
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
        return f"'{name}' is not a {what} in this template{_did_you_mean(name, scope.nodes)}"
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
        declared = _names(_as_dict(callee.get("outputs")).get(kind))
        if parts[4] not in declared:
            return (
                f"template '{tname}' (run by {what} '{name}') declares no output "
                f"{kind[:-1]} '{parts[4]}'{_did_you_mean(parts[4], declared)}"
            )
    return None


# ============================================================================================
# Entry points
# ============================================================================================


def _lint(doc: Mapping[str, Any], source: str, strict: bool, document: str) -> list[LintProblem]:
    problems = schema_problems(doc, source, strict, document)
    if doc.get("kind") in ARGO_KINDS:
        report = _Report(source, document)
        _semantic(doc, report)
        problems.extend(report.problems)
    return problems


def lint_document(
    doc: dict[str, Any], source: str = "<string>", strict: bool = True
) -> list[LintProblem]:
    """Schema and semantic problems of one Argo document (an empty list when it is clean)."""
    return _lint(doc, source, strict, _document_label(doc, 1))


def is_argo_document(doc: Any) -> bool:
    """Whether ``doc`` is one of the Argo kinds this linter checks (others are skipped)."""
    if not isinstance(doc, dict) or doc.get("kind") not in ARGO_KINDS:
        return False
    api = doc.get("apiVersion")
    # A wrong or missing apiVersion on an Argo kind is a problem to report, not a reason to skip;
    # only a different API group (someone else's "Workflow") is skipped.
    return not isinstance(api, str) or "/" not in api or api.startswith("argoproj.io/")


def _iter_files(paths: Sequence[str | Path]) -> Iterator[tuple[Path, bool]]:
    """(file, exists) for each path; directories give their *.yaml / *.yml files, sorted."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files = (p for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
            for file in sorted(files):
                yield file, True
        else:
            yield path, path.is_file()


def _load_yaml_documents(text: str, source: str) -> Iterator[tuple[int, Any] | LintProblem]:
    """Yields (1-based index, document) or a LintProblem for a syntax error (then stops)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    index = 0
    try:
        for index, doc in enumerate(yaml.load_all(text, Loader=loader), start=1):
            yield index, doc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        message = f"YAML syntax error: {where}{problem}"
        yield LintProblem(source, f"document {index + 1}", "", message)


_YAML_TYPE_NAMES = {
    list: "a list",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
}


def lint_paths(paths: Sequence[str | Path], strict: bool = True) -> tuple[list[LintProblem], int]:
    """Lint files and directories; returns (problems, number of Argo documents checked)."""
    problems, checked, _ = lint_files(paths, strict)
    return problems, checked


def lint_files(paths: Sequence[str | Path], strict: bool = True
               ) -> tuple[list[LintProblem], int, list[str]]:
    """:func:`lint_paths`, plus the YAML files skipped for holding no Argo document (Kubernetes
    objects of an install, a kustomization), so that a user sees what was not checked."""
    problems: list[LintProblem] = []
    checked = 0
    skipped: list[str] = []
    for file, exists in _iter_files(paths):
        before = checked
        source = str(file)
        if not exists:
            problems.append(LintProblem(source, "", "", "no such file or directory"))
            continue
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(LintProblem(source, "", "", f"cannot read file: {exc}"))
            continue
        for item in _load_yaml_documents(text, source):
            if isinstance(item, LintProblem):
                problems.append(item)
                continue
            index, doc = item
            if doc is None:
                continue  # empty document, e.g. a trailing '---'
            if not isinstance(doc, dict):
                what = _YAML_TYPE_NAMES.get(type(doc), type(doc).__name__)
                message = f"document is {what}, not a mapping"
                problems.append(LintProblem(source, f"document {index}", "", message))
            elif is_argo_document(doc):
                checked += 1
                problems.extend(_lint(doc, source, strict, _document_label(doc, index)))
        if checked == before and not any(p.source == source for p in problems):
            skipped.append(source)
    return problems, checked, skipped
