"""`sublimate server`'s CronWorkflows: when schedules are due (exact times and zones, DST
included), and, through a real server's HTTP API with every body checked against Argo's
OpenAPI document, what firing does: the workflows started, the CronWorkflow's status, the
concurrency policy, history limits, stop strategy, suspend, a schedule missed while the server
was down, `sublimate install` / `sublimate cron trigger` and Hera's CronWorkflow."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from sublimate.pipelines.cli import main as cli_main
from sublimate.pipelines.server.cron import (
    ScheduleError,
    parse_schedule,
    stop_reached,
    when_holds,
    zone,
)

from .argo_api import Server, on_the_wire, wait_for, workflow

BASE = "/api/v1/cron-workflows/ns"
CRON_LABEL = "workflows.argoproj.io/cron-workflow"


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


def cron_workflow(name: str, command: str, schedule: str = "@every 2s",
                  **spec: Any) -> dict:
    return {"metadata": {"name": name, "labels": {"team": "ml"}},
            "spec": {"schedules": [schedule], **spec,
                     "workflowSpec": workflow("unused", command)["spec"]}}


def children(server: Server, cron: str) -> list[dict]:
    _, listing = server.call("GET", "/api/v1/workflows/ns",
                             params={"listOptions.labelSelector": f"{CRON_LABEL}={cron}"})
    return listing["items"]


def wait_until(check: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


# ----------------------------------------------------------------- when schedules are due


def test_schedules_are_due_on_the_wall_clock_of_their_zone() -> None:
    new_york = zone("America/New_York")
    daily = parse_schedule("30 2 * * *", new_york)
    assert daily.next_after(utc(2024, 3, 8, 12)) == utc(2024, 3, 9, 7, 30)  # 02:30 EST
    # 02:30 does not exist on 10 March (clocks go 02:00 -> 03:00): not run that day, as robfig
    assert daily.next_after(utc(2024, 3, 9, 7, 30)) == utc(2024, 3, 11, 6, 30)  # 02:30 EDT
    # 01:30 happens twice on 3 November (clocks go 02:00 -> 01:00): run both times, as robfig
    early = parse_schedule("30 1 * * *", new_york)
    first = early.next_after(utc(2024, 11, 3))
    assert first == utc(2024, 11, 3, 5, 30) and early.next_after(first) == utc(2024, 11, 3, 6, 30)
    assert early.last_between(utc(2024, 11, 1), utc(2024, 11, 3, 6)) == first
    assert early.last_between(utc(2024, 11, 3, 6, 30), utc(2024, 11, 3, 7)) is None

    tokyo = parse_schedule("0 9 * * mon-fri", zone("Asia/Tokyo"))
    assert tokyo.next_after(utc(2024, 11, 1, 0, 0)) == utc(2024, 11, 4, 0, 0)  # Mon 09:00 JST
    # a prefix overrides the zone given; day of month OR day of week when both are restricted
    either = parse_schedule("CRON_TZ=UTC 0 0 13 * fri", new_york)
    assert either.next_after(utc(2024, 9, 10)) == utc(2024, 9, 13)  # Friday the 13th
    assert either.next_after(utc(2024, 9, 13)) == utc(2024, 9, 20)  # the next Friday
    # a day of month that only leap years have; a step over `*`, names, descriptors
    assert parse_schedule("0 0 29 feb *", zone("UTC")).next_after(utc(2025, 1, 1)) == \
        utc(2028, 2, 29)
    assert parse_schedule("*/20 * * * *", zone("UTC")).next_after(utc(2024, 1, 1, 0, 41)) == \
        utc(2024, 1, 1, 1, 0)
    assert parse_schedule("@weekly", zone("UTC")).next_after(utc(2024, 1, 1)) == utc(2024, 1, 7)
    every = parse_schedule("@every 1m30s", zone("UTC"))
    assert every.next_after(utc(2024, 1, 1, 0, 2), anchor=utc(2024, 1, 1)) == \
        utc(2024, 1, 1, 0, 3)
    assert every.last_between(utc(2024, 1, 1, 0, 1), utc(2024, 1, 1, 0, 4),
                              anchor=utc(2024, 1, 1)) == utc(2024, 1, 1, 0, 3)
    for bad, why in (("* * * *", "expected exactly 5 fields"), ("60 * * * *", "above maximum"),
                     ("* * * * 7", "above maximum"), ("5-1 * * * *", "beyond end"),
                     ("@sometimes", "unrecognized descriptor"), ("@every soon", "duration"),
                     ("x * * * *", "failed to parse int")):
        with pytest.raises(ScheduleError, match=why):
            parse_schedule(bad, zone("UTC"))
    with pytest.raises(ScheduleError, match="unknown time zone"):
        zone("Mars/Olympus_Mons")


def test_stop_strategy_and_when_expressions() -> None:
    cron = {"metadata": {"name": "nightly", "namespace": "ns"},
            "status": {"failed": 3, "succeeded": 1}}
    assert stop_reached("cronworkflow.failed >= 3", cron)
    assert not stop_reached("cronworkflow.succeeded > 1", cron)
    with pytest.raises(ScheduleError, match="not a boolean"):
        stop_reached("cronworkflow.failed", cron)
    assert when_holds("{{cronworkflow.failed}} < 5", cron)
    assert not when_holds("{{= cronworkflow.succeeded == 0 }}", cron)
    assert when_holds("", cron)


# ------------------------------------------------------------------ through the server


def test_cron_workflows_are_checked_as_argo_checks_them(start: Callable[..., Server]) -> None:
    server = start()
    good = cron_workflow("checked", "true", "0 2 * * *", timezone="Europe/Paris")
    for change, field in (
            ({"schedules": ["61 * * * *"]}, "cronWorkflow.spec.schedules[0]"),
            ({"schedules": []}, "cronWorkflow.spec.schedules"),
            ({"timezone": "Nowhere/Else"}, "cronWorkflow.spec.timezone"),
            ({"concurrencyPolicy": "Sometimes"}, "cronWorkflow.spec.concurrencyPolicy"),
            ({"startingDeadlineSeconds": -1}, "cronWorkflow.spec.startingDeadlineSeconds"),
            ({"workflowSpec": {**good["spec"]["workflowSpec"], "entrypoint": "nowhere"}},
             "cronWorkflow.spec.workflowSpec"),
            ({"workflowSpec": {"workflowTemplateRef": {"name": "absent"}}},
             "cronWorkflow.spec.workflowSpec"),
            ({"scheduel": "* * * * *"}, "cronWorkflow.spec.scheduel")):
        bad = {**good, "spec": {**good["spec"], **change}}
        for method, path in (("POST", BASE), ("POST", f"{BASE}/lint")):
            status, body = server.call(method, path, json={"cronWorkflow": bad})
            assert (status, body["code"]) == (400, 3), (change, body)
            assert body["message"].startswith(field), (change, body)
    for name in ("a" * 53, "../escape", "Upper"):
        status, body = server.call("POST", BASE, json={"cronWorkflow": {
            **good, "metadata": {"name": name}}})
        assert (status, body["code"]) == (400, 3)
        assert body["message"].startswith("cronWorkflow.metadata.name"), body
    assert not list((server.home / "server").rglob("*escape*"))

    # the older `schedule` is kept as one of `schedules`, as Argo v4 and Hera 7 have it
    legacy = {**good, "spec": {**{k: v for k, v in good["spec"].items() if k != "schedules"},
                               "schedule": "15 3 * * *"}}
    status, linted = server.call("POST", f"{BASE}/lint", json={"cronWorkflow": legacy})
    assert status == 200 and linted["spec"]["schedules"] == ["15 3 * * *"]
    assert "schedule" not in linted["spec"]

    status, created = server.call("POST", BASE, json={"cronWorkflow": good})
    assert status == 200 and created["metadata"]["uid"] and created["metadata"]["namespace"] == "ns"
    assert server.call("POST", BASE, json={"cronWorkflow": good})[1]["code"] == 6
    assert server.call("GET", f"{BASE}/absent")[0] == 404
    assert server.call("GET", f"{BASE}/..%2F..%2Fworkflows")[0] == 404
    assert server.call("PUT", f"{BASE}/absent", json={"cronWorkflow": good})[0] == 404
    assert server.call("PUT", f"{BASE}/absent/suspend")[0] == 404
    status, body = server.call("PUT", f"{BASE}/checked", json={"cronWorkflow": {
        **good, "metadata": {"name": "other"}}})
    assert (status, body["code"]) == (400, 3) and "name in the path" in body["message"]

    # an update keeps what the server owns, and Argo's labels select
    updated_spec = {**good["spec"], "schedules": ["0 3 * * *"]}
    status, updated = server.call("PUT", f"{BASE}/checked", json={"cronWorkflow": {
        **good, "spec": updated_spec}})
    assert status == 200 and updated["metadata"]["resourceVersion"] == "2"
    assert updated["metadata"]["uid"] == created["metadata"]["uid"]
    for selector, count in (("team=ml", 1), ("team!=ml", 0), ("!team", 0)):
        _, listing = server.call("GET", BASE, params={"listOptions.labelSelector": selector})
        assert len(listing["items"]) == count
    assert server.call("GET", "/api/v1/cron-workflows/other")[1]["items"] == []

    # kept on disk: a restarted server has it, and the scheduler reads it again
    server.stop()
    again = start()
    _, kept = again.call("GET", f"{BASE}/checked")
    assert kept["spec"]["schedules"] == ["0 3 * * *"] and kept["spec"]["timezone"] == \
        "Europe/Paris"
    assert again.call("DELETE", f"{BASE}/checked") == (200, {})
    assert again.call("DELETE", f"{BASE}/checked")[0] == 404


def test_schedules_fire_with_argo_names_and_status(start: Callable[..., Server]) -> None:
    server = start()
    # Forbid: the first run sleeps through the next schedules, which are skipped
    cron = cron_workflow("sleepy", "sleep 30", concurrencyPolicy="Forbid",
                         workflowMetadata={"labels": {"from": "cron"}})
    assert server.call("POST", BASE, json={"cronWorkflow": cron})[0] == 200
    running = wait_until(lambda: children(server, "sleepy"))
    time.sleep(5)  # two more schedules come and go
    assert len(children(server, "sleepy")) == 1
    child = running[0]
    stamp = int(child["metadata"]["name"].removeprefix("sleepy-"))
    assert abs(stamp - time.time()) < 30
    assert child["metadata"]["labels"]["from"] == "cron"
    scheduled = child["metadata"]["annotations"]["workflows.argoproj.io/scheduled-time"]
    assert datetime.fromisoformat(scheduled).timestamp() == stamp
    _, status = server.call("GET", f"{BASE}/sleepy")
    assert [ref["name"] for ref in status["status"]["active"]] == [child["metadata"]["name"]]
    assert status["status"]["phase"] == "Active"
    assert datetime.fromisoformat(status["status"]["lastScheduledTime"]).timestamp() == stamp

    # Replace: the running one is terminated for the next
    replacing = {**cron, "spec": {**cron["spec"], "concurrencyPolicy": "Replace"}}
    assert server.call("PUT", f"{BASE}/sleepy", json={"cronWorkflow": replacing})[0] == 200
    wait_until(lambda: len(children(server, "sleepy")) >= 2, timeout=30)
    first = wait_for(server, "ns", child["metadata"]["name"],
                     lambda body: body["status"]["phase"] == "Failed")
    assert "Terminate" in first["status"]["message"]

    # suspended, nothing starts; deleted, its workflows go with it (Kubernetes' owner GC)
    _, suspended = server.call("PUT", f"{BASE}/sleepy/suspend")
    assert suspended["spec"]["suspend"] is True
    time.sleep(0.5)
    count = len(children(server, "sleepy"))
    time.sleep(4)
    assert len(children(server, "sleepy")) == count
    _, resumed = server.call("PUT", f"{BASE}/sleepy/resume")
    assert resumed["spec"]["suspend"] is False
    wait_until(lambda: len(children(server, "sleepy")) > count, timeout=30)
    assert server.call("DELETE", f"{BASE}/sleepy") == (200, {})
    wait_until(lambda: not children(server, "sleepy"), timeout=60)


def test_history_limits_and_stop_strategy(start: Callable[..., Server]) -> None:
    server = start()
    failing = cron_workflow("flaky", "exit 3", "@every 1s", failedJobsHistoryLimit=1,
                            stopStrategy={"expression": "cronworkflow.failed >= 3"})
    assert server.call("POST", BASE, json={"cronWorkflow": failing})[0] == 200
    stopped = wait_until(lambda: (body := server.call("GET", f"{BASE}/flaky")[1])
                         ["status"].get("phase") == "Stopped" and body, timeout=60)
    assert stopped["status"]["failed"] == 3 and stopped["status"].get("succeeded", 0) == 0
    assert stopped["metadata"]["labels"]["cronworkflows.argoproj.io/completed"] == "true"
    # the older failed workflows are deleted: one kept (failedJobsHistoryLimit)
    wait_until(lambda: len(children(server, "flaky")) == 1, timeout=30)
    time.sleep(3)  # stopped: nothing more starts
    assert len(children(server, "flaky")) == 1
    assert server.call("GET", f"{BASE}/flaky")[1]["status"]["failed"] == 3

    # succeeded ones: the default keeps 3; `when` false starts nothing
    passing = cron_workflow("steady", "true", "@every 1s")
    assert server.call("POST", BASE, json={"cronWorkflow": passing})[0] == 200
    wait_until(lambda: server.call("GET", f"{BASE}/steady")[1]["status"].get("succeeded", 0)
               >= 5, timeout=60)
    assert len(children(server, "steady")) <= 4  # 3 kept, perhaps one running
    wait_until(lambda: len([c for c in children(server, "steady")
                            if c["status"]["phase"] == "Succeeded"]) == 3)
    never = cron_workflow("never", "true", "@every 1s", when="{{cronworkflow.failed}} > 0")
    assert server.call("POST", BASE, json={"cronWorkflow": never})[0] == 200
    time.sleep(3)
    assert children(server, "never") == []
    assert "lastScheduledTime" not in server.call("GET", f"{BASE}/never")[1]["status"]


def test_a_schedule_missed_while_down_runs_once_within_the_deadline(
        start: Callable[..., Server]) -> None:
    first = start()
    # yearly, at midnight on 1 January: last run a year before the last one due
    for name, deadline in (("catch-up", 400 * 86400), ("too-late", 60)):
        cron = cron_workflow(name, "true", "0 0 1 1 *", timezone="UTC",
                             startingDeadlineSeconds=deadline)
        assert first.call("POST", BASE, json={"cronWorkflow": cron})[0] == 200
    first.stop()
    this_year = datetime.now(UTC).year
    missed = datetime(this_year, 1, 1, tzinfo=UTC)
    for name in ("catch-up", "too-late"):
        path = first.home / "server" / "cron-workflows" / "ns" / f"{name}.json"
        stored = json.loads(path.read_text())
        stored["status"] = {"lastScheduledTime": f"{this_year - 1}-01-01T00:00:00Z"}
        stored["metadata"]["annotations"] = {
            "cronworkflows.argoproj.io/last-used-schedule": "CRON_TZ=UTC 0 0 1 1 *"}
        path.write_text(json.dumps(stored))

    second = start()
    second.call("GET", BASE)
    ran = wait_until(lambda: children(second, "catch-up"), timeout=30)
    assert [item["metadata"]["name"] for item in ran] == [f"catch-up-{int(missed.timestamp())}"]
    # the status is written just after the workflow is made, as Argo's controller writes it
    def last_scheduled() -> str | None:
        return second.call("GET", f"{BASE}/catch-up")[1]["status"].get("lastScheduledTime")

    assert wait_until(lambda: last_scheduled() == f"{this_year}-01-01T00:00:00Z", timeout=30)
    assert children(second, "too-late") == []
    second.stop()
    third = start()
    third.call("GET", BASE)
    time.sleep(2)
    assert len(children(third, "catch-up")) == 1  # once: the next start has nothing missed


def test_install_and_cron_trigger_against_the_server(
        start: Callable[..., Server], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    server = start()
    seen = on_the_wire(monkeypatch)
    assert cli_main(["install", "--argo-server", server.url, "-n", "ns"]) == 0
    out = capsys.readouterr().out
    assert "CronWorkflow/sublimate-train-nightly: created or updated" in out
    assert ("POST", f"{BASE}", 200) in seen
    # a second install updates what the first created
    assert cli_main(["install", "--argo-server", server.url, "-n", "ns"]) == 0
    assert ("PUT", f"{BASE}/sublimate-train-nightly", 200) in seen
    monkeypatch.undo()
    _, cron = server.call("GET", f"{BASE}/sublimate-train-nightly")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    assert cron["metadata"]["resourceVersion"] == "2"

    on_the_wire(monkeypatch)
    capsys.readouterr()
    assert cli_main(["cron", "trigger", "sublimate-train-nightly", "--argo-server", server.url,
                     "-n", "ns"]) == 0
    monkeypatch.undo()
    name = capsys.readouterr().out.split()[1]
    assert name.startswith("sublimate-train-nightly-")
    _, started = server.call("GET", f"/api/v1/workflows/ns/{name}")
    assert started["metadata"]["labels"][CRON_LABEL] == "sublimate-train-nightly"
    assert "workflows.argoproj.io/scheduled-time" in started["metadata"]["annotations"]
    # shown as the cron gave it (the reference), run as the template resolves it
    assert started["spec"]["workflowTemplateRef"] == {"name": "sublimate-retrain"}
    assert server.call("DELETE", f"/api/v1/workflows/ns/{name}") == (200, {})
    status, body = server.call("POST", "/api/v1/workflows/ns/submit", json={
        "resourceKind": "cronwf", "resourceName": "absent"})
    assert (status, body["code"]) == (404, 5)
    status, body = server.call("POST", "/api/v1/workflows/ns/submit", json={
        "resourceKind": "Pod", "resourceName": "x"})
    assert (status, body["code"]) == (400, 3) and body["message"].startswith("resourceKind")


def test_hera_cron_workflow(start: Callable[..., Server],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    from hera.workflows import Container, CronWorkflow, WorkflowsService
    from hera.workflows.models import (
        CronWorkflowResumeRequest,
        CronWorkflowSuspendRequest,
        UpdateCronWorkflowRequest,
    )

    server = start()
    seen = on_the_wire(monkeypatch)
    service = WorkflowsService(host=server.url, namespace="hera")
    with CronWorkflow(name="hera-nightly", schedules=["0 4 * * *"], timezone="Asia/Tokyo",
                      entrypoint="main", namespace="hera", workflows_service=service,
                      successful_jobs_history_limit=2) as cron:
        Container(name="main", image="alpine:3.20", command=["sh", "-c", "echo night"])
    created = cron.create()
    assert created.metadata.uid and created.spec.schedules == ["0 4 * * *"]
    got = service.get_cron_workflow("hera-nightly", namespace="hera")
    assert got.spec.timezone == "Asia/Tokyo" and got.spec.successful_jobs_history_limit == 2
    suspended = service.suspend_cron_workflow("hera-nightly", CronWorkflowSuspendRequest(
        name="hera-nightly", namespace="hera"), namespace="hera")
    assert suspended.spec.suspend is True
    resumed = service.resume_cron_workflow("hera-nightly", CronWorkflowResumeRequest(
        name="hera-nightly", namespace="hera"), namespace="hera")
    assert resumed.spec.suspend is False
    got.spec.schedules = ["30 4 * * *"]
    updated = service.update_cron_workflow("hera-nightly", UpdateCronWorkflowRequest(
        cron_workflow=got), namespace="hera")
    assert updated.spec.schedules == ["30 4 * * *"]
    assert [item.metadata.name for item in service.list_cron_workflows(
        namespace="hera").items or []] == ["hera-nightly"]
    cron.update()  # Hera's get-then-update, as `sublimate install` does
    service.delete_cron_workflow("hera-nightly", namespace="hera")
    assert service.list_cron_workflows(namespace="hera").items in (None, [])
    methods = {(method, path) for method, path, _ in seen}
    assert ("PUT", "/api/v1/cron-workflows/hera/hera-nightly/suspend") in methods
    assert ("DELETE", "/api/v1/cron-workflows/hera/hera-nightly") in methods
    assert all(status == 200 for _, _, status in seen)
