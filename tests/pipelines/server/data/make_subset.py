"""Regenerate ``argo_swagger_subset.json`` from Argo's own OpenAPI document: the paths
``sublimate server`` serves and every definition they reference, transitively (descriptions
and Kubernetes' ``x-`` extensions left out, to keep the copy small).

    python tests/pipelines/server/data/make_subset.py SWAGGER_JSON COMMIT

``SWAGGER_JSON`` is ``api/openapi-spec/swagger.json`` of argoproj/argo-workflows at ``COMMIT``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

PATHS = [
    "/api/v1/version",
    "/api/v1/workflows/{namespace}",
    "/api/v1/workflows/{namespace}/lint",
    "/api/v1/workflows/{namespace}/submit",
    "/api/v1/workflows/{namespace}/{name}",
    "/api/v1/workflows/{namespace}/{name}/log",
    "/api/v1/workflows/{namespace}/{name}/{podName}/log",
    "/api/v1/workflows/{namespace}/{name}/retry",
    "/api/v1/workflows/{namespace}/{name}/resubmit",
    "/api/v1/workflows/{namespace}/{name}/resume",
    "/api/v1/workflows/{namespace}/{name}/set",
    "/api/v1/workflows/{namespace}/{name}/stop",
    "/api/v1/workflows/{namespace}/{name}/suspend",
    "/api/v1/workflows/{namespace}/{name}/terminate",
    "/api/v1/workflow-events/{namespace}",
    "/api/v1/workflow-templates/{namespace}",
    "/api/v1/workflow-templates/{namespace}/lint",
    "/api/v1/workflow-templates/{namespace}/{name}",
    "/api/v1/cluster-workflow-templates",
    "/api/v1/cluster-workflow-templates/lint",
    "/api/v1/cluster-workflow-templates/{name}",
    "/api/v1/cron-workflows/{namespace}",
    "/api/v1/cron-workflows/{namespace}/lint",
    "/api/v1/cron-workflows/{namespace}/{name}",
    "/api/v1/cron-workflows/{namespace}/{name}/resume",
    "/api/v1/cron-workflows/{namespace}/{name}/suspend",
]


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: _strip(value) for key, value in node.items()
                # (a property named "description" is an object, and stays)
                if not (key == "description" and isinstance(value, str))
                and not key.startswith("x-")}
    if isinstance(node, list):
        return [_strip(value) for value in node]
    return node


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"].rsplit("/", 1)[-1]} if isinstance(node.get("$ref"), str) else set()
        for value in node.values():
            found |= _refs(value)
        return found
    if isinstance(node, list):
        return set().union(*(_refs(value) for value in node)) if node else set()
    return set()


def subset(swagger: dict, commit: str) -> dict:
    paths = {path: _strip(swagger["paths"][path]) for path in PATHS}
    definitions: dict[str, Any] = {}
    pending = sorted(_refs(paths))
    while pending:
        name = pending.pop()
        if name in definitions:
            continue
        definitions[name] = _strip(swagger["definitions"][name])
        pending += sorted(_refs(definitions[name]) - set(definitions))
    return {
        "_source": f"argoproj/argo-workflows api/openapi-spec/swagger.json at {commit}: the "
                   "paths sublimate server serves and the definitions they reference, "
                   "transitively (descriptions left out)",
        "swagger": swagger["swagger"], "info": _strip(swagger["info"]),
        "paths": paths, "definitions": dict(sorted(definitions.items())),
    }


if __name__ == "__main__":
    source, commit = sys.argv[1], sys.argv[2]
    out = Path(__file__).with_name("argo_swagger_subset.json")
    out.write_text(json.dumps(subset(json.loads(Path(source).read_text()), commit), indent=1)
                   + "\n")
    print(f"wrote {out}")
