"""Kubernetes label selectors (``listOptions.labelSelector``), as ``k8s.io/apimachinery``'s
``labels.Parse`` reads them: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``,
``k notin (a,b)``, joined by commas; and field selectors (``listOptions.fieldSelector``), the
ones Argo Server takes for workflows (``server/utils/list_options.go`` ``BuildListOptions``):
``metadata.name`` and ``metadata.namespace`` with ``=``, ``==`` or ``!=``, and
``spec.startedAt>TIME`` / ``spec.startedAt<TIME`` (RFC 3339, tested against the workflow's
``status.startedAt``), as ``fields.ParseSelector`` splits them (``\\,`` and ``\\=`` escape a
comma and an equals sign in a value). Argo refuses any other field (``status.phase`` among
them: a workflow's phase is its label ``workflows.argoproj.io/phase``), and so does this."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime

from .errors import invalid

Requirement = Callable[[Mapping[str, str]], bool]
WorkflowTest = Callable[[dict], bool]

_SET = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s+\(([^()]*)\)\s*$")
_COMPARE = re.compile(r"^\s*([^\s!=(),]+)\s*(==|=|!=)\s*([^\s!=(),]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*$")

FIELD_SELECTOR = "listOptions.fieldSelector"


def parse_selector(text: str, parameter: str = "listOptions.labelSelector") -> Requirement:
    """A function telling whether a workflow's labels match ``text``; ``ApiError`` (400) naming
    ``parameter`` when it does not parse."""
    requirements = [_requirement(part, parameter) for part in _split(text) if part.strip()]
    return lambda labels: all(requirement(labels) for requirement in requirements)


def _split(text: str) -> list[str]:
    """Commas separate requirements, except inside a set's parentheses."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def _requirement(part: str, parameter: str) -> Requirement:
    if match := _SET.match(part):
        key, operator = match.group(1), match.group(2)
        values = {value.strip() for value in match.group(3).split(",") if value.strip()}
        if operator == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if match := _COMPARE.match(part):
        key, operator, value = match.groups()
        if operator == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if match := _EXISTS.match(part):
        negated, key = match.group(1) == "!", match.group(2)
        return lambda labels: (key in labels) != negated
    raise invalid(f"{parameter}: cannot parse requirement '{part.strip()}'")


# ----------------------------------------------------------------------- field selectors

# (operator, the field it is allowed on); "!=" before "=" and "==" before "=": the first
# operator found in a term is the one it has, as fields.splitTerm looks for them.
_OPERATORS = ("!=", "==", "=", ">", "<")
_NAMESPACE, _NAME, _STARTED = "metadata.namespace", "metadata.name", "spec.startedAt"
_COUNT = "ext.showRemainingItemCount"  # the UI's paging hint: accepted, it changes nothing here
_SUPPORTED = (f"{_NAME}, {_NAMESPACE} (=, ==, !=), {_STARTED} (> or <, RFC 3339 times)")


def parse_field_selector(text: str, namespace: str) -> WorkflowTest:
    """A function telling whether a Workflow object (as ``convert.to_workflow`` makes it)
    matches the field selector ``text``, in the request's ``namespace``; ``ApiError`` (400)
    naming ``listOptions.fieldSelector`` when it does not parse or tests a field Argo does not
    select workflows by."""
    tests = [_field_test(term, namespace) for term in _split_terms(text)]
    return lambda workflow: all(test(workflow) for test in tests)


def selected_name(text: str) -> str | None:
    """The one workflow name a field selector asks for (``metadata.name=NAME``, as Argo's UI
    and ``argo watch`` send it), else None (Argo's ``RecoverWorkflowNameFromSelector...``)."""
    for term in _split_terms(text):
        key, operator, value = _parts(term)
        if key == _NAME and operator in ("=", "=="):
            return value
    return None


def workflow_selector(label_selector: str, field_selector: str, namespace: str) -> WorkflowTest:
    """Whether a Workflow object is chosen by both selectors of a list or watch request."""
    labels = parse_selector(label_selector)
    fields = parse_field_selector(field_selector, namespace)
    return lambda workflow: labels(workflow["metadata"].get("labels") or {}) and fields(workflow)


def _split_terms(text: str) -> list[str]:
    """Terms split at commas not escaped by a backslash (``fields.splitTerms``); blank ones
    dropped."""
    terms, current, escaped = [], [], False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            current.append(char)
            escaped = True
        elif char == ",":
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return [term.strip() for term in terms if term.strip()]


def _parts(term: str) -> tuple[str, str, str]:
    """(field, operator, value) of one term, the value unescaped; 400 when it has no
    operator or a bad escape."""
    for index in range(len(term)):
        if index and term[index - 1] == "\\":
            continue  # an escaped character is part of a value, never an operator
        for operator in _OPERATORS:
            if term.startswith(operator, index):
                return (term[:index].strip(), operator,
                        _unescape(term[index + len(operator):].strip(), term))
    raise invalid(f"{FIELD_SELECTOR}: '{term}' is not field=value, field==value or "
                  f"field!=value")


def _unescape(value: str, term: str) -> str:
    out, escaped = [], False
    for char in value:
        if escaped:
            if char not in "\\,=":
                raise invalid(f"{FIELD_SELECTOR}: '{term}': invalid escape sequence '\\{char}'")
            out.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        else:
            out.append(char)
    if escaped:
        raise invalid(f"{FIELD_SELECTOR}: '{term}': a value cannot end with '\\'")
    return "".join(out)


def _field_test(term: str, namespace: str) -> WorkflowTest:
    key, operator, value = _parts(term)
    if key in (_NAME, _NAMESPACE) and operator in ("=", "==", "!="):
        if key == _NAMESPACE and operator != "!=" and value != namespace:
            # Argo's words for it (BuildListOptions): the path's namespace is the query's
            raise invalid(f"{FIELD_SELECTOR}: 'namespace' query param ({namespace!r}) and "
                          f"fieldselector 'metadata.namespace' ({value!r}) are both specified "
                          f"and contradict each other")
        equal = operator != "!="
        section, field = key.split(".")
        return lambda workflow: (workflow[section].get(field) == value) == equal
    if key == _STARTED and operator in (">", "<"):
        moment = _time(value, term)
        after = operator == ">"

        def started(workflow: dict) -> bool:
            text = (workflow.get("status") or {}).get("startedAt")
            if not text:
                return False  # not started: neither after nor before any time
            when = _time(text, term)
            return when > moment if after else when < moment

        return started
    if key == _COUNT and operator in ("=", "=="):
        if value.lower() not in ("true", "false", "1", "0", "t", "f"):
            raise invalid(f"{FIELD_SELECTOR}: '{term}': {value!r} is not a boolean")
        return lambda _workflow: True
    hint = ("; a workflow's phase is its label workflows.argoproj.io/phase: "
            "listOptions.labelSelector=workflows.argoproj.io/phase=Running"
            if key.startswith("status.") else "")
    raise invalid(f"{FIELD_SELECTOR}: unsupported requirement '{term}' (workflows are "
                  f"selected by {_SUPPORTED}){hint}")


def _time(text: str, term: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise invalid(f"{FIELD_SELECTOR}: '{term}': {text!r} is not an RFC 3339 time "
                      f"(2006-01-02T15:04:05Z)") from None
    if moment.tzinfo is None:
        raise invalid(f"{FIELD_SELECTOR}: '{term}': {text!r} has no time zone (RFC 3339 "
                      f"needs one: Z or +01:00)")
    return moment
