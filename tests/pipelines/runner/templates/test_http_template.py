"""HTTP templates against a real server on 127.0.0.1: headers (one from a Secret), a body, a
timeout, and a successCondition that passes and one that fails."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from sublimate.pipelines.runner import NodePhase
from sublimate.pipelines.runner.harness import run


class _Registry(BaseHTTPRequestHandler):
    """A model registry's webhook: POST /models answers 201 with JSON; /slow takes its time."""

    seen: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        type(self).seen.append({"path": self.path, "body": body, "method": self.command,
                                "authorization": self.headers.get("Authorization"),
                                "trace": self.headers.get("X-Trace")})
        if self.path == "/slow":
            time.sleep(2)
        reply = json.dumps({"version": 7, "accepted": self.path == "/models"}).encode()
        self.send_response(201 if self.path == "/models" else 503)
        self.send_header("content-type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def registry() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    server.daemon_threads = True
    _Registry.seen = []
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


NOTIFY = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: register-}
spec:
  entrypoint: main
  arguments:
    parameters: [{name: registry}]
  templates:
  - name: main
    dag:
      tasks:
      - name: register
        template: post
        arguments:
          parameters:
          - {name: path, value: /models}
          - name: condition
            value: >-
              response.statusCode == 201 &&
              response.headers["Content-Type"][0] == "application/json" &&
              fromJSON(response.body).accepted == true &&
              request.headers["X-Trace"][0] == "abc"
      - name: wrong-version
        template: post
        arguments:
          parameters:
          - {name: path, value: /models}
          - {name: condition, value: 'fromJSON(response.body).version == 8'}
      - name: unavailable
        template: plain
        arguments:
          parameters: [{name: path, value: /maintenance}]
      - name: slow
        template: post
        arguments:
          parameters:
          - {name: path, value: /slow}
          - {name: condition, value: "true"}
  - name: post
    inputs:
      parameters: [{name: path}, {name: condition}]
    http:
      method: POST
      url: "{{workflow.parameters.registry}}{{inputs.parameters.path}}"
      headers:
      - {name: X-Trace, value: abc}
      - name: Authorization
        valueFrom: {secretKeyRef: {name: registry-token, key: token}}
      body: '{"model": "mlp", "metrics": {"accuracy": 0.97}}'
      timeoutSeconds: 1
      successCondition: "{{inputs.parameters.condition}}"
  - name: plain
    inputs:
      parameters: [{name: path}]
    http:
      method: POST
      url: "{{workflow.parameters.registry}}{{inputs.parameters.path}}"
"""
TOKEN = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "registry-token"},
         "stringData": {"token": "Bearer 5up3r-s3cret"}}


def test_http_templates_against_a_local_server(registry: str, tmp_path: Path) -> None:
    done = run(NOTIFY, {"registry": registry}, home=tmp_path, echo=False, timeout=60,
               objects=[TOKEN])
    register = done.node("register")
    assert (register.type, register.phase) == ("HTTP", NodePhase.SUCCEEDED), register.message
    assert json.loads(register.result or "") == {"version": 7, "accepted": True}
    wrong = done.node("wrong-version")
    assert (wrong.phase, wrong.message) == (
        NodePhase.FAILED, "successCondition 'fromJSON(response.body).version == 8' evaluated "
        "false")
    unavailable = done.node("unavailable")
    assert (unavailable.phase, unavailable.message) == (
        NodePhase.FAILED, "received non-2xx response code: 503")
    slow = done.node("slow")
    assert slow.phase == NodePhase.FAILED
    assert slow.message == f'Post "{registry}/slow": timed out after 1s (timeoutSeconds)'
    assert done.phase == NodePhase.FAILED
    # what the server received: the method, body and headers, the secret's real value
    posted = [r for r in _Registry.seen if r["path"] == "/models"]
    assert posted and all(r["authorization"] == "Bearer 5up3r-s3cret" and r["trace"] == "abc"
                          and json.loads(r["body"])["model"] == "mlp" for r in posted)
    assert "5up3r-s3cret" not in (done.run_folder / "status.json").read_text()


def test_a_refused_connection_is_the_nodes_failure(tmp_path: Path) -> None:
    done = run(NOTIFY, {"registry": "http://127.0.0.1:9"}, home=tmp_path, echo=False,
               timeout=60, objects=[TOKEN])
    node = done.node("unavailable")
    assert (node.phase, node.message) == (
        NodePhase.FAILED, 'Post "http://127.0.0.1:9/maintenance": connection refused')
