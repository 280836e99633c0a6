"""Kubernetes label selectors (``listOptions.labelSelector``), as ``k8s.io/apimachinery``'s
``labels.Parse`` reads them: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``,
``k notin (a,b)``, joined by commas."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from .errors import invalid

Requirement = Callable[[Mapping[str, str]], bool]

_SET = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s+\(([^()]*)\)\s*$")
_COMPARE = re.compile(r"^\s*([^\s!=(),]+)\s*(==|=|!=)\s*([^\s!=(),]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*$")


def parse_selector(text: str) -> Requirement:
    """A function telling whether a workflow's labels match ``text``; ``ApiError`` (400) naming
    the field when it does not parse."""
    requirements = [_requirement(part) for part in _split(text) if part.strip()]
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


def _requirement(part: str) -> Requirement:
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
    raise invalid(f"listOptions.labelSelector: cannot parse requirement '{part.strip()}'")
