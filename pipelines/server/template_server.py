"""WorkflowTemplates (create, lint, get, list, update, delete) and workflows submitted from
one (Argo's ``server/workflowtemplate/`` and ``SubmitWorkflow``), over the ``TemplateStore``."""

from __future__ import annotations

from .convert import to_workflow
from .errors import UNIMPLEMENTED, ApiError, invalid
from .routing import Request, route
from .templates import submitted_workflow

_BASE = "/api/v1/workflow-templates/{namespace}"


def _checked_template(request: Request) -> dict:
    """The request's WorkflowTemplate's shape, then the runner's checks of what it would run."""
    server = request.server
    checked = server.templates.checked(request.namespace, request.object().get("template"))
    workflow, _, _ = submitted_workflow(checked, {})
    server.launcher.lint(request.namespace, workflow)
    return checked


def create(request: Request) -> tuple[int, dict]:
    return 200, request.server.templates.create(_checked_template(request))


def lint(request: Request) -> tuple[int, dict]:
    return 200, _checked_template(request)


def list_templates(request: Request) -> tuple[int, dict]:
    return 200, {"apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowTemplateList",
                 "metadata": {"resourceVersion": "1"},
                 "items": request.server.templates.list(request.namespace)}


def get(request: Request) -> tuple[int, dict]:
    return 200, request.server.templates.get(request.namespace, request.name)


def update(request: Request) -> tuple[int, dict]:
    template = _checked_template(request)
    if template["metadata"]["name"] != request.name:
        raise invalid(f"template.metadata.name: '{template['metadata']['name']}' is not "
                      f"'{request.name}', the name in the path")
    return 200, request.server.templates.update(template)


def delete(request: Request) -> tuple[int, dict]:
    request.server.templates.delete(request.namespace, request.name)
    return 200, {}


def submit(request: Request) -> tuple[int, dict]:
    body = request.object()
    kind = str(body.get("resourceKind") or "")
    if kind.lower() != "workflowtemplate":
        raise ApiError(UNIMPLEMENTED, f"resourceKind: {kind or '(none)'}: only "
                                      f"WorkflowTemplate is served by sublimate server yet")
    name = body.get("resourceName")
    if not isinstance(name, str) or not name:
        raise invalid("resourceName: required, the WorkflowTemplate's name")
    namespace = request.namespace
    template = request.server.templates.get(namespace, name)
    options = body.get("submitOptions")
    workflow, shown, parameters = submitted_workflow(template, options)
    launcher = request.server.launcher
    if isinstance(options, dict) and (options.get("serverDryRun") or options.get("dryRun")):
        checked = launcher.lint(namespace, workflow, parameters)
        return 200, {**checked, "spec": shown}
    record = launcher.start(namespace, workflow, parameters, shown)
    return 200, to_workflow(record, None, live=True)


TEMPLATE_ROUTES = [
    route("POST", _BASE, create),
    route("GET", _BASE, list_templates),
    route("POST", f"{_BASE}/lint", lint),
    route("GET", f"{_BASE}/{{name}}", get),
    route("PUT", f"{_BASE}/{{name}}", update),
    route("DELETE", f"{_BASE}/{{name}}", delete),
    route("POST", "/api/v1/workflows/{namespace}/submit", submit),
]
