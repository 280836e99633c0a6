"""``{{...}}`` variable substitution: Argo's simple tags, and ``{{=...}}`` expression tags
(evaluated by ``expr_lang``, imported only when a text holds one)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from sublimate.pipelines.argo_terms import EXPRESSION_TAG, TAG

from ..errors import NodeError

# A scope of variables by their dotted name (``inputs.parameters.x``, ``tasks.a.outputs.result``).
Vars = dict[str, str]

# Only tags that look like variable references are touched; anything else (e.g. the
# ``{{`` escapes of a Python f-string in a script) is left alone, as Argo would do.
_VARIABLE = re.compile(r"[A-Za-z_][\w\-]*(?:\.[\w\-]+)*")


def substitute_text(text: str, scope: Mapping[str, str], where: str,
                    keep_unresolved: bool = False) -> str:
    """``text`` with its tags replaced from ``scope``; a tag it cannot resolve is a
    ``NodeError``, or, with ``keep_unresolved``, stays as written (Argo's first pass over a
    template, ``template.Replace(..., allowUnresolved=true)``: an expression that fails or gives
    nil stays too, for the pass that has the inputs)."""
    if "{{" not in text:
        return text
    missing: list[str] = []

    def replace(match: re.Match[str]) -> str:
        if match.group(1).startswith("="):
            if keep_unresolved:
                try:
                    return _expression_tag(match.group(1)[1:], scope, where)
                except NodeError:
                    return match.group(0)
            return _expression_tag(match.group(1)[1:], scope, where)
        name = match.group(1).strip()
        if not _VARIABLE.fullmatch(name):
            return match.group(0)
        value = scope.get(name)
        if value is None:
            if not keep_unresolved:
                missing.append(name)
            return match.group(0)
        return value

    result = TAG.sub(replace, text)
    if missing:
        names = ", ".join("{{" + name + "}}" for name in dict.fromkeys(missing))
        raise NodeError(f"{where}: unable to resolve {names}")
    return result


def _expression_tag(source: str, scope: Mapping[str, str], where: str) -> str:
    """A ``{{=...}}`` tag (util/template/template.go: the kind after ``{{`` is ``=``, with no
    space before it), evaluated as expr-lang; the evaluator loads only when a tag needs it."""
    from .conditions import ExpressionError
    from .expr_lang import render_tag

    try:
        return render_tag(source, scope)
    except ExpressionError as exc:
        raise NodeError(f"{where}: {exc}") from None


def substitute(value: object, scope: Mapping[str, str], where: str) -> object:
    """Substitute recursively in strings inside dicts and lists (keys are left alone)."""
    if isinstance(value, str):
        return substitute_text(value, scope, where)
    if isinstance(value, dict):
        return {k: substitute(v, scope, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, scope, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def as_text(value: object) -> str:
    """Render a manifest value the way Argo stringifies parameters and items."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, int | float):
        return str(value)
    import json

    return json.dumps(value, separators=(",", ":"))


def expression_sites(spec: dict, strings: Iterable[tuple[str, str]]
                     ) -> list[tuple[str, str, str]]:
    """Every expr-lang expression of a spec, found without loading the evaluator: ``{{=...}}``
    tags in any string, ``outputs.parameters[].valueFrom.expression`` and ``fromExpression``
    (outputs and call arguments). Each is ``(path, source, problem)``, ``problem`` being what
    Argo's validate.go refuses in where it stands, or ``""``."""
    sites: list[tuple[str, str, str]] = []
    for path, text in strings:
        if EXPRESSION_TAG.search(text):
            sites += [(path, m.group(1)[1:], "") for m in TAG.finditer(text)
                      if m.group(1).startswith("=")]
    for i, template in enumerate(spec.get("templates") or []):
        if not isinstance(template, dict):
            continue
        where = f"spec.templates[{i}]"
        composite = "dag" in template or "steps" in template
        outputs = template.get("outputs") if isinstance(template.get("outputs"), dict) else {}
        for j, param in enumerate(outputs.get("parameters") or []):
            source = (param.get("valueFrom") or {}) if isinstance(param, dict) else {}
            if isinstance(source, dict) and "expression" in source:
                problem = "" if composite else "only a DAG or steps template's outputs take " \
                    "an expression (validate.go: a pod's output parameter needs a path)"
                if "parameter" in source:
                    problem = "give parameter or expression, not both (validate.go)"
                sites.append((f"{where}.outputs.parameters[{j}].valueFrom.expression",
                              str(source["expression"]), problem))
        arts = [(f"{where}.outputs.artifacts[{j}]", a, composite)
                for j, a in enumerate(outputs.get("artifacts") or [])]
        calls = ((template.get("dag") or {}).get("tasks") or []) if isinstance(
            template.get("dag"), dict) else []
        groups = template.get("steps") if isinstance(template.get("steps"), list) else []
        named = [(f"{where}.dag.tasks[{k}]", c) for k, c in enumerate(calls)] + [
            (f"{where}.steps[{g}][{k}]", c) for g, group in enumerate(groups)
            if isinstance(group, list) for k, c in enumerate(group)]
        for call_path, call in named:
            args = (call.get("arguments") or {}) if isinstance(call, dict) else {}
            arts += [(f"{call_path}.arguments.artifacts[{j}]", a, True)
                     for j, a in enumerate(args.get("artifacts") or [])
                     if isinstance(args, dict)]
        for art_path, art, allowed in arts:
            if not isinstance(art, dict) or "fromExpression" not in art:
                continue
            problem = "" if allowed else "only a DAG or steps template's outputs take " \
                "fromExpression (a pod's output artifact needs a path)"
            if art.get("from"):
                problem = "shouldn't have both `from` and `fromExpression` (validate.go)"
            sites.append((f"{art_path}.fromExpression", str(art["fromExpression"]), problem))
    return sites
