"""Argo's ``jsonpath(json, path)`` expression function, on jsonpath-ng.

Argo (util/expr/env/env.go ``jsonPath``) decodes the first argument with Go's ``encoding/json``
and queries it with github.com/evilmonkeyinc/jsonpath v0.8.1. No Python library answers like
that one; jsonpath-ng (``jsonpath_ng.ext``) comes closest, and this adapter gives it the Go
library's shapes and refuses, by name, every construct where the two part ways, so a path runs
here exactly as on Argo or not at all.
``tests/pipelines/runner/expressions/test_jsonpath.py`` holds it to the Go library's own answers on
286 cases (its test suite plus Argo's examples).

What is kept from the Go library:

- the document is a JSON text (a parameter is a string); every number decodes as a float64
  (``type()`` says ``float``), and a text that is not JSON is an error (``unexpected end of JSON
  input`` for ``""``, what a YAML mapping given as a parameter value becomes on Argo);
- a map's members are visited in sorted key order (wildcards, ``..``);
- a *definite* path (the root, ``.name``, ``['name']``, ``[n]``) gives the value itself and an
  error when a member or index is missing; any other (a wildcard, slice, union, filter or
  ``..``) gives a list, possibly empty, missing members dropped;
- slices and indices apply to arrays only (Go: ``expected [array slice] got [map]``);
- a filter's ``@.x != literal`` holds only where ``x`` exists (Go drops the others).

Refused (``Unsupported``, at load time when the path is a literal): a second wildcard, slice,
union, filter or ``..`` after the first (Go nests the results instead of flattening them),
``.length``, script subscripts ``[(...)]``, a path ending in ``..``, ``...``, quoted names after
``.``, a quoted ``'*'``, slice steps below 1, unquoted names in brackets, and any filter other
than comparisons of ``@``-paths with literals joined by ``&&`` and ``||`` (Go's truthiness,
``!``, ``in``, ``=~``, arithmetic and list literals differ).

jsonpath-ng is imported on the first call: only a manifest that uses ``jsonpath`` pays for it.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jsonpath_ng import JSONPath


class JsonPathError(ValueError):
    """What Go's library (and so Argo's expression) fails with: the tag is an error."""


class Unsupported(JsonPathError):
    """A construct the local runner refuses: jsonpath-ng would answer differently from Argo."""


_LITERAL = r"""(?:'[^'\\]*'|"[^"\\]*"|-?(?:0|[1-9]\d*)(?:\.\d+)?|true|false|null)"""
_AT_PATH = r"""@(?:\.[A-Za-z_][A-Za-z0-9_]*|\['[^'\\]*'\]|\[-?\d+\])+"""
_OPERATOR = r"(?:==|!=|<=|>=|<|>)"
_COMPARISON = (rf"\s*(?:{_AT_PATH}\s*{_OPERATOR}\s*{_LITERAL}"
               rf"|{_LITERAL}\s*{_OPERATOR}\s*{_AT_PATH})\s*")
_TERM = rf"\s*\(*{_COMPARISON}\)*\s*"
_SUPPORTED_FILTER = re.compile(rf"^(?:{_TERM}(?:&&|\|\|))*{_TERM}$")
_FILTER = re.compile(r"\[\?\((.*?)\)\](?=$|[.\[])")
_BRACKET = re.compile(r"\[(?!\?\()([^\]]*)\]")
_QUOTED = r"""(?:'[^'\\]*'|"[^"\\]*")"""
_SUPPORTED_BRACKET = re.compile(
    rf"^\s*(?:\*|-?\d+(?:\s*,\s*-?\d+)*|{_QUOTED}(?:\s*,\s*{_QUOTED})*|-?\d*:-?\d*(?::-?\d*)?)\s*$")
_NOT_EQUAL = re.compile(rf"({_AT_PATH})\s*!=\s*({_LITERAL})|({_LITERAL})\s*!=\s*({_AT_PATH})")


def _refuse(path: str, what: str, why: str = "") -> Unsupported:
    return Unsupported(f"jsonpath {path!r}: {what} is not supported by the local runner"
                       + (f" ({why})" if why else ""))


def _check_text(path: str) -> None:
    """Refuse by name what jsonpath-ng would read differently from the Go library."""
    if not path.startswith("$"):
        raise _refuse(path, "a path not starting with '$'")
    if "..." in path or re.search(r"\.\s*['\"]", path):
        raise _refuse(path, "'...' or a quoted name after '.'")
    if re.search(r"\.length(?:$|[.\[])", path):
        raise _refuse(path, "'.length'")
    if "[(" in path:
        raise _refuse(path, "a script subscript [(...)]")
    if path.endswith(".."):
        raise _refuse(path, "a path ending in '..'")
    for body in _BRACKET.findall(_FILTER.sub("", path)):
        if not _SUPPORTED_BRACKET.match(body) or re.fullmatch(r"\s*['\"]\*['\"]\s*", body):
            raise _refuse(path, f"the subscript [{body}]")
        step = re.fullmatch(r"\s*-?\d*:-?\d*:(-?\d*)\s*", body)
        if step and step.group(1) and int(step.group(1)) <= 0:
            raise _refuse(path, "a slice step below 1")
    for body in _FILTER.findall(path):
        if not _SUPPORTED_FILTER.match(body):
            raise _refuse(path, f"the filter ({body})", "only comparisons of @-paths with "
                                                        "literals, joined by && and ||")
    if "[?" in path and not _FILTER.search(path):
        raise _refuse(path, "a filter not written [?(...)]")


def _rewrite(path: str) -> str:
    """Go's meaning in jsonpath-ng's spelling: ``@.x != lit`` also needs ``x`` present, and a
    non-ASCII name after ``.`` becomes a quoted subscript (jsonpath-ng's lexer reads ASCII)."""
    def not_equal(match: re.Match[str]) -> str:
        at, literal = ((match.group(1), match.group(2)) if match.group(1)
                       else (match.group(4), match.group(3)))
        return f"({at} && {at} != {literal})"

    path = _FILTER.sub(lambda f: "[?(" + _NOT_EQUAL.sub(not_equal, f.group(1)) + ")]", path)
    return re.sub(r"\.([^\x00-\x7f.\[\]'\"]+)", lambda m: f"['{m.group(1)}']", path)


def _segments(expr: JSONPath) -> list[JSONPath]:
    from jsonpath_ng import jsonpath as jp

    if isinstance(expr, jp.Child):
        return _segments(expr.left) + _segments(expr.right)
    if isinstance(expr, jp.Descendants):
        return [*_segments(expr.left), expr, *_segments(expr.right)]
    return [expr]


def _multi_valued(segment: JSONPath) -> bool:
    from jsonpath_ng import jsonpath as jp
    from jsonpath_ng.ext.filter import Filter

    if isinstance(segment, jp.Wildcard | jp.Slice | jp.Descendants | Filter):
        return True
    if isinstance(segment, jp.Fields):
        return len(segment.fields) != 1 or segment.fields[0] == "*"
    if isinstance(segment, jp.Index):
        return len(segment.indices) != 1
    return False


_compiled: dict[str, tuple[JSONPath, bool]] = {}


def compile_path(path: str) -> tuple[JSONPath, bool]:
    """The parsed path and whether it is definite; ``Unsupported`` or ``JsonPathError`` when it
    cannot run. Cheap to call again (cached), and callable at load time on a literal path."""
    found = _compiled.get(path)
    if found is None:
        _check_text(path)
        from jsonpath_ng.ext import parse  # deferred: only a manifest using jsonpath loads it

        try:
            expr = parse(_rewrite(path))
        except Exception as exc:  # ply raises several kinds: each one means a bad path
            raise JsonPathError(f"invalid JSONPath selector {path!r}: {exc}") from None
        multi = [s for s in _segments(expr) if _multi_valued(s)]
        if len(multi) > 1:
            raise _refuse(path, "a second wildcard, slice, union, filter or '..' after the "
                                "first", "Argo nests the results")
        found = _compiled[path] = (expr, not multi)
    return found


def jsonpath(document: Any, path: Any) -> Any:
    """``jsonpath(json, path)`` as Argo's expressions answer it (see the module docstring)."""
    if not isinstance(document, str) or not isinstance(path, str):
        raise JsonPathError("jsonpath(json, path) takes two strings (decode a value with "
                            "toJson first)")
    expr, definite = compile_path(path)
    try:
        data = _sorted(json.loads(document, parse_int=float))
    except ValueError as exc:
        raise JsonPathError("unexpected end of JSON input" if not document.strip()
                            else f"invalid JSON: {exc}") from None
    _check_types(expr, data, path)
    found = [match.value for match in expr.find(data)]
    if not definite:
        return found
    if not found:
        raise JsonPathError(f"jsonpath {path!r}: not found")
    return found[0]


def _sorted(value: Any) -> Any:
    """Maps with their keys in sorted order, as the Go library visits them."""
    if isinstance(value, dict):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value


def _check_types(expr: JSONPath, data: Any, path: str) -> None:
    """Go's range and index tokens fail on anything but an array, where jsonpath-ng finds
    nothing: follow the definite head of the path and check where it leads."""
    from jsonpath_ng import jsonpath as jp

    value = data
    for segment in _segments(expr):
        if isinstance(segment, jp.Root):
            continue
        if isinstance(segment, jp.Slice | jp.Index) and not isinstance(value, list):
            raise JsonPathError(f"jsonpath {path!r}: expected an array")
        if _multi_valued(segment) or not isinstance(segment, jp.Fields | jp.Index):
            return
        if isinstance(segment, jp.Fields):
            if not isinstance(value, dict) or segment.fields[0] not in value:
                return  # the query itself reports it
            value = value[segment.fields[0]]
        else:
            index = segment.indices[0]
            if not -len(value) <= index < len(value):
                return
            value = value[index]
