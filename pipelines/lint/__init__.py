"""Offline linter for Argo Workflows manifests: the backend of ``sublimate lint``.

Two layers, like ``argo lint``: :mod:`.schema` checks every document against Argo's own JSON
Schema (strict by default, so misspelled fields are reported); :mod:`.semantics` checks what the
schema cannot express (template and task references, DAG cycles, ``{{...}}`` references).
:mod:`.files` reads files and folders; :mod:`.problems` is what they report.

The CLI imports this package on every start, so it stays cheap to import: jsonschema, PyYAML and
difflib are imported inside the functions that need them.
"""

from sublimate.pipelines.argo_terms import DEPENDS_RESULTS

from .files import is_argo_document, lint_document, lint_files, lint_paths
from .problems import ARGO_KINDS, LintProblem
from .schema import schema_problems
from .semantics import semantic_problems

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
