"""A template's inputs: the ``inputs.*`` variables of one invocation, from its arguments.

Parameters take the argument, else the declared ``value``/``default``, and must match their
``enum``; artifacts expose their ``path`` and, for a DAG/steps template handing one on, where
it comes from. Pure: shared by the engine and the dry run.
"""

from __future__ import annotations

import json

from .errors import NodeError
from .parameter_resolution import declared_value, enum_choices
from .substitution import Vars, as_text


def resolve_inputs(template: dict, arguments: dict, pod_name: str) -> Vars:
    """``arguments`` are already substituted: ``{"parameters": {name: value}, "artifacts":
    {name: argument}}``. ``pod_name`` is the node id (``{{pod.name}}``)."""
    given = arguments.get("parameters") or {}
    values: Vars = {"pod.name": pod_name}
    declared = (template.get("inputs") or {}).get("parameters") or []
    for param in declared:
        pname = param["name"]
        value = declared_value(param, as_text(given[pname]) if pname in given else None)
        if value is None:
            raise NodeError(f"input parameter {pname!r} of template "
                            f"{template['name']!r} was not supplied")
        allowed = enum_choices(param)
        if allowed and value not in allowed:
            raise NodeError(f"input parameter {pname!r}: {value!r} is not one of "
                            f"{', '.join(allowed)}")
        values[f"inputs.parameters.{pname}"] = value
    values["inputs.parameters"] = json.dumps(
        [{"name": p["name"], "value": values[f"inputs.parameters.{p['name']}"]}
         for p in declared]
    )
    given_arts = arguments.get("artifacts") or {}
    for art in (template.get("inputs") or {}).get("artifacts") or []:
        if art.get("path"):
            values[f"inputs.artifacts.{art['name']}.path"] = art["path"]
        source = given_arts.get(art["name"]) or art
        if source.get("from"):
            # Lets a DAG/steps template hand its input artifact on to its tasks.
            values[f"inputs.artifacts.{art['name']}"] = str(source["from"])
    return values
