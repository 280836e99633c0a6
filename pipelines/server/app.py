"""The HTTP side: Argo Server's REST paths (``api/openapi-spec/swagger.json`` in
argo-workflows) on the standard library's ``ThreadingHTTPServer``, one thread per request, JSON
in and out (or a stream of events), errors in grpc-gateway's shape (``errors``).
Authentication, the origin check and matching a request to its route (``routing``) live here;
what a request does is in the module whose routes it matched, one per kind of object, as in
Argo's ``server/`` (``workflow_server``, ``template_server``, ``cron_server``, ``streams``)."""

from __future__ import annotations

import contextlib
import hmac
import json
import platform
import sys
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .errors import (
    INTERNAL,
    NOT_FOUND,
    PERMISSION_DENIED,
    UNAUTHENTICATED,
    UNIMPLEMENTED,
    ApiError,
    invalid,
)
from .execution import Launcher
from .routing import Raw, Request, Route, Stream, route
from .store import WorkflowStore
from .templates import TemplateStore

DEFAULT_PORT = 2746  # Argo Server's
MAX_BODY = 16 * 1024 * 1024  # Argo's own limit on a request is of this order (grpc: 4 MiB+)


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
        self.routes = _routes()


def make_server(home: Path, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                token: str | None = None, namespace: str = "sublimate",
                log: Callable[[str], None] | None = None,
                allow_privileged: bool = False) -> ArgoApiServer:
    """A server bound to ``host:port`` over ``home``, the runs a previous server left settled
    first; ``serve_forever()`` it. ``allow_privileged``: run workflows whose pods ask for more
    than a container's privileges (``policy``)."""
    store = WorkflowStore(home, namespace)
    server = ArgoApiServer((host, port), store, token, log)
    server.launcher.allow_privileged = allow_privileged
    server.launcher.settle()
    from .cron_server import scheduler

    scheduler(server)  # CronWorkflows fire from the start; a missed schedule is caught up now
    return server


def version(_request: Request | None = None) -> tuple[int, dict]:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        ours = package_version("sublimate")
    except PackageNotFoundError:
        ours = "unknown"
    # Argo's Version object; the Go fields say what stands in for them here.
    return 200, {"version": f"sublimate-{ours}", "buildDate": "", "gitCommit": "",
                 "gitTag": "", "gitTreeState": "",
                 "goVersion": f"python{platform.python_version()}",
                 "compiler": platform.python_implementation().lower(),
                 "platform": f"{sys.platform}/{platform.machine()}"}


def _routes() -> list[Route]:
    from .artifacts_server import ARTIFACT_ROUTES
    from .cron_server import CRON_ROUTES
    from .streams import STREAM_ROUTES
    from .template_server import TEMPLATE_ROUTES
    from .training_server import TRAINING_ROUTES
    from .web_server import WEB_ROUTES
    from .workflow_server import WORKFLOW_ROUTES

    return [route("GET", "/api/v1/version", version), *WORKFLOW_ROUTES, *TEMPLATE_ROUTES,
            *CRON_ROUTES, *STREAM_ROUTES, *TRAINING_ROUTES, *ARTIFACT_ROUTES, *WEB_ROUTES]


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
            answer = self._route(method, body)
            if isinstance(answer, Stream):
                self._stream(answer)
                return
            if isinstance(answer, Raw):
                self._raw(answer)
                return
            status, payload = answer
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

    def _check_access(self, needs_token: bool = True) -> None:
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
        if token is None or not needs_token:
            return
        given = self.headers.get("Authorization") or ""
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise ApiError(UNAUTHENTICATED, "token not valid: send 'Authorization: Bearer "
                                            "<token>' (the server's --auth-token)")

    def _route(self, method: str, body: Any) -> tuple[int, dict] | Stream | Raw:
        url = urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        for candidate in self.server.routes:
            match = candidate.pattern.fullmatch(path)
            if match and candidate.method == method:
                self._check_access(candidate.needs_token)
                request = Request(self.server, method, path, match.groupdict(),
                                  parse_qs(url.query), body, self.headers, self.connection)
                return candidate.handler(request)
        self._check_access()
        if path.startswith("/api/"):
            raise ApiError(UNIMPLEMENTED, f"{method} {path}: not served by sublimate server "
                                          f"(docs/server.md says what is)")
        raise ApiError(NOT_FOUND, "Not Found")

    def _raw(self, answer: Raw) -> None:
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        for key, value in (answer.headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(answer.body)

    def _stream(self, stream: Stream) -> None:
        """Send each result as it comes, then end the response by closing the connection (no
        length is known); a client that went away ends the stream."""
        events = "text/event-stream" in (self.headers.get("Accept") or "")
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if events else "application/json")
        self.send_header("Cache-Control", "no-cache")
        # Chunked, as Go's net/http sends Argo Server's streams: a client reading a body with
        # neither a length nor chunks (urllib3, under requests' iter_lines) waits to fill its
        # buffer (512 bytes) before it hands a line over, so events came late, the last never.
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            for line in _framed(stream.results, events, stream.heartbeat_s):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")  # the last chunk: the stream ended, whole
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away: nothing to send it
        except ApiError as error:  # found mid-stream: said as grpc-gateway says it, then done
            with_error = json.dumps({"error": error.body()}) + "\n"
            data = (f"data: {with_error}\n" if events else with_error).encode()
            with contextlib.suppress(OSError):
                self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
        finally:
            close = getattr(stream.results, "close", None)
            if close is not None:
                close()  # the generator's own clean-up (a watch's poller) runs now


def _framed(results: Iterator[dict | None], events: bool, heartbeat_s: float
            ) -> Iterator[bytes]:
    """Each result as one line of JSON (``{"result": ...}``), or as a server-sent event; a
    ``None`` from the results means "nothing yet": past ``heartbeat_s`` of them a comment goes
    out (SSE), so a client and any proxy between see the stream alive."""
    quiet_since = time.monotonic()
    for result in results:
        if result is None:
            if events and time.monotonic() - quiet_since >= heartbeat_s:
                quiet_since = time.monotonic()
                yield b": heartbeat\n\n"
            continue
        quiet_since = time.monotonic()
        line = json.dumps({"result": result})
        yield (f"data: {line}\n\n" if events else f"{line}\n").encode()
