"""How a request reaches the code that answers it: each module of the server exports its
routes (``Route``: a method, a path as Argo's OpenAPI document writes it, and a handler), and
``app`` matches them in the order given. A handler takes a ``Request`` and returns the status
and the JSON body, or a ``Stream``: events sent as they come (server-sent events when the
client accepts them, as Argo's UI does; else newline-delimited JSON, as grpc-gateway streams),
each ``{"result": ...}``, until the iterator ends or the client goes."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .errors import invalid
from .store import NAME

if TYPE_CHECKING:
    import socket

    from .execution import Launcher
    from .store import WorkflowStore
    from .templates import TemplateStore


class ServerState(Protocol):
    """What a handler may use of the server (``app.ArgoApiServer``)."""

    store: WorkflowStore
    launcher: Launcher
    templates: TemplateStore


@dataclass
class Request:
    server: ServerState
    method: str
    path: str
    params: dict[str, str]  # the path's {placeholders}
    query: dict[str, list[str]]
    body: Any
    headers: Any  # the request's headers (an ``email.message.Message``)
    # The client's socket: a stream looks at it between polls, so that one whose client has
    # gone ends then, not at its next write (``streams``)
    connection: socket.socket | None = None

    def one(self, key: str, default: str = "") -> str:
        """A query parameter's last value (grpc-gateway keeps the last of repeated scalars)."""
        values = self.query.get(key) or [default]
        return values[-1]

    def flag(self, key: str) -> bool:
        """A boolean query parameter, as grpc-gateway parses one; 400 for anything else."""
        value = self.one(key).lower()
        if value in ("", "false", "0", "f"):
            return False
        if value in ("true", "1", "t"):
            return True
        raise invalid(f"{key}: {value!r} is not a boolean")

    @property
    def namespace(self) -> str:
        text = self.params["namespace"]
        if not NAME.fullmatch(text):
            raise invalid(f"namespace: '{text}' is not a valid Kubernetes name")
        return text

    @property
    def name(self) -> str:
        """The path's {name}: a name that is no Kubernetes name names nothing here (nor any path
        outside the home); the handler says it is not found."""
        return self.params["name"]

    def object(self) -> dict:
        if not isinstance(self.body, dict):
            raise invalid("body: required, a JSON object")
        return self.body


@dataclass
class Stream:
    """Events to send as they come: each item is one event's ``result``, or None for "nothing
    yet" (a poller's idle turn); ``heartbeat_s``: how often a quiet stream sends a comment
    (SSE) so that proxies and clients see it alive. An ``ApiError`` raised by the iterator
    ends the stream with grpc-gateway's ``{"error": ...}`` line."""

    results: Iterator[dict | None]
    heartbeat_s: float = 15.0


@dataclass
class Raw:
    """An answer that is not JSON: a file of the web page, a downloaded artifact."""

    body: bytes
    content_type: str
    headers: dict[str, str] | None = None
    status: int = 200


Handler = Callable[[Request], "tuple[int, dict] | Stream | Raw"]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    handler: Handler
    # False: served without the token (the web page's own files, which hold no data: the
    # page asks for the token, and sends it with every request of the API)
    needs_token: bool = True


def route(method: str, path: str, handler: Handler, needs_token: bool = True) -> Route:
    """``path`` as Argo's document writes it: ``/api/v1/workflows/{namespace}/{name}/retry``;
    ``{rest...}`` matches the rest of the path, slashes included."""
    regex = re.escape(path)
    regex = re.sub(r"\\\{(\w+)\\\.\\\.\\\.\\\}", r"(?P<\1>.+)", regex)
    regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", regex)
    return Route(method, re.compile(regex), handler, needs_token)
