"""`sublimate server`'s ClusterWorkflowTemplates, and workflows whose ``workflowTemplateRef``
or ``templateRef`` names a stored (Cluster)WorkflowTemplate, through a real server's HTTP API,
every body checked against Argo's OpenAPI document."""

from __future__ import annotations

from collections.abc import Callable

from .argo_api import Server, ended, wait_for

BASE = "/api/v1/cluster-workflow-templates"


def say_template(name: str) -> dict:
    return {"metadata": {"name": name, "labels": {"scope": "cluster"}}, "spec": {
        "entrypoint": "main",
        "arguments": {"parameters": [{"name": "word", "value": "hello"}]},
        "templates": [{
            "name": "main",
            "steps": [[{"name": "say", "template": "say", "arguments": {"parameters": [
                {"name": "word", "value": "{{workflow.parameters.word}}"}]}}]]}, {
            "name": "say",
            "inputs": {"parameters": [{"name": "word"}]},
            "container": {"image": "alpine:3.20", "command": [
                "sh", "-c", "printf '%s' '{{inputs.parameters.word}}' > /tmp/word"]},
            "outputs": {"parameters": [{"name": "word", "valueFrom": {"path": "/tmp/word"}}]}}]}}


def pod_outputs(body: dict) -> list[list[dict]]:
    return [node.get("outputs", {}).get("parameters", []) for node in body["status"]["nodes"]
            .values() if node["type"] == "Pod"]


def test_cluster_workflow_templates(start: Callable[..., Server]) -> None:
    server = start()
    status, created = server.call("POST", BASE, json={"template": say_template("say")})
    assert status == 200 and created["metadata"]["uid"]
    assert created["kind"] == "ClusterWorkflowTemplate" and "namespace" not in created["metadata"]
    assert server.call("POST", BASE, json={"template": say_template("say")})[1]["code"] == 6
    assert (server.home / "server" / "cluster-workflow-templates" / "say.json").is_file()
    changed = say_template("say")
    changed["spec"]["arguments"]["parameters"][0]["value"] = "bonjour"
    status, updated = server.call("PUT", f"{BASE}/say", json={"template": changed})
    assert status == 200 and updated["metadata"]["resourceVersion"] == "2"
    assert updated["metadata"]["uid"] == created["metadata"]["uid"]
    for selector, count in (("scope=cluster", 1), ("scope=namespace", 0)):
        _, listing = server.call("GET", BASE, params={"listOptions.labelSelector": selector})
        assert len(listing["items"]) == count

    broken = say_template("broken")
    broken["spec"]["entrypoint"] = "nowhere"
    for method, path in (("POST", BASE), ("POST", f"{BASE}/lint")):
        status, body = server.call(method, path, json={"template": broken})
        assert (status, body["code"]) == (400, 3) and "nowhere" in body["message"]
    for name in ("../escape", "Upper", "a" * 254):
        status, body = server.call("POST", BASE, json={"template": {
            **say_template("x"), "metadata": {"name": name}}})
        assert (status, body["code"]) == (400, 3)
        assert body["message"].startswith("template.metadata.name"), body
    status, body = server.call("GET", f"{BASE}/absent")
    assert (status, body["code"]) == (404, 5) and '"absent" not found' in body["message"]
    assert server.call("PUT", f"{BASE}/absent", json={"template": say_template("absent")})[0] \
        == 404
    assert server.call("POST", f"{BASE}/lint", json={"template": say_template("linted")})[0] \
        == 200
    assert server.call("GET", f"{BASE}/linted")[0] == 404

    # submitted from, as `argo submit --from clusterworkflowtemplate/say -p word=hi` sends it
    status, submitted = server.call("POST", "/api/v1/workflows/ns/submit", json={
        "resourceKind": "ClusterWorkflowTemplate", "resourceName": "say",
        "submitOptions": {"parameters": ["word=hi"]}})
    assert status == 200 and submitted["metadata"]["name"].startswith("say-")
    done = wait_for(server, "ns", submitted["metadata"]["name"], ended)
    assert done["status"]["phase"] == "Succeeded"
    assert done["spec"]["workflowTemplateRef"] == {"name": "say", "clusterScope": True}
    assert done["metadata"]["labels"]["workflows.argoproj.io/cluster-workflow-template"] == "say"
    assert pod_outputs(done) == [[{"name": "word", "value": "hi"}]]

    # kept across a restart; deleted, it is gone
    server.stop()
    again = start()
    assert again.call("GET", f"{BASE}/say")[1]["spec"]["arguments"]["parameters"][0][
        "value"] == "bonjour"
    assert again.call("DELETE", f"{BASE}/say") == (200, {})
    assert again.call("GET", f"{BASE}/say")[0] == 404
    assert again.call("DELETE", f"{BASE}/say")[0] == 404


def test_references_resolve_from_stored_templates(start: Callable[..., Server]) -> None:
    server = start()
    assert server.call("POST", BASE, json={"template": say_template("say")})[0] == 200
    # a WorkflowTemplate whose step calls the cluster template's `say` (clusterScope)
    caller = {"metadata": {"name": "caller"}, "spec": {
        "entrypoint": "main",
        "templates": [{"name": "main", "steps": [[{
            "name": "greet",
            "templateRef": {"name": "say", "template": "say", "clusterScope": True},
            "arguments": {"parameters": [{"name": "word", "value": "steps"}]}}]]}]}}
    status, body = server.call("POST", "/api/v1/workflow-templates/ns",
                               json={"template": caller})
    assert status == 200, body
    status, submitted = server.call("POST", "/api/v1/workflows/ns/submit", json={
        "resourceKind": "WorkflowTemplate", "resourceName": "caller"})
    assert status == 200, submitted
    done = wait_for(server, "ns", submitted["metadata"]["name"], ended)
    assert done["status"]["phase"] == "Succeeded"
    assert pod_outputs(done) == [[{"name": "word", "value": "steps"}]]

    # a Workflow created by name (Hera's `Workflow(workflow_template_ref=...).create()`):
    # its workflowTemplateRef found among the stored templates, shown as sent
    created = {"metadata": {"name": "by-ref"}, "spec": {"workflowTemplateRef": {
        "name": "caller"}}}
    assert server.call("POST", "/api/v1/workflows/ns/lint",
                       json={"workflow": created})[0] == 200
    status, body = server.call("POST", "/api/v1/workflows/ns", json={"workflow": created})
    assert status == 200, body
    done = wait_for(server, "ns", "by-ref", ended)
    assert done["status"]["phase"] == "Succeeded"
    assert done["spec"] == {"workflowTemplateRef": {"name": "caller"}}
    assert pod_outputs(done) == [[{"name": "word", "value": "steps"}]]
    status, body = server.call("POST", "/api/v1/workflows/ns", json={"workflow": {
        "metadata": {"name": "by-absent"}, "spec": {"workflowTemplateRef": {"name": "absent"}}}})
    assert (status, body["code"]) == (400, 3) and "'absent' not found" in body["message"]

    # a reference to a template not stored: refused, naming it and where it was looked for
    missing = {**caller, "metadata": {"name": "missing"}}
    missing["spec"] = {**caller["spec"], "templates": [{"name": "main", "steps": [[{
        "name": "greet", "templateRef": {"name": "absent", "template": "say"}}]]}]}
    status, body = server.call("POST", "/api/v1/workflow-templates/ns",
                               json={"template": missing})
    assert (status, body["code"]) == (400, 3)
    assert "'absent' not found among the WorkflowTemplates of namespace ns" in body["message"]
    # a namespace's WorkflowTemplate is not a cluster one (clusterScope names which)
    status, body = server.call("POST", BASE, json={"template": {
        **caller, "metadata": {"name": "cluster-caller"}, "spec": {
            **caller["spec"], "templates": [{"name": "main", "steps": [[{
                "name": "greet", "templateRef": {"name": "caller", "template": "main"}}]]}]}}})
    assert (status, body["code"]) == (400, 3) and "caller" in body["message"]

    # a CronWorkflow's workflowSpec naming the cluster template, started now
    cron = {"metadata": {"name": "greeter"}, "spec": {
        "schedules": ["0 0 1 1 *"], "workflowSpec": {
            "workflowTemplateRef": {"name": "say", "clusterScope": True},
            "arguments": {"parameters": [{"name": "word", "value": "cron"}]}}}}
    status, body = server.call("POST", "/api/v1/cron-workflows/ns", json={"cronWorkflow": cron})
    assert status == 200, body
    status, submitted = server.call("POST", "/api/v1/workflows/ns/submit", json={
        "resourceKind": "CronWorkflow", "resourceName": "greeter"})
    assert status == 200, submitted
    assert submitted["metadata"]["labels"]["workflows.argoproj.io/cron-workflow"] == "greeter"
    done = wait_for(server, "ns", submitted["metadata"]["name"], ended)
    assert done["status"]["phase"] == "Succeeded"
    assert done["spec"]["workflowTemplateRef"] == {"name": "say", "clusterScope": True}
    assert pod_outputs(done) == [[{"name": "word", "value": "cron"}]]
