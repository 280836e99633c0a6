"""Offline linter for Argo Workflows manifests: the backend of ``sublimate lint``.

Two layers, like ``argo lint``: :mod:`.schema` checks every document against Argo's own JSON
Schema (strict by default, so misspelled fields are reported); :mod:`.semantics` checks what the
schema cannot express (template and task references, DAG cycles, ``{{...}}`` references).
:mod:`.files` reads files and folders; :mod:`.problems` is what they report.

The CLI imports this package on every start, so it stays cheap to import: jsonschema, PyYAML and
difflib are imported inside the functions that need them.
"""

from sublimate.pipelines.argo_terms import DEPENDS_RESULTS

from .problems import ARGO_KINDS, LintProblem

# Loaded on first use (PEP 562): `sublimate run` checks a manifest's semantics only, and
# importing them must not bring the file reader and the schema layer along.
_LAZY = {"is_argo_document": "files", "lint_document": "files", "lint_files": "files",
         "lint_paths": "files", "schema_problems": "schema", "semantic_problems": "semantics"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ARGO_KINDS",
    "DEPENDS_RESULTS",
    "LintProblem",
    "is_argo_document",
    "lint_document",
    "lint_files",
    "lint_paths",
    "schema_problems",
    "semantic_problems",
]
