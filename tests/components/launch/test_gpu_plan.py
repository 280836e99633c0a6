"""Simulated nodes on one host get distinct GPUs, or none: proven on TorchX's dry runs of
``local_cwd`` and ``local_netns`` with a faked GPU count (no GPU is needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from torchx.specs import AppDef

from sublimate.components.data.datasets import build_builtin
from sublimate.components.launch import local_cwd_scheduler
from sublimate.components.launch.gpu_plan import GpuShortage, gpu_plan, place_gpus
from sublimate.components.launch.job_runner import make_runner
from sublimate.components.launch.launcher import build_app, scheduler_config
from sublimate.components.launch.local_cwd_scheduler import host_gpu_count
from sublimate.components.launch.request import TrainRequest, plan_launch
from sublimate.components.steps.train import main, parse_args

ARGS = ["--data-dir", "/srv/datasets/digits", "--run-dir", "/srv/runs/r1"]


def _app(request: TrainRequest, scheduler: str) -> AppDef:
    return build_app(request, plan_launch(request, scheduler=scheduler))


def _replica_envs(argv: list[str], scheduler: str) -> dict[str, list[dict[str, str]]]:
    """Each replica's environment, role by role, in the scheduler's dry run."""
    args = parse_args([*ARGS, *argv])
    app = _app(args, scheduler)
    cfg = dict(scheduler_config(args, scheduler))
    place_gpus(app, cfg, gpu_plan(app, args.backend, args.host_gpus))
    with make_runner(scheduler, args.host_gpus) as runner:
        request = runner.dryrun(app, scheduler, cfg=cfg).request
    return {role: [replica.env for replica in replicas]
            for role, replicas in request.role_params.items()}


@pytest.mark.parametrize("scheduler", ["local_cwd", "local_netns"])
def test_each_simulated_node_gets_its_own_gpus(scheduler: str) -> None:
    envs = _replica_envs(["--nodes", "3", "--gpus-per-node", "1", "--global-batch-size", "96",
                          "--host-gpus", "4"], scheduler)
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs["worker"]] == ["0", "1", "2"]
    envs = _replica_envs(["--nodes", "2", "--procs-per-node", "2", "--gpus-per-node", "2",
                          "--global-batch-size", "64", "--host-gpus", "4"], scheduler)
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs["worker"]] == ["0,1", "2,3"]


def test_a_parameter_server_sees_no_gpu_and_each_trainer_its_own() -> None:
    envs = _replica_envs(["--algorithm", "async", "--nodes", "2", "--gpus-per-node", "1",
                          "--host-gpus", "2"], "local_cwd")
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs["ps"]] == [""]
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs["trainer"]] == ["0", "1"]


def test_cpu_nodes_see_no_gpu_and_the_host_is_not_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    args = parse_args([*ARGS, "--nodes", "2"])
    envs = _replica_envs(["--nodes", "2"], "local_cwd")
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs["worker"]] == ["", ""]
    asked: list[bool] = []  # nvidia-smi is run only for jobs that ask for GPUs
    monkeypatch.setattr(local_cwd_scheduler, "host_gpu_count", lambda: asked.append(True) or 0)
    assert gpu_plan(_app(args, "local_cwd"), args.backend, args.host_gpus).assign is False
    assert not asked
    assert gpu_plan(_app(parse_args([*ARGS, "--gpus-per-node", "1"]), "local_cwd"), "auto",
                    None).assign is False
    assert asked == [True]


def test_too_few_gpus_fall_back_to_the_cpu_and_say_so_once(
        capsys: pytest.CaptureFixture) -> None:
    argv = ["--nodes", "2", "--gpus-per-node", "1", "--host-gpus", "1"]
    args = parse_args([*ARGS, *argv])
    plan = gpu_plan(_app(args, "local_cwd"), args.backend, args.host_gpus)
    assert plan.note == ("this host has 1 GPU and the simulated nodes need 2 (2 worker x 1 GPU; "
                         "NCCL refuses two ranks on one GPU); they train on the CPU with gloo "
                         "(backend nccl refuses instead)")
    envs = _replica_envs(argv, "local_netns")
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs["worker"]] == ["", ""]
    assert all(env["OMP_NUM_THREADS"] == "1" for env in envs["worker"])
    assert "Running multiple role replicas that require GPUs" not in capsys.readouterr().err


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_builtin("digits", tmp_path_factory.mktemp("data") / "digits")


def test_too_few_gpus_for_nccl_are_refused_in_one_line(
        digits: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUBLIMATE_TERMINATION_LOG", str(tmp_path / "termination-log"))
    run_dir = tmp_path / "run"
    code = main(["--data-dir", str(digits), "--run-dir", str(run_dir), "--scheduler",
                 "local_cwd", "--nodes", "2", "--gpus-per-node", "2", "--backend", "nccl",
                 "--host-gpus", "3"])
    assert code == 2
    assert capsys.readouterr().err == (
        "train: error: gpus-per-node: this host has 3 GPUs and the simulated nodes need 4 "
        "(2 worker x 2 GPU; NCCL refuses two ranks on one GPU): lower nodes or gpus-per-node, or "
        "set backend to auto or gloo to train on the CPU\n")
    assert not run_dir.exists(), "nothing was started"
    args = parse_args([*ARGS, "--gpus-per-node", "1", "--backend", "nccl", "--host-gpus", "1"])
    with pytest.raises(GpuShortage):
        gpu_plan(_app(args, "local_netns"), args.backend, args.host_gpus)


def test_without_nvidia_tools_the_host_has_no_gpu(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi there
    assert host_gpu_count() == 0
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-1)'\n"
                    "echo 'GPU 1: NVIDIA H100 (UUID: GPU-2)'\n")
    fake.chmod(0o755)
    assert host_gpu_count() == 2
