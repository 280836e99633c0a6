"""`sublimate server` as a client sees it, shared by the server's tests: a real server process
on a free loopback port over a temporary SUBLIMATE_HOME, and every request and response checked
against Argo's own OpenAPI document (the subset in data/argo_swagger_subset.json, regenerated
by data/make_subset.py: the paths served and the definitions they use). The definitions a body
is checked against are the ones Argo's document gives its path and method, found by matching
the path against the document's path templates."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from jsonschema import Draft4Validator

DATA = Path(__file__).parent / "data"
SWAGGER = json.loads((DATA / "argo_swagger_subset.json").read_text())
# Argo's document types IntOrString as a string only, while Kubernetes' JSON (and Hera, and
# Argo's own server) takes an integer too (``retryStrategy.backoff.factor: 2``): widened here,
# the copy itself kept as Argo publishes it.
SWAGGER["definitions"]["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {
    "type": ["string", "integer"]}
V1 = "io.argoproj.workflow.v1alpha1."


def validate(definition: str, payload: Any) -> None:
    schema = {"$ref": f"#/definitions/{definition}", "definitions": SWAGGER["definitions"]}
    Draft4Validator(schema).validate(payload)


@cache
def _templates() -> list[tuple[re.Pattern[str], str]]:
    # literal segments first: /workflows/{ns}/lint is not /workflows/{ns}/{name}
    found = [(re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$"), path)
             for path in SWAGGER["paths"]]
    return sorted(found, key=lambda item: item[1].count("{"))


def operation(method: str, path: str) -> dict:
    """Argo's document's operation for ``method path`` (a concrete path)."""
    for pattern, template in _templates():
        if pattern.match(path.rstrip("/")):
            operations = SWAGGER["paths"][template]
            if method.lower() in operations:
                return operations[method.lower()]
    raise AssertionError(f"{method} {path}: no such operation in Argo's document")


def _definition(schema: dict) -> str:
    return schema["$ref"].rsplit("/", 1)[-1]


def response_definition(method: str, path: str, status: int) -> str:
    """The definition Argo's document gives the response to ``method path``."""
    if status != 200:  # every operation's "default": grpc-gateway's error (also for paths not
        return "grpc.gateway.runtime.Error"  # served, which the document has no entry for)
    responses = operation(method, path)["responses"]
    schema = responses["200"]["schema"]
    if schema.get("title", "").startswith("Stream result of"):
        # a stream: each line's "result" is the definition; the whole is not one document
        return _definition(schema["properties"]["result"])
    return _definition(schema)


def check_request(method: str, path: str, body: bytes | str | None) -> None:
    """A client's request body against the definition Argo's document gives it."""
    if method not in ("POST", "PUT") or not body:
        return
    for parameter in operation(method, path)["parameters"]:
        if parameter["in"] == "body":
            validate(_definition(parameter["schema"]), json.loads(body))


def is_stream(response: requests.Response) -> bool:
    return response.headers.get("Content-Type", "").startswith(("text/event-stream",
                                                               "application/x-ndjson"))


def check_response(response: requests.Response) -> Any:
    if is_stream(response):
        return None  # read, and checked line by line, by stream_results
    payload = response.json()
    url = urlsplit(response.request.url or "")
    validate(response_definition(response.request.method or "", url.path, response.status_code),
             payload)
    return payload


def stream_results(response: requests.Response, path: str, limit: int | None = None,
                   until: Callable[[dict], bool] | None = None) -> list[dict]:
    """The ``result`` of each event of a streamed response (server-sent events, as Argo's UI
    reads them, or newline-delimited JSON, as grpc-gateway sends them), each checked against
    the definition Argo's document gives a result; stops after ``limit`` results, or at the
    first for which ``until`` holds."""
    definition = response_definition("GET", path, 200)
    results: list[dict] = []
    for raw in response.iter_lines(decode_unicode=True):
        line = raw.removeprefix("data:").strip() if raw.startswith("data:") else raw.strip()
        if not line or raw.startswith((":", "event:", "id:", "retry:")):
            continue
        event = json.loads(line)
        assert "error" not in event, event
        validate(definition, event["result"])
        results.append(event["result"])
        if (limit is not None and len(results) >= limit) or (until and until(event["result"])):
            break
    return results


class Server:
    """A `sublimate server` process; ``stop`` (SIGTERM) or ``kill`` (SIGKILL) it."""

    def __init__(self, home: Path, *flags: str) -> None:
        self.home = home
        self.log = (home.parent / f"server-{time.monotonic_ns()}.log").open("w")
        # SIGTERM when the thread that started it ends (PR_SET_PDEATHSIG): a killed test or
        # benchmark leaves no server behind, and the server ends its runs as it stops (under
        # pytest the session's reaper, tests/conftest.py, ends it too)
        self.process = subprocess.Popen(
            ["setpriv", "--pdeathsig", "TERM", "--", sys.executable, "-m", "sublimate.pipelines",
             "server", "--port", "0", "--home", str(home), *flags],
            stdout=subprocess.PIPE, stderr=self.log, text=True,
            env={**os.environ, "SUBLIMATE_HOME": str(home)})
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 60)
        line = self.process.stdout.readline() if ready else ""
        if "http://" not in line:
            self.kill()
            raise AssertionError(f"no server: {line!r} {(home.parent / self.log.name)}")
        self.url = line.split("on ", 1)[1].split()[0]

    def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        """The response's status and body, the body checked (requests are not: tests send
        wrong ones on purpose; a client's are checked by ``on_the_wire``)."""
        response = requests.request(method, self.url + path, timeout=60, **kwargs)
        return response.status_code, check_response(response)

    def stream(self, path: str, **kwargs: Any) -> requests.Response:
        """A streamed GET (close it, or use it in ``with``)."""
        kwargs.setdefault("timeout", 60)
        return requests.get(self.url + path, stream=True, **kwargs)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.log.close()


def workflow(name: str, command: str, **metadata: Any) -> dict:
    return {"metadata": {"name": name, **metadata}, "spec": {
        "entrypoint": "main",
        "templates": [{"name": "main", "container": {"image": "alpine:3.20",
                                                      "command": ["sh", "-c", command]}}]}}


def wait_for(server: Server, namespace: str, name: str,
             done: Callable[[dict], bool], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status, body = server.call("GET", f"/api/v1/workflows/{namespace}/{name}")
        assert status == 200, body
        if done(body):
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.1)


def ended(body: dict) -> bool:
    return body["status"].get("phase") in ("Succeeded", "Failed", "Error")


def on_the_wire(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, int]]:
    """Every request a client in this process sends (Hera's, `sublimate`'s), its body and its
    response checked against Argo's document; the list of (method, path, status) seen."""
    seen: list[tuple[str, str, int]] = []
    send = requests.Session.send

    def checked_send(session: requests.Session, request: Any, **kwargs: Any) -> Any:
        path = urlsplit(request.url).path
        check_request(request.method, path, request.body)
        response = send(session, request, **kwargs)
        check_response(response)
        seen.append((request.method, path, response.status_code))
        return response

    monkeypatch.setattr(requests.Session, "send", checked_send)
    return seen
