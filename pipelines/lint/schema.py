"""The schema layer: Argo's own JSON Schema (shipped gzipped in ``schema/``, see
``schema/SOURCE.md``), strict by default so that misspelled fields are reported.

jsonschema is imported inside the functions: the CLI imports the linter on every start.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from .problems import (
    ARGO_KINDS,
    LintProblem,
    did_you_mean,
    document_label,
    format_path,
    path_key,
    quoted_list,
    short,
)

_SCHEMA_FILE = "schema/argo-workflows.schema.json.gz"
_DEF_PREFIX = "io.argoproj.workflow.v1alpha1."

# --- load-time schema patches (documented in schema/SOURCE.md) -------------------------------

# Argo's Go types accept more JSON types than schema.json says (its CRDs agree with the Go types).
_INT_OR_STRING = {"type": ["integer", "string"]}  # intstr.IntOrString: Hera writes `limit: 3`
_QUANTITY = {"type": ["number", "string"]}  # resource.Quantity: `cpu: 1`, `memory: 2Gi`
_ANY_STRING = {"type": ["string", "number", "boolean"]}  # wfv1.AnyString: `value: 3`
_ANY_STRING_FIELDS = {
    "Parameter": ("value", "default", "description"),
    "ValueFrom": ("default",),
}
# Enums that Argo's CRDs (kubebuilder markers) declare but schema.json does not.
_ENUMS: dict[tuple[str, str], list[str]] = {
    ("ArtifactGC", "strategy"): ["", "OnWorkflowCompletion", "OnWorkflowDeletion", "Never"],
    ("WorkflowLevelArtifactGC", "strategy"): [
        "",
        "OnWorkflowCompletion",
        "OnWorkflowDeletion",
        "Never",
    ],
    ("CronWorkflowSpec", "concurrencyPolicy"): ["Allow", "Forbid", "Replace"],
    ("Gauge", "operation"): ["Set", "Add", "Sub"],
    ("PodGC", "strategy"): [
        "",
        "OnPodCompletion",
        "OnPodSuccess",
        "OnWorkflowCompletion",
        "OnWorkflowSuccess",
    ],
    ("ResourceTemplate", "action"): ["get", "create", "apply", "delete", "replace", "patch"],
    ("ResourceTemplate", "mergeStrategy"): ["strategic", "merge", "json"],
    ("RetryStrategy", "retryPolicy"): ["Always", "OnFailure", "OnError", "OnTransientError"],
    ("S3Artifact", "addressingStyle"): ["", "path", "virtual-hosted"],
    ("S3ArtifactRepository", "addressingStyle"): ["", "path", "virtual-hosted"],
}


@functools.cache
def _base_definitions() -> Mapping[str, Any]:
    """Upstream definitions with the type widenings and enums applied (shared, never mutated)."""
    import gzip
    import json
    from importlib import resources

    raw = resources.files("sublimate.pipelines.lint").joinpath(_SCHEMA_FILE).read_bytes()
    defs: dict[str, Any] = json.loads(gzip.decompress(raw))["definitions"]
    defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = _INT_OR_STRING
    defs["io.k8s.apimachinery.pkg.api.resource.Quantity"] = _QUANTITY
    for name, fields in _ANY_STRING_FIELDS.items():
        props = defs[_DEF_PREFIX + name]["properties"]
        for fname in fields:
            props[fname] = {**props[fname], **_ANY_STRING}
    params = defs[_DEF_PREFIX + "Parameter"]["properties"]
    params["enum"] = {**params["enum"], "items": _ANY_STRING}
    for (name, fname), values in _ENUMS.items():
        props = defs[_DEF_PREFIX + name]["properties"]
        props[fname] = {**props[fname], "enum": values}
    return defs


@functools.cache
def _definitions(strict: bool) -> Mapping[str, Any]:
    defs = _base_definitions()
    if not strict:
        return defs
    # argo lint decodes strictly and rejects unknown fields. Maps (labels, annotations, resource
    # limits, hooks) are inline `additionalProperties` schemas inside properties, not top-level
    # definitions, so closing every definition that has `properties` leaves them open.
    return {
        name: {**d, "additionalProperties": False} if "properties" in d else d
        for name, d in defs.items()
    }


@functools.cache
def _validator(kind: str, strict: bool) -> Any:
    from jsonschema import Draft202012Validator

    schema = {"$ref": f"#/definitions/{_DEF_PREFIX}{kind}", "definitions": _definitions(strict)}
    return Draft202012Validator(schema)


def _describe(error: Any) -> list[tuple[str, str]]:
    """Turn one jsonschema error into (path, plain-words message) pairs."""
    path = format_path(error.absolute_path)
    kind, inst, schema = error.validator, error.instance, error.schema
    if kind == "additionalProperties" and isinstance(inst, dict):
        known = schema.get("properties", {})
        return [
            (path, f"unknown field '{key}'{did_you_mean(key, known)}")
            for key in inst
            if key not in known
        ]
    if kind == "type":
        types = error.validator_value
        types = [types] if isinstance(types, str) else types
        return [(path, f"{short(inst)} is not of type {' or '.join(map(repr, types))}")]
    if kind == "enum":
        allowed = quoted_list(error.validator_value)
        return [(path, f"{short(inst)} is not one of the allowed values: {allowed}")]
    if kind == "const":
        return [(path, f"{short(inst)} must be {error.validator_value!r}")]
    if kind == "required":
        missing = [r for r in error.validator_value if isinstance(inst, dict) and r not in inst]
        return [(path, f"missing required field '{name}'") for name in missing]
    return [(path, error.message if len(error.message) <= 200 else error.message[:197] + "...")]


def schema_problems(
    doc: Mapping[str, Any], source: str = "<string>", strict: bool = True, document: str = ""
) -> list[LintProblem]:
    """Validate ``doc`` against its kind's definition in Argo's JSON Schema."""
    from jsonschema.exceptions import best_match

    document = document or document_label(doc, 1)
    kind = doc.get("kind")
    if kind not in ARGO_KINDS:
        return [LintProblem(source, document, "kind", _not_argo_message(kind))]
    seen: set[tuple[str, str]] = set()
    problems: list[LintProblem] = []
    for error in _validator(kind, strict).iter_errors(doc):
        # oneOf/anyOf errors say "is not valid under any of the given schemas"; the most
        # relevant sub-error says what is actually wrong.
        specific = best_match([error]) if error.context else error
        for path, message in _describe(specific):
            if (path, message) not in seen:
                seen.add((path, message))
                problems.append(LintProblem(source, document, path, message))
    return sorted(problems, key=path_key)


def _not_argo_message(kind: Any) -> str:
    return f"not an Argo Workflows document: kind {kind!r} is not one of {quoted_list(ARGO_KINDS)}"
