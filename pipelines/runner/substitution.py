"""``{{...}}`` variable substitution, following Argo's simple (non-expression) tags."""

from __future__ import annotations

import re
from collections.abc import Mapping

from sublimate.pipelines.argo_terms import EXPRESSION_TAG, TAG  # noqa: F401  (re-exported)

from .errors import NodeError

# A scope of variables by their dotted name (``inputs.parameters.x``, ``tasks.a.outputs.result``).
Vars = dict[str, str]

# Only tags that look like variable references are touched; anything else (e.g. the
# ``{{`` escapes of a Python f-string in a script) is left alone, as Argo would do.
_VARIABLE = re.compile(r"[A-Za-z_][\w\-]*(?:\.[\w\-]+)*")


def substitute_text(text: str, scope: Mapping[str, str], where: str) -> str:
    if "{{" not in text:
        return text
    missing: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name = match.group(1).strip()
        if not _VARIABLE.fullmatch(name):
            return match.group(0)
        value = scope.get(name)
        if value is None:
            missing.append(name)
            return match.group(0)
        return value

    result = TAG.sub(replace, text)
    if missing:
        names = ", ".join("{{" + name + "}}" for name in dict.fromkeys(missing))
        raise NodeError(f"{where}: unable to resolve {names}")
    return result


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
