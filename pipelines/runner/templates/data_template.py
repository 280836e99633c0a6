"""Data templates: a listing of artifact keys, filtered and mapped by expressions.

Argo runs one as a pod (``argoexec data``: workflow/executor/data.go, workflow/data/data.go),
so its node is a ``Pod`` node; locally it runs in the runner, on the home's artifact repository
(``repository``) and the runner's expression evaluator (``expr_lang``):

- ``source.artifactPaths`` is an artifact location (``s3``/``gcs``/``oss`` ``bucket`` and
  ``key``, ...; a key-only one is in the repository's own bucket). Its listing is every object
  under the key as a prefix (``<key>/``), recursively, by full key, in the store's order
  (sorted), as the drivers' ``ListObjects`` give it; an empty listing where the key does not
  exist either is the error ``no key found of name <key>``; an existing object with nothing
  under it lists as ``null``.
- each ``transformation[].expression``, in order, is evaluated with one variable, ``data``
  (the listing, then the previous result), and expr's own builtins only: no Argo function
  (``asInt``, ``jsonpath``, ``sprig``), no workflow variable, as ``processExpression`` compiles
  it (``filter(data, {# endsWith ".csv"})``, ``map(data, {...})``).
- ``outputs.result`` is the result as JSON (Go's ``json.Marshal``). Any error fails the node:
  ``unable to process data template: ...``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sublimate.pipelines.argo_terms import NodePhase

from ..expressions.substitution import Vars, substitute
from ..manifest.repository import (
    BUCKET_KINDS,
    bucket_and_key,
    location_kind,
    object_path,
    repository_root,
)
from ..pods.scope import CancelScope
from ..records.run_types import NodeResult

if TYPE_CHECKING:
    from .context import RunContext


class DataError(Exception):
    """The data template cannot produce its result (Argo's wrapped error text)."""


def run_data(run: RunContext, template: dict, local: Vars, node: NodeResult,
             scope: CancelScope) -> NodeResult:
    """``NodeError`` (an unresolvable variable) propagates: the node errs."""
    record = run.record
    data: dict = substitute(template["data"], local,  # type: ignore[assignment]
                            f"templates.{template['name']}.data")
    record.transition(node, NodePhase.RUNNING)
    try:
        value = transform(listing((data.get("source") or {}).get("artifactPaths"),
                                  run.layout.home), data.get("transformation") or [])
        from ..expressions.expr_lang import go_json

        node.result = go_json(value)
    except DataError as exc:
        return record.finish(node, NodePhase.FAILED, f"unable to process data template: {exc}")
    if scope.stop_reason():
        return record.finish(node, NodePhase.FAILED, scope.stop_reason() or "")
    return record.finish(node, NodePhase.SUCCEEDED)


def listing(art: dict | None, home: Path) -> list[str] | None:
    """The keys under an artifact location, as ``ListObjects`` gives them (None: an existing
    object with nothing under it)."""
    where = "unable to process data source"
    if not isinstance(art, dict):
        raise DataError(f"{where}: no valid source is used for data template")
    kind = location_kind(art)
    if kind is not None and kind not in BUCKET_KINDS:
        raise DataError(f"{where}: unable to source artifact paths: {kind} artifacts cannot "
                        "be listed")
    bucket, key = bucket_and_key(art)
    clean = key.strip("/")
    try:
        root = object_path(home, bucket, clean) if clean else \
            repository_root(home) / bucket
    except ValueError as exc:
        raise DataError(f"{where}: unable to source artifact paths: {exc}") from None
    found = _objects(home, root)
    keys = sorted(f"{clean}/{name}" if clean else name for name in found or ())
    if keys:
        return keys
    if found is None:
        raise DataError(f"{where}: unable to source artifact paths: no key found of name {key}")
    return None


def _objects(home: Path, root: Path) -> list[str] | None:
    """The files under ``root`` (paths relative to it; None when nothing is there), walked
    inside the repository through descriptors: a link stored there (a folder's objects, archive
    none, keep a pod's links) is never followed out of it, so no host folder is listed."""
    import os
    import stat

    from ..pods.inside import InRoot, open_path

    repository = repository_root(home)
    try:
        top = open_path(InRoot(repository, os.path.relpath(root, repository)))
    except OSError:
        return None
    found: list[str] = []
    try:
        if not stat.S_ISDIR(os.fstat(top).st_mode):
            return found
        for folder, _, files, folder_fd in os.fwalk(".", dir_fd=top):  # follows no link
            found += [os.path.normpath(os.path.join(folder, name)) for name in files
                      if stat.S_ISREG(os.stat(name, dir_fd=folder_fd,
                                              follow_symlinks=False).st_mode)]
    finally:
        os.close(top)
    return found


def transform(value: Any, steps: list[dict]) -> Any:
    """Each ``expression`` in turn, on ``data`` alone (``processTransformation``)."""
    from ..expressions.conditions import ExpressionError
    from ..expressions.expr_lang import evaluate

    for i, step in enumerate(steps):
        expression = str(step.get("expression") or "")
        if not expression:
            continue
        try:
            value = evaluate(expression, {}, env={"data": value})
        except ExpressionError as exc:
            raise DataError(f"unable to process data transformation: error processing data "
                            f"step {i}: {exc}") from None
    return value
