"""The HTTP side: Argo Server's REST paths (``api/openapi-spec/swagger.json`` in
argo-workflows) on the standard library's ``ThreadingHTTPServer``, one thread per request, JSON
in and out, errors in grpc-gateway's shape (``errors``). Routing, authentication and the
origin check live here; what a request does is the store's and the launcher's."""

from __future__ import annotations

import hmac
import json
import platform
import re
import sys
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .convert import to_workflow
from .errors import (
    INTERNAL,
    NOT_FOUND,
    PERMISSION_DENIED,
    UNAUTHENTICATED,
    UNIMPLEMENTED,
    ApiError,
    invalid,
    not_found,
)
from .execution import Launcher
from .selectors import parse_selector
from .store import WorkflowStore
from .templates import TemplateStore, submitted_workflow

DEFAULT_PORT = 2746  # Argo Server's
MAX_BODY = 16 * 1024 * 1024  # Argo's own limit on a request is of this order (grpc: 4 MiB+)
# A Kubernetes name: DNS-1123 subdomain (what Argo accepts for a namespace and a workflow).
_NAME = r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?"
_PREFIX = "/api/v1/workflows"
_TEMPLATES = "/api/v1/workflow-templates"


_LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


class ArgoApiServer(ThreadingHTTPServer):
    daemon_threads = True  # a client that never closes its connection does not hold a stop

    def __init__(self, address: tuple[str, int], store: WorkflowStore, token: str | None,
                 log: Callable[[str], None] | None = None) -> None:
        super().__init__(address, _Handler)
        self.store = store
        self.launcher = Launcher(store)
        self.templates = TemplateStore(store.home)
        self.token = token
        self.log = log


def make_server(home: Path, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                token: str | None = None, namespace: str = "sublimate",
                log: Callable[[str], None] | None = None) -> ArgoApiServer:
    """A server bound to ``host:port`` over ``home``, the runs a previous server left settled
    first; ``serve_forever()`` it."""
    store = WorkflowStore(home, namespace)
    server = ArgoApiServer((host, port), store, token, log)
    server.launcher.settle()
    return server


def version() -> dict:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        ours = package_version("sublimate")
    except PackageNotFoundError:
        ours = "unknown"
    # Argo's Version object; the Go fields say what stands in for them here.
    return {"version": f"sublimate-{ours}", "buildDate": "", "gitCommit": "", "gitTag": "",
            "gitTreeState": "", "goVersion": f"python{platform.python_version()}",
            "compiler": platform.python_implementation().lower(),
            "platform": f"{sys.platform}/{platform.machine()}"}


class _Handler(BaseHTTPRequestHandler):
    server: ArgoApiServer
    protocol_version = "HTTP/1.1"  # keep-alive, as requests' sessions expect

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")

    def do_DELETE(self) -> None:
        self._answer("DELETE")

    def do_PUT(self) -> None:
        self._answer("PUT")

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.log is not None:
            self.server.log(f"{self.address_string()} {format % args}")

    def _answer(self, method: str) -> None:
        try:
            body = self._read_body()
            self._check_access()
            status, payload = self._route(method, body)
        except ApiError as error:
            status, payload = error.http_status, error.body()
        except Exception as error:  # a bug: said as Argo says one, the server goes on
            import traceback

            traceback.print_exc(file=sys.stderr)
            failure = ApiError(INTERNAL, f"{type(error).__name__}: {error}")
            status, payload = failure.http_status, failure.body()
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _read_body(self) -> Any:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError as error:
            self.close_connection = True
            raise invalid("Content-Length: not a number") from error
        if length > MAX_BODY:
            self.close_connection = True  # its bytes are not read: the connection ends
            raise invalid(f"body: {length} bytes, more than the {MAX_BODY} accepted")
        raw = self.rfile.read(length) if length else b""
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError as error:
            raise invalid(f"body: not valid JSON: {error}") from error

    def _check_access(self) -> None:
        host = urlsplit(f"//{self.headers.get('Host') or ''}").hostname or ""
        if self.server.token is None and host not in _LOOPBACK_NAMES:
            # No token: only this machine's own names may be asked for, so that a page whose
            # name was made to resolve to 127.0.0.1 (DNS rebinding) cannot submit workflows.
            raise ApiError(PERMISSION_DENIED, f"requests for host {host!r} are refused: "
                                              "without --auth-token only 127.0.0.1, localhost "
                                              "or ::1 is served")
        origin = self.headers.get("Origin")
        if origin and urlsplit(origin).netloc != self.headers.get("Host"):
            # a page elsewhere driving a browser that holds the token: refused
            raise ApiError(PERMISSION_DENIED, f"requests from origin {origin} are refused")
        token = self.server.token
        if token is None:
            return
        given = self.headers.get("Authorization") or ""
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise ApiError(UNAUTHENTICATED, "token not valid: send 'Authorization: Bearer "
                                            "<token>' (the server's --auth-token)")

    def _route(self, method: str, body: Any) -> tuple[int, dict]:
        url = urlsplit(self.path)
        path = url.path.rstrip("/")
        query = parse_qs(url.query)
        if path == "/api/v1/version" and method == "GET":
            return 200, version()
        if match := re.fullmatch(rf"{_PREFIX}/([^/]+)/submit", path):
            if method == "POST":
                return 200, self._submit(_namespace(match.group(1)), _object(body))
        elif match := re.fullmatch(rf"{_TEMPLATES}/([^/]+)(/lint)?", path):
            namespace, lint = _namespace(match.group(1)), match.group(2)
            templates = self.server.templates
            if method == "POST":
                template = self._checked_template(namespace, _object(body).get("template"))
                return 200, template if lint else templates.create(template)
            if method == "GET" and not lint:
                return 200, {"apiVersion": "argoproj.io/v1alpha1",
                             "kind": "WorkflowTemplateList",
                             "metadata": {"resourceVersion": "1"},
                             "items": templates.list(namespace)}
        elif match := re.fullmatch(rf"{_TEMPLATES}/([^/]+)/([^/]+)", path):
            namespace, name = _namespace(match.group(1)), match.group(2)
            templates = self.server.templates
            if method == "GET":
                return 200, templates.get(namespace, name)
            if method == "PUT":
                template = self._checked_template(namespace, _object(body).get("template"))
                if template["metadata"]["name"] != name:
                    raise invalid(f"template.metadata.name: '{template['metadata']['name']}' "
                                  f"is not '{name}', the name in the path")
                return 200, templates.update(template)
            if method == "DELETE":
                templates.delete(namespace, name)
                return 200, {}
        elif match := re.fullmatch(rf"{_PREFIX}/([^/]+)(/lint)?", path):
            namespace, lint = _namespace(match.group(1)), match.group(2)
            if method == "POST":
                request = _object(body)
                if lint:
                    return 200, self.server.launcher.lint(namespace, request.get("workflow"))
                return 200, self._create(namespace, request)
            if method == "GET" and not lint:
                return 200, self._list(namespace, query)
        elif match := re.fullmatch(rf"{_PREFIX}/([^/]+)/([^/]+)", path):
            namespace, name = _namespace(match.group(1)), match.group(2)
            if method == "GET":
                return 200, self._get(namespace, name)
            if method == "DELETE":
                return 200, self._delete(namespace, name)
        if path.startswith("/api/"):
            raise ApiError(UNIMPLEMENTED, f"{method} {path}: not served by sublimate server "
                                          f"yet (docs/local-runner.md says what is)")
        raise ApiError(NOT_FOUND, "Not Found")

    def _create(self, namespace: str, request: dict) -> dict:
        launcher = self.server.launcher
        options = request.get("createOptions") or {}
        if not isinstance(options, dict):
            raise invalid("createOptions: must be an object")
        if request.get("serverDryRun") or "All" in (options.get("dryRun") or []):
            return launcher.lint(namespace, request.get("workflow"))
        record = launcher.start(namespace, request.get("workflow"))
        return to_workflow(record, None, live=True)

    def _checked_template(self, namespace: str, template: object) -> dict:
        """A WorkflowTemplate's shape, then the runner's checks of what it would run."""
        checked = self.server.templates.checked(namespace, template)
        workflow, _, _ = submitted_workflow(checked, {})
        self.server.launcher.lint(namespace, workflow)
        return checked

    def _submit(self, namespace: str, request: dict) -> dict:
        kind = str(request.get("resourceKind") or "")
        if kind.lower() != "workflowtemplate":
            raise ApiError(UNIMPLEMENTED, f"resourceKind: {kind or '(none)'}: only "
                                          f"WorkflowTemplate is served by sublimate server yet")
        name = request.get("resourceName")
        if not isinstance(name, str) or not name:
            raise invalid("resourceName: required, the WorkflowTemplate's name")
        template = self.server.templates.get(namespace, name)
        options = request.get("submitOptions")
        workflow, shown, parameters = submitted_workflow(template, options)
        launcher = self.server.launcher
        if isinstance(options, dict) and (options.get("serverDryRun") or options.get("dryRun")):
            checked = launcher.lint(namespace, workflow, parameters)
            return {**checked, "spec": shown}
        record = launcher.start(namespace, workflow, parameters, shown)
        return to_workflow(record, None, live=True)

    def _find(self, namespace: str, name: str) -> tuple[dict, dict | None]:
        # (a name that is no Kubernetes name names no workflow, nor any path outside the home)
        record = self.server.store.record(name) if re.fullmatch(_NAME, name) else None
        if record is None or record.get("namespace") != namespace:
            raise not_found(namespace, name)
        return record, self.server.store.status(name)

    def _get(self, namespace: str, name: str) -> dict:
        record, status = self._find(namespace, name)
        return to_workflow(record, status, self.server.launcher.is_live(name))

    def _list(self, namespace: str, query: dict[str, list[str]]) -> dict:
        selector = parse_selector(_one(query, "listOptions.labelSelector"))
        name_filter = _one(query, "nameFilter")
        store, launcher = self.server.store, self.server.launcher
        items = []
        for name in store.names():
            record = store.record(name)
            if record is None or record.get("namespace") != namespace:
                continue
            if name_filter and name_filter not in name:
                continue
            workflow = to_workflow(record, store.status(name), launcher.is_live(name))
            if selector(workflow["metadata"]["labels"]):
                items.append(workflow)
        # newest first, as Argo lists them
        items.sort(key=lambda item: item["metadata"]["creationTimestamp"], reverse=True)
        return {"apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowList",
                "metadata": {"resourceVersion": "1"}, "items": items}

    def _delete(self, namespace: str, name: str) -> dict:
        self._find(namespace, name)
        launcher = self.server.launcher
        if launcher.is_live(name):
            launcher.terminate(name, "the workflow was deleted", wait_s=30)
        self.server.store.remove(name)
        return {}


def _namespace(text: str) -> str:
    if not re.fullmatch(_NAME, text):
        raise invalid(f"namespace: '{text}' is not a valid Kubernetes name")
    return text


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise invalid("body: required, a JSON object")
    return body


def _one(query: dict[str, list[str]], key: str) -> str:
    values = query.get(key) or [""]
    return values[-1]
