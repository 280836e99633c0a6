"""WorkflowTemplates and ClusterWorkflowTemplates (create, lint, get, list, update, delete:
Argo's ``server/workflowtemplate/`` and ``server/clusterworkflowtemplate/``) over their stores,
and workflows submitted from a WorkflowTemplate, a ClusterWorkflowTemplate or a CronWorkflow
(Argo's ``SubmitWorkflow``: ``argo submit --from KIND/NAME``, ``sublimate submit``,
``sublimate cron trigger``). A template's own ``templateRef``s and ``workflowTemplateRef`` are
resolved from the stored templates, when checked and when run."""

from __future__ import annotations

import copy
import re
from datetime import datetime

from sublimate.pipelines.runner.manifest.library import (
    ANNOTATION_SCHEDULED_TIME,
    LABEL_CRON_WORKFLOW,
    rfc3339,
)

from .convert import to_workflow
from .cron_server import crons, scheduler
from .errors import invalid
from .routing import Request, route
from .selectors import parse_selector
from .templates import (
    API_VERSION,
    cluster_templates,
    resolve_references,
    submit_options,
    submitted_workflow,
)

_BASE = "/api/v1/workflow-templates/{namespace}"
_CLUSTER_BASE = "/api/v1/cluster-workflow-templates"


def _checked_template(request: Request) -> dict:
    """The request's WorkflowTemplate's shape, then the runner's checks of what it would run
    (its references to other templates found among the stored ones, or itself)."""
    server = request.server
    checked = server.templates.checked(request.namespace, request.object().get("template"))
    workflow, _, _ = submitted_workflow(checked, {})
    server.launcher.lint(request.namespace, resolve_references(
        server, request.namespace, workflow, checking=checked))
    return checked


def _labelled(items: list[dict], request: Request) -> list[dict]:
    selector = parse_selector(request.one("listOptions.labelSelector"))
    return [item for item in items if selector(item["metadata"].get("labels") or {})]


def create(request: Request) -> tuple[int, dict]:
    return 200, request.server.templates.create(_checked_template(request))


def lint(request: Request) -> tuple[int, dict]:
    return 200, _checked_template(request)


def list_templates(request: Request) -> tuple[int, dict]:
    items = _labelled(request.server.templates.list(request.namespace), request)
    return 200, {"apiVersion": API_VERSION, "kind": "WorkflowTemplateList",
                 "metadata": {"resourceVersion": "1"}, "items": items}


def get(request: Request) -> tuple[int, dict]:
    return 200, request.server.templates.get(request.namespace, request.name)


def update(request: Request) -> tuple[int, dict]:
    request.server.templates.get(request.namespace, request.name)  # 404 first
    template = _checked_template(request)
    if template["metadata"]["name"] != request.name:
        raise invalid(f"template.metadata.name: '{template['metadata']['name']}' is not "
                      f"'{request.name}', the name in the path")
    return 200, request.server.templates.update(template)


def delete(request: Request) -> tuple[int, dict]:
    request.server.templates.delete(request.namespace, request.name)
    return 200, {}


# ------------------------------------------------------------- ClusterWorkflowTemplates


def _checked_cluster_template(request: Request) -> dict:
    """As a WorkflowTemplate, in no namespace: it may name only ClusterWorkflowTemplates
    (Argo validates one without a namespace's templates)."""
    server = request.server
    checked = cluster_templates(server).checked(request.object().get("template"))
    workflow, _, _ = submitted_workflow(checked, {}, cluster_scope=True)
    namespace = server.store.default_namespace  # (where a lint's workflow would run)
    server.launcher.lint(namespace, resolve_references(server, None, workflow,
                                                       checking=checked))
    return checked


def create_cluster(request: Request) -> tuple[int, dict]:
    return 200, cluster_templates(request.server).create(_checked_cluster_template(request))


def lint_cluster(request: Request) -> tuple[int, dict]:
    return 200, _checked_cluster_template(request)


def list_cluster(request: Request) -> tuple[int, dict]:
    items = _labelled(cluster_templates(request.server).list(None), request)
    return 200, {"apiVersion": API_VERSION, "kind": "ClusterWorkflowTemplateList",
                 "metadata": {"resourceVersion": "1"}, "items": items}


def get_cluster(request: Request) -> tuple[int, dict]:
    return 200, cluster_templates(request.server).get(None, request.name)


def update_cluster(request: Request) -> tuple[int, dict]:
    store = cluster_templates(request.server)
    store.get(None, request.name)
    template = _checked_cluster_template(request)
    if template["metadata"]["name"] != request.name:
        raise invalid(f"template.metadata.name: '{template['metadata']['name']}' is not "
                      f"'{request.name}', the name in the path")
    return 200, store.update(template)


def delete_cluster(request: Request) -> tuple[int, dict]:
    cluster_templates(request.server).delete(None, request.name)
    return 200, {}


# ------------------------------------------------------------------------------- submit

# Argo's names for each kind it submits from: Kind, singular, plural, short name.
_WORKFLOW_TEMPLATE = {"workflowtemplate", "workflowtemplates", "wftmpl"}
_CLUSTER_TEMPLATE = {"clusterworkflowtemplate", "clusterworkflowtemplates", "cwftmpl"}
_CRON_WORKFLOW = {"cronworkflow", "cronworkflows", "cronwf"}


def submit(request: Request) -> tuple[int, dict]:
    body = request.object()
    kind = str(body.get("resourceKind") or "")
    name = body.get("resourceName")
    if not isinstance(name, str) or not name:
        raise invalid("resourceName: required, the name of what to submit from")
    namespace, server = request.namespace, request.server
    options = body.get("submitOptions")
    run_namespace: str | None = namespace
    if kind.lower() in _WORKFLOW_TEMPLATE:
        template = server.templates.get(namespace, name)
        workflow, shown, parameters = submitted_workflow(template, options)
        check_settings(template, parameters)
    elif kind.lower() in _CLUSTER_TEMPLATE:
        template = cluster_templates(server).get(None, name)
        workflow, shown, parameters = submitted_workflow(template, options, cluster_scope=True)
        check_settings(template, parameters)
        run_namespace = None  # its own references are to ClusterWorkflowTemplates only
    elif kind.lower() in _CRON_WORKFLOW:
        workflow, shown, parameters = _from_cron(crons(server).get(namespace, name), options)
    else:
        raise invalid(f"resourceKind: Resource kind '{kind}' is not supported for submitting "
                      f"(WorkflowTemplate, ClusterWorkflowTemplate or CronWorkflow)")
    to_run = resolve_references(server, run_namespace, workflow)
    launcher = server.launcher
    if isinstance(options, dict) and (options.get("serverDryRun") or options.get("dryRun")):
        checked = launcher.lint(namespace, to_run, parameters)
        return 200, {**checked, "spec": shown}
    record = launcher.start(namespace, to_run, parameters, shown)
    if kind.lower() in _CRON_WORKFLOW:  # the cron's own: listed in its status.active now
        scheduler(server).changed(namespace, name, None)
    return 200, to_workflow(record, None, live=True)


# A setting's refusal starts with the setting's name: "epochs: ...", "global-batch-size 63 is
# not divisible by ...".
_SETTING_FIRST = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)(: | )")


def check_settings(template: dict, parameters: dict[str, str]) -> None:
    """What ``sublimate run`` and ``sublimate submit`` check before anything runs
    (``cli.common.check_settings``), for a template rendered from one of sublimate's pipelines
    (its ``sublimate.dev/pipeline`` label): its parameters as the runner resolves them, then
    the rules that tie its settings together. A refusal names the parameter as the runner's
    own refusals do (``parameter 'global-batch-size': ...``), so that a client can show it at
    that parameter's field; one that names no parameter is said as it is."""
    from sublimate.pipelines.render import parameter_check

    check = parameter_check({**template, "kind": "WorkflowTemplate"})
    if check is None:
        return
    from sublimate.components.base.settings import SettingError
    from sublimate.pipelines.runner import ParameterError, resolve_parameters

    try:
        check(resolve_parameters(template, parameters))
    except ParameterError as error:
        raise invalid(str(error)) from error
    except SettingError as error:
        message = str(error)
        declared = {parameter.get("name") for parameter in
                    (template["spec"].get("arguments") or {}).get("parameters") or []}
        first = _SETTING_FIRST.match(message)
        if first and first.group(1) in declared:
            said = message[first.end():] if first.group(2) == ": " else message
            message = f"parameter '{first.group(1)}': {said}"
        raise invalid(message) from error


def _from_cron(cron: dict, options: object) -> tuple[dict, dict, dict[str, str]]:
    """A workflow from a CronWorkflow now, as Argo's ``ConvertCronWorkflowToWorkflow`` makes
    one (``generateName: <cron>-``, the cron's label, the scheduled time of now), with the
    submit options applied."""
    spec = cron["spec"]
    labels = dict((spec.get("workflowMetadata") or {}).get("labels") or {})
    labels[LABEL_CRON_WORKFLOW] = cron["metadata"]["name"]
    metadata, parameters, entrypoint = submit_options(options, labels,
                                                      f"{cron['metadata']['name']}-")
    annotations = dict((spec.get("workflowMetadata") or {}).get("annotations") or {})
    annotations[ANNOTATION_SCHEDULED_TIME] = rfc3339(datetime.now().astimezone())
    metadata["annotations"] = annotations
    workflow_spec = copy.deepcopy(spec["workflowSpec"])
    shown = copy.deepcopy(workflow_spec)
    if parameters:
        given = [{"name": key, "value": value} for key, value in parameters.items()]
        arguments = shown.setdefault("arguments", {})
        others = [p for p in arguments.get("parameters") or [] if p.get("name") not in parameters]
        arguments["parameters"] = others + given
    if entrypoint:
        workflow_spec["entrypoint"] = shown["entrypoint"] = entrypoint
    workflow = {"apiVersion": API_VERSION, "kind": "Workflow", "metadata": metadata,
                "spec": workflow_spec}
    return workflow, shown, parameters


TEMPLATE_ROUTES = [
    route("POST", _BASE, create),
    route("GET", _BASE, list_templates),
    route("POST", f"{_BASE}/lint", lint),
    route("GET", f"{_BASE}/{{name}}", get),
    route("PUT", f"{_BASE}/{{name}}", update),
    route("DELETE", f"{_BASE}/{{name}}", delete),
    route("POST", _CLUSTER_BASE, create_cluster),
    route("GET", _CLUSTER_BASE, list_cluster),
    route("POST", f"{_CLUSTER_BASE}/lint", lint_cluster),
    route("GET", f"{_CLUSTER_BASE}/{{name}}", get_cluster),
    route("PUT", f"{_CLUSTER_BASE}/{{name}}", update_cluster),
    route("DELETE", f"{_CLUSTER_BASE}/{{name}}", delete_cluster),
    route("POST", "/api/v1/workflows/{namespace}/submit", submit),
]
