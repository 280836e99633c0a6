"""The ``train`` step: launch multi-node data-parallel training through TorchX.

:func:`template` is the step's Hera template; :func:`main` is what its container runs
(``python -m sublimate.components.steps.train``): it parses and checks the step's arguments,
refuses in one line what would make every worker fail (a dataset smaller than the batch, a
missing entry point or model, too few GPUs), then hands over to the launcher
(:func:`sublimate.components.launch.launcher.launch`), which submits the job, streams the workers'
logs into the step's log, relaunches it when it stalls or loses a node, and fails the step with
the failing worker's error. Stopping the step cancels the job.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

from sublimate.components.base import settings as declared
from sublimate.components.base.settings import (
    ETCD_V2,
    PER_STEP,
    RESTART,
    SettingError,
    add_arguments,
    check,
    rendezvous_backend,
)
from sublimate.components.base.termination import OneLineParser, disk_full_in_one_line, fail
from sublimate.components.data.datasets import read_metadata, streams
from sublimate.components.launch import etcd_server
from sublimate.components.launch.job_runner import LOCAL_SCHEDULERS
from sublimate.components.launch.launcher import STEP, entrypoint_problem, launch
from sublimate.components.launch.request import (
    LaunchPlan,
    TrainRequest,
    choose_scheduler,
    plan_launch,
)
from sublimate.components.monitoring import metrics

RUN_ID = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def parse_args(argv: list[str] | None = None) -> TrainRequest:
    """The step's command line as its request, checked by the settings' rules (refusals in one
    line, as ``sublimate run`` words them)."""
    parser = OneLineParser(prog=STEP, description=__doc__.splitlines()[0])
    # Every setting of the step, typed and bounded by its one declaration; the ones the workers
    # read are passed on to them (training_flags).
    add_arguments(parser, declared.settings(step=STEP))
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path,
                        help="folder for checkpoints, logs and the model (or use --runs-root)")
    parser.add_argument("--runs-root", type=Path, help="folder holding one folder per run")
    parser.add_argument("--workflow-name", default="", help="the Argo workflow's name")
    parser.add_argument("--run-dir-output", type=Path,
                        help="file to write the run folder's path to (an Argo output)")
    parser.add_argument("--mount", action="append", default=[],
                        help="TorchX mount for the workers (kubernetes only)")
    parser.add_argument("--model-path-output", type=Path,
                        help="file to write the trained model's path to (an Argo output)")
    parser.add_argument("--dryrun", action="store_true",
                        help="print the scheduler request instead of submitting it")
    parser.add_argument("--host-gpus", type=int, metavar="N",
                        help="GPUs of this host that simulated nodes (local schedulers) share "
                             "(default: as many as nvidia-smi lists)")
    args = parser.parse_args(argv)
    return _request(parser, args)


def _request(parser: argparse.ArgumentParser, args: argparse.Namespace) -> TrainRequest:
    if args.host_gpus is not None and args.host_gpus < 0:
        parser.error(f"--host-gpus {args.host_gpus}: give 0 or more GPUs")
    if args.run_dir is None:
        run_id = args.run_id or args.workflow_name
        if args.runs_root is None or not run_id:
            parser.error("give --run-dir, or --runs-root with --run-id or --workflow-name")
        if not RUN_ID.fullmatch(run_id):
            parser.error(f"run-id '{run_id}' must be lowercase letters, digits and '-' "
                         "(it names a folder on the shared volume)")
        args.run_dir = args.runs_root / run_id
    try:  # the rules `sublimate run` and `submit` checked before any step, in the same words
        # (with scheduler auto as it resolves here: kubernetes in a cluster's pod)
        check({**vars(args), "scheduler": choose_scheduler(args.scheduler)})
    except SettingError as error:
        parser.error(str(error))
    return TrainRequest.from_values({**vars(args), "mounts": tuple(args.mount)})


def plan(request: TrainRequest, launch_time: float | None = None) -> LaunchPlan:
    """The launcher's decisions for this step: the scheduler, and the recovery mode
    (auto: per-step where the job can run it; diloco: always per-step, on torchft's Manager)
    with the restarts it gets."""
    return plan_launch(request, streamed=_streamed(request), launch_time=launch_time)


def _streamed(request: TrainRequest) -> bool:
    """Whether data-loading auto streams this job's training split (per-step holds it in
    memory, so recovery auto is restart then). A dataset that cannot be read yet counts as
    held in memory: the workers say what is wrong with it."""
    if request.data_loading != "auto":
        return False
    try:
        return streams("auto", read_metadata(Path(request.data_dir)))
    except (OSError, ValueError, KeyError):
        return False


def template_inputs() -> dict[str, str | None]:
    """The train step's workflow inputs and their defaults, each passed to the launcher as the
    flag of the same name: where the data and the run live (no default), then every setting a
    pipeline sets, from its one declaration. A setting's input defaults to its declared default,
    so a pipeline that sets only some of them still passes Argo's argument check."""
    return {"data-dir": None, "workflow-name": None,
            **{setting.name: setting.default_text() for setting in declared.settings(step=STEP)
               if setting.in_pipeline}}


TEMPLATE_INPUTS = tuple(template_inputs())


def template(name: str = "train", **step_options: object):
    """The ``train`` step: launches the TorchX job and waits for it.

    Outputs ``run-dir`` (the run's folder on the shared volume) and ``model-path``.
    """
    from hera.workflows import Parameter

    from sublimate.components.base.mlflow_connection import credentials_env as mlflow_env
    from sublimate.components.base.runtime import (
        DEFAULT_CLAIM,
        RUNS_PATH,
        SHARED_VOLUME_PATH,
        python_step,
    )

    claim = step_options.get("claim_name", DEFAULT_CLAIM)
    inputs = template_inputs()
    step = python_step(
        name, "sublimate.components.steps.train",
        inputs={parameter: f"--{parameter}" for parameter in inputs},
        outputs={"run-dir": "--run-dir-output", "model-path": "--model-path-output"},
        extra_args=["--runs-root", RUNS_PATH,
                    "--mount", f"type=volume,src={claim},dst={SHARED_VOLUME_PATH}"],
        env=mlflow_env(),  # tracking's server: a Secret, optional
        **step_options,  # type: ignore[arg-type]
    )
    # Inputs added after the first release default to the launcher's own default, so that a
    # pipeline written against the earlier inputs still passes Argo's argument check.
    step.inputs = [p if inputs[p.name] is None else Parameter(name=p.name, default=inputs[p.name])
                   for p in step.inputs]
    # Read by the local runner only (pipelines/runner/pods/sandbox.py, resource_limits.py),
    # inert on a cluster: locally this pod runs the job's nodes itself, so its limits are not
    # theirs; and local_netns builds their namespaces, links and cgroups, which needs this
    # machine's privileges and PID namespace.
    step.annotations = {
        "sublimate.dev/local-job": "true",
        "sublimate.dev/local-privileged": "{{=inputs.parameters.scheduler == 'local_netns'}}",
    }
    return step


@disk_full_in_one_line(STEP)
def main(argv: list[str] | None = None) -> int:
    # The launcher's process start (interpreter included): where the step's start-up begins.
    launch_time = metrics.process_start_time()
    request = parse_args(argv)
    decided = plan(request, launch_time)
    # Refused here, in one line, before any worker starts: otherwise every worker fails with
    # its own traceback and torchrun's failure report around it.
    from sublimate.components.data.datasets import data_problem  # numpy: not for template()

    problem = data_problem(request.data_dir, request.global_batch_size,
                           request.eval_every_epoch and not request.entrypoint)
    if problem is not None:
        return fail(STEP, problem)
    if request.entrypoint:
        problem = entrypoint_problem(request.entrypoint, decided.scheduler != "kubernetes")
        if problem is not None:
            return fail(STEP, problem)
    elif request.model != "mlp":  # the built-in needs no check (nor the torch import it costs)
        from sublimate.components.model.models import resolve

        try:
            resolve(request.model)  # a typo in the entry point fails here, not in every worker
        except ValueError as error:
            return fail(STEP, str(error))  # it names the model: "model 'x:y': ..."
    if decided.per_step and importlib.util.find_spec("torchft") is None:
        return fail(STEP, f"recovery {PER_STEP} needs torchft in the image (pip install "
                          f"'torchft>=0.2'); or use recovery {RESTART}")
    problem = etcd_server.missing_prerequisite(
        serve=decided.scheduler in LOCAL_SCHEDULERS and not request.rendezvous_endpoint) \
        if rendezvous_backend(decided.resolved(request)) == ETCD_V2 else None
    if problem is not None:
        return fail(STEP, problem)
    return _tracked_launch(request, decided)


def _tracked_launch(request: TrainRequest, decided: LaunchPlan) -> int:
    """:func:`launch`, logged to MLflow when tracking is on: the server is checked before the
    job starts; the run is logged from a thread of this process, from the records the workers
    already write, so that no training step waits on it (mlflow_tracking)."""
    from sublimate.components.base.mlflow_connection import TrackingError, tracking_uri

    if request.dryrun or tracking_uri(request.tracking) is None:
        return launch(request, decided)
    from sublimate.components.monitoring.mlflow_tracking import TrainingTracker

    try:
        tracker = TrainingTracker.start(request, request.run_dir, Path(request.data_dir),
                                        request.workflow_name or request.run_dir.name)
    except TrackingError as error:
        return fail(STEP, str(error))
    if tracker is None:
        return launch(request, decided)
    code = 1
    try:
        code = launch(request, decided)
    finally:
        problem = tracker.finish(code)
    if problem is not None and code == 0:
        return fail(STEP, problem)
    return code


if __name__ == "__main__":
    sys.exit(main())
