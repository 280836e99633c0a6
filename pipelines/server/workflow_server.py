"""Workflows: create, lint, get, list, delete (Argo's ``server/workflow/workflow_server.go``),
over the store's records and the launcher's runs."""

from __future__ import annotations

import json

from .convert import to_workflow
from .errors import invalid, not_found
from .routing import NAME, Request, route
from .selectors import workflow_selector
from .templates import resolve_references

_BASE = "/api/v1/workflows/{namespace}"


def create(request: Request) -> tuple[int, dict]:
    body = request.object()
    launcher = request.server.launcher
    options = body.get("createOptions") or {}
    if not isinstance(options, dict):
        raise invalid("createOptions: must be an object")
    given = body.get("workflow")
    # a workflowTemplateRef or templateRef names the server's stored templates (``templates``)
    to_run = resolve_references(request.server, request.namespace, given)
    if body.get("serverDryRun") or "All" in (options.get("dryRun") or []):
        return 200, launcher.lint(request.namespace, to_run)
    shown = given.get("spec") if to_run is not given and isinstance(given, dict) else None
    record = launcher.start(request.namespace, to_run, None, shown)
    return 200, to_workflow(record, None, live=True)


def lint(request: Request) -> tuple[int, dict]:
    namespace = request.namespace
    given = request.object().get("workflow")
    return 200, request.server.launcher.lint(
        namespace, resolve_references(request.server, namespace, given))


def find(request: Request) -> tuple[dict, dict | None]:
    """The record and status of the workflow the request's path names; 404 if none."""
    namespace, name = request.namespace, request.name
    store = request.server.store
    # (a name that is no Kubernetes name names no workflow, nor any path outside the home)
    record = store.record(name) if NAME.fullmatch(name) else None
    if record is None or record.get("namespace") != namespace:
        raise not_found(namespace, name)
    return record, store.status(name)


def _as_now(request: Request, name: str, record: dict) -> dict:
    """The Workflow ``record`` is, with its run's status and this server's live state."""
    store, launcher = request.server.store, request.server.launcher
    workflow = to_workflow(record, store.status(name), launcher.is_live(name))
    if launcher.is_suspended(name):
        workflow["spec"] = {**workflow["spec"], "suspend": True}
    return workflow


def shown(request: Request, name: str) -> dict:
    """Workflow ``name`` as Argo shows it now (found by the caller)."""
    store = request.server.store
    record = store.record(name)
    assert record is not None
    workflow = _as_now(request, name, record)
    if "workflowTemplateRef" in workflow["spec"]:
        # what ran, as Argo keeps it for a workflow from a template: the page finds the
        # templates of its nodes there (a suspend node's supplied outputs, a node's inputs)
        stored = store.manifest_spec(name)
        if stored is not None:
            workflow["status"]["storedWorkflowTemplateSpec"] = stored
    return workflow


def get(request: Request) -> tuple[int, dict]:
    find(request)
    return 200, shown(request, request.name)


def listed(request: Request) -> list[dict]:
    """The workflows of the request's namespace its selectors choose, newest first."""
    chosen = workflow_selector(request.one("listOptions.labelSelector"),
                               request.one("listOptions.fieldSelector"), request.namespace)
    name_filter = request.one("nameFilter")
    store = request.server.store
    items = []
    for name in store.names():
        record = store.record(name)
        if record is None or record.get("namespace") != request.namespace:
            continue
        if name_filter and name_filter not in name:
            continue
        workflow = _as_now(request, name, record)
        if chosen(workflow):
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


# ------------------------------------------------------------------ acting on a workflow


def _options(request: Request) -> dict:
    """The action's request body (``{name, namespace, ...}``; the path's win, as Argo's)."""
    body = request.body if request.body is not None else {}
    if not isinstance(body, dict):
        raise invalid("body: must be a JSON object")
    return body


def _text(body: dict, key: str) -> str:
    value = body.get(key) or ""
    if not isinstance(value, str):
        raise invalid(f"{key}: must be a string")
    return value


def _entries(body: dict, key: str) -> list[str]:
    value = body.get(key) or []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise invalid(f"{key}: must be a list of NAME=VALUE strings")
    return value


def retry(request: Request) -> tuple[int, dict]:
    """``argo retry``: its failed nodes and what comes after them run again (a finished one)."""
    find(request)
    body = _options(request)
    request.server.launcher.retry(request.name, bool(body.get("restartSuccessful")),
                                  _text(body, "nodeFieldSelector"), _entries(body, "parameters"))
    return 200, shown(request, request.name)


def resubmit(request: Request) -> tuple[int, dict]:
    """``argo resubmit [--memoized]``: a new workflow of the same spec."""
    find(request)
    body = _options(request)
    record = request.server.launcher.resubmit(request.name, bool(body.get("memoized")),
                                              _entries(body, "parameters"))
    return 200, shown(request, record["name"])


def set_nodes(request: Request) -> tuple[int, dict]:
    """``argo node set``: a suspend node's supplied outputs set (it resumes), or its phase."""
    find(request)
    body = _options(request)
    selector = _text(body, "nodeFieldSelector")
    if not selector:
        raise invalid("nodeFieldSelector: required, the suspend nodes to set")
    outputs: dict[str, str] = {}
    if text := _text(body, "outputParameters"):
        try:
            outputs = json.loads(text)
        except ValueError as error:
            raise invalid(f"outputParameters: not a JSON object: {error}") from None
        if not isinstance(outputs, dict) or not all(
                isinstance(value, str) for value in outputs.values()):
            raise invalid("outputParameters: must be a JSON object of strings")
    request.server.launcher.set_nodes(request.name, selector, _text(body, "phase"),
                                      _text(body, "message"), outputs)
    return 200, shown(request, request.name)


def stop(request: Request) -> tuple[int, dict]:
    find(request)
    body = _options(request)
    request.server.launcher.stop(request.name, _text(body, "nodeFieldSelector"),
                                 _text(body, "message"))
    return 200, shown(request, request.name)


def terminate(request: Request) -> tuple[int, dict]:
    find(request)
    launcher = request.server.launcher
    if not launcher.is_live(request.name):
        raise invalid(f"workflow {request.name} is not running here: nothing to terminate")
    launcher.terminate(request.name, "terminated", wait_s=30)
    return 200, shown(request, request.name)


def suspend(request: Request) -> tuple[int, dict]:
    find(request)
    request.server.launcher.suspend(request.name)
    return 200, shown(request, request.name)


def resume(request: Request) -> tuple[int, dict]:
    find(request)
    body = _options(request)
    request.server.launcher.resume(request.name, _text(body, "nodeFieldSelector"))
    return 200, shown(request, request.name)


WORKFLOW_ROUTES = [
    route("POST", _BASE, create),
    route("GET", _BASE, list_workflows),
    route("POST", f"{_BASE}/lint", lint),
    route("GET", f"{_BASE}/{{name}}", get),
    route("DELETE", f"{_BASE}/{{name}}", delete),
    route("PUT", f"{_BASE}/{{name}}/retry", retry),
    route("PUT", f"{_BASE}/{{name}}/resubmit", resubmit),
    route("PUT", f"{_BASE}/{{name}}/stop", stop),
    route("PUT", f"{_BASE}/{{name}}/terminate", terminate),
    route("PUT", f"{_BASE}/{{name}}/suspend", suspend),
    route("PUT", f"{_BASE}/{{name}}/resume", resume),
    route("PUT", f"{_BASE}/{{name}}/set", set_nodes),
]
