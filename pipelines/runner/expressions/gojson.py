"""Go's ``encoding/json`` text for strings and structs: what Argo writes where a variable holds
JSON (``{{inputs.parameters}}``, a ``{{=...}}`` tag's result). No imports beyond ``json``, so a
module that only needs this does not load the expression evaluator."""

from __future__ import annotations

import json
from collections.abc import Iterable


def go_string(text: str) -> str:
    """A JSON string as Go's ``json.Marshal`` writes it: UTF-8 kept, ``<``, ``>``, ``&`` and the
    line and paragraph separators escaped (HTML-safe, encode.go ``htmlSafeSet``)."""
    return (json.dumps(text, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("&", "\\u0026").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def go_struct(fields: Iterable[tuple[str, str | list[str]]]) -> str:
    """A struct of string and string-list fields, in the order given (Go writes a struct's
    fields in declaration order, not sorted as a map's keys), compact."""
    def text(value: str | list[str]) -> str:
        if isinstance(value, list):
            return "[" + ",".join(go_string(v) for v in value) + "]"
        return go_string(value)

    return "{" + ",".join(f"{go_string(name)}:{text(value)}" for name, value in fields) + "}"
