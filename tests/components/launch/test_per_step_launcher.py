"""The launcher's side of per-step recovery, without a job: the settings' rules, the TorchX app
(a torchrun per node, a Lighthouse role after the nodes), the Volcano job on Kubernetes (a lost
node restarted alone), the replacer's decisions, chaos's schedule, and the summary of what each
loss cost (from records laid out as the workers write them)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from torchx.specs import AppState

from sublimate.components.base import elastic_errors, replica_groups, run_files
from sublimate.components.base.replica_groups import StepCounters
from sublimate.components.base.settings import (
    SettingError,
    check,
    collective_timeout,
    max_restarts,
    parse_values,
    recovery_mode,
)
from sublimate.components.launch import launcher, per_step, volcano_job
from sublimate.components.launch.chaos import Chaos
from sublimate.components.launch.launcher import build_app
from sublimate.components.launch.request import plan_launch
from sublimate.components.steps.train import parse_args

ARGS = ["--data-dir", "/mnt/sublimate/datasets/digits", "--run-dir", "/tmp/run",
        "--workflow-name", "w"]


# -- settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(("texts", "refusal"), [
    ({"recovery": "per-step", "algorithm": "async"},
     "recovery per-step: algorithm async keeps its own parameter server"),
    ({"recovery": "per-step", "entrypoint": "train.py"},
     "recovery per-step runs sublimate's own step loop"),
    ({"chaos-mtbf": "5"}, "chaos-mtbf kills nodes of a local_netns cluster"),
    ({"nodes": "2:4", "max-restarts": "0", "recovery": "restart"},
     "elastic training needs max-restarts of at least 1"),
])
def test_settings_refuse_what_cannot_run_naming_the_setting(texts: dict[str, str],
                                                            refusal: str) -> None:
    with pytest.raises(SettingError, match=refusal):
        check(parse_values(texts))


@pytest.mark.parametrize(("texts", "mode"), [
    ({}, "per-step"),  # the default pipeline: sync on 2 nodes
    ({"nodes": "3:4"}, "per-step"),
    ({"algorithm": "bmuf"}, "restart"),  # its rounds as transactions cost 12 to 15%
    ({"algorithm": "easgd"}, "restart"),
    ({"algorithm": "bmuf", "recovery": "per-step"}, "per-step"),
    ({"recovery": "restart"}, "restart"),
    ({"nodes": "1"}, "restart"),  # no peer to go on with
    ({"algorithm": "async"}, "restart"),  # its parameter server has its own failure story
    ({"entrypoint": "train.py"}, "restart"),  # a torchrun script averages over its node only
    ({"checkpoint-format": "dcp"}, "restart"),
    ({"data-loading": "stream"}, "restart"),
    ({"rendezvous": "etcd-v2"}, "restart"),
    ({"algorithm": "diloco", "recovery": "restart"}, "per-step"),  # always: torchft's Manager
])
def test_recovery_auto_is_per_step_wherever_the_job_can_run_it(texts: dict[str, str],
                                                               mode: str) -> None:
    assert recovery_mode(parse_values(texts)) == mode
    check(parse_values(texts))  # and auto never picks what the checks refuse


def test_recovery_auto_is_restart_for_a_split_that_streams() -> None:
    assert recovery_mode(parse_values({}), streamed=True) == "restart"
    assert recovery_mode(parse_values({"recovery": "per-step"}), streamed=True) == "per-step"


def test_auto_settings_follow_the_recovery_mode() -> None:
    restart = {"recovery": "restart"}
    assert max_restarts(parse_values(restart)) == 0
    # elastic, left at auto: works
    assert max_restarts(parse_values({**restart, "nodes": "1:2"})) == 3
    assert max_restarts(parse_values({})) == 10  # auto: per-step on 2 nodes
    assert max_restarts(parse_values({"recovery": "per-step", "max-restarts": "2"})) == 2
    assert collective_timeout(parse_values(restart)) == 300
    assert collective_timeout(parse_values({})) == 30
    assert collective_timeout(parse_values({"recovery": "per-step",
                                            "collective-timeout": "7"})) == 7
    check(parse_values({**restart, "nodes": "1:2"}))  # refused before auto restarts existed
    # per-step keeps every node's slice of the batch: 64 need only divide by 4, not by 3 or 2
    check(parse_values({"nodes": "2:4"}))
    with pytest.raises(SettingError, match="not divisible by nodes x procs-per-node = 3"):
        check(parse_values({**restart, "nodes": "2:4", "max-restarts": "1"}))


# -- the app and the Volcano job -------------------------------------------------------------


def test_a_per_step_app_is_a_torchrun_per_node_and_a_lighthouse_after_them() -> None:
    args = parse_args([*ARGS, "--nodes", "3", "--recovery", "per-step",
                       "--global-batch-size", "60"])
    app = build_app(args, plan_launch(args, scheduler="local_cwd"))
    worker, lighthouse = app.roles
    assert (worker.name, worker.num_replicas, lighthouse.name, lighthouse.num_replicas) == \
        ("worker", 3, "lighthouse", 1)
    command = worker.args[1]
    # every node its own single-node torchrun and store, never restarted in place
    assert "--nnodes 1 " in command and "--rdzv-backend static" in command
    assert "--rdzv-endpoint localhost:0" in command and "--max-restarts 0" in command
    assert worker.env[replica_groups.GROUP_ENV] == "${replica_id}"
    assert worker.env[replica_groups.GROUPS_ENV] == "3"
    assert worker.env[replica_groups.MIN_GROUPS_ENV] == "1"  # a plain count: any survivor
    port = worker.env[replica_groups.LIGHTHOUSE_PORT_ENV]
    assert f"--port {port} --min-groups 1 --bind ${{SUBLIMATE_NODE_ADDR:-127.0.0.1}}" in \
        lighthouse.args[1]
    request = parse_args([*ARGS, "--nodes", "2:4", "--recovery", "per-step"])
    elastic = build_app(request, plan_launch(request, scheduler="local_cwd"))
    assert elastic.roles[0].env[replica_groups.MIN_GROUPS_ENV] == "2"


def _kubernetes_per_step(nodes: str = "2:4", max_restarts: int = 5) -> Any:
    from sublimate.components.launch.job_runner import make_runner

    args = parse_args([*ARGS, "--nodes", nodes, "--recovery", "per-step", "--scheduler",
                       "kubernetes", "--max-restarts", str(max_restarts), "--mount",
                       "type=volume,src=sublimate-data,dst=/mnt/sublimate"])
    app = build_app(args, plan_launch(args, scheduler="kubernetes"))
    return make_runner("kubernetes").dryrun(app, "kubernetes",  # type: ignore[attr-defined]
                                            cfg={"queue": "default", "job_name": "job-x"})


def test_on_kubernetes_no_number_of_lost_pods_up_to_the_budget_fails_the_job() -> None:
    info = _kubernetes_per_step("2:4", max_restarts=5)
    spec = info.request.resource["spec"]
    # the training nodes are one task of 4 pods (launch/volcano_job.py); the lighthouse is no
    # task of the job (its Deployment, below)
    (worker_task,) = spec["tasks"]
    assert (worker_task["name"], worker_task["replicas"]) == ("worker", 4)
    # a lost node's pod is replaced alone; all four nodes done completes the job
    assert worker_task["policies"] == [{"event": "PodFailed", "action": "RestartPod"},
                                       {"event": "PodEvicted", "action": "RestartPod"},
                                       {"event": "TaskCompleted", "action": "CompleteJob"}]
    # Volcano adds one to the job's retryCount per RestartPod and fails the job once it
    # reaches maxRetry, which an unset or zero value makes 3 at admission (the third pod lost
    # failed the job): one above 5 replacements of each of the 4 nodes. A task's maxRetry
    # counts only restarts in place, and the task's minAvailable, unset, becomes its replicas.
    assert spec["maxRetry"] == 5 * 4 + 1 and "maxRetry" not in worker_task
    assert (spec["minAvailable"], worker_task["minAvailable"]) == (2, 2)
    assert "minSuccess" not in spec and "policies" not in spec
    # no svc plugin: it deletes the job's Service on every RestartPod
    assert spec["plugins"] == {"env": []}
    # the values Volcano's admission accepts (pkg/webhooks/admission/jobs/validate/util.go)
    events = {"*", "PodPending", "PodFailed", "PodEvicted", "Unknown", "TaskCompleted",
              "TaskFailed", "JobUpdated"}
    actions = {"AbortJob", "RestartJob", "RestartTask", "RestartPod", "RestartPartition",
               "TerminateJob", "CompleteJob", "ResumeJob"}
    for policy in worker_task["policies"]:
        assert policy["event"] in events and policy["action"] in actions
    worker = worker_task["template"].spec.containers[0]
    assert "TORCHX_RANK0_HOST" not in " ".join(worker.command)
    env = {variable.name: variable.value for variable in worker.env}
    # each node's group is its index in the task (Volcano's env plugin); the lighthouse is its
    # Service's name
    assert replica_groups.GROUP_ENV not in env and env[replica_groups.GROUPS_ENV] == "4"
    assert env[replica_groups.LIGHTHOUSE_HOSTS_ENV] == "job-x-lighthouse"
    assert "$(VC_TASK_INDEX)" in " ".join(worker.command)
    assert replica_groups.ReplicaGroups.from_env(
        {**env, "VC_TASK_INDEX": "3"}).lighthouse == "http://job-x-lighthouse:29510"


def test_on_kubernetes_the_lighthouse_is_a_deployment_behind_a_service(tmp_path: Path) -> None:
    import shutil
    import subprocess

    import yaml

    from tests.conftest import REPO, require

    info = _kubernetes_per_step()
    assert repr(info.request) == str(info.request)  # a dry run prints the repr: the YAML
    documents = list(yaml.safe_load_all(str(info.request)))
    job, deployment, service = documents
    assert job["kind"] == "Job" and [task["name"] for task in job["spec"]["tasks"]] == ["worker"]
    assert (deployment["kind"], deployment["metadata"]["name"]) == ("Deployment",
                                                                    "job-x-lighthouse")
    assert (service["kind"], service["metadata"]["name"]) == ("Service", "job-x-lighthouse")
    pod = deployment["spec"]["template"]
    assert pod["spec"]["restartPolicy"] == "Always" and deployment["spec"]["replicas"] == 1
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"] == selector
    assert selector.items() <= pod["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    assert port["port"] == port["targetPort"] == 29510
    assert "--bind 0.0.0.0" in " ".join(pod["spec"]["containers"][0]["command"])
    # Kubernetes' own schemas, strict (kubernetes-validate, which CI installs)
    validator = shutil.which("kubernetes-validate") or next(
        (str(p) for p in [REPO / ".tools" / "bin" / "kubernetes-validate"] if p.exists()), None)
    require(validator is not None, "kubernetes-validate is not installed (run .ci/run)")
    files = []
    for document in (deployment, service):
        path = tmp_path / f"{document['kind']}.yaml"
        path.write_text(yaml.safe_dump(document))
        files.append(str(path))
    completed = subprocess.run([str(validator), "--strict", *files], capture_output=True,
                               text=True)
    assert completed.returncode == 0, completed.stdout + completed.stderr


# -- the replacer ----------------------------------------------------------------------------


class FakeRunner:
    """Replica states in sequence, and the restarts asked for."""

    def __init__(self, states: list[dict[tuple[str, int], AppState]]) -> None:
        self.states, self.restarts = states, []

    def replica_states(self, handle: str) -> dict[tuple[str, int], AppState]:
        return self.states.pop(0)

    def restart_replica(self, handle: str, role: str, replica: int,
                        env: dict[str, str]) -> None:
        self.restarts.append((role, replica, env))


R, S, F = AppState.RUNNING, AppState.SUCCEEDED, AppState.FAILED


def _states(*workers: AppState, lighthouse: AppState = R) -> dict[tuple[str, int], AppState]:
    return {**{("worker", i): state for i, state in enumerate(workers)},
            ("lighthouse", 0): lighthouse}


def test_the_replacer_replaces_a_lost_node_alone_and_ends_as_the_nodes_end() -> None:
    runner = FakeRunner([_states(R, R, R), _states(F, R, R), _states(R, R, R),
                         _states(R, R, R, lighthouse=F), _states(S, R, S), _states(S, S, S)])
    replacer = per_step.Replacer(runner, "h", budget=2)
    outcomes = [replacer.check() for _ in range(6)]
    assert outcomes == [None, None, None, None, None, "succeeded"]
    (role, node, env), lighthouse = runner.restarts
    # the environment it had, as Volcano restarts a pod: it knows itself by its start record
    assert (role, node, set(env)) == ("worker", 0, {"SUBLIMATE_LAUNCH_TIME"})
    assert float(env["SUBLIMATE_LAUNCH_TIME"]) > 0  # the replacement's start-up clock
    assert lighthouse == ("lighthouse", 0, {})
    assert [(loss.node, loss.replacement) for loss in replacer.losses] == [(0, 1)]


def test_a_stopping_launcher_replaces_no_node() -> None:
    # Stopped by a signal (its runner killed) while it followed the job, the launcher must
    # cancel the job, not start nodes under the cancel (CI once saw a stopped run's agents and
    # Lighthouse outlive it).
    stop = threading.Event()
    stop.set()
    runner = FakeRunner([_states(F, R, lighthouse=F)])
    replacer = per_step.Replacer(runner, "h", budget=3, stop=stop)
    assert replacer.check() is None and runner.restarts == [] and replacer.losses == []


def test_every_node_lost_falls_back_to_a_relaunch_and_a_node_out_of_replacements_fails() -> None:
    replacer = per_step.Replacer(FakeRunner([_states(F, F)]), "h", budget=3)
    assert replacer.check() == "lost" and "lost every node (node0, node1)" in replacer.message
    runner = FakeRunner([_states(F, R), _states(F, R)])
    replacer = per_step.Replacer(runner, "h", budget=1)
    assert replacer.check() is None
    assert replacer.check() == "failed" and "node0 was lost again after 1" in replacer.message
    # a node that ends after the last step was committed is not replaced: the job is done
    runner = FakeRunner([_states(F, S)])
    assert per_step.Replacer(runner, "h", budget=3).check() == "succeeded"
    assert runner.restarts == []


def _error_file(run_dir: Path, node: int, app_id: str, message: str,
                monkeypatch: pytest.MonkeyPatch) -> None:
    """What a node's training process writes when it raises (elastic_errors.write_failure),
    where torchrun puts it: every per-step node is a torchrun of its own, app-id-<node>."""
    path = run_dir / "logs" / "elastic" / f"node{node}" / f"{app_id}-{node}_x1y2z3w4" / \
        "attempt_0" / "0" / "error.json"
    path.parent.mkdir(parents=True)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    elastic_errors.write_failure(message)


def test_a_node_whose_code_raised_fails_the_job_in_one_line_and_is_not_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Replaced like a lost node, a node whose model raised ran into the same error again, ten
    # times per node, then the job relaunched ten times more: a user's bug, as recovery.
    app = "sublimate-sync-abc"
    monkeypatch.setenv("RANK", "0")  # each node its own torchrun: rank 0 of its node
    _error_file(tmp_path, 1, "sublimate-sync-older", "ValueError: another job's", monkeypatch)
    runner = FakeRunner([_states(R, F), _states(R, F)])
    replacer = per_step.Replacer(runner, f"local_cwd://torchx/{app}", budget=3,
                                 run_dir=tmp_path)
    assert replacer.check() is None  # killed (no error file of this job): replaced
    assert [node for _, node, _ in runner.restarts] == [1]
    time.sleep(1.01)  # error files are dated to the second: after the replacement started
    _error_file(tmp_path, 1, app, "ValueError: my model's forward is broken", monkeypatch)
    assert replacer.check() == "failed"
    assert [node for _, node, _ in runner.restarts] == [1]  # not replaced again
    assert replacer.message.startswith("rank 0 (node1) failed: ValueError: my model's forward "
                                       "is broken; its traceback: ")
    assert replacer.message.endswith("(a failure of the training code, not a lost node: not "
                                     "replaced)")


# -- chaos -----------------------------------------------------------------------------------


def test_chaos_draws_the_same_schedule_from_the_same_seed() -> None:
    def schedule(seed: int) -> list[tuple[float, int]]:
        chaos = Chaos(Path("/nonexistent"), mtbf=10, seed=seed)
        return [chaos.schedule([0, 1, 2, 3]) for _ in range(200)]

    first, again, other = schedule(4), schedule(4), schedule(5)
    assert first == again and first != other
    intervals = [interval for interval, _ in first]
    assert 8 < sum(intervals) / len(intervals) < 12  # exponential with mean 10 s
    assert {node for _, node in first} == {0, 1, 2, 3}
    fixed = Chaos(Path("/nonexistent"), every=2.5, node=1)
    assert [fixed.schedule([0, 1, 2]) for _ in range(3)] == [(2.5, 1)] * 3
    with pytest.raises(ValueError, match="one of mtbf and every"):
        Chaos(Path("/nonexistent"), mtbf=1, every=1)


# -- what the losses cost --------------------------------------------------------------------


def _incarnation(folder: Path, node: int, start: float, events: list[dict[str, Any]],
                 counters: tuple[int, int, int, int], **start_fields: Any) -> None:
    stem = replica_groups.incarnation_name(node, start)
    (folder / f"{stem}.jsonl").write_text("".join(
        json.dumps(event) + "\n"
        for event in [{"event": "start", "time": start, **start_fields}, *events]))
    written = StepCounters(folder / f"{stem}.counters")
    for index, value in enumerate(counters):
        written.values[index] = value
    written.close()


def _finished(folder: Path, node: int, start: float, end: float,
              counters: tuple[int, int, int, int]) -> None:
    """An incarnation that trained from step 1 and recorded its end."""
    _incarnation(folder, node, start, [{"event": "first_commit", "time": start + 0.1, "step": 1},
                                       {"event": "end", "time": end}], counters)


def _killed(folder: Path, node: int, start: float, killed: float, step: int,
            counters: tuple[int, int, int, int]) -> None:
    """An incarnation that trained from step 1 until the fault injection killed it."""
    _incarnation(folder, node, start, [{"event": "first_commit", "time": start + 0.05, "step": 1},
                                       {"event": "killed", "time": killed, "step": step}],
                 counters)


def test_the_summary_dates_each_loss_and_times_its_replacement(tmp_path: Path) -> None:
    folder = tmp_path / run_files.FAULT_TOLERANCE
    folder.mkdir()
    # node 0 dropped a step earlier, then dies at step 120 with a step in flight; its
    # replacement starts at 110 s, heals at step 131 and commits at 112.5 s; node 1 drops the
    # step node 0 died in, then goes on
    _incarnation(folder, 0, 100.0, [{"event": "first_commit", "time": 100.5, "step": 1}],
                 (122, 120, 120, 1))
    _incarnation(folder, 0, 110.4, [{"event": "healed", "time": 112.4, "step": 131},
                                    {"event": "first_commit", "time": 112.5, "step": 132},
                                    {"event": "end", "time": 130.0}], (69, 69, 200, 0))
    _incarnation(folder, 1, 100.1, [{"event": "first_commit", "time": 100.5, "step": 1},
                                    {"event": "abort", "time": 108.2, "step": 120},
                                    {"event": "resumed", "time": 108.7, "step": 121},
                                    {"event": "end", "time": 130.0}], (201, 200, 200, 1))
    loss = per_step.Loss(node=0, detected=108.3, replaced=110.0, replacement=1)
    kill = type("Kill", (), {"node": 0, "time": 108.0})()
    section = per_step.summarize(tmp_path, [loss], since=99.0, kills=[kill])
    assert section["failures"] == [{
        "node": 0, "time": 108.0, "step": 120, "steps_lost": 1,
        "detected_after_seconds": 0.3,
        # node 1 dropped the step node 0 died in and committed the next 0.7 s after the kill
        "survivors_stalled_seconds": 0.7, "survivor_steps_dropped": 1,
        "replaced_at": 110.0, "replacement_trained_after_seconds": 2.5, "healed_at_step": 131}]
    assert (section["steps_attempted"], section["steps_committed"]) == (392, 389)
    assert section["committed_ratio"] == round(389 / 392, 5)
    assert section["committed_bound"] == round(1 - 1 / 392, 5)
    assert section["dropped_steps"] == 1
    assert section["timeline"] == [
        {"node": 0, "from_step": 1, "to_step": 120, "replacement": False},
        {"node": 0, "from_step": 132, "to_step": 200, "replacement": False},
        {"node": 1, "from_step": 1, "to_step": 200, "replacement": False}]
    lines = per_step.describe(section)
    assert lines[0] == ("lost node0, after step 120, 1 step(s) lost, the others went on 0.7s "
                        "later (1 group-step(s) dropped), its replacement trained again 2.5s "
                        "after starting (healed at step 131)")
    assert "389 of 392 group-steps committed (99.23%, bound 99.74%)" in lines[-1]


def test_the_summary_counts_a_transaction_of_several_steps_as_what_a_loss_may_cost(
        tmp_path: Path) -> None:
    # commit-every 8: node 0 dies after step 45, five steps into the transaction that began
    # after step 40 (its counters: 45 attempted, 40 committed, none dropped); node 1 drops those
    # five steps and takes them again. Counted as one step each, the survivor's drop read "1
    # group-step(s) dropped" and the bound assumed one step lost per loss.
    folder = tmp_path / run_files.FAULT_TOLERANCE
    folder.mkdir()
    _killed(folder, 0, 100.0, killed=104.0, step=45, counters=(45, 40, 40, 0))
    _incarnation(folder, 1, 100.1, [{"event": "first_commit", "time": 100.5, "step": 8},
                                    {"event": "abort", "time": 104.1, "step": 40, "steps": 5},
                                    {"event": "resumed", "time": 104.4, "step": 48},
                                    {"event": "end", "time": 110.0}], (85, 80, 80, 5),
                 steps_per_commit=8)
    section = per_step.summarize(tmp_path, [], since=99.0)
    (failure,) = section["failures"]
    assert (failure["step"], failure["steps_lost"]) == (40, 5)
    assert (failure["survivors_stalled_seconds"], failure["survivor_steps_dropped"]) == (0.4, 5)
    assert section["steps_per_commit"] == 8 and section["dropped_steps"] == 5
    assert section["committed_bound"] == round(1 - 8 / 130, 5)
    assert per_step.describe(section)[0].startswith(
        "lost node0, after step 40, 5 step(s) lost, the others went on 0.4s later (5 "
        "group-step(s) dropped)")


def test_the_summary_counts_rounds_under_a_periodic_paradigm_and_names_a_start_up_loss(
        tmp_path: Path) -> None:
    # DiLoCo's counters count rounds: the summary said "at step 198" of round 198 (a local step
    # near 1,600), and a node lost before its first step read "lost at step None".
    folder = tmp_path / run_files.FAULT_TOLERANCE
    folder.mkdir()
    _incarnation(folder, 0, 100.0, [{"event": "first_commit", "time": 100.5, "step": 1},
                                    {"event": "end", "time": 130.0}], (40, 40, 40, 0))
    _incarnation(folder, 1, 100.1, [{"event": "first_commit", "time": 100.5, "step": 1},
                                    {"event": "end", "time": 130.0}], (40, 40, 40, 0))
    loss = per_step.Loss(node=2, detected=100.2, replacement=1)
    section = per_step.summarize(tmp_path, [loss], since=99.0, unit="round")
    assert section["unit"] == "round"
    (failure,) = section["failures"]
    assert failure["in_start_up"] and failure["step"] is None
    lines = per_step.describe(section)
    assert lines[0] == "lost node2, in its start-up, before its first step"
    assert "80 of 80 group-rounds committed" in lines[-1]



# -- Kubernetes: the launcher's watch of a Volcano job ------------------------------------------

# Volcano's controller under the per-step layout, as its source reports a pod's loss (volcano
# ed72c7c8; docs/fault-tolerance.md, "On Kubernetes"): RestartPod on PodFailed moves the job
# Running -> Restarting (state/running.go, retryCount + 1) and deletes that pod
# (job_controller_actions.go killPods); once it is gone, syncJob creates it again under the
# same name, a new uid (job_controller_actions.go syncJob), Pending until scheduled
# (state/restarting.go -> state/pending.go), then Running. TaskCompleted -> CompleteJob ends it:
# Completing, then Completed (state/completing.go). A pod can also fail and come back between
# two of the launcher's polls: only its uid tells.
RUNNING3 = {0: ("a0", "Running"), 1: ("a1", "Running"), 2: ("a2", "Running")}
VOLCANO_SCRIPT: list[tuple[str, dict[int, tuple[str, str]]]] = [
    ("Pending", {}),
    ("Pending", {0: ("a0", "Pending"), 1: ("a1", "Pending"), 2: ("a2", "Pending")}),
    ("Running", RUNNING3),
    ("Restarting", {**RUNNING3, 2: ("a2", "Failed")}),  # worker-2's PodFailed: RestartPod
    ("Restarting", {0: ("a0", "Running"), 1: ("a1", "Running")}),  # a2 deleted
    ("Pending", {**RUNNING3, 2: ("b2", "Pending")}),  # created again, under its name
    ("Running", {**RUNNING3, 2: ("b2", "Running")}),
    ("Running", {0: ("c0", "Running"), 1: ("a1", "Running"), 2: ("b2", "Running")}),
    ("Running", {0: ("c0", "Succeeded"), 1: ("a1", "Succeeded"), 2: ("b2", "Succeeded")}),
    ("Completing", {0: ("c0", "Succeeded"), 1: ("a1", "Succeeded"), 2: ("b2", "Succeeded")}),
    ("Completed", {0: ("c0", "Succeeded"), 1: ("a1", "Succeeded"), 2: ("b2", "Succeeded")}),
]


class FakeVolcano:
    """A TorchX runner whose Kubernetes job goes through ``script`` (the job's Volcano phase and
    its worker pods, one entry per poll of the pods); ``on_step`` is called with each entry's
    index, as the pods would write their records then."""

    def __init__(self, script: list[tuple[str, dict[int, tuple[str, str]]]],
                 on_step: Any = None) -> None:
        self.script, self.on_step = script, on_step
        self.position, self.submitted, self.cancelled = 0, None, False

    def name(self) -> str:
        return "sublimate"

    def status(self, handle: str) -> Any:
        from torchx.specs import AppStatus

        if self.submitted is None:
            return None
        phase, _ = self.script[min(self.position, len(self.script) - 1)]
        return AppStatus(state=volcano_job.job_state(phase))

    def run(self, app: Any, scheduler: str, cfg: Any) -> str:
        self.submitted = app
        return "kubernetes://sublimate/default:job-x"

    def worker_pods(self, handle: str) -> dict[int, tuple[str, str]]:
        _, pods = self.script[min(self.position, len(self.script) - 1)]
        if self.on_step is not None:
            self.on_step(self.position)
        self.position += 1
        time.sleep(0.01)  # polls are apart in time (the summary dates and orders the losses)
        return pods

    def cancel(self, handle: str) -> None:
        self.cancelled = True

    def log_lines(self, *args: Any, **kwargs: Any) -> Any:
        return iter(())


def _kubernetes_attempt(tmp_path: Path, runner: FakeVolcano,
                        monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(launcher, "POLL_SECONDS", {"kubernetes": 0.0})
    args = parse_args([*ARGS[:2], "--run-dir", str(tmp_path), *ARGS[4:], "--nodes", "3",
                       "--recovery", "per-step", "--scheduler", "kubernetes",
                       "--max-restarts", "2", "--global-batch-size", "60"])
    return launcher._run_attempt(runner, args, plan_launch(args, scheduler="kubernetes"), 0)


def test_the_kubernetes_watch_goes_on_through_lost_pods_and_summarizes_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: the launcher saw worker-2 FAILED and cancelled the whole job, with no summary.
    folder = tmp_path / run_files.FAULT_TOLERANCE
    folder.mkdir()
    started = time.time()
    replacement: list[str] = []

    def pods_write_their_records(position: int) -> None:
        now = time.time()
        if position == 2:  # every node trains
            for node in range(3):
                _incarnation(folder, node, started + node / 1000, [
                    {"event": "first_commit", "time": now, "step": 1}], (10, 10, 10, 0))
        if position == 6:  # worker-2's replacement healed from a peer and trains
            replacement.append(replica_groups.incarnation_name(2, now))
            _incarnation(folder, 2, now, [
                {"event": "healed", "time": now, "step": 12},
                {"event": "first_commit", "time": now, "step": 13}], (18, 18, 30, 0))
        if position == 8:  # the job's end, recorded by the nodes that finished
            # (node 0's first incarnation was lost after step 10: no end of its own)
            for stem in [replica_groups.incarnation_name(1, started + 1 / 1000), *replacement]:
                with (folder / f"{stem}.jsonl").open("a") as log:
                    log.write(json.dumps({"event": "end", "time": now, "step": 30}) + "\n")

    runner = FakeVolcano(VOLCANO_SCRIPT, pods_write_their_records)
    assert _kubernetes_attempt(tmp_path, runner, monkeypatch) == launcher.SUCCEEDED
    out = capsys.readouterr().out
    assert "lost node2; the others go on without it, and Volcano replaces its pod" in out
    assert "lost node0; the others go on without it" in out  # seen only by its new uid
    assert runner.position == len(VOLCANO_SCRIPT) and runner.cancelled
    # the lighthouse is no pod of the job's to follow: a Deployment beside it
    assert [role.name for role in runner.submitted.roles] == ["worker", "lighthouse"]
    summary = json.loads((tmp_path / run_files.SUMMARY).read_text())
    failures = summary["fault_tolerance"]["failures"]
    assert [failure["node"] for failure in failures] == [2, 0]
    assert failures[0]["healed_at_step"] == 12
    assert (failures[1]["step"], failures[1]["steps_lost"]) == (10, 0)
    assert failures[0]["replacement_trained_after_seconds"] >= 0


def test_the_kubernetes_watch_reports_volcanos_spent_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the third restart of a budget of 3 (maxRetry 3): Volcano fails the job (restarting.go)
    script = [*VOLCANO_SCRIPT[:4], ("Failed", {0: ("a0", "Running"), 1: ("a1", "Running")})]
    runner = FakeVolcano(script)
    assert _kubernetes_attempt(tmp_path, runner, monkeypatch) == launcher.FAILED
    err = capsys.readouterr().err
    assert "Volcano ended the job (FAILED) after 1 lost pod(s) seen; its budget is the " \
           "job's: max-restarts (2) x 3 nodes" in err


def test_a_node_killed_a_moment_after_its_start_is_a_loss_when_its_replacement_is_stopped(
        tmp_path: Path) -> None:
    # Node 2 dies 0.2 s after it started; its replacement is still starting when the job ends
    # and the launcher stops it. Only that newest process was stopped: the first one is a
    # loss, at its step. (A window of 1 s before the replacement took both for stopped, and
    # the report said node 2 was lost "in its start-up".)
    folder = tmp_path / run_files.FAULT_TOLERANCE
    folder.mkdir()
    _finished(folder, 0, 100.0, 103.0, (23, 23, 23, 0))
    _killed(folder, 2, 100.05, 100.25, 60, (7, 7, 7, 0))
    _incarnation(folder, 2, 101.0, [], (0, 0, 0, 0))  # the replacement, stopped at the end
    loss = per_step.Loss(node=2, detected=100.8, replaced=100.95, replacement=1)
    section = per_step.summarize(tmp_path, [loss], since=99.0, stopped=[2], unit="round")
    (failure,) = section["failures"]
    assert (failure["node"], failure["step"], failure["time"]) == (2, 7, 100.25)
    assert "in_start_up" not in failure


def test_a_node_dead_before_the_launcher_saw_it_is_a_loss_though_it_was_stopped(
        tmp_path: Path) -> None:
    # Under load the job ended before the launcher saw node 2 fail (its agent notices a dead
    # worker a moment later): still RUNNING to the launcher, it was among those stopped at the
    # end, and its killed process was taken for a stopped replacement: "0 node(s) lost".
    folder = tmp_path / run_files.FAULT_TOLERANCE
    folder.mkdir()
    _finished(folder, 0, 100.0, 103.0, (66, 65, 66, 1))
    _killed(folder, 2, 100.0, 101.0, 40, (40, 39, 39, 0))
    section = per_step.summarize(tmp_path, [], since=99.0, stopped=[2])
    (failure,) = section["failures"]
    assert (failure["node"], failure["step"], failure["steps_lost"]) == (2, 39, 1)


@pytest.mark.parametrize("replacement_trained", [False, True])
def test_the_last_node_holding_the_state_lost_relaunches_at_once(
        tmp_path: Path, replacement_trained: bool) -> None:
    # Node 0 dies, then node 1 a poll later. Unless node 0's replacement has trained since (it
    # copied node 1's state before node 1 died), no process holds the job's state: relaunch at
    # once. The replacement would wait for a peer up to the collective timeout (a test of it
    # took 45 s instead of 15).
    folder = tmp_path / run_files.FAULT_TOLERANCE
    folder.mkdir()
    runner = FakeRunner([_states(F, R), _states(R, F), _states(R, R)])
    replacer = per_step.Replacer(runner, "h", budget=2, run_dir=tmp_path)
    assert replacer.check() is None  # node 0 replaced
    if replacement_trained:
        _incarnation(folder, 0, time.time(), [
            {"event": "healed", "time": time.time(), "step": 50},
            {"event": "first_commit", "time": time.time(), "step": 51}], (1, 1, 51, 0))
    outcome = replacer.check()  # node 1 lost
    if replacement_trained:
        assert outcome is None and [node for _, node, _ in runner.restarts] == [0, 1]
    else:
        assert outcome == "lost" and [node for _, node, _ in runner.restarts] == [0]
        assert "none of their replacements had copied the job's state" in replacer.message
