"""HTTP templates: one request from the runner, judged by a ``successCondition``.

Argo sends it from its agent pod (workflow/executor/agent.go ``executeHTTPTemplate``); the
node is an ``HTTP`` node. Locally the runner sends it from this machine, to any address it can
reach:

- ``method`` (empty: GET), ``url``, ``headers`` (a ``Host`` header sets the request's host; a
  ``valueFrom.secretKeyRef`` value comes from a Secret manifest, ``k8s_objects``, and is
  masked), ``body`` or ``bodyFrom.bytes`` (base64 in the manifest), ``insecureSkipVerify``;
  ``timeoutSeconds`` bounds the connection and each read (Go's bounds the whole exchange);
  redirects are followed, and a proxy from the environment is used except for this machine,
  as Go's default client does.
- The whole body is ``outputs.result``.
- Without ``successCondition`` a status from 200 to 299 succeeds, anything else fails:
  ``received non-2xx response code: N``. With one, it is an expr-lang expression over
  ``request`` (``method``, ``url``, ``body``, ``bodyBytes``, ``headers``: names as written,
  each a one-element list, secret-valued ones left out) and ``response`` (``statusCode``, an
  integer; ``body``; ``headers``: canonical names, ``response.headers["Content-Type"][0]``)
  and nothing else, no Argo function (``argoexpr.EvalBool``); false fails the node with
  ``successCondition '<cond>' evaluated false``, a result that is not a boolean is an error.
- A transport error (refused, timed out) fails the node with its text; retries apply.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, NamedTuple

from sublimate.pipelines.argo_terms import NodePhase

from ..expressions.substitution import Vars, as_text, substitute
from ..pods.scope import CancelScope
from ..records.run_types import NodeResult

if TYPE_CHECKING:
    from .context import RunContext


class Exchange(NamedTuple):
    status: int
    body: bytes
    headers: dict[str, list[str]]  # canonical names


class HttpError(Exception):
    """The request could not be made or judged: the node fails with this text."""


def run_http(run: RunContext, template: dict, local: Vars, node: NodeResult,
             scope: CancelScope) -> NodeResult:
    """``NodeError`` (an unresolvable variable) propagates: the node errs."""
    record = run.record
    where = f"templates.{template['name']}.http"
    http: dict = substitute(template["http"], local, where)  # type: ignore[assignment]
    record.transition(node, NodePhase.RUNNING)
    headers: list[tuple[str, str]] = []
    plain: dict[str, list[str]] = {}  # request.headers, as the condition sees them
    for item in http.get("headers") or []:
        name = str(item.get("name") or "")
        ref = (item.get("valueFrom") or {}).get("secretKeyRef")
        if ref is None:
            value = as_text(item.get("value", ""))
            plain[name] = [value]
        else:
            from ..pods.k8s_objects import masked_forms, secret_key

            value = secret_key(run.layout.objects, ref, f"{where}.headers.{name}")
            record.remember_secrets(frozenset(masked_forms(value)))
        headers.append((name, value))
    outcome: list[Exchange | HttpError] = []
    done = _Done()
    thread = threading.Thread(target=lambda: (outcome.append(_send(http, headers)), done.set()),
                              name=f"http {node.display_name}", daemon=True)
    if not scope.add(done):
        return record.finish(node, NodePhase.FAILED, scope.stop_reason() or "stopped")
    try:
        thread.start()
        done.wait()  # the answer, or a stop of the scope (a deadline, Ctrl-C)
    finally:
        scope.discard(done)
    if not outcome:
        return record.finish(node, NodePhase.FAILED, scope.stop_reason() or "stopped")
    exchange = outcome[0]
    if isinstance(exchange, HttpError):
        return record.finish(node, NodePhase.FAILED, str(exchange))
    node.result = exchange.body.decode("utf-8", "replace")
    try:
        message = _judge(http, plain, exchange)
    except HttpError as exc:
        return record.finish(node, NodePhase.FAILED, str(exc))
    return record.finish(node, NodePhase.FAILED if message else NodePhase.SUCCEEDED, message)


class _Done(threading.Event):
    """The request's end, or a stop of its scope (``scope.Stoppable``)."""

    def stop(self) -> None:
        self.set()


def _send(http: dict, headers: list[tuple[str, str]]) -> Exchange | HttpError:
    import base64
    import urllib.error
    import urllib.request
    from urllib.parse import urlsplit

    from ..manifest.repository import LOCAL_HOSTS

    method = str(http.get("method") or "GET")
    url = str(http.get("url") or "")
    verb = method[:1].upper() + method[1:].lower()  # Go's url.Error: `Get "url": ...`
    body_from = http.get("bodyFrom") or {}
    try:
        body = base64.b64decode(str(body_from["bytes"])) if "bytes" in body_from \
            else str(http.get("body") or "").encode()
        request = urllib.request.Request(url, data=body or None, method=method)
    except ValueError as exc:
        return HttpError(f"{verb} {url!r}: {exc}")
    for name, value in headers:
        request.add_header(name, value)  # a Host header is the request's host, as in Go
    handlers: list[Any] = []
    if (urlsplit(url).hostname or "") in LOCAL_HOSTS:
        handlers.append(urllib.request.ProxyHandler({}))  # Go never proxies loopback
    if http.get("insecureSkipVerify") in (True, "true"):
        import ssl

        handlers.append(urllib.request.HTTPSHandler(context=ssl._create_unverified_context()))
    timeout = float(http["timeoutSeconds"]) if http.get("timeoutSeconds") is not None \
        else None
    try:
        with urllib.request.build_opener(*handlers).open(request, timeout=timeout) as response:
            return Exchange(response.status, response.read(), _canonical(response.headers))
    except urllib.error.HTTPError as exc:  # a status of 400 or more is an answer all the same
        with exc:
            return Exchange(exc.code, exc.read(), _canonical(exc.headers))
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        if isinstance(reason, OSError) and reason.strerror:
            reason = reason.strerror.lower()  # "connection refused", as Go words it
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            reason = f"timed out after {timeout:g}s (timeoutSeconds)"
        return HttpError(f'{verb} "{url}": {reason}')


def _canonical(headers: Any) -> dict[str, list[str]]:
    """Go's ``http.Header``: ``textproto.CanonicalMIMEHeaderKey`` names, each to its values."""
    found: dict[str, list[str]] = {}
    for name, value in headers.items():
        key = "-".join(part[:1].upper() + part[1:].lower() for part in name.split("-"))
        found.setdefault(key, []).append(value)
    return found


def _judge(http: dict, plain: dict[str, list[str]], exchange: Exchange) -> str:
    """Why the exchange failed, or ``""``; ``HttpError`` when the condition cannot be judged."""
    condition = str(http.get("successCondition") or "")
    if not condition:
        if 200 <= exchange.status < 300:
            return ""
        return f"received non-2xx response code: {exchange.status}"
    import base64

    from ..expressions.conditions import ExpressionError
    from ..expressions.expr_lang import evaluate, go_format

    body_from = http.get("bodyFrom") or {}
    env = {
        "request": {"method": str(http.get("method") or ""), "url": str(http.get("url") or ""),
                    "body": str(http.get("body") or ""),
                    "bodyBytes": list(base64.b64decode(str(body_from["bytes"])))
                    if "bytes" in body_from else None,
                    "headers": plain},
        "response": {"statusCode": exchange.status,
                     "body": exchange.body.decode("utf-8", "replace"),
                     "headers": exchange.headers},
    }
    try:
        result = evaluate(condition, {}, env=env)
    except ExpressionError as exc:
        raise HttpError(f"unable to evaluate expression '{condition}': {exc}") from None
    if not isinstance(result, bool):
        raise HttpError(f"unable to cast expression result '{go_format(result)}' to bool")
    return "" if result else f"successCondition '{condition}' evaluated false"
