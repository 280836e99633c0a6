"""A template's inputs: the ``inputs.*`` variables of one invocation, from its arguments.

Parameters take the argument, else the declared ``value``/``default``, and must match their
``enum``; artifacts expose their ``path`` and, for a DAG/steps template handing one on, where
it comes from. Pure: shared by the engine and the dry run.

As Argo's ``SubstituteParams`` (workflow/common/util.go) does, a parameter's value is first
substituted with the globals and locals only (``workflow.*``, ``pod.name``; tags it cannot
resolve stay), so ``value: "{{=jsonpath(workflow.parameters.config, '$.a')}}"`` is the value
itself by the time ``{{inputs.parameters.a}}`` is read; ``{{inputs.parameters}}`` is the JSON
Go writes for the parameters after that pass.
"""

from __future__ import annotations

from ..errors import NodeError
from ..expressions.gojson import go_struct
from ..expressions.substitution import Vars, as_text, substitute_text
from ..manifest.parameter_resolution import declared_value, enum_choices


def resolve_inputs(template: dict, arguments: dict, pod_name: str,
                   scope: Vars | None = None) -> Vars:
    """``arguments`` are already substituted: ``{"parameters": {name: value}, "artifacts":
    {name: argument}}``. ``pod_name`` is the node id (``{{pod.name}}``); ``scope`` the
    globals of the first pass."""
    given = arguments.get("parameters") or {}
    values: Vars = {"pod.name": pod_name}
    first_pass = {**(scope or {}), "pod.name": pod_name}
    declared = (template.get("inputs") or {}).get("parameters") or []
    structs = []
    for index, param in enumerate(declared):
        pname = param["name"]
        where = f"templates.{template['name']}.inputs.parameters[{index}]"
        value = declared_value(param, as_text(given[pname]) if pname in given else None)
        if value is None:
            raise NodeError(f"input parameter {pname!r} of template "
                            f"{template['name']!r} was not supplied")
        value = substitute_text(value, first_pass, where, keep_unresolved=True)
        allowed = enum_choices(param)
        if allowed and value not in allowed:
            raise NodeError(f"input parameter {pname!r}: {value!r} is not one of "
                            f"{', '.join(allowed)}")
        values[f"inputs.parameters.{pname}"] = value
        structs.append(_parameter_json(param, value, first_pass, where))
    values["inputs.parameters"] = "[" + ",".join(structs) + "]"
    given_arts = arguments.get("artifacts") or {}
    for art in (template.get("inputs") or {}).get("artifacts") or []:
        if art.get("path"):
            values[f"inputs.artifacts.{art['name']}.path"] = art["path"]
        source = given_arts.get(art["name"]) or art
        if source.get("from"):
            # Lets a DAG/steps template hand its input artifact on to its tasks.
            values[f"inputs.artifacts.{art['name']}"] = str(source["from"])
    return values


def _parameter_json(param: dict, value: str, first_pass: Vars, where: str) -> str:
    """One ``wfv1.Parameter`` as ``json.Marshal`` writes it: its fields in Go's order (name,
    default, value, globalName, enum, description), empty ones left out."""
    fields: list[tuple[str, str | list[str]]] = [("name", str(param["name"]))]
    if param.get("default") is not None:
        fields.append(("default", substitute_text(as_text(param["default"]), first_pass, where,
                                                  keep_unresolved=True)))
    fields.append(("value", value))
    if param.get("globalName"):
        fields.append(("globalName", str(param["globalName"])))
    if param.get("enum"):
        fields.append(("enum", enum_choices(param)))
    if param.get("description"):
        fields.append(("description", str(param["description"])))
    return go_struct(fields)
