"""`sublimate lint` on manifests at scale: an object over etcd's limits is an error, a loop whose
status or pod creation would outgrow Argo's defaults a warning naming the setting; the rendered
pipelines pass clean."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from sublimate.components.launch import volcano_job
from sublimate.components.launch.job_runner import make_runner
from sublimate.components.launch.launcher import build_app
from sublimate.components.launch.request import plan_launch
from sublimate.components.steps.train import parse_args
from sublimate.pipelines.lint import lint_files
from tests.conftest import REPO


def _volcano_job(nodes: int, torchx_form: bool) -> dict[str, Any]:
    """The train step's Volcano Job at ``nodes`` x 8 GPUs, as the launcher renders it, or in
    TorchX's own form (one task per replica: its task, copied for every replica)."""
    args = parse_args(["--data-dir", "/d", "--run-dir", "/tmp/run", "--workflow-name", "w",
                       "--scheduler", "kubernetes", "--gpus-per-node", "8", "--procs-per-node",
                       "8", "--nodes", "512", "--global-batch-size", "4096"])
    app = build_app(args, plan_launch(args, scheduler="kubernetes"))
    app.roles[0].num_replicas = nodes
    job = make_runner("kubernetes").dryrun(app, "kubernetes",  # type: ignore[attr-defined]
                                           cfg={"queue": "default", "job_name": "job-x"})
    from kubernetes.client import ApiClient

    rendered = ApiClient().sanitize_for_serialization(job.request.resource)
    if torchx_form:
        [task] = rendered["spec"]["tasks"]
        tasks = []
        for replica in range(nodes):
            one = copy.deepcopy(task)
            one.update(name=f"worker-{replica}", replicas=1)
            one["template"]["spec"]["containers"][0]["name"] = f"worker-{replica}"
            tasks.append(one)
        rendered["spec"]["tasks"] = tasks
    return rendered


def _lint(tmp_path: Path, name: str, doc: dict[str, Any]) -> list[Any]:
    path = tmp_path / name
    # JSON is YAML too, and 30x faster to write than PyYAML's dumper at 17 MB
    path.write_text(json.dumps(doc))
    problems, checked, _ = lint_files([path])
    assert checked == 1
    return problems


def test_a_volcano_job_over_etcds_request_limit_is_an_error_and_one_task_passes(
        tmp_path: Path) -> None:
    [problem] = _lint(tmp_path, "torchx-4096.yaml", _volcano_job(4096, torchx_form=True))
    assert not problem.warning
    assert "4096 task(s): over etcd's default request limit of 1.5 MiB" in problem.message
    assert "replicas: N" in problem.message
    assert _lint(tmp_path, "one-task-4096.yaml", _volcano_job(4096, torchx_form=False)) == []
    # TorchX's own form is already past the limit at 512 nodes
    assert volcano_job.job_bytes(_volcano_job(512, torchx_form=True)) > 1_572_864


def _sweep(points: int, parallelism: int | None) -> dict[str, Any]:
    pod = {"container": {"image": "busybox", "command": ["true"]},
           "retryStrategy": {"limit": 2}}
    spec: dict[str, Any] = {"entrypoint": "main", "templates": [
        {"name": "main", "dag": {"tasks": [
            {"name": "point", "template": "point", "withSequence": {"count": str(points)}}]}},
        {"name": "point", "dag": {"tasks": [
            {"name": "train", "template": "pod"},
            {"name": "evaluate", "template": "pod", "depends": "train"}]}},
        {"name": "pod", **pod}]}
    if parallelism:
        spec["templates"][0]["parallelism"] = parallelism
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"generateName": "sweep-"}, "spec": spec}


def test_a_thousand_point_loop_warns_about_its_status_and_the_controllers_rate(
        tmp_path: Path) -> None:
    problems = _lint(tmp_path, "sweep.yaml", _sweep(1000, parallelism=None))
    assert all(problem.warning for problem in problems)
    status, rate = (problem.message for problem in problems)
    assert "1,000 items make about 5,000 nodes, 9.5 MB of workflow status" in status
    assert "persistence.nodeStatusOffLoad" in status
    assert "without parallelism" in rate and "20 requests/s" in rate
    assert problems[0].path == "spec.templates[0].dag.tasks[0]"
    # parallelism answers the rate, not the status; 64 points need neither
    [left] = _lint(tmp_path, "limited.yaml", _sweep(1000, parallelism=8))
    assert "nodeStatusOffLoad" in left.message
    assert _lint(tmp_path, "small.yaml", _sweep(64, parallelism=None)) == []


def test_the_rendered_pipelines_pass_without_warnings_and_warnings_pass_the_cli(
        tmp_path: Path) -> None:
    problems, checked, _ = lint_files([REPO / "argo"])
    assert checked >= 4 and problems == []
    (tmp_path / "sweep.yaml").write_text(json.dumps(_sweep(1000, parallelism=None)))
    linted = subprocess.run([sys.executable, "-m", "sublimate.pipelines", "lint",
                             str(tmp_path / "sweep.yaml")], capture_output=True, text=True,
                            check=False)
    assert linted.returncode == 0, linted.stderr
    assert "warning: 1,000 items" in linted.stdout
    assert "1 document(s) passed lint, with 2 warning(s)" in linted.stdout


def _workflow(templates: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"generateName": "wide-"},
            "spec": {"entrypoint": "main", "templates": templates}}


POD = {"name": "pod", "container": {"image": "busybox", "command": ["true"]}}


def test_a_dag_of_4096_tasks_warns_about_its_status_though_it_has_no_loop(
        tmp_path: Path) -> None:
    # Issue 40: the object is 150 KB, under etcd's 1 MB; its status would be 7.8 MB.
    tasks = [{"name": f"t{i}", "template": "pod"} for i in range(4096)]
    [problem] = _lint(tmp_path, "wide.yaml", _workflow([{"name": "main", "dag": {"tasks": tasks}},
                                                        POD]))
    assert problem.warning and problem.path == "spec.templates[0]"
    assert problem.message.startswith(
        "the workflow makes about 4,097 nodes from template 'main', 7.8 MB of workflow status, "
        "over etcd's 1 MB: Argo compresses it (status.compressedNodes), and past that the "
        "controller needs persistence.nodeStatusOffLoad (a database); fewer nodes")
    # 256 tasks (486 KB of status) need nothing
    assert _lint(tmp_path, "narrow.yaml", _workflow([
        {"name": "main", "dag": {"tasks": tasks[:256]}}, POD])) == []


def test_a_sequence_given_by_its_ends_warns_like_one_given_by_its_count(tmp_path: Path) -> None:
    loop = {"name": "fan", "template": "pod", "withSequence": {"start": "1", "end": "5000"}}
    status, rate = _lint(tmp_path, "ends.yaml", _workflow([
        {"name": "main", "steps": [[loop]]}, POD]))
    assert status.warning and rate.warning
    assert status.message.startswith("5,000 items make about 5,000 nodes, 9.5 MB")
    assert status.path == "spec.templates[0].steps[0]"
