"""Talking to Argo Server: submit, cron trigger, install, get, list and logs, through Hera's
WorkflowsService.

Connection settings follow the ``argo`` CLI: ``--argo-server`` / ``ARGO_SERVER`` (``host:port``
or a URL), ``--token`` / ``ARGO_TOKEN``, ``--namespace`` / ``ARGO_NAMESPACE``, ``ARGO_SECURE``
(``false`` for plain HTTP), ``ARGO_INSECURE_SKIP_VERIFY``. Every failure becomes one
:class:`ArgoServerError` that says what to fix.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
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


def create(conn: Connection, workflow: dict) -> str:
    """Create ``workflow`` (a Workflow manifest) as ``argo submit FILE`` does; its name."""
    from hera.workflows.models import WorkflowCreateRequest

    request = WorkflowCreateRequest.model_validate({"namespace": conn.namespace,
                                                   "workflow": workflow})
    shown = (workflow.get("metadata") or {}).get("name") or "the workflow"
    created = _call(conn, f"creating {shown}", lambda: service(conn).create_workflow(
        request, namespace=conn.namespace))
    return created.metadata.name


def put_template(conn: Connection, template: dict) -> str:
    """Create the WorkflowTemplate ``template``, or update the one of its name; its name."""
    from hera.exceptions import AlreadyExists
    from hera.workflows.models import (
        WorkflowTemplateCreateRequest,
        WorkflowTemplateUpdateRequest,
    )

    name = template["metadata"]["name"]
    what = f"WorkflowTemplate '{name}'"

    def create_or_update() -> Any:
        api = service(conn)
        try:
            return api.create_workflow_template(WorkflowTemplateCreateRequest.model_validate(
                {"namespace": conn.namespace, "template": template}), namespace=conn.namespace)
        except AlreadyExists:
            current = api.get_workflow_template(name, namespace=conn.namespace)
            updated = {**template, "metadata": {
                **template["metadata"], "resourceVersion": current.metadata.resource_version}}
            return api.update_workflow_template(name, WorkflowTemplateUpdateRequest.model_validate(
                {"namespace": conn.namespace, "name": name, "template": updated}),
                namespace=conn.namespace)

    return _call(conn, what, create_or_update).metadata.name


def trigger_cron(conn: Connection, name: str) -> str:
    """Start the CronWorkflow ``name`` now, as ``argo submit --from cronwf/NAME`` does (Argo
    Server's ``SubmitWorkflow`` with ``resourceKind`` ``cronworkflow``: the server makes the
    workflow with ``generateName: NAME-``, the ``cron-workflow`` label and the scheduled time
    of now); return the workflow's name."""
    from hera.workflows.models import WorkflowSubmitRequest

    request = WorkflowSubmitRequest(namespace=conn.namespace, resource_kind="cronworkflow",
                                    resource_name=name)
    workflow = _call(conn, f"CronWorkflow '{name}'",
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


def retry(conn: Connection, name: str, restart_successful: bool = False,
          node_field_selector: str = "", parameters: dict[str, str] | None = None) -> str:
    """``argo retry``: the workflow's failed nodes, and what comes after them, run again."""
    from hera.workflows.models import WorkflowRetryRequest

    request = WorkflowRetryRequest(
        name=name, namespace=conn.namespace, restart_successful=restart_successful or None,
        node_field_selector=node_field_selector or None,
        parameters=[f"{key}={value}" for key, value in (parameters or {}).items()] or None)
    workflow = _call(conn, f"retrying workflow '{name}'", lambda: service(conn).retry_workflow(
        name, request, namespace=conn.namespace))
    return workflow.metadata.name


def resubmit(conn: Connection, name: str, memoized: bool = False,
             parameters: dict[str, str] | None = None) -> str:
    """``argo resubmit``: a new workflow of the same spec; its name."""
    from hera.workflows.models import WorkflowResubmitRequest

    request = WorkflowResubmitRequest(
        name=name, namespace=conn.namespace, memoized=memoized or None,
        parameters=[f"{key}={value}" for key, value in (parameters or {}).items()] or None)
    workflow = _call(conn, f"resubmitting workflow '{name}'",
                     lambda: service(conn).resubmit_workflow(name, request,
                                                             namespace=conn.namespace))
    return workflow.metadata.name


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


def authorization(token: str) -> str:
    """The Authorization header for ``token``: ``argo auth token`` prints it with its
    ``Bearer`` prefix and ARGO_TOKEN is often set from that, so the prefix is added only when
    missing (as Hera's WorkflowsService does for the other requests)."""
    return token if token.startswith("Bearer ") else f"Bearer {token}"


# Seconds to connect to Argo Server, and how long a log stream may stay quiet before the
# workflow's phase is checked (a running step can be silent for minutes: data staging, a long
# epoch, a rendezvous).
CONNECT_SECONDS = 30.0
QUIET_SECONDS = 30.0
# An RFC 3339 timestamp as Kubernetes prefixes log lines with (logOptions.timestamps).
_TIMESTAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")


def split_timestamp(content: str) -> tuple[int | None, str]:
    """(nanoseconds since the epoch, text) of a log line with a timestamp; (None, line)
    without one."""
    stamp, separator, text = content.partition(" ")
    match = _TIMESTAMP.fullmatch(stamp)
    if not separator or not match:
        return None, content
    zone = "+00:00" if match[3] == "Z" else match[3]
    seconds = int(datetime.fromisoformat(match[1] + zone).timestamp())
    return seconds * 1_000_000_000 + int((match[2] or "").ljust(9, "0")), text


def logs(conn: Connection, name: str, follow: bool = False,
         quiet_seconds: float = QUIET_SECONDS, poll_seconds: float = 5.0) -> Iterator[str]:
    """The workflow's log lines (``pod: line``); Argo streams them as JSON lines.

    ``follow`` keeps on while the workflow runs, as ``argo logs --follow`` does: after a stream
    ends (a proxy's idle timeout, a server restart) or stays quiet for ``quiet_seconds``, the
    workflow's phase is checked; while it is not finished the stream is opened again from the
    last line seen (its timestamp; lines already printed are not printed twice), checking
    again every ``poll_seconds`` while the server has nothing to stream; once it is finished the
    lines not yet seen are read and the iteration ends.
    """
    if not follow:
        yield from (f"{pod}: {text}" for pod, text in _log_entries(conn, name, {}, QUIET_SECONDS))
        return
    last: dict[str, int] = {}  # each pod's last timestamp printed
    seen: dict[str, set[str]] = {}  # the lines printed at that timestamp, per pod
    options = {"logOptions.timestamps": "true", "logOptions.follow": "true"}
    finished = False
    while True:
        if last:  # from the earliest of the pods' last lines: no line of any pod is missed
            options["logOptions.sinceTime.seconds"] = str(min(last.values()) // 1_000_000_000)
        quiet = False
        try:
            for pod, content in _log_entries(conn, name, options, quiet_seconds):
                stamp, text = split_timestamp(content)
                if stamp is not None:
                    if stamp < last.get(pod, -1) or (
                            stamp == last.get(pod) and text in seen[pod]):
                        continue  # printed before the stream was opened again
                    if stamp != last.get(pod):
                        last[pod], seen[pod] = stamp, set()
                    seen[pod].add(text)
                yield f"{pod}: {text}"
        except _StreamInterrupted:
            quiet = True  # nothing for quiet_seconds, or the connection broke mid-stream
        if finished:
            return
        phase = (get(conn, name).get("status") or {}).get("phase")
        if phase in TERMINAL_PHASES:
            # One more pass, not followed, for what was logged after the last line read.
            finished = True
            options["logOptions.follow"] = "false"
        elif not quiet:
            time.sleep(poll_seconds)  # the server ended the stream early: do not hammer it


class _StreamInterrupted(Exception):
    """A followed log stream stayed quiet too long or broke; the caller checks the phase."""


def _log_entries(conn: Connection, name: str, options: dict[str, str],
                 quiet_seconds: float) -> Iterator[tuple[str, str]]:
    """(pod, content) of each entry of one log request."""
    import requests

    url = f"{conn.url}/api/v1/workflows/{conn.namespace}/{name}/log"
    params = {"logOptions.container": "main", "logOptions.follow": "false", **options}
    headers = {"Authorization": authorization(conn.token)} if conn.token else {}

    def request() -> Any:
        from hera.exceptions import exception_from_server_response

        response = requests.get(url, params=params, headers=headers, stream=True,
                                verify=conn.verify_tls, timeout=(CONNECT_SECONDS, quiet_seconds))
        if not response.ok:
            raise exception_from_server_response(response)
        return response

    response = _call(conn, f"logs of workflow '{name}'", request)
    with response:
        try:
            for raw in response.iter_lines():
                if raw:
                    entry = json.loads(raw).get("result", {})
                    yield entry.get("podName", ""), entry.get("content", "")
        except requests.exceptions.RequestException as error:
            # requests reports a read timeout in the middle of a body as a ConnectionError
            if params["logOptions.follow"] != "true":
                raise ArgoServerError(f"logs of workflow '{name}' broke off on {conn.url}: "
                                      f"{type(error).__name__}") from None
            raise _StreamInterrupted from None
