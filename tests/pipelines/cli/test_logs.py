"""`sublimate logs` against a local stand-in for Argo Server: the token's prefix, and
`--follow` for as long as the workflow runs (quiet periods, streams the server ends early)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from sublimate.pipelines.argo_server import split_timestamp
from sublimate.pipelines.cli import main

WORKFLOW = "/api/v1/workflows/ml/run-1"
LOG = f"{WORKFLOW}/log"
# (timestamp, text) of the train pod's lines, in the order it printed them.
LINES = [("2026-01-02T03:04:05.100000000Z", "epoch 1/3"),
         ("2026-01-02T03:04:05.200000000Z", "epoch 2/3"),
         ("2026-01-02T03:05:00.5Z", "epoch 3/3")]


class LogServer:
    """Argo Server's workflow and log endpoints, following a script of log connections.

    Each followed connection sends every line logged so far since ``sinceTime`` (as the
    server does, whole seconds), logs the connection's new lines, then either stays open and
    quiet for ``quiet`` seconds or ends the stream early. The workflow runs until the last
    connection of the script has been served.
    """

    def __init__(self, script: list[tuple[int, float | None]]) -> None:
        self.script = script  # per connection: lines logged by then, quiet seconds (None: end)
        self.requests: list[dict] = []
        self.logged = 0
        self.phase = "Running"
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # a log stream is chunked, as Argo Server's

            def do_GET(self) -> None:
                url = urlparse(self.path)
                query = {key: values[0] for key, values in parse_qs(url.query).items()}
                server.requests.append({"path": url.path, "query": query,
                                        "authorization": self.headers.get_all("Authorization")})
                if url.path == WORKFLOW:
                    self._send_json({"metadata": {"name": "run-1", "namespace": "ml"},
                                     "spec": {}, "status": {"phase": server.phase}})
                elif url.path == LOG:
                    self._stream_log(query)
                else:
                    self._send_json({"message": "not found"}, 404)

            def _send_json(self, body: dict, status: int = 200) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream_log(self, query: dict[str, str]) -> None:
                followed = query.get("logOptions.follow") == "true"
                step = None
                if followed and server.script:
                    step = server.script.pop(0)
                    server.logged = max(server.logged, step[0])
                    if not server.script:
                        server.phase = "Succeeded"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                since = int(query.get("logOptions.sinceTime.seconds", "0"))
                try:
                    for stamp, text in LINES[:server.logged]:
                        if split_timestamp(f"{stamp} x")[0] // 1_000_000_000 < since:
                            continue
                        content = f"{stamp} {text}" \
                            if query.get("logOptions.timestamps") == "true" else text
                        entry = {"result": {"podName": "run-1-train", "content": content}}
                        self._chunk(json.dumps(entry).encode() + b"\n")
                    if step is not None and step[1] is not None:
                        time.sleep(step[1])  # open and quiet, as a step that prints nothing
                    self._chunk(b"")  # the end of the stream
                except OSError:
                    pass  # the follower gave up on this stream and closed it

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def flags(self, token: str = "s3cret-token") -> list[str]:
        return ["--argo-server", self.url, "--token", token, "-n", "ml"]


@pytest.fixture
def serve() -> Iterator[list[LogServer]]:
    started: list[LogServer] = []
    yield started
    for server in started:
        server.httpd.shutdown()
        server.httpd.server_close()
        server.thread.join(timeout=5)


def _start(serve: list[LogServer], script: list[tuple[int, float | None]]) -> LogServer:
    server = LogServer(script)
    server.thread.start()
    serve.append(server)
    return server


@pytest.mark.parametrize("token", ["s3cret-token", "Bearer s3cret-token"])
def test_the_token_is_sent_with_one_bearer(serve: list[LogServer], token: str,
                                           capsys: pytest.CaptureFixture) -> None:
    server = _start(serve, [])
    server.logged = 2
    assert main(["logs", "run-1", *server.flags(token)]) == 0
    assert main(["get", "run-1", *server.flags(token)]) == 0  # through Hera, for comparison
    assert [request["authorization"] for request in server.requests] == \
        [["Bearer s3cret-token"]] * 2
    assert capsys.readouterr().out.startswith("run-1-train: epoch 1/3\nrun-1-train: epoch 2/3\n")


def test_follow_outlasts_quiet_periods_and_early_ends_until_the_workflow_finishes(
        serve: list[LogServer], capsys: pytest.CaptureFixture) -> None:
    quiet, limit = 1.0, 0.3
    server = _start(serve, [
        (1, quiet),  # epoch 1, then quiet for longer than the follower's limit
        (2, None),   # epoch 2, then the stream ends early (a proxy's idle timeout)
        (3, None),   # epoch 3; the workflow has succeeded once this one is served
    ])
    started = time.monotonic()
    assert main(["logs", "run-1", "--follow", "--quiet-seconds", str(limit),
                 "--poll-seconds", "0.05", *server.flags("Bearer s3cret-token")]) == 0
    elapsed = time.monotonic() - started
    # every line once, though each new stream began with lines already printed
    assert capsys.readouterr().out.splitlines() == [f"run-1-train: {text}" for _, text in LINES]
    assert elapsed >= limit  # it went on past a quiet period longer than its limit
    logs = [request for request in server.requests if request["path"] == LOG]
    # 3 followed streams, then one unfollowed read for what came after the last line seen
    assert [request["query"]["logOptions.follow"] for request in logs] == \
        ["true", "true", "true", "false"]
    assert "logOptions.sinceTime.seconds" not in logs[0]["query"]
    assert logs[1]["query"]["logOptions.sinceTime.seconds"] == \
        str(split_timestamp(f"{LINES[0][0]} x")[0] // 1_000_000_000)
    assert all(request["authorization"] == ["Bearer s3cret-token"]
               for request in server.requests)
    phases = [request for request in server.requests if request["path"] == WORKFLOW]
    assert len(phases) == 3  # checked after each stream; the last saw Succeeded


def test_timestamps_are_split_from_the_text() -> None:
    assert split_timestamp("2026-01-02T03:04:05.5Z epoch 1") == (1767323045_500_000_000,
                                                                  "epoch 1")
    assert split_timestamp("2026-01-02T04:04:05+01:00 x y") == (1767323045_000_000_000, "x y")
    assert split_timestamp("epoch 1 of 3") == (None, "epoch 1 of 3")
