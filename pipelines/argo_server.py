"""Talking to Argo Server: submit, install, get, list and logs, through Hera's WorkflowsService.

Connection settings follow the ``argo`` CLI: ``--argo-server`` / ``ARGO_SERVER`` (``host:port``
or a URL), ``--token`` / ``ARGO_TOKEN``, ``--namespace`` / ``ARGO_NAMESPACE``, ``ARGO_SECURE``
(``false`` for plain HTTP), ``ARGO_INSECURE_SKIP_VERIFY``. Every failure becomes one
:class:`ArgoServerError` that says what to fix.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

TERMINAL_PHASES = ("Succeeded", "Failed", "Error")


class ArgoServerError(Exception):
    """A request to Argo Server failed; the message names the server and the remedy."""


@dataclass(frozen=True)
class Connection:
    url: str
    token: str | None
    namespace: str
    verify_tls: bool


def connection(server: str | None, token: str | None, namespace: str | None,
               insecure: bool = False) -> Connection:
    server = server or os.environ.get("ARGO_SERVER")
    if not server:
        raise ArgoServerError("no Argo Server given: pass --argo-server HOST:PORT or set "
                              "ARGO_SERVER (e.g. localhost:2746 with `kubectl port-forward`)")
    if "://" not in server:
        secure = os.environ.get("ARGO_SECURE", "true").lower() != "false"
        server = f"{'https' if secure else 'http'}://{server}"
    skip_verify = insecure or os.environ.get("ARGO_INSECURE_SKIP_VERIFY", "") == "true"
    return Connection(url=server.rstrip("/"), token=token or os.environ.get("ARGO_TOKEN"),
                      namespace=namespace or os.environ.get("ARGO_NAMESPACE") or "sublimate",
                      verify_tls=not skip_verify)


def service(conn: Connection) -> Any:
    from hera.workflows import WorkflowsService

    return WorkflowsService(host=conn.url, token=conn.token, namespace=conn.namespace,
                            verify_ssl=conn.verify_tls)


def _call(conn: Connection, what: str, request: Callable[[], Any]) -> Any:
    """Run one request and turn every way it can fail into a message that says what to fix."""
    import requests
    from hera.exceptions import Forbidden, NotFound, Unauthorized

    try:
        return request()
    except requests.exceptions.ConnectionError as error:
        raise ArgoServerError(f"cannot reach Argo Server at {conn.url}: "
                              f"{type(error).__name__}; check --argo-server / ARGO_SERVER and "
                              "that the server (or its port-forward) is running") from None
    except requests.exceptions.Timeout:
        raise ArgoServerError(f"Argo Server at {conn.url} did not answer in time") from None
    except Unauthorized:
        raise ArgoServerError(f"Argo Server at {conn.url} refused the token (401 Unauthorized): "
                              "pass a valid --token or set ARGO_TOKEN "
                              "(`argo auth token`)") from None
    except Forbidden:
        raise ArgoServerError(f"Argo Server at {conn.url} forbids {what} in namespace "
                              f"'{conn.namespace}' (403): the token's account lacks RBAC "
                              "permissions there") from None
    except NotFound:
        raise ArgoServerError(f"{what}: not found in namespace '{conn.namespace}' on "
                              f"{conn.url}; install it with `sublimate install`") from None
    except Exception as error:  # other HTTP statuses: Hera puts the server's message in it
        raise ArgoServerError(f"{what} failed on {conn.url}: {error}") from None


def submit(conn: Connection, template: str, parameters: dict[str, str],
           labels: dict[str, str] | None = None) -> str:
    """Submit a workflow from the WorkflowTemplate ``template``; return the workflow's name."""
    from hera.workflows.models import SubmitOpts, WorkflowSubmitRequest

    request = WorkflowSubmitRequest(
        namespace=conn.namespace, resource_kind="WorkflowTemplate", resource_name=template,
        submit_options=SubmitOpts(
            parameters=[f"{name}={value}" for name, value in parameters.items()] or None,
            labels=",".join(f"{k}={v}" for k, v in (labels or {}).items()) or None))
    workflow = _call(conn, f"WorkflowTemplate '{template}'",
                     lambda: service(conn).submit_workflow(request, namespace=conn.namespace))
    return workflow.metadata.name


def install(conn: Connection, workflows: list[Any]) -> list[str]:
    """Create or update each Hera WorkflowTemplate / CronWorkflow; return what was done."""
    done = []
    for workflow in workflows:
        workflow.workflows_service = service(conn)
        workflow.namespace = conn.namespace
        kind = type(workflow).__name__
        _call(conn, f"{kind} '{workflow.name}'", workflow.update)
        done.append(f"{kind}/{workflow.name}")
    return done


def get(conn: Connection, name: str) -> dict[str, Any]:
    workflow = _call(conn, f"workflow '{name}'",
                     lambda: service(conn).get_workflow(name, namespace=conn.namespace))
    return workflow.model_dump(mode="json", by_alias=True, exclude_none=True)


def list_runs(conn: Connection, selector: str = "sublimate.dev/pipeline") -> list[dict]:
    listing = _call(conn, "listing workflows", lambda: service(conn).list_workflows(
        namespace=conn.namespace, label_selector=selector))
    return [item.model_dump(mode="json", by_alias=True, exclude_none=True)
            for item in listing.items or []]


def wait(conn: Connection, name: str, on_change: Callable[[str], None],
         poll_seconds: float = 5.0) -> str:
    """Poll until the workflow ends; report each phase change; return the final phase."""
    seen = None
    while True:
        status = get(conn, name).get("status", {})
        phase = status.get("phase") or "Pending"
        if phase != seen:
            on_change(phase + (f" ({status['message']})" if status.get("message") else ""))
            seen = phase
        if phase in TERMINAL_PHASES:
            return phase
        time.sleep(poll_seconds)


def logs(conn: Connection, name: str, follow: bool = False) -> Iterator[str]:
    """The workflow's log lines (``pod: line``); Argo streams them as JSON lines."""
    import requests

    url = f"{conn.url}/api/v1/workflows/{conn.namespace}/{name}/log"
    params = {"logOptions.container": "main", "logOptions.follow": str(follow).lower()}
    headers = {"Authorization": f"Bearer {conn.token}"} if conn.token else {}

    def request() -> Any:
        from hera.exceptions import exception_from_server_response

        response = requests.get(url, params=params, headers=headers, stream=True,
                                verify=conn.verify_tls, timeout=30)
        if not response.ok:
            raise exception_from_server_response(response)
        return response

    response = _call(conn, f"logs of workflow '{name}'", request)
    for raw in response.iter_lines():
        if raw:
            entry = json.loads(raw).get("result", {})
            yield f"{entry.get('podName', '')}: {entry.get('content', '')}"
