"""The launcher's side of per-step recovery, without a job: the settings' rules, the TorchX app
(a torchrun per node, a Lighthouse role after the nodes), the Volcano job on Kubernetes (a lost
node restarted alone), the replacer's decisions, chaos's schedule, and the summary of what each
loss cost (from records laid out as the workers write them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from torchx.specs import AppState

from sublimate.components.base import replica_groups, run_files
from sublimate.components.base.replica_groups import StepCounters
from sublimate.components.base.settings import (
    SettingError,
    check,
    collective_timeout,
    max_restarts,
    parse_values,
)
from sublimate.components.launch import per_step
from sublimate.components.launch.chaos import Chaos
from sublimate.components.launch.launcher import build_app
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
    ({"nodes": "2:4", "max-restarts": "0"}, "elastic training needs max-restarts of at least 1"),
])
def test_settings_refuse_what_cannot_run_naming_the_setting(texts: dict[str, str],
                                                            refusal: str) -> None:
    with pytest.raises(SettingError, match=refusal):
        check(parse_values(texts))


def test_auto_settings_follow_the_recovery_mode() -> None:
    assert max_restarts(parse_values({})) == 0
    assert max_restarts(parse_values({"nodes": "1:2"})) == 3  # elastic, left at auto: works
    assert max_restarts(parse_values({"recovery": "per-step"})) == 10
    assert max_restarts(parse_values({"recovery": "per-step", "max-restarts": "2"})) == 2
    assert collective_timeout(parse_values({})) == 300
    assert collective_timeout(parse_values({"recovery": "per-step"})) == 30
    assert collective_timeout(parse_values({"recovery": "per-step",
                                            "collective-timeout": "7"})) == 7
    check(parse_values({"nodes": "1:2"}))  # refused before auto restarts existed
    # per-step keeps every node's slice of the batch: 64 need only divide by 4, not by 3 or 2
    check(parse_values({"recovery": "per-step", "nodes": "2:4"}))
    with pytest.raises(SettingError, match="not divisible by nodes x procs-per-node = 3"):
        check(parse_values({"nodes": "2:4", "max-restarts": "1"}))


# -- the app and the Volcano job -------------------------------------------------------------


def test_a_per_step_app_is_a_torchrun_per_node_and_a_lighthouse_after_them() -> None:
    args = parse_args([*ARGS, "--nodes", "3", "--recovery", "per-step",
                       "--global-batch-size", "60"])
    app = build_app(args, "local_cwd")
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
    elastic = build_app(parse_args([*ARGS, "--nodes", "2:4", "--recovery", "per-step"]),
                        "local_cwd")
    assert elastic.roles[0].env[replica_groups.MIN_GROUPS_ENV] == "2"


def test_on_kubernetes_volcano_restarts_a_lost_node_alone() -> None:
    from sublimate.components.launch.cluster_job import make_runner

    args = parse_args([*ARGS, "--nodes", "2:4", "--recovery", "per-step", "--scheduler",
                       "kubernetes", "--max-restarts", "5", "--mount",
                       "type=volume,src=sublimate-data,dst=/mnt/sublimate"])
    app = build_app(args, "kubernetes")
    info = make_runner("kubernetes").dryrun(app, "kubernetes",  # type: ignore[attr-defined]
                                            cfg={"queue": "default", "job_name": "job-x"})
    spec = info.request.resource["spec"]
    # the training nodes are one task of 4 pods (launch/volcano_job.py), the lighthouse another
    assert [(task["name"], task["replicas"]) for task in spec["tasks"]] == [("worker", 4),
                                                                           ("lighthouse-0", 1)]
    # a lost node's pod is replaced alone, 5 times per node; the lighthouse's task alone too
    worker_task, lighthouse_task = spec["tasks"]
    assert worker_task["maxRetry"] == 20 and lighthouse_task["maxRetry"] == 5
    assert worker_task["policies"] == [{"event": "PodFailed", "action": "RestartPod"},
                                       {"event": "PodEvicted", "action": "RestartPod"}]
    assert lighthouse_task["policies"] == [{"event": "PodFailed", "action": "RestartTask"},
                                           {"event": "PodEvicted", "action": "RestartTask"}]
    # the gang: the minimum of nodes and the lighthouse; done when every node succeeded
    assert (spec["minAvailable"], spec["minSuccess"], spec["maxRetry"]) == (3, 4, 0)
    assert spec["policies"] == [{"event": "TaskFailed", "action": "TerminateJob"}]
    # the values Volcano's Job CRD (batch.volcano.sh_jobs.yaml, v1alpha1) accepts, transcribed:
    # events are an enum there; actions are its pkg/apis/bus/v1alpha1 Action constants
    events = {"*", "PodPending", "PodRunning", "PodFailed", "PodEvicted", "Unknown",
              "TaskCompleted", "OutOfSync", "CommandIssued", "JobUpdated", "TaskFailed"}
    actions = {"AbortJob", "RestartJob", "RestartTask", "RestartPod", "TerminateJob",
               "CompleteJob", "ResumeJob"}
    for policy in [*spec["policies"], *(p for task in spec["tasks"] for p in task["policies"])]:
        assert policy["event"] in events and policy["action"] in actions
    # every node finds the lighthouse where Volcano's svc plugin names it
    worker = spec["tasks"][0]["template"].spec.containers[0]
    assert "TORCHX_RANK0_HOST" not in " ".join(worker.command)
    env = {variable.name: variable.value for variable in worker.env}
    # each node's group is its index in the task, from Volcano's env plugin
    assert replica_groups.GROUP_ENV not in env and env[replica_groups.GROUPS_ENV] == "4"
    assert "$(VC_TASK_INDEX)" in " ".join(worker.command)
    assert replica_groups.ReplicaGroups.from_env(
        {**env, "VC_TASK_INDEX": "3", "VC_LIGHTHOUSE_0_HOSTS": "job-x-lighthouse-0-0.job-x"}
    ).group == 3
    assert replica_groups.volcano_hosts_env("lighthouse", 0) == "VC_LIGHTHOUSE_0_HOSTS"


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
    assert (role, node, env[replica_groups.REPLACEMENT_ENV]) == ("worker", 0, "1")
    assert float(env["SUBLIMATE_LAUNCH_TIME"]) > 0  # the replacement's start-up clock
    assert lighthouse == ("lighthouse", 0, {})
    assert [(loss.node, loss.replacement) for loss in replacer.losses] == [(0, 1)]


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
                 counters: tuple[int, int, int, int]) -> None:
    stem = replica_groups.incarnation_name(node, start)
    (folder / f"{stem}.jsonl").write_text("".join(
        json.dumps(event) + "\n" for event in [{"event": "start", "time": start}, *events]))
    written = StepCounters(folder / f"{stem}.counters")
    for index, value in enumerate(counters):
        written.values[index] = value
    written.close()


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
                                    {"event": "end", "time": 130.0}], (201, 200, 200, 1))
    loss = per_step.Loss(node=0, detected=108.3, replaced=110.0, replacement=1)
    kill = type("Kill", (), {"node": 0, "time": 108.0})()
    section = per_step.summarize(tmp_path, [loss], since=99.0, kills=[kill])
    assert section["failures"] == [{
        "node": 0, "time": 108.0, "step": 120, "steps_lost": 1,
        "detected_after_seconds": 0.3, "replaced_at": 110.0,
        "replacement_trained_after_seconds": 2.5, "healed_at_step": 131}]
    assert (section["steps_attempted"], section["steps_committed"]) == (392, 389)
    assert section["committed_ratio"] == round(389 / 392, 5)
    assert section["committed_bound"] == round(1 - 1 / 392, 5)
    assert section["dropped_steps"] == 1
    assert section["timeline"] == [
        {"node": 0, "from_step": 1, "to_step": 120, "replacement": False},
        {"node": 0, "from_step": 132, "to_step": 200, "replacement": False},
        {"node": 1, "from_step": 1, "to_step": 200, "replacement": False}]
    lines = per_step.describe(section)
    assert lines[0] == ("lost node0, at step 120, 1 step(s) lost, its replacement trained again "
                        "2.5s after starting (healed at step 131)")
    assert "389 of 392 group-steps committed (99.23%, bound 99.74%)" in lines[-1]

