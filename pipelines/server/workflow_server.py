"""Workflows: create, lint, get, list, delete (Argo's ``server/workflow/workflow_server.go``),
over the store's records and the launcher's runs."""

from __future__ import annotations

from .convert import to_workflow
from .errors import invalid, not_found
from .routing import NAME, Request, route
from .selectors import parse_selector

_BASE = "/api/v1/workflows/{namespace}"


def create(request: Request) -> tuple[int, dict]:
    body = request.object()
    launcher = request.server.launcher
    options = body.get("createOptions") or {}
    if not isinstance(options, dict):
        raise invalid("createOptions: must be an object")
    if body.get("serverDryRun") or "All" in (options.get("dryRun") or []):
        return 200, launcher.lint(request.namespace, body.get("workflow"))
    record = launcher.start(request.namespace, body.get("workflow"))
    return 200, to_workflow(record, None, live=True)


def lint(request: Request) -> tuple[int, dict]:
    return 200, request.server.launcher.lint(request.namespace, request.object().get("workflow"))


def find(request: Request) -> tuple[dict, dict | None]:
    """The record and status of the workflow the request's path names; 404 if none."""
    namespace, name = request.namespace, request.name
    store = request.server.store
    # (a name that is no Kubernetes name names no workflow, nor any path outside the home)
    record = store.record(name) if NAME.fullmatch(name) else None
    if record is None or record.get("namespace") != namespace:
        raise not_found(namespace, name)
    return record, store.status(name)


def get(request: Request) -> tuple[int, dict]:
    record, status = find(request)
    return 200, to_workflow(record, status, request.server.launcher.is_live(request.name))


def listed(request: Request) -> list[dict]:
    """The workflows of the request's namespace its selectors choose, newest first."""
    selector = parse_selector(request.one("listOptions.labelSelector"))
    name_filter = request.one("nameFilter")
    store, launcher = request.server.store, request.server.launcher
    items = []
    for name in store.names():
        record = store.record(name)
        if record is None or record.get("namespace") != request.namespace:
            continue
        if name_filter and name_filter not in name:
            continue
        workflow = to_workflow(record, store.status(name), launcher.is_live(name))
        if selector(workflow["metadata"]["labels"]):
            items.append(workflow)
    # newest first, as Argo lists them
    items.sort(key=lambda item: item["metadata"]["creationTimestamp"], reverse=True)
    return items


def list_workflows(request: Request) -> tuple[int, dict]:
    return 200, {"apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowList",
                 "metadata": {"resourceVersion": "1"}, "items": listed(request)}


def delete(request: Request) -> tuple[int, dict]:
    find(request)
    launcher = request.server.launcher
    if launcher.is_live(request.name):
        launcher.terminate(request.name, "the workflow was deleted", wait_s=30)
    request.server.store.remove(request.name)
    return 200, {}


WORKFLOW_ROUTES = [
    route("POST", _BASE, create),
    route("GET", _BASE, list_workflows),
    route("POST", f"{_BASE}/lint", lint),
    route("GET", f"{_BASE}/{{name}}", get),
    route("DELETE", f"{_BASE}/{{name}}", delete),
]
