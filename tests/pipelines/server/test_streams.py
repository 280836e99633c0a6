"""`sublimate server`'s streams through a real server process: watching workflows
(``/api/v1/workflow-events``) and reading their logs (``/log``), each streamed result checked
against the definition Argo's document gives it (``argo_api.stream_results``)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
import yaml

from sublimate.pipelines.runner.records.run_folder import pod_name
from sublimate.pipelines.server.routing import Request
from sublimate.pipelines.server.streams import field_cleaner, rfc3339_nano

from .argo_api import (
    Server,
    ended,
    response_definition,
    stream_results,
    validate,
    wait_for,
    workflow,
)

WATCH = "/api/v1/workflow-events/ns"
SSE = {"Accept": "text/event-stream"}
# Kubernetes' log line times: Go's RFC3339Nano, trailing zeros of the fraction dropped
STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{0,8}[1-9])?Z) (.*)")


def talk(name: str) -> dict:
    """Two pods at once, each printing three lines and a last one without a newline."""
    say = ("for i in 1 2 3; do echo {{inputs.parameters.who}} $i; sleep 0.2; done; "
           "printf 'no newline'")
    return {"metadata": {"name": name}, "spec": {"entrypoint": "main", "templates": [
        {"name": "main", "dag": {"tasks": [
            {"name": who, "template": "say",
             "arguments": {"parameters": [{"name": "who", "value": who}]}}
            for who in ("one", "two")]}},
        {"name": "say", "inputs": {"parameters": [{"name": "who"}]},
         "container": {"image": "alpine:3.20", "command": ["sh", "-c", say]}}]}}


def pods_of(server: Server, name: str) -> dict[str, str]:
    """Display name -> the pod name Argo gives it, from the workflow's nodes."""
    _, body = server.call("GET", f"/api/v1/workflows/ns/{name}")
    return {node["displayName"]: pod_name(name, node["name"], node["templateName"])
            for node in body["status"]["nodes"].values() if node["type"] == "Pod"}


def logs(server: Server, path: str, **params: str) -> list[dict]:
    with server.stream(path, params=params) as response:
        assert response.status_code == 200, response.text
        return stream_results(response, path)


def refusal(server: Server, path: str, **params: str) -> str:
    status, body = server.call("GET", path, params=params)
    assert (status, body["code"]) == (400, 3), body
    return body["message"]


def first_result(lines: Iterator[str]) -> dict:
    """The next event's result of a watch's lines, checked as ``stream_results`` checks it."""
    for line in lines:
        text = line.removeprefix("data:").strip()
        if text and not line.startswith(":"):
            result = json.loads(text)["result"]
            validate(response_definition("GET", WATCH, 200), result)
            return result
    raise AssertionError("the watch ended")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"Threads:\s+(\d+)", status)[1])  # type: ignore[index]


def test_a_watch_sends_every_workflow_then_each_change(start: Callable[..., Server],
                                                       tmp_path: Path) -> None:
    server = start()
    assert server.call("POST", "/api/v1/workflows/ns", json={
        "workflow": workflow("before", "echo done")})[0] == 200
    wait_for(server, "ns", "before", ended)
    manifest = tmp_path / "local.yaml"
    manifest.write_text(yaml.safe_dump({**workflow("local-run", "sleep 0.5"),
                                        "apiVersion": "argoproj.io/v1alpha1",
                                        "kind": "Workflow"} | {"metadata": {
                                            "name": "local-run", "namespace": "ns"}}))

    def meanwhile() -> None:
        server.call("POST", "/api/v1/workflows/ns", json={
            "workflow": workflow("slow", "sleep 1; echo done")})
        # a `sublimate run` run in the same home is a workflow of its namespace too
        subprocess.run([sys.executable, "-m", "sublimate.pipelines", "run", str(manifest),
                        "-q", "--home", str(server.home)], check=True, timeout=120,
                       capture_output=True)
        # deleted once the watch has said it ended (a poll between two changes sees both)
        assert slow_ended.wait(60)
        server.call("DELETE", "/api/v1/workflows/ns/slow")

    def until(event: dict) -> bool:
        name, phase = event["object"]["metadata"]["name"], event["object"]["status"].get("phase")
        if (name, phase) == ("slow", "Succeeded"):
            slow_ended.set()
        return (event["type"], name) == ("DELETED", "slow")

    slow_ended = threading.Event()
    actions = threading.Thread(target=meanwhile)
    with server.stream(WATCH, headers=SSE) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        actions.start()
        events = stream_results(response, WATCH, until=until)
    actions.join()

    def of(name: str) -> list[dict]:
        return [event for event in events if event["object"]["metadata"]["name"] == name]

    # what was there first, as ADDED, once: nothing about it changed since
    assert events[0]["type"] == "ADDED" and events[0]["object"]["metadata"]["name"] == "before"
    assert [event["type"] for event in of("before")] == ["ADDED"]
    assert of("before")[0]["object"]["status"]["phase"] == "Succeeded"
    slow = of("slow")
    assert slow[0]["type"] == "ADDED" and slow[-1]["type"] == "DELETED"
    assert {event["type"] for event in slow[1:-1]} == {"MODIFIED"}
    phases = [event["object"]["status"].get("phase") for event in slow[:-1]]
    assert phases[-1] == "Succeeded" and "Running" in phases
    # a MODIFIED says something changed: never the same workflow twice in a row
    assert all(first["object"] != second["object"]
               for first, second in itertools.pairwise(slow[:-1]))
    local = of("local-run")
    assert local[0]["type"] == "ADDED"
    assert local[-1]["object"]["status"]["phase"] == "Succeeded"
    assert local[-1]["object"]["metadata"]["namespace"] == "ns"


def test_a_watch_takes_selectors_fields_and_a_timeout(start: Callable[..., Server]) -> None:
    server = start()
    for name, team in (("alpha", "a"), ("beta", "b")):
        body = workflow(name, "true", labels={"team": team})
        assert server.call("POST", "/api/v1/workflows/ns", json={"workflow": body})[0] == 200
        wait_for(server, "ns", name, ended)

    def watched(**params: str) -> list[dict]:
        # JSON lines (no Accept: text/event-stream), ended by the server after timeoutSeconds
        began = time.monotonic()
        with server.stream(WATCH, params={"listOptions.timeoutSeconds": "1", **params}) as got:
            assert got.status_code == 200 and got.headers["Content-Type"] == "application/json"
            events = stream_results(got, WATCH)
        assert time.monotonic() - began < 10
        return events

    # what `argo watch` and the UI's workflow page send
    alpha = watched(**{"listOptions.fieldSelector": "metadata.name=alpha"})
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in alpha] == [("ADDED", "alpha")]
    others = watched(**{"listOptions.fieldSelector": "metadata.name!=alpha"})
    assert [event["object"]["metadata"]["name"] for event in others] == ["beta"]
    trimmed = watched(**{"listOptions.labelSelector": "team=b",
                         "fields": "result.object.metadata.name,result.object.status.phase"})
    assert [event["object"] for event in trimmed] == [
        {"metadata": {"name": "beta"}, "spec": {}, "status": {"phase": "Succeeded"}}]
    assert watched(**{"listOptions.labelSelector": "team=c"}) == []

    # the list takes the same field selector (`argo list --field-selector`)
    for selector, names in (("metadata.name=beta", ["beta"]),
                            ("metadata.name!=beta,metadata.namespace=ns", ["alpha"]),
                            ("spec.startedAt>2000-01-01T00:00:00Z", ["alpha", "beta"]),
                            ("spec.startedAt<2000-01-01T00:00:00Z", [])):
        _, listing = server.call("GET", "/api/v1/workflows/ns",
                                 params={"listOptions.fieldSelector": selector})
        assert sorted(item["metadata"]["name"] for item in listing["items"]) == names, selector
    assert refusal(server, "/api/v1/workflows/ns", **{
        "listOptions.fieldSelector": "status.phase=Running"}).startswith(
        "listOptions.fieldSelector")

    status, body = server.call("GET", WATCH,
                               params={"listOptions.fieldSelector": "metadata.name=missing"})
    assert (status, body["code"]) == (404, 5) and '"missing" not found' in body["message"]
    for params, named in (({"listOptions.fieldSelector": "status.phase=Running"},
                           "listOptions.fieldSelector"),
                          ({"listOptions.fieldSelector": "metadata.name"},
                           "listOptions.fieldSelector"),
                          ({"listOptions.labelSelector": "a in (b"},
                           "listOptions.labelSelector"),
                          ({"listOptions.timeoutSeconds": "soon"}, "listOptions.timeoutSeconds"),
                          ({"listOptions.timeoutSeconds": "-1"}, "listOptions.timeoutSeconds")):
        assert refusal(server, WATCH, **params).startswith(named), params
    assert refusal(server, "/api/v1/workflow-events/Bad_Namespace").startswith("namespace")


def test_field_cleaner_keeps_or_drops_as_argo() -> None:
    item = {"metadata": {"name": "w", "labels": {"a": "b"}}, "spec": {"x": 1},
            "status": {"phase": "Running", "nodes": {"n": {"phase": "Running", "id": "n"}}}}
    assert field_cleaner("")(item) is item
    kept = field_cleaner("result.object.status.nodes.n.phase", "result.object.")(item)
    assert kept == {"metadata": {}, "spec": {}, "status": {"nodes": {"n": {"phase": "Running"}}}}
    dropped = field_cleaner("-status.nodes,spec")(item)
    assert dropped == {"metadata": item["metadata"], "spec": {},
                       "status": {"phase": "Running"}}
    assert item["status"]["nodes"]  # the original is left as it was


def test_idle_watchers_cost_little_and_end_with_their_clients(
        start: Callable[..., Server]) -> None:
    server = start()
    assert server.call("POST", "/api/v1/workflows/ns", json={
        "workflow": workflow("there", "true")})[0] == 200
    wait_for(server, "ns", "there", ended)
    pid = server.process.pid
    watchers = [server.stream(WATCH, headers=SSE if index % 2 else {}) for index in range(5)]
    # each stream's lines read on from one iterator kept open: a reader that stops (as
    # stream_results does) closes its connection
    readers = [response.iter_lines(decode_unicode=True) for response in watchers]
    try:
        for lines in readers:
            assert first_result(lines)["type"] == "ADDED"
        watching = threads(pid)
        assert watching >= 1 + 5  # the main thread, and one per watcher
        before, began = cpu_seconds(pid), time.monotonic()
        time.sleep(5)
        used = cpu_seconds(pid) - before
        assert threads(pid) == watching  # still watching: their clients are still there
        # five watchers polling a home of one run: a few stat calls each, three times a second
        assert used < 0.25 * (time.monotonic() - began), f"{used:.2f} s of CPU in 5 s"
    finally:
        for response in watchers:
            response.close()
    if "connection" not in Request.__dataclass_fields__:
        pytest.skip("app does not pass the client's socket (Request.connection): a departed "
                    "client is found at the next write only")
    deadline = time.monotonic() + 5
    while threads(pid) > watching - 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert threads(pid) <= watching - 5, "the watchers' threads outlived their clients"


def test_streams_end_when_the_server_stops(start: Callable[..., Server]) -> None:
    server = start()
    assert server.call("POST", "/api/v1/workflows/ns", json={
        "workflow": workflow("forever", "echo started; sleep 300")})[0] == 200
    wait_for(server, "ns", "forever", lambda body: any(
        node["phase"] == "Running" for node in body["status"].get("nodes", {}).values()
        if node["type"] == "Pod"))
    log_path = "/api/v1/workflows/ns/forever/log"
    watch = server.stream(WATCH)
    followed = server.stream(log_path, params={"logOptions.follow": "true"})
    try:
        assert stream_results(watch, WATCH, limit=1)[0]["type"] == "ADDED"
        assert stream_results(followed, log_path, limit=1)[0]["content"] == "started"
        began = time.monotonic()
        server.stop()
        assert server.process.returncode == 0
        assert time.monotonic() - began < 20
        for response in (watch, followed):
            # the rest of each stream (the run ended Failed) has come, and then its end
            drained = time.monotonic()
            with contextlib.suppress(requests.RequestException):  # cut, rather than ended
                for _ in response.iter_lines():
                    pass
            assert time.monotonic() - drained < 5
    finally:
        watch.close()
        followed.close()


def test_logs_as_argo_sends_them(start: Callable[..., Server]) -> None:
    server = start()
    assert server.call("POST", "/api/v1/workflows/ns", json={"workflow": talk("talk")})[0] == 200
    wait_for(server, "ns", "talk", ended)
    pods = pods_of(server, "talk")
    assert pods["one"] == pod_name("talk", "talk.one", "say") != pods["two"]
    path = "/api/v1/workflows/ns/talk/log"
    said = {who: [f"{who} 1", f"{who} 2", f"{who} 3", "no newline"] for who in ("one", "two")}

    def by_pod(entries: list[dict]) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for entry in entries:
            found.setdefault(entry["podName"], []).append(entry["content"])
        return found

    plain = logs(server, path, **{"logOptions.container": "main"})
    assert by_pod(plain) == {pods[who]: lines for who, lines in said.items()}

    # times: RFC3339Nano, rising within each pod, the lines in time order across pods, and
    # the same for every request (a client resumes a stream from one)
    stamped = logs(server, path, **{"logOptions.timestamps": "true"})
    matches = [STAMP.fullmatch(entry["content"]) for entry in stamped]
    assert all(matches), stamped
    times = [match[1] for match in matches if match]
    assert [match[2] for match in matches if match] == [entry["content"] for entry in plain]
    assert times == sorted(times, key=lambda text: text.replace("Z", "").ljust(29, "0"))
    assert logs(server, path, **{"logOptions.timestamps": "true"}) == stamped
    one = [(match[1], match[2]) for match, entry in zip(matches, stamped, strict=True)
           if match and entry["podName"] == pods["one"]]
    assert len(set(stamp for stamp, _ in one)) == 4

    # one pod: by the path (PodLogs) or the query; a name that is no pod's is nothing
    for got in (logs(server, f"/api/v1/workflows/ns/talk/{pods['two']}/log"),
                logs(server, path, podName=pods["two"])):
        assert by_pod(got) == {pods["two"]: said["two"]}
    assert logs(server, path, podName="../../../etc/passwd") == []
    assert logs(server, "/api/v1/workflows/ns/talk/..%2F..%2Fstatus.json/log") == []
    assert logs(server, path, **{"logOptions.container": "sidecar"}) == []
    assert logs(server, path, **{"logOptions.previous": "true"}) == []

    assert by_pod(logs(server, path, grep=r"\b2$")) == {pods["one"]: ["one 2"],
                                                      pods["two"]: ["two 2"]}
    assert by_pod(logs(server, path, **{"logOptions.tailLines": "2"})) == {
        pods[who]: lines[-2:] for who, lines in said.items()}
    assert logs(server, path, **{"logOptions.tailLines": "0"}) == []
    # limitBytes counts each pod's lines as the kubelet sends them to Argo: with their times
    first_line = len(f"{times[0]} one 1\n")
    limited = by_pod(logs(server, path, **{"logOptions.limitBytes": str(first_line + 5)}))
    assert limited == {pods["one"]: ["one 1"], pods["two"]: ["two 1"]}

    third = next(stamp for stamp, text in one if text == "one 3")
    seconds = int(time.mktime(time.strptime(third[:19], "%Y-%m-%dT%H:%M:%S"))
                  - time.timezone)
    nanos = int((third[20:-1] if "." in third else "0").ljust(9, "0"))
    since = by_pod(logs(server, path, podName=pods["one"], **{
        "logOptions.sinceTime.seconds": str(seconds), "logOptions.sinceTime.nanos": str(nanos)}))
    assert since == {pods["one"]: ["one 3", "no newline"]}
    assert logs(server, path, **{"logOptions.sinceTime.seconds": str(2**40)}) == []
    assert len(logs(server, path, **{"logOptions.sinceSeconds": "3600"})) == 8

    assert server.call("GET", "/api/v1/workflows/ns/missing/log")[0] == 404
    for params in ({"logOptions.tailLines": "ten"}, {"logOptions.tailLines": "-1"},
                   {"logOptions.sinceSeconds": "0"}, {"logOptions.limitBytes": "1e3"},
                   {"logOptions.sinceTime.seconds": "9" * 30},
                   {"logOptions.follow": "maybe"}, {"logOptions.container": "../main"},
                   {"grep": "("}, {"logOptions.stream": "Stdout"}):
        assert refusal(server, path, **params).startswith(next(iter(params))), params
    assert "at most one" in refusal(server, path, **{"logOptions.sinceSeconds": "5",
                                                     "logOptions.sinceTime.seconds": "5"})


def test_rfc3339_nano_as_go_writes_it() -> None:
    assert rfc3339_nano(0) == "1970-01-01T00:00:00Z"
    assert rfc3339_nano(1_500_000_000) == "1970-01-01T00:00:01.5Z"
    assert rfc3339_nano(1_000_000_100) == "1970-01-01T00:00:01.0000001Z"


def test_sublimate_logs_reads_and_follows_the_server(start: Callable[..., Server]) -> None:
    server = start()
    print_slowly = "for i in 1 2 3 4 5 6; do echo line $i; sleep 0.5; done"
    assert server.call("POST", "/api/v1/workflows/ns", json={
        "workflow": workflow("chatty", print_slowly)})[0] == 200
    wait_for(server, "ns", "chatty", lambda body: any(
        node["phase"] == "Running" for node in body["status"].get("nodes", {}).values()
        if node["type"] == "Pod"))
    command = [sys.executable, "-m", "sublimate.pipelines", "logs", "chatty",
               "--argo-server", server.url, "-n", "ns"]
    follower = subprocess.Popen([*command, "--follow"], stdout=subprocess.PIPE, text=True)
    assert follower.stdout is not None
    arrivals = []
    for line in follower.stdout:
        arrivals.append((time.monotonic(), line.rstrip("\n")))
    assert follower.wait(60) == 0
    expected = [f"chatty: line {index}" for index in range(1, 7)]
    assert [line for _, line in arrivals] == expected  # each once, in order
    # followed as printed, not read at the end: the first line came well before the last
    assert arrivals[-1][0] - arrivals[0][0] > 1.0
    assert wait_for(server, "ns", "chatty", ended)["status"]["phase"] == "Succeeded"

    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == expected
