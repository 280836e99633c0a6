"""One training job per workflow step on a cluster: its deterministic name, in TorchX's
Kubernetes dry run, and what a (retried) launcher does about a job of that name, proven with
fake runners and a fake Kubernetes API (no cluster)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException
from torchx.specs import AppDef, AppState, AppStatus

from sublimate.components.launch import job_runner
from sublimate.components.launch.job_runner import (
    ATTACH,
    REPLACE,
    START,
    claim_job,
    job_handle,
    job_name,
    make_runner,
    previous_job_action,
)
from sublimate.components.launch.launcher import (
    FAILED,
    SUCCEEDED,
    build_app,
    run_attempt,
    scheduler_config,
)
from sublimate.components.launch.request import TrainRequest, plan_launch
from sublimate.components.steps.train import parse_args

RUNS = Path("/mnt/sublimate/runs")
# the restart mode's job (per-step recovery's layout: test_per_step_launcher.py)
ARGS = ["--data-dir", "/mnt/sublimate/datasets/digits", "--runs-root", str(RUNS),
        "--mount", "type=volume,src=sublimate-data,dst=/mnt/sublimate", "--stall-seconds", "0",
        "--recovery", "restart"]


def _kubernetes_app(request: TrainRequest) -> AppDef:
    return build_app(request, plan_launch(request, scheduler="kubernetes"))


def test_the_job_name_follows_the_workflow_and_the_run_folder() -> None:
    name = job_name("sublimate-train-x7k2q", RUNS / "sublimate-train-x7k2q")
    assert name == job_name("sublimate-train-x7k2q", RUNS / "sublimate-train-x7k2q")
    assert re.fullmatch(r"sublimate-train-x7k2q-[0-9a-f]{8}", name)
    # the same run-id resubmitted by another workflow is another job
    assert job_name("sublimate-train-zz9", RUNS / "sublimate-train-x7k2q") != name
    long = job_name("wf", RUNS / ("Resnet.50-" + "a" * 80))
    assert len(long) <= job_runner.JOB_NAME_MAX
    assert re.fullmatch(r"sublimate-resnet-50-a+-[0-9a-f]{8}", long)


def _kubernetes_job(argv: list[str]) -> dict:
    from kubernetes.client import ApiClient

    args = parse_args([*ARGS, *argv])
    with make_runner("kubernetes") as runner:
        info = runner.dryrun(_kubernetes_app(args), "kubernetes",
                             cfg=scheduler_config(args, "kubernetes"))
    return ApiClient().sanitize_for_serialization(info.request.resource)


def test_the_kubernetes_dryrun_renders_the_deterministic_name() -> None:
    argv = ["--workflow-name", "sublimate-train-x7k2q", "--nodes", "2"]
    job = _kubernetes_job(argv)
    name = job_name("sublimate-train-x7k2q", RUNS / "sublimate-train-x7k2q")
    assert job["metadata"]["name"] == name
    assert _kubernetes_job(argv)["metadata"]["name"] == name  # no random suffix
    for task in job["spec"]["tasks"]:
        pod = task["template"]
        assert pod["metadata"]["labels"]["app.kubernetes.io/instance"] == name
        assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == "sublimate-sync"
        # torchrun's rendezvous id is the app id TorchX substituted: the same name
        command = " ".join(pod["spec"]["containers"][0]["command"])
        assert re.search(rf"--rdzv-id '?{name}'? ", command)
    # without the option TorchX names the job itself, randomly
    from torchx.runner import get_runner

    args = parse_args([*ARGS, *argv])
    with get_runner() as runner:
        names = {runner.dryrun(_kubernetes_app(args), "kubernetes",
                               cfg={"queue": "default"}).request.resource["metadata"]["name"]
                 for _ in range(2)}
    assert len(names) == 2


# ------------------------------------------------------------- the decision, on fake runners


def _status(state: AppState) -> AppStatus:
    return AppStatus(state=state)


@pytest.mark.parametrize(("state", "ending", "fresh", "action"), [
    (None, "", False, START),
    (AppState.RUNNING, "", False, ATTACH),
    (AppState.PENDING, "", False, ATTACH),
    (AppState.SUCCEEDED, "", False, ATTACH),  # its results stand: follow it to its end
    (AppState.FAILED, "", False, REPLACE),
    (AppState.CANCELLED, "", False, REPLACE),
    (AppState.UNKNOWN, "", False, REPLACE),
    (AppState.RUNNING, "phase Terminating", False, REPLACE),
    (AppState.RUNNING, "", True, REPLACE),  # this launcher's own relaunch
])
def test_what_to_do_about_a_job_of_the_same_name(state: AppState | None, ending: str,
                                                 fresh: bool, action: str) -> None:
    status = None if state is None else _status(state)
    assert previous_job_action(status, ending, fresh) == action


class FakeRunner:
    """TorchX's Runner API as the launcher uses it, over one named job whose states are
    scripted: ``states`` are what status() returns in turn (the last one stays)."""

    def __init__(self, states: list[AppState | None], ending: str = "") -> None:
        self.states = states
        self.ending_reason = ending
        self.calls: list[tuple[str, ...]] = []

    def name(self) -> str:
        return "sublimate"

    def status(self, handle: str) -> AppStatus | None:
        self.calls.append(("status", handle))
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return None if state is None else _status(state)

    def ending(self, handle: str) -> str:
        return self.ending_reason

    def delete(self, handle: str) -> None:
        self.calls.append(("delete", handle))
        self.states = [None]  # gone

    def run(self, app: object, scheduler: str, cfg: dict) -> str:
        self.calls.append(("run", scheduler, str(cfg["job_name"])))
        self.states = [AppState.RUNNING, AppState.SUCCEEDED]
        return f"{scheduler}://sublimate/{cfg['namespace']}:{cfg['job_name']}"

    def cancel(self, handle: str) -> None:
        self.calls.append(("cancel", handle))

    def log_lines(self, *args: object, **kwargs: object) -> list[str]:
        return []

    def verbs(self) -> list[str]:
        return [call[0] for call in self.calls if call[0] != "status"]


HANDLE = "kubernetes://sublimate/ml:sublimate-r1-0123abcd"


def test_a_running_job_is_attached_not_started(capsys: pytest.CaptureFixture) -> None:
    runner = FakeRunner([AppState.RUNNING])
    assert claim_job(runner, HANDLE, fresh=False) is True
    assert runner.verbs() == []
    assert f"re-attached to {HANDLE} (RUNNING)" in capsys.readouterr().out


def test_a_failed_job_is_deleted_then_started_anew(capsys: pytest.CaptureFixture) -> None:
    runner = FakeRunner([AppState.FAILED])
    assert claim_job(runner, HANDLE, fresh=False, poll=0.01) is False
    assert runner.verbs() == ["delete"]
    assert f"deleting {HANDLE} (FAILED) before submitting it again" in capsys.readouterr().out


def test_an_ending_job_is_replaced_and_an_absent_one_started() -> None:
    runner = FakeRunner([AppState.RUNNING], ending="being deleted")
    assert claim_job(runner, HANDLE, fresh=False, poll=0.01) is False
    assert runner.verbs() == ["delete"]
    runner = FakeRunner([None])
    assert claim_job(runner, HANDLE, fresh=False) is False
    assert runner.verbs() == []


def test_a_job_that_will_not_go_is_one_clear_error() -> None:
    runner = FakeRunner([AppState.FAILED])
    runner.delete = lambda handle: None  # type: ignore[method-assign]  # it stays
    with pytest.raises(RuntimeError, match=r"still there 0s after deleting it; delete it by "
                                           r"hand \(kubectl delete vcjob\)"):
        claim_job(runner, HANDLE, fresh=False, wait_seconds=0.05, poll=0.01)


def _retried_step(tmp_path: Path, runner: FakeRunner) -> str:
    args = parse_args([*ARGS, "--run-dir", str(tmp_path / "r1"), "--workflow-name", "wf-1"])
    return run_attempt(runner, args, plan_launch(args, scheduler="kubernetes"), attempt=0)


def test_a_retried_step_follows_the_running_job_to_its_end(tmp_path: Path) -> None:
    runner = FakeRunner([AppState.RUNNING, AppState.RUNNING, AppState.SUCCEEDED])
    assert _retried_step(tmp_path, runner) == SUCCEEDED
    assert runner.verbs() == []  # never submitted, never cancelled


def test_a_retried_step_replaces_a_failed_job_and_starts_an_absent_one(tmp_path: Path) -> None:
    name = job_name("wf-1", tmp_path / "r1")
    runner = FakeRunner([AppState.FAILED])
    assert _retried_step(tmp_path, runner) == SUCCEEDED
    assert runner.verbs() == ["delete", "run"]
    assert ("run", "kubernetes", name) in runner.calls
    runner = FakeRunner([None])
    assert _retried_step(tmp_path, runner) == SUCCEEDED
    assert runner.verbs() == ["run"]


def test_a_relaunch_replaces_its_own_stopped_job(tmp_path: Path) -> None:
    args = parse_args([*ARGS, "--run-dir", str(tmp_path / "r1"), "--workflow-name", "wf-1"])
    runner = FakeRunner([AppState.RUNNING])  # still being torn down after the cancel
    plan = plan_launch(args, scheduler="kubernetes")
    assert run_attempt(runner, args, plan, attempt=1) == SUCCEEDED
    assert runner.verbs() == ["delete", "run"]


def test_a_failed_attached_job_fails_the_step(tmp_path: Path) -> None:
    runner = FakeRunner([AppState.RUNNING, AppState.FAILED])
    assert _retried_step(tmp_path, runner) == FAILED


# ------------------------------------------------- the Runner and scheduler, on a fake API


class FakeVolcanoApi:
    """The custom-objects API TorchX's Kubernetes scheduler calls, over a dict of jobs."""

    def __init__(self, jobs: dict[str, dict]) -> None:
        self.jobs = jobs
        self.deleted: list[str] = []

    def _job(self, name: str) -> dict:
        if name not in self.jobs:
            raise ApiException(status=404, reason="Not Found")
        return self.jobs[name]

    def get_namespaced_custom_object_status(self, name: str, **kwargs: object) -> dict:
        return self._job(name)

    def get_namespaced_custom_object(self, name: str, **kwargs: object) -> dict:
        return self._job(name)

    def delete_namespaced_custom_object(self, name: str, **kwargs: object) -> None:
        self._job(name)
        self.deleted.append(name)
        del self.jobs[name]


def _runner_on(api: FakeVolcanoApi) -> object:
    scheduler = job_runner._kubernetes_scheduler_class()("sublimate", client=None)
    scheduler._custom_objects_api = lambda: api
    return job_runner._runner_class()("sublimate", {"kubernetes": lambda *_, **__: scheduler})


def test_the_runner_finds_deletes_and_reports_named_jobs() -> None:
    api = FakeVolcanoApi({
        "ended": {"metadata": {"name": "ended"}, "status": {"state": {"phase": "Failed"}}},
        "ending": {"metadata": {"name": "ending"},
                   "status": {"state": {"phase": "Terminating"}}},
        "deleting": {"metadata": {"name": "deleting", "deletionTimestamp": "2026-01-01T00:00Z"},
                     "status": {"state": {"phase": "Running"}}},
    })
    runner = _runner_on(api)
    handle = job_handle(runner, "kubernetes", {"namespace": "ml", "job_name": "ended"})
    assert handle == "kubernetes://sublimate/ml:ended"
    assert runner.status("kubernetes://sublimate/ml:absent") is None  # not TorchX's 404 error
    assert runner.status(handle).state == AppState.FAILED
    assert runner.ending("kubernetes://sublimate/ml:ending") == "phase Terminating"
    assert runner.ending("kubernetes://sublimate/ml:deleting") == "being deleted"
    runner.delete(handle)  # an ended job, which TorchX's cancel leaves in place
    runner.delete(handle)  # already gone: nothing to do
    assert api.deleted == ["ended"] and runner.status(handle) is None
