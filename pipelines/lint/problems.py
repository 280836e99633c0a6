"""What the linter reports, and the small helpers that word it."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ARGO_KINDS = ("Workflow", "WorkflowTemplate", "ClusterWorkflowTemplate", "CronWorkflow")


@dataclass(frozen=True)
class LintProblem:
    """One finding. ``path`` is a dotted field path ("" for the document root)."""

    source: str
    document: str
    path: str
    message: str
    # A warning is printed but passes lint: the manifest is valid, yet at its size it needs a
    # setting of the controller or of the manifest (pipelines/lint/scale.py).
    warning: bool = False

    def __str__(self) -> str:
        parts = [p for p in (self.source, self.document, self.path) if p]
        return ": ".join([*parts, f"warning: {self.message}" if self.warning else self.message])


def format_path(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def quoted_list(values: Iterable[Any]) -> str:
    return ", ".join(repr(v) for v in values)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""




def path_key(problem: LintProblem) -> tuple[Any, ...]:
    # Sort "templates[10]" after "templates[2]": compare indices numerically.
    return tuple(
        (0, int(tok), "") if tok.isdigit() else (1, 0, tok)
        for tok in re.split(r"[.\[\]]+", problem.path)
        if tok
    )


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def names(items: Any) -> list[str]:
    return [
        item["name"]
        for item in as_list(items)
        if isinstance(item, dict) and isinstance(item.get("name"), str)
    ]


def document_label(doc: Mapping[str, Any], index: int) -> str:
    meta = as_dict(doc.get("metadata"))
    name = meta.get("name") or meta.get("generateName")
    kind = doc.get("kind")
    if isinstance(kind, str) and isinstance(name, str) and name:
        return f"{kind}/{name}"
    return f"document {index}"
