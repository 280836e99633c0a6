"""`sublimate server`'s workflows, templates and access rules, through its HTTP API, every
body checked against Argo's own OpenAPI document (``argo_api``)."""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sublimate.pipelines.cli import main as cli_main
from sublimate.pipelines.server.selectors import parse_selector

from .argo_api import DATA, Server, ended, on_the_wire, wait_for, workflow


def server_home(server: Server) -> Path:
    return server.home


def test_hera_ci_script_runs_unchanged(start: Callable[..., Server], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    server = start()
    seen = on_the_wire(monkeypatch)
    monkeypatch.setenv("ARGO_SERVER_URL", server.url)
    monkeypatch.setenv("ARGO_NAMESPACE", "ci")
    monkeypatch.setenv("RESULT_FILE", str(tmp_path / "result.json"))
    runpy.run_path(str(DATA / "hera_ci.py"), run_name="__main__")

    result = json.loads((tmp_path / "result.json").read_text())
    assert result["phase"] == "Succeeded"
    assert result["words"] == {"first": ["hello"], "second": ["world"]}
    assert result["outputs"] == {"last-word": "world"}
    assert ("POST", "/api/v1/workflows/ci", 200) in seen
    assert any(method == "GET" and path.endswith(result["name"]) for method, path, _ in seen)
    monkeypatch.undo()

    # the Workflow as Argo shows it: nodes keyed by id, phases, times, outputs
    _, body = server.call("GET", f"/api/v1/workflows/ci/{result['name']}")
    status = body["status"]
    assert body["metadata"]["generateName"] == "ci-check-" and body["metadata"]["uid"]
    assert status["startedAt"] <= status["finishedAt"] and status["progress"] == "2/2"
    assert all(node_id == node["id"] for node_id, node in status["nodes"].items())
    pods = {node["displayName"]: node for node in status["nodes"].values()
            if node["type"] == "Pod"}
    assert pods["second"]["outputs"]["parameters"] == [{"name": "word", "value": "world"}]
    assert pods["second"]["phase"] == "Succeeded" and pods["second"]["templateName"] == "say"

    # the label selector: Argo's own labels and the workflow's
    for selector, count in (("ci=true", 1), ("ci!=true", 0), ("ci in (true,x)", 1),
                            ("!ci", 0), ("workflows.argoproj.io/completed=true", 1)):
        _, listing = server.call("GET", "/api/v1/workflows/ci",
                                 params={"listOptions.labelSelector": selector})
        assert len(listing["items"]) == count, selector
    _, listing = server.call("GET", "/api/v1/workflows/other")
    assert listing["items"] == []

    # sublimate's own Argo Server client reads it (`sublimate get`)
    capsys.readouterr()
    on_the_wire(monkeypatch)
    assert cli_main(["get", result["name"], "--argo-server", server.url, "-n", "ci"]) == 0
    out = capsys.readouterr().out
    assert f"{result['name']}: Succeeded" in out and "word=world" in out


def test_a_restart_keeps_finished_runs_and_fails_the_running_one(
        start: Callable[..., Server]) -> None:
    first = start()
    assert first.call("POST", "/api/v1/workflows/ns", json={
        "workflow": workflow("finished", "echo done")})[0] == 200
    wait_for(first, "ns", "finished", ended)
    status, created = first.call("POST", "/api/v1/workflows/ns", json={
        "workflow": workflow("sleeper", "sleep 307")})
    assert status == 200 and created["metadata"]["name"] == "sleeper"
    wait_for(first, "ns", "sleeper", lambda body: any(
        node["type"] == "Pod" and node["phase"] == "Running"
        for node in body["status"].get("nodes", {}).values()))
    first.kill()  # the server dies mid-run, as a crash or the OOM killer would end it

    second = start()
    _, listing = second.call("GET", "/api/v1/workflows/ns")
    phases = {item["metadata"]["name"]: item["status"]["phase"] for item in listing["items"]}
    assert phases == {"finished": "Succeeded", "sleeper": "Failed"}
    _, sleeper = second.call("GET", "/api/v1/workflows/ns/sleeper")
    assert "sublimate server stopped while the workflow ran" in sleeper["status"]["message"]
    assert "finishedAt" in sleeper["status"]
    pod = next(node for node in sleeper["status"]["nodes"].values() if node["type"] == "Pod")
    assert pod["phase"] == "Failed" and "server stopped" in pod["message"]

    # stopped in order (SIGTERM), the server ends what it runs, saying so
    second.call("POST", "/api/v1/workflows/ns", json={
        "workflow": workflow("sleeper-two", "sleep 308")})
    wait_for(second, "ns", "sleeper-two", lambda body: body["status"].get("nodes"))
    second.stop()
    assert second.process.returncode == 0
    third = start()
    _, again = third.call("GET", "/api/v1/workflows/ns/sleeper-two")
    assert again["status"]["phase"] == "Failed"
    assert "sublimate server stopped" in again["status"]["message"]
    _, listing = third.call("GET", "/api/v1/workflows/ns")
    assert len(listing["items"]) == 3


def test_errors_have_argo_shapes(start: Callable[..., Server]) -> None:
    server = start()
    status, body = server.call("GET", "/api/v1/workflows/ns/missing")
    assert (status, body["code"]) == (404, 5) and '"missing" not found' in body["message"]

    assert server.call("POST", "/api/v1/workflows/ns", json={
        "workflow": workflow("once", "true")})[0] == 200
    status, body = server.call("POST", "/api/v1/workflows/ns", json={
        "workflow": workflow("once", "true")})
    assert (status, body["code"]) == (409, 6) and "already exists" in body["message"]

    for request, field in (({}, "workflow"), ({"workflow": {"metadata": {}, "spec": {}}},
                                              "workflow.metadata"),
                           ({"workflow": {"metadata": {"name": "x"}}}, "workflow.spec"),
                           ({"workflow": workflow("../escape", "true")},
                            "workflow.metadata.name"),
                           ({"workflow": {**workflow("", "true"),
                                          "metadata": {"generateName": "Up-"}}},
                            "workflow.metadata.generateName")):
        status, body = server.call("POST", "/api/v1/workflows/ns", json=request)
        assert (status, body["code"]) == (400, 3) and body["message"].startswith(field), body
    status, body = server.call("POST", "/api/v1/workflows/ns", data=b"{not json")
    assert (status, body["code"]) == (400, 3) and "body" in body["message"]
    assert not (server_home(server) / "escape").exists()

    broken = workflow("broken", "true")
    broken["spec"]["entrypoint"] = "nowhere"
    status, body = server.call("POST", "/api/v1/workflows/ns/lint", json={"workflow": broken})
    assert (status, body["code"]) == (400, 3) and "nowhere" in body["message"]
    status, body = server.call("POST", "/api/v1/workflows/ns/lint",
                               json={"workflow": workflow("fine", "true")})
    assert status == 200 and body["metadata"]["namespace"] == "ns"

    status, body = server.call("GET", "/api/v1/workflows/ns",
                               params={"listOptions.labelSelector": "a in (b"})
    assert (status, body["code"]) == (400, 3) and "labelSelector" in body["message"]
    status, body = server.call("GET", "/api/v1/workflows/Not_A_Name")
    assert (status, body["code"]) == (400, 3) and body["message"].startswith("namespace")
    status, body = server.call("GET", "/api/v1/archived-workflows")
    assert (status, body["code"]) == (501, 12)

    wait_for(server, "ns", "once", ended)
    assert server.call("DELETE", "/api/v1/workflows/ns/once") == (200, {})
    assert server.call("GET", "/api/v1/workflows/ns/once")[0] == 404
    assert server.call("DELETE", "/api/v1/workflows/ns/once")[0] == 404


def test_workflow_templates_and_submit(start: Callable[..., Server],
                                       capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    server = start()
    template = {"metadata": {"name": "greet"}, "spec": {
        "entrypoint": "main", "arguments": {"parameters": [{"name": "who", "value": "nobody"}]},
        "templates": [{"name": "main", "container": {
            "image": "alpine:3.20",
            "command": ["sh", "-c", "printf '%s' {{workflow.parameters.who}} > /tmp/who"]},
            "outputs": {"parameters": [{"name": "who", "valueFrom": {"path": "/tmp/who"}}]}}]}}
    base = "/api/v1/workflow-templates/ns"
    status, created = server.call("POST", base, json={"template": template})
    assert status == 200 and created["metadata"]["uid"]
    assert server.call("POST", base, json={"template": template})[1]["code"] == 6
    template["spec"]["arguments"]["parameters"][0]["value"] = "someone"
    status, updated = server.call("PUT", f"{base}/greet", json={"template": template})
    assert status == 200 and updated["metadata"]["resourceVersion"] == "2"
    assert updated["metadata"]["uid"] == created["metadata"]["uid"]
    _, listing = server.call("GET", base)
    assert [item["metadata"]["name"] for item in listing["items"]] == ["greet"]
    broken = {**template, "metadata": {"name": "broken"},
              "spec": {**template["spec"], "entrypoint": "nowhere"}}
    assert server.call("POST", f"{base}/lint", json={"template": broken})[0] == 400
    assert server.call("GET", f"{base}/broken")[0] == 404

    # submitted from it, as `argo submit --from workflowtemplate/greet -p who=you` sends it
    status, submitted = server.call("POST", "/api/v1/workflows/ns/submit", json={
        "resourceKind": "WorkflowTemplate", "resourceName": "greet",
        "submitOptions": {"parameters": ["who=you"], "labels": "team=ml"}})
    assert status == 200 and submitted["metadata"]["name"].startswith("greet-")
    done = wait_for(server, "ns", submitted["metadata"]["name"], ended)
    assert done["status"]["phase"] == "Succeeded"
    assert done["spec"] == {"workflowTemplateRef": {"name": "greet"}, "arguments": {
        "parameters": [{"name": "who", "value": "you"}]}}
    assert done["metadata"]["labels"]["workflows.argoproj.io/workflow-template"] == "greet"
    assert done["metadata"]["labels"]["team"] == "ml"
    pod = next(node for node in done["status"]["nodes"].values() if node["type"] == "Pod")
    assert pod["outputs"]["parameters"] == [{"name": "who", "value": "you"}]
    status, body = server.call("POST", "/api/v1/workflows/ns/submit", json={
        "resourceKind": "WorkflowTemplate", "resourceName": "absent"})
    assert (status, body["code"]) == (404, 5)

    # `sublimate submit` against it: the pipeline's WorkflowTemplate installed as it renders
    from sublimate.pipelines.render import render_dict

    train = render_dict("train")
    assert server.call("POST", base, json={"template": train})[0] == 200
    capsys.readouterr()
    seen = on_the_wire(monkeypatch)
    assert cli_main(["submit", "train", "-p", "epochs=1", "--argo-server", server.url,
                     "-n", "ns"]) == 0
    assert seen == [("POST", "/api/v1/workflows/ns/submit", 200)]
    monkeypatch.undo()
    name = capsys.readouterr().out.split()[1]
    _, running = server.call("GET", f"/api/v1/workflows/ns/{name}")
    assert running["spec"]["workflowTemplateRef"] == {"name": train["metadata"]["name"]}
    assert {"name": "epochs", "value": "1"} in running["spec"]["arguments"]["parameters"]
    # deleting a running workflow ends it first
    assert server.call("DELETE", f"/api/v1/workflows/ns/{name}") == (200, {})
    assert server.call("GET", f"/api/v1/workflows/ns/{name}")[0] == 404
    assert not (server_home(server) / "runs" / name).exists()
    assert server.call("DELETE", f"{base}/greet") == (200, {})


def test_off_loopback_needs_a_token(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "SUBLIMATE_AUTH_TOKEN"}
    refused = subprocess.run(
        [sys.executable, "-m", "sublimate.pipelines", "server", "--host", "0.0.0.0",
         "--port", "0", "--home", str(tmp_path)], capture_output=True, text=True, timeout=60,
        env=env)
    assert refused.returncode == 2
    assert "--host 0.0.0.0: not a loopback address" in refused.stderr
    assert "--auth-token" in refused.stderr and not (tmp_path / "runs").exists()


def test_without_a_token_only_this_machines_names_are_served(
        start: Callable[..., Server]) -> None:
    # DNS rebinding: a page at a name made to resolve to 127.0.0.1 sends its own Host (and a
    # matching Origin): without a token, nothing but this machine's names is served.
    server = start()
    for host in ("rebound.example:2746", "rebound.example"):
        status, body = server.call("GET", "/api/v1/version",
                                   headers={"Host": host, "Origin": f"http://{host}"})
        assert (status, body["code"]) == (403, 7), body
    for host in ("127.0.0.1", "localhost:2746", "[::1]:2746"):
        assert server.call("GET", "/api/v1/version", headers={"Host": host})[0] == 200


def test_a_token_is_required_once_given(start: Callable[..., Server]) -> None:
    server = start("--auth-token", "s3cret-token")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token"}):
        status, body = server.call("GET", "/api/v1/version", headers=headers)
        assert (status, body["code"]) == (401, 16)
        assert "s3cret-token" not in json.dumps(body)
    good = {"Authorization": "Bearer s3cret-token"}
    assert server.call("GET", "/api/v1/version", headers=good)[0] == 200
    status, body = server.call("GET", "/api/v1/version",
                               headers={**good, "Origin": "https://elsewhere.example"})
    assert (status, body["code"]) == (403, 7)

    # Hera sends the token as Argo's `--auth-mode client` expects it
    from hera.workflows import WorkflowsService

    assert WorkflowsService(host=server.url, token="s3cret-token").get_version().version
    with pytest.raises(Exception, match="token not valid"):
        WorkflowsService(host=server.url).get_version()


def test_label_selectors() -> None:
    labels = {"app": "train", "tier": "gpu"}
    assert parse_selector("")(labels)
    assert parse_selector("app=train,tier in (gpu, cpu)")(labels)
    assert not parse_selector("app==train,tier notin (gpu)")(labels)
    assert parse_selector("app,!missing")(labels)
    assert not parse_selector("app!=train")(labels)


def test_a_memoized_node_is_shown_cached(start: Callable[..., Server]) -> None:
    """Argo 3.7's mark on a node taken from the cache: ``memoizationStatus.hit``."""
    server = start()
    memoized = workflow("first-memo", "date +%s%N > /tmp/v")
    template = memoized["spec"]["templates"][0]
    template["memoize"] = {"key": "k", "maxAge": "1h", "cache": {"configMap": {"name": "memo"}}}
    template["outputs"] = {"parameters": [{"name": "v", "valueFrom": {"path": "/tmp/v"}}]}
    shown = []
    for name in ("first-memo", "second-memo"):
        memoized["metadata"]["name"] = name
        assert server.call("POST", "/api/v1/workflows/ns", json={"workflow": memoized})[0] == 200
        done = wait_for(server, "ns", name, ended)
        shown.append(next(iter(done["status"]["nodes"].values())))
    assert shown[0]["memoizationStatus"] == {"hit": False, "key": "k", "cacheName": "memo"}
    assert shown[1]["memoizationStatus"] == {"hit": True, "key": "k", "cacheName": "memo"}
    assert shown[1]["outputs"] == shown[0]["outputs"]


def test_a_run_folder_whose_manifest_is_torn_is_still_listed(
        start: Callable[..., Server]) -> None:
    # a `sublimate run` folder whose workflow.yaml is not YAML (cut short by a crash, or
    # written by hand): listed with what its status says, in the default namespace
    server = start()
    folder = server_home(server) / "runs" / "torn"
    folder.mkdir(parents=True)
    (folder / "workflow.yaml").write_text("metadata: {name: torn\nspec: [")
    (folder / "status.json").write_text(json.dumps({
        "name": "torn", "phase": "Succeeded", "started_at": "2026-12-06T10:00:00Z",
        "finished_at": "2026-12-06T10:00:01Z", "nodes": []}))
    status, listing = server.call("GET", "/api/v1/workflows/sublimate")
    assert status == 200, listing
    assert [item["metadata"]["name"] for item in listing["items"]] == ["torn"]
    status, body = server.call("GET", "/api/v1/workflows/sublimate/torn")
    assert status == 200 and body["status"]["phase"] == "Succeeded"
