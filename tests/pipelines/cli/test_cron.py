"""`sublimate cron trigger NAME`: a CronWorkflow run now on Argo Server, as
`argo submit --from cronwf/NAME` does, against a local stand-in for the server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sublimate.pipelines.cli import main


class SubmitServer:
    """Argo Server's submit endpoint: records each request, answers with ``answer``."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.answer: tuple[int, dict] = (404, {"code": 5, "message": "not found"})
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                server.requests.append({"path": self.path, "headers": dict(self.headers),
                                        "body": json.loads(self.rfile.read(length) or b"null")})
                status, body = server.answer
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def flags(self) -> list[str]:
        return ["--argo-server", self.url, "--token", "t0ken", "-n", "ml"]


@pytest.fixture
def argo() -> Iterator[SubmitServer]:
    server = SubmitServer()
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


def test_trigger_submits_from_the_cron_workflow(argo: SubmitServer,
                                                capsys: pytest.CaptureFixture) -> None:
    argo.answer = (200, {"metadata": {"name": "sublimate-train-nightly-q7x2k", "namespace": "ml",
                                      "labels": {"workflows.argoproj.io/cron-workflow":
                                                 "sublimate-train-nightly"}},
                         "spec": {"workflowTemplateRef": {"name": "sublimate-train"}}})
    assert main(["cron", "trigger", "sublimate-train-nightly", *argo.flags()]) == 0
    (request,) = argo.requests
    assert request["path"] == "/api/v1/workflows/ml/submit"
    assert request["headers"]["Authorization"] == "Bearer t0ken"
    assert request["body"] == {"namespace": "ml", "resourceKind": "cronworkflow",
                               "resourceName": "sublimate-train-nightly"}
    assert capsys.readouterr().out == (
        f"submitted sublimate-train-nightly-q7x2k in namespace ml: "
        f"{argo.url}/workflows/ml/sublimate-train-nightly-q7x2k\n")


def test_an_unknown_cron_workflow_is_one_clear_error(argo: SubmitServer,
                                                     capsys: pytest.CaptureFixture) -> None:
    argo.answer = (404, {"code": 5, "message": 'cronworkflows.argoproj.io "nope" not found'})
    assert main(["cron", "trigger", "nope", *argo.flags()]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (f"error: CronWorkflow 'nope': not found in namespace 'ml' on {argo.url}; "
                   "install it with `sublimate install`\n")
    assert "t0ken" not in err
