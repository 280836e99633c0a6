"""Linting files and folders: YAML documents in, problems out (``sublimate lint``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .problems import ARGO_KINDS, LintProblem, document_label
from .scale import is_volcano_job, scale_problems
from .schema import schema_problems
from .semantics import check_semantics


def _lint(doc: Mapping[str, Any], source: str, strict: bool, document: str) -> list[LintProblem]:
    if is_volcano_job(doc):  # what the train step submits: only its size is checked
        return scale_problems(doc, source, document)
    problems = schema_problems(doc, source, strict, document)
    if doc.get("kind") in ARGO_KINDS:
        problems.extend(check_semantics(doc, source, document))
    return problems + scale_problems(doc, source, document)


def lint_document(
    doc: dict[str, Any], source: str = "<string>", strict: bool = True
) -> list[LintProblem]:
    """Schema and semantic problems of one Argo document (an empty list when it is clean)."""
    return _lint(doc, source, strict, document_label(doc, 1))


def is_argo_document(doc: Any) -> bool:
    """Whether ``doc`` is one of the Argo kinds this linter checks (others are skipped)."""
    if not isinstance(doc, dict) or doc.get("kind") not in ARGO_KINDS:
        return False
    api = doc.get("apiVersion")
    # A wrong or missing apiVersion on an Argo kind is a problem to report, not a reason to skip;
    # only a different API group (someone else's "Workflow") is skipped.
    return not isinstance(api, str) or "/" not in api or api.startswith("argoproj.io/")


def _iter_files(paths: Sequence[str | Path]) -> Iterator[tuple[Path, bool]]:
    """(file, exists) for each path; directories give their *.yaml / *.yml files, sorted."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files = (p for p in path.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())
            for file in sorted(files):
                yield file, True
        else:
            yield path, path.is_file()


def _load_yaml_documents(text: str, source: str) -> Iterator[tuple[int, Any] | LintProblem]:
    """Yields (1-based index, document) or a LintProblem for a syntax error (then stops)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    index = 0
    try:
        for index, doc in enumerate(yaml.load_all(text, Loader=loader), start=1):
            yield index, doc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        message = f"YAML syntax error: {where}{problem}"
        yield LintProblem(source, f"document {index + 1}", "", message)


_YAML_TYPE_NAMES = {
    list: "a list",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
}


def lint_paths(paths: Sequence[str | Path], strict: bool = True) -> tuple[list[LintProblem], int]:
    """Lint files and directories; returns (problems, number of Argo documents checked)."""
    problems, checked, _ = lint_files(paths, strict)
    return problems, checked


def lint_files(paths: Sequence[str | Path], strict: bool = True
               ) -> tuple[list[LintProblem], int, list[str]]:
    """:func:`lint_paths`, plus the YAML files skipped for holding no Argo document (Kubernetes
    objects of an install, a kustomization), so that a user sees what was not checked."""
    problems: list[LintProblem] = []
    checked = 0
    skipped: list[str] = []
    for file, exists in _iter_files(paths):
        before = checked
        source = str(file)
        if not exists:
            problems.append(LintProblem(source, "", "", "no such file or directory"))
            continue
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(LintProblem(source, "", "", f"cannot read file: {exc}"))
            continue
        for item in _load_yaml_documents(text, source):
            if isinstance(item, LintProblem):
                problems.append(item)
                continue
            index, doc = item
            if doc is None:
                continue  # empty document, e.g. a trailing '---'
            if not isinstance(doc, dict):
                what = _YAML_TYPE_NAMES.get(type(doc), type(doc).__name__)
                message = f"document is {what}, not a mapping"
                problems.append(LintProblem(source, f"document {index}", "", message))
            elif is_argo_document(doc) or is_volcano_job(doc):
                checked += 1
                problems.extend(_lint(doc, source, strict, document_label(doc, index)))
        if checked == before and not any(p.source == source for p in problems):
            skipped.append(source)
    return problems, checked, skipped
