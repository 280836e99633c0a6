"""Resolution and checking of workflow parameters given with ``-p name=value``."""

from __future__ import annotations

import json
import re

from sublimate.pipelines.argo_terms import TYPES_ANNOTATION

from ..errors import ParameterError
from ..expressions.substitution import as_text


def resolve_parameters(workflow: dict, overrides: dict[str, str]) -> dict[str, str]:
    """Merge ``overrides`` into the workflow's ``spec.arguments.parameters`` and check them."""
    declared = (workflow.get("spec", {}).get("arguments") or {}).get("parameters") or []
    by_name = {p["name"]: p for p in declared if isinstance(p, dict) and "name" in p}
    unknown = [name for name in overrides if name not in by_name]
    if unknown:
        import difflib  # only on this error path

        close = difflib.get_close_matches(unknown[0], list(by_name), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        known = ", ".join(by_name) or "none"
        raise ParameterError(
            f"unknown parameter {unknown[0]!r} ({hint}known parameters: {known})"
        )
    types = _type_annotation(workflow)
    resolved: dict[str, str] = {}
    for name, param in by_name.items():
        value = declared_value(param, str(overrides[name]) if name in overrides else None)
        if value is None:
            raise ParameterError(
                f"parameter {name!r} has no value and no default; pass -p {name}=..."
            )
        allowed = enum_choices(param)
        if allowed and value not in allowed:
            raise ParameterError(
                f"parameter {name!r}: {value!r} is not one of {', '.join(allowed)}")
        if name in types:
            _check_type(name, value, types[name])
        resolved[name] = value
    return resolved


def declared_value(param: dict, supplied: str | None) -> str | None:
    """A declared parameter's value as Argo picks it: supplied, else ``value``, else ``default``.

    ``None`` when there is none of the three.
    """
    if supplied is not None:
        return supplied
    for key in ("value", "default"):
        if param.get(key) is not None:
            return as_text(param[key])
    return None


def enum_choices(param: dict) -> list[str]:
    """The values a parameter's ``enum`` allows, as text; empty when it has no enum."""
    return [as_text(choice) for choice in param.get("enum") or []]


def _type_annotation(workflow: dict) -> dict[str, dict]:
    annotations = (workflow.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(TYPES_ANNOTATION)
    if not raw:
        return {}
    try:
        types = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ParameterError(f"annotation {TYPES_ANNOTATION} is not valid JSON: {exc}") from exc
    if not isinstance(types, dict):
        raise ParameterError(f"annotation {TYPES_ANNOTATION} must be a JSON object")
    return {k: v for k, v in types.items() if isinstance(v, dict)}


def _check_type(name: str, value: str, rule: dict) -> None:
    kind = rule.get("type", "string")
    number: float | None = None
    if kind == "integer":
        try:
            number = int(value)
        except ValueError:
            raise ParameterError(f"parameter {name!r}: {value!r} is not an integer") from None
    elif kind == "number":
        try:
            number = float(value)
        except ValueError:
            raise ParameterError(f"parameter {name!r}: {value!r} is not a number") from None
    elif kind == "boolean" and value.lower() not in ("true", "false"):
        raise ParameterError(f"parameter {name!r}: {value!r} is not a boolean (true/false)")
    if number is not None:
        if "minimum" in rule and number < rule["minimum"]:
            raise ParameterError(
                f"parameter {name!r}: {value} is below the minimum {rule['minimum']}"
            )
        if "maximum" in rule and number > rule["maximum"]:
            raise ParameterError(
                f"parameter {name!r}: {value} is above the maximum {rule['maximum']}"
            )
    pattern = rule.get("pattern")
    if pattern and re.search(pattern, value) is None:
        raise ParameterError(f"parameter {name!r}: {value!r} does not match pattern {pattern!r}")
