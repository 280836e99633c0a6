"""Acting on a workflow through `sublimate server` (retry, resubmit, stop, terminate, suspend,
resume), as the argo CLI and Argo's UI send them (PUT /api/v1/workflows/{ns}/{name}/...), each
request and response checked against Argo's own OpenAPI document (``argo_api``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from .argo_api import Server, check_request, ended, on_the_wire, wait_for

STEP = {"name": "step", "inputs": {"parameters": [{"name": "who"}]}, "script": {
    "image": "alpine:3.20", "command": ["sh"],
    "source": 'date +%s%N > /tmp/v; test "{{inputs.parameters.who}}" != '
              '"{{workflow.parameters.bad}}"'},
    "outputs": {"parameters": [{"name": "v", "valueFrom": {"path": "/tmp/v"}}]}}


def pipeline(name: str) -> dict:
    """stage -> train -> evaluate; evaluate fails while `bad` is `evaluate`."""
    def task(who: str, after: str | None = None) -> dict:
        return {"name": who, "template": "step", **({"depends": after} if after else {}),
                "arguments": {"parameters": [{"name": "who", "value": who}]}}

    return {"metadata": {"name": name, "labels": {"team": "ml"}}, "spec": {
        "entrypoint": "main",
        "arguments": {"parameters": [{"name": "bad", "value": "evaluate"}]},
        "templates": [{"name": "main", "dag": {"tasks": [
            task("stage"), task("train", "stage"), task("evaluate", "train")]}}, STEP]}}


def put(server: Server, path: str, body: dict) -> tuple[int, dict]:
    check_request("PUT", path, json.dumps(body))
    return server.call("PUT", path, json=body)


def pods(workflow: dict) -> dict[str, dict]:
    return {node["displayName"]: node for node in workflow["status"]["nodes"].values()
            if node["type"] == "Pod"}


def test_retry_runs_the_failed_step_only_and_resubmit_makes_a_new_workflow(
        start: Callable[..., Server]) -> None:
    server = start()
    assert server.call("POST", "/api/v1/workflows/ml",
                       json={"workflow": pipeline("nightly")})[0] == 200
    failed = wait_for(server, "ml", "nightly", ended)
    assert failed["status"]["phase"] == "Failed"
    before = pods(failed)
    assert before["evaluate"]["phase"] == "Failed"
    # each node with the inputs it was invoked with, as Argo shows them
    assert before["evaluate"]["inputs"] == {"parameters": [{"name": "who", "value": "evaluate"}]}

    # as `argo retry nightly -p bad=none` sends it
    status, body = put(server, "/api/v1/workflows/ml/nightly/retry",
                       {"name": "nightly", "namespace": "ml", "parameters": ["bad=none"]})
    assert status == 200 and body["metadata"]["name"] == "nightly"
    retried = wait_for(server, "ml", "nightly", ended)
    assert retried["status"]["phase"] == "Succeeded"
    assert retried["metadata"]["uid"] == failed["metadata"]["uid"]
    after = pods(retried)
    for kept in ("stage", "train"):  # not run again: the same node, as it ended
        assert after[kept]["startedAt"] == before[kept]["startedAt"]
        assert after[kept]["outputs"] == before[kept]["outputs"]
    assert after["evaluate"]["phase"] == "Succeeded"
    assert after["evaluate"]["startedAt"] >= failed["status"]["finishedAt"]

    # a succeeded workflow is retried only from named nodes, as Argo requires
    status, body = put(server, "/api/v1/workflows/ml/nightly/retry", {})
    assert (status, body["code"]) == (400, 3) and "--restart-successful" in body["message"]
    status, _ = put(server, "/api/v1/workflows/ml/nightly/retry",
                    {"restartSuccessful": True, "nodeFieldSelector": "displayName=train"})
    assert status == 200
    again = pods(wait_for(server, "ml", "nightly", ended))
    # (Argo's times are whole seconds: the output, nanoseconds, tells a run apart)
    assert again["stage"]["outputs"] == after["stage"]["outputs"]
    assert again["train"]["outputs"] != after["train"]["outputs"]

    # resubmit: a new workflow of the same spec, named from the old, labelled with it
    status, body = put(server, "/api/v1/workflows/ml/nightly/resubmit", {"memoized": False})
    assert status == 200 and body["metadata"]["name"].startswith("nightly-")
    fresh = wait_for(server, "ml", body["metadata"]["name"], ended)
    labels = fresh["metadata"]["labels"]
    assert labels["workflows.argoproj.io/resubmitted-from-workflow"] == "nightly"
    assert labels["team"] == "ml" and fresh["status"]["phase"] == "Succeeded"
    assert all(pods(fresh)[name]["outputs"] != again[name]["outputs"] for name in again)
    status, body = put(server, "/api/v1/workflows/ml/nightly/resubmit", {"memoized": True})
    assert (status, body["code"]) == (400, 3) and "Failed or Error run only" in body["message"]
    assert put(server, "/api/v1/workflows/ml/absent/retry", {})[0] == 404


def sleeper(name: str, seconds: int, **spec: object) -> dict:
    return {"metadata": {"name": name}, "spec": {
        "entrypoint": "main", "onExit": "bye", **spec,
        "templates": [
            {"name": "main", "steps": [
                [{"name": "first", "template": "nap"}],
                [{"name": "second", "template": "bye"}]]},
            {"name": "nap", "container": {"image": "alpine:3.20",
                                          "command": ["sleep", str(seconds)]}},
            {"name": "bye", "container": {"image": "alpine:3.20", "command": ["echo", "bye"]}}]}}


def running(body: dict) -> bool:
    return any(node["type"] == "Pod" and node["phase"] == "Running"
               for node in body["status"].get("nodes", {}).values())


def test_suspend_resume_stop_and_terminate(start: Callable[..., Server]) -> None:
    server = start()
    # created suspended (spec.suspend: true, as `argo submit --suspend` sends it):
    # nothing starts until resumed
    assert server.call("POST", "/api/v1/workflows/ml",
                       json={"workflow": sleeper("held", 1, suspend=True)})[0] == 200
    time.sleep(1.0)
    _, held = server.call("GET", "/api/v1/workflows/ml/held")
    assert held["spec"]["suspend"] is True and not pods(held)
    status, body = put(server, "/api/v1/workflows/ml/held/resume", {})
    assert status == 200 and "suspend" not in body["spec"]
    done = wait_for(server, "ml", "held", ended)
    assert done["status"]["phase"] == "Succeeded" and set(pods(done)) == {
        "first", "second", "onExit"}

    # suspended while a step runs: that step goes on, the next does not start
    server.call("POST", "/api/v1/workflows/ml", json={"workflow": sleeper("paused", 1)})
    wait_for(server, "ml", "paused", running)
    assert put(server, "/api/v1/workflows/ml/paused/suspend", {})[0] == 200
    wait_for(server, "ml", "paused",
             lambda body: pods(body).get("first", {}).get("phase") == "Succeeded")
    time.sleep(1.0)
    _, paused = server.call("GET", "/api/v1/workflows/ml/paused")
    assert "second" not in pods(paused) and paused["status"]["phase"] == "Running"
    put(server, "/api/v1/workflows/ml/paused/resume", {})
    assert wait_for(server, "ml", "paused", ended)["status"]["phase"] == "Succeeded"

    # stop: the running step ends, the exit handler runs, the workflow fails "stopped"
    server.call("POST", "/api/v1/workflows/ml", json={"workflow": sleeper("stopped", 300)})
    wait_for(server, "ml", "stopped", running)
    assert put(server, "/api/v1/workflows/ml/stopped/stop",
               {"message": "enough"})[0] == 200
    stopped = wait_for(server, "ml", "stopped", ended, timeout=30)
    assert stopped["status"]["phase"] == "Failed" and "enough" in stopped["status"]["message"]
    assert pods(stopped)["onExit"]["phase"] == "Succeeded"

    # terminate: everything killed now, the exit handler too
    server.call("POST", "/api/v1/workflows/ml", json={"workflow": sleeper("ended", 300)})
    wait_for(server, "ml", "ended", running)
    status, body = put(server, "/api/v1/workflows/ml/ended/terminate", {})
    assert status == 200 and body["status"]["phase"] == "Failed"
    assert body["status"]["message"] == "terminated"
    assert "onExit" not in pods(body)

    # on a finished workflow: one line saying why not
    for action in ("stop", "terminate", "suspend", "resume"):
        status, body = put(server, f"/api/v1/workflows/ml/ended/{action}", {})
        assert (status, body["code"]) == (400, 3) and "not running" in body["message"], action


def test_resume_and_stop_suspend_nodes_by_selector(start: Callable[..., Server]) -> None:
    server = start()
    gate = {"metadata": {"name": "gated"}, "spec": {"entrypoint": "main", "templates": [
        {"name": "main", "steps": [[{"name": "approve", "template": "wait"},
                                    {"name": "veto", "template": "wait"}]]},
        {"name": "wait", "suspend": {}}]}}
    server.call("POST", "/api/v1/workflows/ml", json={"workflow": gate})
    wait_for(server, "ml", "gated", lambda body: sum(
        node["type"] == "Suspend" and node["phase"] == "Running"
        for node in body["status"].get("nodes", {}).values()) == 2)
    assert put(server, "/api/v1/workflows/ml/gated/resume",
               {"nodeFieldSelector": "displayName=approve"})[0] == 200
    assert put(server, "/api/v1/workflows/ml/gated/stop",
               {"nodeFieldSelector": "displayName=veto", "message": "no"})[0] == 200
    done = wait_for(server, "ml", "gated", ended)
    phases = {node["displayName"]: node["phase"] for node in done["status"]["nodes"].values()
              if node["type"] == "Suspend"}
    assert phases == {"approve": "Succeeded", "veto": "Failed"}
    assert done["status"]["phase"] == "Failed"


def test_hera_retries_a_failed_workflow_it_created(start: Callable[..., Server],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A CI script's way: Hera's WorkflowsService creates, waits, retries, waits again."""
    from hera.workflows import WorkflowsService
    from hera.workflows.models import WorkflowCreateRequest, WorkflowRetryRequest

    server = start()
    seen = on_the_wire(monkeypatch)
    service = WorkflowsService(host=server.url, namespace="ci")
    created = service.create_workflow(WorkflowCreateRequest.model_validate(
        {"workflow": pipeline("from-ci")}))
    name = created.metadata.name

    def wait() -> str:
        for _ in range(600):
            phase = service.get_workflow(name).status.phase
            if phase in ("Succeeded", "Failed", "Error"):
                return phase
            time.sleep(0.1)
        raise AssertionError(f"{name} did not end")

    assert wait() == "Failed"
    service.retry_workflow(name, WorkflowRetryRequest(parameters=["bad=none"]))
    assert wait() == "Succeeded"
    assert ("PUT", f"/api/v1/workflows/ci/{name}/retry", 200) in seen
    nodes = service.get_workflow(name).status.nodes
    assert nodes is not None
    assert {node.display_name: node.phase for node in nodes.values() if node.type == "Pod"} \
        == {"stage": "Succeeded", "train": "Succeeded", "evaluate": "Succeeded"}


def test_pods_with_more_than_a_containers_privileges_need_allow_privileged(
        start: Callable[..., Server]) -> None:
    def asking(name: str, **context: object) -> dict:
        body = {"image": "alpine:3.20", "command": ["true"], "securityContext": context}
        return {"metadata": {"name": name}, "spec": {
            "entrypoint": "main", "arguments": {"parameters": [{"name": "priv", "value": "true"}]},
            "templates": [{"name": "main", "container": body, "metadata": {"annotations": {
                "sublimate.dev/local-privileged": "{{workflow.parameters.priv}}"}}}]}}

    server = start()
    for name, context, field in (
            ("root", {"privileged": True}, "container.securityContext.privileged"),
            ("caps", {"capabilities": {"add": ["SYS_ADMIN"]}},
             "container.securityContext.capabilities.add"),
            ("setuid", {"allowPrivilegeEscalation": True},
             "container.securityContext.allowPrivilegeEscalation")):
        for path in ("/api/v1/workflows/ml", "/api/v1/workflows/ml/lint"):
            status, body = server.call("POST", path, json={"workflow": asking(name, **context)})
            assert (status, body["code"]) == (403, 7), body
            assert f"spec.templates[0] (main).{field}: asks for a pod with more" in \
                body["message"] and "--allow-privileged" in body["message"]
        assert server.call("GET", f"/api/v1/workflows/ml/{name}")[0] == 404
    # a privilege a parameter asks for is known when the pod starts: refused there
    assert server.call("POST", "/api/v1/workflows/ml",
                       json={"workflow": asking("later")})[0] == 200
    done = wait_for(server, "ml", "later", ended)
    node = next(iter(pods(done).values()))
    assert node["phase"] == "Error"
    assert node["message"].startswith("templates.main.metadata.annotations."
                                      "sublimate.dev/local-privileged: this run allows no pod")

    trusting = start("--allow-privileged")
    assert trusting.call("POST", "/api/v1/workflows/ml", json={
        "workflow": asking("trusted", privileged=True)})[0] == 200
    assert wait_for(trusting, "ml", "trusted", ended)["status"]["phase"] == "Succeeded"


def test_sublimate_retry_and_resubmit_against_an_argo_server(
        start: Callable[..., Server], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from sublimate.pipelines.cli import main as cli_main

    server = start()
    server.call("POST", "/api/v1/workflows/ml", json={"workflow": pipeline("remote")})
    wait_for(server, "ml", "remote", ended)
    seen = on_the_wire(monkeypatch)
    flags = ["--argo-server", server.url, "-n", "ml"]
    assert cli_main(["retry", "remote", *flags, "-p", "bad=none", "--wait"]) == 0
    assert ("PUT", "/api/v1/workflows/ml/remote/retry", 200) in seen
    out = capsys.readouterr().out
    assert out.startswith(f"remote: retried ({server.url}/workflows/ml/remote)")
    assert "remote: Succeeded" in out
    assert cli_main(["resubmit", "remote", *flags, "--wait"]) == 0
    out = capsys.readouterr().out
    name = out.split()[3]
    assert out.startswith("remote: resubmitted as remote-") and f"{name}: Succeeded" in out
    # a mistake: one line naming what to fix
    assert cli_main(["retry", "absent", *flags]) == 1
    assert "retrying workflow 'absent': not found in namespace 'ml'" in capsys.readouterr().err


def test_set_gives_a_suspend_node_its_supplied_outputs(
        start: Callable[..., Server], capsys: pytest.CaptureFixture[str]) -> None:
    """`argo node set --output-parameter` (what Argo's UI sends to resume with values)."""
    server = start()
    gate = {"metadata": {"name": "chosen"}, "spec": {"entrypoint": "main", "templates": [
        {"name": "main", "steps": [[{"name": "approve", "template": "wait"}]]},
        {"name": "wait", "suspend": {}, "outputs": {"parameters": [{
            "name": "env", "valueFrom": {"supplied": {}, "default": "dev"},
            "enum": ["dev", "prod"]}]}}]}}
    server.call("POST", "/api/v1/workflows/ml", json={"workflow": gate})
    wait_for(server, "ml", "chosen", lambda body: any(
        node["type"] == "Suspend" and node["phase"] == "Running"
        for node in body["status"].get("nodes", {}).values()))
    # `sublimate get` says how to resume the waiting step
    from sublimate.pipelines.cli import main as cli_main

    assert cli_main(["get", "chosen", "--argo-server", server.url, "-n", "ml"]) == 0
    waiting = capsys.readouterr().out
    assert "approve          Waiting    waiting: sublimate resume chosen --node-field-selector " \
        "displayName=approve -p env=dev|prod" in waiting, waiting
    path = "/api/v1/workflows/ml/chosen/set"
    status, body = put(server, path, {"nodeFieldSelector": "displayName=approve",
                                      "outputParameters": '{"env": "staging"}'})
    assert (status, body["code"]) == (400, 3) and "staging" in body["message"]
    status, body = put(server, path, {"outputParameters": '{"env": "prod"}'})
    assert (status, body["code"]) == (400, 3) and body["message"].startswith("nodeFieldSelector")
    assert put(server, path, {"nodeFieldSelector": "displayName=approve",
                              "outputParameters": '{"env": "prod"}'})[0] == 200
    done = wait_for(server, "ml", "chosen", ended)
    node = next(n for n in done["status"]["nodes"].values() if n["type"] == "Suspend")
    assert node["phase"] == "Succeeded"
    assert node["outputs"]["parameters"] == [{"name": "env", "value": "prod"}]
