"""The page's workflows list, submit form and a workflow's actions, in a real browser on a real
server: a run submitted from the form shows in the list and reaches Succeeded there live; a
refused parameter is said at its field; the list's filters; resume with a supplied value,
retry and delete from the workflow's page. The server's own part: a submit from one of
sublimate's pipelines is checked as `sublimate run` checks it, its refusal naming the
parameter."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..argo_api import Server, ended, wait_for, workflow

NS = "sublimate"  # the server's default namespace: the page's own
def refused_as_expected(tab: Any) -> None:
    """The browser logs each 400 the page asked for on purpose: those, and nothing else."""
    errors = tab.errors()
    assert errors and all("status of 400 (Bad Request)" in error for error in errors), errors


def greet_template(name: str = "greet") -> dict:
    return {"metadata": {"name": name, "annotations": {
        "workflows.argoproj.io/description": "Say something, after a short pause."}},
        "spec": {"entrypoint": "main", "arguments": {"parameters": [
            {"name": "message", "value": "hello", "enum": ["hello", "bye"],
             "description": "What to say"},
            {"name": "pause", "value": "1", "description": "Seconds to wait first"}]},
            "templates": [{"name": "main", "container": {
                "image": "alpine:3.20", "command": ["sh", "-c"],
                "args": ["sleep {{workflow.parameters.pause}}; "
                         "echo {{workflow.parameters.message}}"]}}]}}


def create(server: Server, body: dict) -> dict:
    status, created = server.call("POST", f"/api/v1/workflows/{NS}", json={"workflow": body})
    assert status == 200, created
    return created


def choose(select: Any, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    Select(select).select_by_value(value)


def test_a_run_submitted_from_the_form_shows_in_the_list_and_succeeds_live(
        start: Callable[..., Server], page: Callable[[Server], Any]) -> None:
    server = start()
    assert server.call("POST", f"/api/v1/workflow-templates/{NS}",
                       json={"template": greet_template()})[0] == 200
    tab = page(server)
    tab.open("/workflow-templates")
    tab.wait('[data-template="greet"] a').click()
    select = tab.wait('select[name="parameter-message"]')
    assert [o.get_attribute("value") for o in select.find_elements("css selector", "option")] \
        == ["hello", "bye"]
    assert "What to say" in tab.wait('[data-parameter="message"] .help').text
    assert tab.wait('input[name="parameter-pause"]').get_attribute("value") == "1"
    tab.shot("submit-form")
    choose(select, "bye")
    tab.wait('.submit-form button[type="submit"]').click()
    tab.wait("#main", condition=lambda _: f"/workflows/{NS}/greet-" in tab.driver.current_url)
    name = tab.driver.current_url.rsplit("/", 1)[-1]
    assert name.startswith("greet-") and f"/workflows/{NS}/" in tab.driver.current_url
    _, submitted = server.call("GET", f"/api/v1/workflows/{NS}/{name}")
    assert submitted["spec"]["arguments"]["parameters"] == [{"name": "message", "value": "bye"}]

    # the list, live: the run goes on to Succeeded, and a new one appears, without a reload
    tab.open("/workflows")
    tab.wait('[data-view="list"]')
    tab.driver.execute_script("window.notReloaded = true")
    row = tab.wait(f'tr[data-workflow="{name}"]')
    assert "greet" in row.text and "message=bye" in row.text
    tab.wait(f'tr[data-workflow="{name}"][data-phase="Succeeded"]', timeout=20)
    create(server, workflow("later", "sleep 1"))
    tab.wait('tr[data-workflow="later"]')
    rows = [r.get_attribute("data-workflow") for r in tab.all("tr[data-workflow]")]
    assert rows == ["later", name], "newest first"
    tab.wait('tr[data-workflow="later"][data-phase="Succeeded"]', timeout=20)
    assert tab.driver.execute_script("return window.notReloaded") is True
    link = tab.wait(f'tr[data-workflow="{name}"] a')
    assert link.get_attribute("href").endswith(f"/workflows/{NS}/{name}")
    tab.shot("list")


def test_a_refused_parameter_is_said_at_its_field(
        start: Callable[..., Server], page: Callable[[Server], Any]) -> None:
    from sublimate.pipelines.render import render_dict

    server = start()
    train = render_dict("train")
    assert server.call("POST", f"/api/v1/workflow-templates/{NS}",
                       json={"template": train})[0] == 200
    submit = {"resourceKind": "WorkflowTemplate", "resourceName": train["metadata"]["name"]}
    # the server checks the pipeline's settings together, as `sublimate run` does, and names
    # the parameter as the runner's own refusals do
    status, body = server.call("POST", f"/api/v1/workflows/{NS}/submit", json={
        **submit, "submitOptions": {"parameters": ["global-batch-size=63", "nodes=2"]}})
    assert status == 400 and body["message"].startswith(
        "parameter 'global-batch-size': global-batch-size 63 is not divisible"), body
    status, body = server.call("POST", f"/api/v1/workflows/{NS}/submit", json={
        **submit, "submitOptions": {"parameters": ["nodes=two"], "serverDryRun": True}})
    assert status == 400 and body["message"].startswith("parameter 'nodes': 'two'"), body
    status, body = server.call("POST", f"/api/v1/workflows/{NS}/submit", json={
        **submit, "submitOptions": {"parameters": ["algorithm=nope"]}})
    assert status == 400 and body["message"].startswith("parameter 'algorithm': 'nope'"), body

    tab = page(server)
    tab.open(f"/workflow-templates/{NS}/{train['metadata']['name']}")
    batch = tab.wait('input[name="parameter-global-batch-size"]')
    batch.clear()
    batch.send_keys("63")
    tab.wait('.submit-form button[type="submit"]').click()
    error = tab.wait('.field-error[data-for="global-batch-size"]',
                     condition=lambda e: e.is_displayed() and e.text)
    assert "not divisible" in error.text
    assert batch.get_attribute("aria-invalid") == "true"
    assert tab.driver.switch_to.active_element == batch
    tab.shot("submit-refused")
    # the next refusal is said at its own field, the earlier one cleared
    batch.clear()
    batch.send_keys("64")
    nodes = tab.wait('input[name="parameter-nodes"]')
    nodes.clear()
    nodes.send_keys("two")
    nodes.submit()
    tab.wait('.field-error[data-for="nodes"]', condition=lambda e: "'two'" in e.text)
    assert nodes.get_attribute("aria-invalid") == "true"
    assert batch.get_attribute("aria-invalid") is None
    assert not tab.wait('.field-error[data-for="global-batch-size"]').is_displayed()
    assert "/workflow-templates/" in tab.driver.current_url
    refused_as_expected(tab)
    assert server.call("GET", f"/api/v1/workflows/{NS}")[1]["items"] == []


def test_the_list_filters_by_phase_and_labels_kept_in_its_link(
        start: Callable[..., Server], page: Callable[[Server], Any]) -> None:
    server = start()
    create(server, workflow("good", "true", labels={"team": "ml"}))
    create(server, workflow("bad", "exit 3", labels={"team": "ml"}))
    create(server, workflow("other", "true", labels={"team": "web"}))
    for name in ("good", "bad", "other"):
        wait_for(server, NS, name, ended)
    tab = page(server)
    tab.open("/workflows?phase=Failed")
    tab.wait('tr[data-workflow="bad"]')
    shown = lambda: sorted(r.get_attribute("data-workflow")  # noqa: E731
                           for r in tab.all("tr[data-workflow]"))
    assert shown() == ["bad"]
    assert tab.wait('input[name="phase"][value="Failed"]').is_selected()
    # one more phase: its rows come, and the link says both
    tab.wait('.phase-toggle-Succeeded').click()
    tab.wait('tr[data-workflow="good"]')
    tab.wait('tr[data-workflow="other"]')
    assert shown() == ["bad", "good", "other"]
    assert "phase=Succeeded%2CFailed" in tab.driver.current_url
    # a label selector, in Kubernetes' grammar
    labels = tab.wait('input[name="label"]')
    labels.send_keys("team!=ml\n")
    tab.wait("tr[data-workflow]", condition=lambda _: shown() == ["other"])
    assert "label=team%21%3Dml" in tab.driver.current_url
    # a link keeps them
    tab.open("/workflows?phase=Succeeded&label=team%3Dml")
    tab.wait('tr[data-workflow="good"]')
    assert shown() == ["good"]
    assert tab.wait('input[name="label"]').get_attribute("value") == "team=ml"
    tab.shot("list-filtered")
    # a selector the server refuses is said at its field
    labels = tab.wait('input[name="label"]')
    labels.clear()
    labels.send_keys("team in (\n")
    tab.wait('.field-error[data-for="label"]', condition=lambda e: e.text)
    assert labels.get_attribute("aria-invalid") == "true"
    refused_as_expected(tab)


def open_workflow(tab: Any, name: str) -> None:
    """The workflow's page, its actions drawn (the workflow view draws `actionsBar`)."""
    tab.open(f"/workflows/{NS}/{name}")
    tab.wait(f'[data-actions="{name}"]')


def test_a_suspended_step_is_resumed_from_the_page_with_a_supplied_value(
        start: Callable[..., Server], page: Callable[[Server], Any]) -> None:
    server = start()
    create(server, {"metadata": {"name": "chosen"}, "spec": {"entrypoint": "main", "templates": [
        {"name": "main", "steps": [[{"name": "approve", "template": "wait"}]]},
        {"name": "wait", "suspend": {}, "outputs": {"parameters": [{
            "name": "env", "valueFrom": {"supplied": {}, "default": "dev"},
            "enum": ["dev", "prod"], "description": "Where to deploy"}]}}]}})
    wait_for(server, NS, "chosen", lambda body: any(
        node["type"] == "Suspend" and node["phase"] == "Running"
        for node in body["status"].get("nodes", {}).values()))
    tab = page(server)
    open_workflow(tab, "chosen")
    assert not tab.all('[data-action="retry"]')
    tab.wait('[data-action="resume"]').click()
    select = tab.wait('dialog[open] select[name="env"]')
    assert select.get_attribute("value") == "dev"
    assert tab.driver.switch_to.active_element == select
    tab.shot("resume-dialog")
    choose(select, "prod")
    tab.wait("dialog[open] button[value=ok]").click()
    done = wait_for(server, NS, "chosen", ended, timeout=20)
    node = next(n for n in done["status"]["nodes"].values() if n["type"] == "Suspend")
    assert node["outputs"]["parameters"] == [{"name": "env", "value": "prod"}]
    assert done["status"]["phase"] == "Succeeded"


def test_a_failed_run_is_retried_and_a_run_deleted_from_the_page(
        start: Callable[..., Server], page: Callable[[Server], Any], tmp_path: Path) -> None:
    server = start()
    flag = tmp_path / "fixed"
    create(server, workflow("flaky", f"test -e {flag}"))
    wait_for(server, NS, "flaky", ended)
    tab = page(server)
    open_workflow(tab, "flaky")
    assert not tab.all('[data-action="resume"]') and not tab.all('[data-action="stop"]')
    flag.touch()
    tab.wait('[data-action="retry"]').click()
    done = wait_for(server, NS, "flaky", lambda body: body["status"].get("phase") == "Succeeded",
                    timeout=20)
    assert done["metadata"]["name"] == "flaky"
    # delete: only after the confirmation, then back to the list
    open_workflow(tab, "flaky")
    tab.wait('[data-action="delete"]').click()
    tab.wait("dialog[open]")
    tab.shot("delete-dialog")
    tab.wait("dialog[open] menu button:not([value=ok])").click()  # Cancel
    assert server.call("GET", f"/api/v1/workflows/{NS}/flaky")[0] == 200
    tab.wait('[data-action="delete"]').click()
    tab.wait("dialog[open] button[value=ok]").click()
    tab.wait('[data-view="list"]')
    assert tab.driver.current_url.endswith(f"/workflows/{NS}")
    assert server.call("GET", f"/api/v1/workflows/{NS}/flaky")[0] == 404
