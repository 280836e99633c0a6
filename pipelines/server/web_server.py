"""The web page (``web/``): plain files served as they are, no build step and nothing from
elsewhere (no CDN: the page works on a machine without internet). The page's paths are Argo's
UI's (``/workflows/NAMESPACE/NAME``): each is answered with ``index.html``, whose script reads
the path and speaks only the API. The files hold no data, so they are served without the
token (the page asks for it and sends it with every request of the API); a Content Security
Policy lets the page load and connect to nothing but this server."""

from __future__ import annotations

import html
from functools import cache
from pathlib import Path

from .errors import not_found
from .routing import Raw, Request, route

WEB = Path(__file__).with_name("web")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; "
                               "style-src 'self'; script-src 'self'; connect-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # a new version of sublimate serves its new page at once
}


@cache
def _file(name: str) -> bytes:
    return (WEB / name).read_bytes()


def page(request: Request) -> Raw:
    """``index.html``, with the server's default namespace for the page to start in."""
    text = _file("index.html").decode().replace(
        "{{default-namespace}}", html.escape(request.server.store.default_namespace))
    return Raw(text.encode(), _TYPES[".html"], _HEADERS)


def static(request: Request) -> Raw:
    """A file of ``web/``, by its name only (never a path elsewhere)."""
    name = request.params["path"]
    suffix = Path(name).suffix
    if "/" in name or name.startswith(".") or suffix not in _TYPES \
            or not (WEB / name).is_file():
        raise not_found("static", name, "files")
    return Raw(_file(name), _TYPES[suffix], _HEADERS)


WEB_ROUTES = [
    route("GET", "/", page, needs_token=False),
    route("GET", "/static/{path...}", static, needs_token=False),
    # the page's own paths, as Argo's UI names them
    *(route("GET", path, page, needs_token=False) for path in (
        "/workflows", "/workflows/{namespace}", "/workflows/{namespace}/{name}",
        "/workflow-templates", "/workflow-templates/{namespace}",
        "/workflow-templates/{namespace}/{name}", "/compare")),
]
