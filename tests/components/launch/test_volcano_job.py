"""The training job's Volcano Job: one task per role, so that it stays a few KB at any number of
nodes (TorchX's own rendering, one task per replica, is 1.7 MB at 512 nodes, past etcd's
1.5 MiB), and the launcher still reads its state."""

from __future__ import annotations

from typing import Any

import pytest
from torchx.specs import AppState

from sublimate.components.launch import volcano_job
from sublimate.components.launch.job_runner import make_runner
from sublimate.components.launch.launcher import build_app
from sublimate.components.launch.request import plan_launch
from sublimate.components.steps.train import parse_args

# the restart mode's job (per-step recovery's layout: test_per_step_launcher.py)
ARGS = ["--data-dir", "/mnt/sublimate/datasets/digits", "--run-dir", "/tmp/run",
        "--workflow-name", "w", "--scheduler", "kubernetes", "--gpus-per-node", "8",
        "--procs-per-node", "8", "--recovery", "restart"]
# etcd's default request limit (https://etcd.io/docs/v3.4/dev-guide/limit/)
ETCD_REQUEST_LIMIT = int(1.5 * 1024 * 1024)


def _render(nodes: int, *extra: str) -> dict[str, Any]:
    # The launcher accepts up to 512 nodes; larger jobs are rendered by growing the role.
    args = parse_args([*ARGS, "--nodes", str(min(nodes, 512)),
                       "--global-batch-size", str(512 * 8), *extra])
    app = build_app(args, plan_launch(args, scheduler="kubernetes"))
    app.roles[0].num_replicas = nodes
    info = make_runner("kubernetes").dryrun(app, "kubernetes",  # type: ignore[attr-defined]
                                            cfg={"queue": "default", "job_name": "job-x"})
    return info.request.resource


@pytest.mark.parametrize("nodes", [2, 512, 4096])
def test_the_job_is_one_task_of_n_pods_and_stays_small(nodes: int) -> None:
    job = _render(nodes)
    [task] = job["spec"]["tasks"]
    assert (task["name"], task["replicas"]) == ("worker", nodes)
    size = volcano_job.job_bytes(job)
    assert size < 8_000, f"{size} bytes at {nodes} nodes"  # TorchX's form: 3,357 B per node
    container = task["template"].spec.containers[0]
    env = {variable.name: variable.value for variable in container.env}
    # every pod, the first included, reaches the rendezvous host by its DNS name
    assert env["TORCHX_RANK0_HOST"] == "job-x-worker-0.job-x"
    assert "torchx.pytorch.org/replica-id" not in task["template"].metadata.labels
    # a fixed number of nodes meets by torchrun's static rendezvous, each node's rank its index
    command = " ".join(container.command)
    assert "--rdzv-backend static" in command and "--node-rank '$(VC_TASK_INDEX)'" in command


def test_an_elastic_jobs_gang_is_its_minimum() -> None:
    spec = _render(8, "--nodes", "4:8", "--global-batch-size", "840",
                   "--procs-per-node", "1")["spec"]
    [task] = spec["tasks"]
    assert (task["replicas"], task["minAvailable"], spec["minAvailable"]) == (8, 4, 4)
    command = " ".join(task["template"].spec.containers[0].command)
    # elastic nodes meet through c10d, with a keep-alive that grows with them
    assert "--rdzv-backend c10d" in command and "keep_alive_interval=1," in command
    assert "--node-rank" not in command


def test_the_launcher_reads_both_forms_of_the_jobs_status() -> None:
    status = {"state": {"phase": "Running"}, "taskStatusCount": {
        "worker": {"phase": {"Failed": 1, "Running": 3}},
        "lighthouse-0": {"phase": {"Running": 1}}}}
    described = volcano_job.describe("ns:job-x", {"status": status})
    assert described.state == AppState.RUNNING
    by_role = {role.role: role.replicas for role in described.roles_statuses}
    assert [replica.state for replica in by_role["worker"]] == [
        AppState.RUNNING, AppState.RUNNING, AppState.RUNNING, AppState.FAILED]
    assert [(replica.id, replica.state) for replica in by_role["lighthouse"]] == [
        (0, AppState.RUNNING)]
    assert volcano_job.describe("ns:job-x", {}).state == AppState.UNKNOWN
