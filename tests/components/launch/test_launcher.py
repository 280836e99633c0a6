from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torchx.specs import AppDef

from sublimate.components.data.datasets import build_builtin
from sublimate.components.launch.apps import trainer
from sublimate.components.launch.job_runner import make_runner
from sublimate.components.launch.launcher import (
    _watched,
    build_app,
    make_watchdog,
)
from sublimate.components.launch.logs import follow_logs, whole_lines
from sublimate.components.launch.request import TrainRequest, choose_scheduler, plan_launch
from sublimate.components.monitoring.watchdog import ProgressReporter
from sublimate.components.steps.train import parse_args

# the restart mode's app (per-step recovery's layout: test_per_step_launcher.py)
ARGS = ["--data-dir", "/mnt/sublimate/datasets/digits", "--run-dir", "/mnt/sublimate/runs/r1",
        "--recovery", "restart"]


def _kubernetes_app(request: TrainRequest) -> AppDef:
    return build_app(request, plan_launch(request, scheduler="kubernetes"))


def test_an_elastic_trainer_starts_the_most_nodes_and_needs_the_fewest() -> None:
    (role,) = trainer("--epochs", "3", nodes=4, min_nodes=2, rendezvous_timeout=60).roles
    assert (role.num_replicas, role.min_replicas) == (4, 2)
    script = role.args[1]
    assert "--nnodes 2:4 " in script
    # a lost node is noticed in seconds, and a rendezvous with its minimum closes soon after
    assert ("join_timeout=60,last_call_timeout=2,keep_alive_interval=1,"
            "keep_alive_max_attempt=3") in script
    with pytest.raises(ValueError, match="min_nodes must be between 1 and nodes"):
        trainer(nodes=2, min_nodes=3)


def test_trainer_is_one_replica_per_node_running_torchrun() -> None:
    app = trainer("--epochs", "3", nodes=3, procs_per_node=2, cpu=4, memMB=8192)
    (role,) = app.roles
    assert role.num_replicas == 3
    script = role.args[1]
    # on CPU nodes the worker module is the torchrun agent and forks its workers
    assert script.startswith("python -m sublimate.components.processes.worker agent --nnodes 3 "
                             "--nproc-per-node 2 --rdzv-backend c10d")
    # the rank-0 host must stay a shell expansion, everything else quoted
    assert "--rdzv-endpoint ${TORCHX_RANK0_HOST:=localhost}:29500" in script
    assert "--max-restarts 0 --monitor-interval 0.1" in script
    # rendezvous options go after what a scheduler put in $PET_RDZV_CONF (local_netns: is_host)
    assert "--rdzv-conf ${PET_RDZV_CONF:+$PET_RDZV_CONF,}join_timeout=300 " in script
    assert role.min_replicas is None
    assert script.endswith(" -- --epochs 3")
    assert role.resource.cpu == 4 and role.resource.memMB == 8192
    assert role.env["OMP_NUM_THREADS"] == "1"
    assert role.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    # GPU nodes start every worker in a fresh interpreter: CUDA and fork do not mix
    gpu_role = trainer("--epochs", "3", gpu=1).roles[0]
    assert "OMP_NUM_THREADS" not in gpu_role.env
    assert "-m torch.distributed.run --nnodes 2 --nproc-per-node 1" in gpu_role.args[1]
    assert gpu_role.args[1].endswith("-m sublimate.components.processes.worker --epochs 3")


def test_own_code_is_watched_once_this_attempt_reports_not_for_an_earlier_ones_files(
        tmp_path: Path) -> None:
    """Own code that never writes heartbeats is left alone by the watchdog, even when an earlier
    attempt on the same run folder (the built-in loop, or a retried step) left some."""
    args = parse_args(["--data-dir", str(tmp_path), "--run-dir", str(tmp_path / "run"),
                       "--entrypoint", "train.py", "--stall-seconds", "60"])
    ProgressReporter(args.run_dir, 0, "node0", attempt="earlier").finish(440)
    dog = make_watchdog(args, "this-attempt")
    assert dog is not None and not _watched(args, dog)
    ProgressReporter(args.run_dir, 1, "node0", attempt="this-attempt")  # a rank uses the library
    assert _watched(args, dog)


def test_launcher_rejects_a_batch_that_does_not_split(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args([*ARGS, "--nodes", "3", "--global-batch-size", "64"])
    assert exit_info.value.code == 2
    assert "global-batch-size 64 is not divisible by nodes x procs-per-node = 3" \
        in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args([*ARGS, "--nodes", "0"])


def test_scheduler_auto_detects_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert choose_scheduler("auto") == "local_cwd"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.delenv("SUBLIMATE_LOCAL_RUN", raising=False)
    assert choose_scheduler("auto") == "kubernetes"
    monkeypatch.setenv("SUBLIMATE_LOCAL_RUN", "1")
    assert choose_scheduler("auto") == "local_cwd"
    assert choose_scheduler("kubernetes") == "kubernetes"


def test_local_app_uses_this_interpreter_and_a_private_port() -> None:
    args = parse_args([*ARGS, "--nodes", "2"])
    plan = plan_launch(args, scheduler="local_cwd")
    first, second = build_app(args, plan), build_app(args, plan)
    assert first.roles[0].args[1].startswith(sys.executable)
    assert first.roles[0].port_map["c10d"] != 29500 or second.roles[0].port_map["c10d"] != 29500
    assert first.roles[0].mounts == []


def test_kubernetes_dryrun_is_a_volcano_job_with_the_claim() -> None:
    from torchx.runner import get_runner

    args = parse_args([*ARGS, "--nodes", "2", "--gpus-per-node", "1", "--memory-mb-per-node",
                       "16384", "--mount", "type=volume,src=sublimate-data,dst=/mnt/sublimate"])
    with get_runner() as runner:
        info = runner.dryrun(_kubernetes_app(args), "kubernetes",
                             cfg={"queue": "default"})
    job = info.request.resource
    assert job["kind"] == "Job" and job["apiVersion"].startswith("batch.volcano.sh/")
    assert job["spec"]["queue"] == "default"
    tasks = job["spec"]["tasks"]
    assert len(tasks) == 2
    pod = tasks[0]["template"].spec
    container = pod.containers[0]
    assert container.resources.limits["nvidia.com/gpu"] == "1"
    # TorchX keeps 1 GiB of the node for the system; the rest is requested (not its 0 default)
    assert container.resources.requests["memory"] == "15360M"
    assert [m.mount_path for m in container.volume_mounts if m.mount_path == "/mnt/sublimate"]
    claims = [v.persistent_volume_claim.claim_name for v in pod.volumes
              if v.persistent_volume_claim]
    assert claims == ["sublimate-data"]
    assert "sublimate.components.processes.worker" in " ".join(container.command)


def _train(tmp_path: Path, data_dir: Path, procs: int, name: str) -> dict[str, torch.Tensor]:
    run_dir = tmp_path / name
    env = {**os.environ, "OMP_NUM_THREADS": "1", "LOGLEVEL": "WARNING"}
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
         str(procs), "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
         "-m", "sublimate.components.processes.worker", "--data-dir", str(data_dir), "--run-dir",
         str(run_dir), "--epochs", "2", "--global-batch-size", "32", "--checkpoint-every", "0"],
        env=env, check=True, capture_output=True, timeout=180)
    return torch.load(run_dir / "model.pt", weights_only=False)["state_dict"]


def test_sync_sgd_on_two_workers_equals_one_process_with_the_global_batch(tmp_path: Path) -> None:
    data_dir = build_builtin("digits", tmp_path / "digits")
    single = _train(tmp_path, data_dir, 1, "one")
    double = _train(tmp_path, data_dir, 2, "two")
    for name, tensor in single.items():
        torch.testing.assert_close(double[name], tensor, rtol=1e-4, atol=1e-5)
    # and the run really trained: the weights moved away from initialisation
    torch.manual_seed(0)
    from sublimate.components.model.models import build_model

    initial = build_model("mlp", {"num_features": 64, "num_classes": 10}).state_dict()
    assert not torch.allclose(initial["0.weight"], single["0.weight"])


def test_async_kubernetes_dryrun_has_a_ps_task_and_trainer_tasks() -> None:
    from torchx.runner import get_runner

    args = parse_args([*ARGS, "--algorithm", "async", "--nodes", "3", "--staleness-bound", "4",
                       "--global-batch-size", "96",
                       "--mount", "type=volume,src=sublimate-data,dst=/mnt/sublimate"])
    with get_runner() as runner:
        info = runner.dryrun(_kubernetes_app(args), "kubernetes",
                             cfg={"queue": "research", "namespace": "ml"})
    job = info.request.resource
    tasks = [task["name"] for task in job["spec"]["tasks"]]
    assert tasks[0].startswith("ps-0") and len(tasks) == 4
    assert job["spec"]["queue"] == "research"
    trainer = job["spec"]["tasks"][1]["template"].spec.containers[0]
    script = " ".join(trainer.command)
    assert "sublimate.components.processes.async_sgd trainer --trainer-id" in script
    assert "--staleness-bound 4" in script and "--num-trainers 3" in script


def test_cluster_runs_use_the_pods_namespace(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from sublimate.components.launch import launcher as train
    from sublimate.components.launch.job_runner import job_name

    (tmp_path / "namespace").write_text("ml-team\n")
    monkeypatch.setattr(train, "SERVICE_ACCOUNT_DIR", tmp_path)
    args = parse_args([*ARGS, "--queue", "gpu"])
    assert train.scheduler_config(args, "kubernetes") == {
        "queue": "gpu", "namespace": "ml-team",
        # named after the workflow and the run folder, so that a retried step finds it
        "job_name": job_name("", args.run_dir)}
    assert train.scheduler_config(args, "local_cwd") == {
        "log_dir": "/mnt/sublimate/runs/r1/logs"}


def test_log_lines_split_across_reads_are_joined() -> None:
    chunks = ["[rank0] epoch 2", "/2 loss 0.1\nnext line\n", "unfinished"]
    assert list(whole_lines(chunks)) == ["[rank0] epoch 2/2 loss 0.1", "next line", "unfinished"]


def test_followed_logs_keep_a_split_line_and_the_last_line(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from torchx import specs

    # Half a line, a pause long enough for a read in between, then a last line just before exit:
    # the two things a follower of a file that is still being written can get wrong.
    program = ("import sys, time; sys.stdout.write('epoch 2'); sys.stdout.flush(); "
               "time.sleep(0.5); print('/2 done', flush=True); print('last line', flush=True)")
    app = specs.AppDef("logs", roles=[specs.Role(
        "worker", image=str(tmp_path), entrypoint=sys.executable, args=["-c", program])])
    with make_runner("local_cwd") as runner:
        handle = runner.run(app, "local_cwd", cfg={"log_dir": str(tmp_path / "logs")})
        threads = follow_logs(runner, handle, app, "local_cwd")
        assert runner.wait(handle, wait_interval=0.1).state == specs.AppState.SUCCEEDED
        for thread in threads:
            thread.join(timeout=10)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["[node0] epoch 2/2 done", "[node0] last line"]


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_builtin("digits", tmp_path_factory.mktemp("data") / "digits")


def _refused(command: list[str], tmp_path: Path) -> tuple[str, str]:
    """Run a step's program that must refuse its input; returns (error line, termination)."""
    termination = tmp_path / "termination-log"
    completed = subprocess.run(
        [sys.executable, "-m", *command], capture_output=True, text=True, timeout=120,
        env={**os.environ, "SUBLIMATE_TERMINATION_LOG": str(termination)}, check=False)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 2, output
    assert "Traceback" not in output
    errors = [line for line in completed.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, output
    return errors[0], termination.read_text()


@pytest.mark.parametrize(("flags", "message"), [
    (["--global-batch-size", "4096"],
     "global-batch-size 4096 is larger than the 1438 training examples of {data}"),
    (["--global-batch-size", "4096", "--algorithm", "async"],
     "global-batch-size 4096 is larger than the 1438 training examples of {data}"),
    (["--data-dir", "{missing}"], "data-dir: dataset folder {missing} does not exist"),
    (["--data-dir", "{empty}"],
     "data-dir: dataset folder {empty} is incomplete: metadata.json is missing"),
])
def test_the_launcher_refuses_what_the_data_rules_out_in_one_line(
        digits: Path, tmp_path: Path, flags: list[str], message: str) -> None:
    (tmp_path / "empty").mkdir()
    paths = {"data": digits, "missing": tmp_path / "missing", "empty": tmp_path / "empty"}
    run_dir = tmp_path / "run"
    line, termination = _refused(
        ["sublimate.components.steps.train", "--data-dir", str(digits), "--run-dir", str(run_dir),
         "--scheduler", "local_cwd", *(flag.format(**paths) for flag in flags)], tmp_path)
    expected = message.format(**paths)
    assert line == f"train: error: {expected}"
    assert termination == expected  # the node's message, on Argo and in the local runner
    assert not run_dir.exists(), "no worker was started"


def test_a_bad_flag_is_one_line_too(digits: Path, tmp_path: Path) -> None:
    line, termination = _refused(
        ["sublimate.components.steps.train", "--data-dir", str(digits), "--run-dir",
         str(tmp_path / "run"), "--global-batch-size", "65"], tmp_path)
    assert line == "train: error: global-batch-size 65 is not divisible by nodes x " \
                   "procs-per-node = 2: use global-batch-size 64 or 66, or nodes 1"
    assert termination == line.removeprefix("train: error: ")


@pytest.mark.parametrize("program", [
    ["sublimate.components.processes.worker"],
    ["sublimate.components.processes.async_sgd", "ps", "--num-trainers", "2",
     "--rpc-endpoint", "localhost:1"],
    ["sublimate.components.processes.async_sgd", "trainer", "--num-trainers", "2",
     "--rpc-endpoint", "localhost:1"],
])
def test_a_worker_run_by_hand_refuses_the_same_with_the_same_words(
        digits: Path, tmp_path: Path, program: list[str]) -> None:
    line, termination = _refused(
        [*program, "--data-dir", str(digits), "--run-dir", str(tmp_path / "run"),
         "--global-batch-size", "4096"], tmp_path)
    expected = f"global-batch-size 4096 is larger than the 1438 training examples of {digits}"
    assert line == f"train: error: {expected}" and termination == expected


def test_the_template_passes_per_epoch_evaluation_on_by_default() -> None:
    from sublimate.components.steps.train import template

    step = template()
    (evaluate,) = [p for p in step.inputs if p.name == "eval-every-epoch"]
    assert evaluate.default == "true"
    flag = step.args.index("--eval-every-epoch")
    assert step.args[flag + 1] == "{{inputs.parameters.eval-every-epoch}}"
    args = parse_args([*ARGS, "--eval-every-epoch", "false"])
    assert args.eval_every_epoch is False and parse_args(ARGS).eval_every_epoch is True
    for algorithm in ("sync", "async"):
        request = parse_args([*ARGS, "--algorithm", algorithm, "--eval-every-epoch", "false"])
        script = build_app(request, plan_launch(request, scheduler="kubernetes")).roles[-1].args[1]
        assert "--eval-every-epoch false" in script


@pytest.mark.parametrize(("flags", "expected"), [
    (["--global-batch-size", "65"],
     "global-batch-size 65 is not divisible by nodes x procs-per-node = 2: use global-batch-size "
     "64 or 66, or nodes 1"),
    (["--sync-period", "0"], "argument --sync-period: 0 is below the minimum 1"),
])
def test_the_launcher_and_the_worker_refuse_a_setting_in_the_same_words(
        digits: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str],
        expected: str) -> None:
    """The settings' one declaration and rules, in both programs: what `sublimate run` refuses
    before any step is refused again, word for word, by whichever program is run by hand."""
    paths = ["--data-dir", str(digits), "--run-dir", str(tmp_path / "run")]
    launcher, _ = _refused(["sublimate.components.steps.train", *paths, *flags], tmp_path)
    # the worker as torchrun starts it for 2 nodes x 1 process
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    worker, termination = _refused(["sublimate.components.processes.worker", *paths, *flags],
                                   tmp_path)
    assert launcher == worker == f"train: error: {expected}"
    assert termination == expected


def test_the_signal_cnn_example_classifies_any_signal_length_and_learns_mnist1d_templates(
) -> None:
    from sublimate.components.data.datasets import mnist1d_splits
    from sublimate.components.examples.example_models import signal_cnn

    for length in (40, 64):  # the convolutions are same-padded and pooled to 4 positions
        assert signal_cnn(length, 10)(torch.zeros(3, length)).shape == (3, 10)
    # 160 SGD steps on 2,000 generated signals beat chance (0.1) by far on held-out ones
    # (0.74 here; 0.89 after 300 steps): the layers are wired so the signal's shape reaches the
    # classifier.
    splits, _ = mnist1d_splits(num_samples=2500, seed=7)
    torch.manual_seed(0)
    model = signal_cnn(40, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.from_numpy(splits["train"].x), torch.from_numpy(splits["train"].y)
    for _ in range(8):
        for start in range(0, len(x), 100):
            loss = torch.nn.functional.cross_entropy(model(x[start:start + 100]),
                                                     y[start:start + 100])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    test_x, test_y = torch.from_numpy(splits["test"].x), torch.from_numpy(splits["test"].y)
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
    assert accuracy > 0.5, accuracy


def test_a_sigterm_while_the_job_runs_cancels_it_and_exits_143(digits: Path,
                                                                tmp_path: Path) -> None:
    """TorchX's local scheduler installs its own SIGTERM handler when the runner first makes it
    (inside the submission), which raised out of the launcher instead of cancelling the job."""
    run_dir = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "sublimate.components.steps.train", "--data-dir", str(digits),
         "--run-dir", str(run_dir), "--scheduler", "local_cwd", "--nodes", "2",
         "--epochs", "500", "--checkpoint-every", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert launcher.stdout is not None
        for line in launcher.stdout:  # the job is submitted: the scheduler exists now
            if "train: submitted" in line:
                break
        time.sleep(1.0)
        launcher.send_signal(signal.SIGTERM)
        _, errors = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 143, errors
    assert "train: stopped; cancelled the training job" in errors
    assert "SignalException" not in errors
    # nothing of the job is left: no process runs from the run's folder
    left = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True)
    assert left.stdout == "", left.stdout


def _status(states: list[str]) -> object:
    from torchx.specs import AppState, AppStatus, ReplicaStatus, RoleStatus

    replicas = [ReplicaStatus(id=index, state=AppState[state], role="worker",
                              hostname=f"10.0.0.{index + 2}")
                for index, state in enumerate(states)]
    ended = all(state != "RUNNING" for state in states)
    return AppStatus(state=AppState.FAILED if ended else AppState.RUNNING,
                     roles=[RoleStatus("worker", replicas)])


def test_a_lost_node_ends_the_attempt_the_same_whether_seen_before_the_others_fail_or_not(
        tmp_path: Path) -> None:
    """An elastic job (2:3) loses node 0 and the others fail after it: LOST (relaunched),
    whether a poll saw node 0 lost first (tolerated) or all three ended before the next poll;
    a node whose processes reported an error of their own is a failure, not a loss."""
    from sublimate.components.launch.launcher import _lost_first

    ended = _status(["FAILED", "FAILED", "FAILED"])
    handle = "local_netns://sublimate/job-1"
    assert _lost_first(tmp_path, handle, "local_netns", ended, ["node0 (10.0.0.2)"]) == \
        ["node0 (10.0.0.2)"]
    # Unseen: the nodes that reported an error were the survivors; node 0 said nothing.
    for node in (1, 2):
        error = tmp_path / "logs" / "elastic" / f"node{node}" / "job-1_abcdefgh" / \
            "attempt_0" / "0" / "error.json"
        error.parent.mkdir(parents=True)
        error.write_text('{"message": {"message": "RendezvousConnectionError: store gone", '
                         '"extraInfo": {"timestamp": "1"}}}')
    assert _lost_first(tmp_path, handle, "local_netns", ended, []) == ["node0 (10.0.0.2)"]
    # local_cwd has no nodes to lose, and a job still running has not failed
    assert _lost_first(tmp_path, handle, "local_cwd", ended, []) == []
    assert _lost_first(tmp_path, handle, "local_netns", _status(["FAILED", "RUNNING", "RUNNING"]),
                       []) == []
