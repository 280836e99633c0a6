"""The ``evaluate`` step: the trained model's metrics on the held-out split.

Three ways, the first that applies: a user's evaluation entry point (``--eval-entrypoint``, run here
with the contract of :mod:`sublimate.components.base.contract`; it writes ``metrics.json`` into the
run folder, any named metrics), the built-in evaluation of a sublimate model (test loss and
accuracy), or the ``metrics.json`` the user's training code wrote itself. The chosen metric
(``--metric``) goes to ``--metric-path`` (the pipeline's ``metric`` output), the accuracy, when
there is one, to ``--accuracy-path``. In ``metrics.json``, ``seconds`` and ``examples_per_second``
measure the evaluation itself (the forward pass over the split); ``total_seconds`` adds importing
torch and loading model and data.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from time import perf_counter
from typing import Any

from sublimate.components.base import run_files
from sublimate.components.base.runtime import shown_path
from sublimate.components.base.termination import disk_full_in_one_line, exit_now
from sublimate.components.data.datasets import DatasetError


def evaluate(model_dir: Path, data_dir: Path, split: str = "test",
             saved: dict[str, Any] | None = None) -> dict[str, float | int | str]:
    """The built-in evaluation of ``model_dir``'s model (``saved``: that model, already
    loaded by the caller) on ``split`` of ``data_dir``."""
    import torch

    from sublimate.components.data.datasets import read_split
    from sublimate.components.model import checkpoint
    from sublimate.components.model.models import build_model

    if saved is None:
        saved = checkpoint.load(model_dir / run_files.MODEL)
    if saved is None:
        raise FileNotFoundError(f"no trained model at {shown_path(model_dir / run_files.MODEL)}; "
                                "did train succeed?")
    model = build_model(saved["architecture"], saved["config"])
    model.load_state_dict(saved["state_dict"])
    model.eval()
    data = read_split(data_dir, split)
    # Only the evaluation itself is timed: importing torch and loading the model and the data
    # take far longer than the forward pass on a small test set, and would make
    # examples_per_second a measure of start-up.
    started = perf_counter()
    with torch.inference_mode():
        logits = model(torch.from_numpy(data.x).reshape(len(data.y), -1))
        labels = torch.from_numpy(data.y)
        # .item() waits for the device, so on a GPU the time below is the kernels' too
        loss = torch.nn.functional.cross_entropy(logits, labels).item()
        accuracy = (logits.argmax(1) == labels).float().mean().item()
    seconds = perf_counter() - started
    return {"split": split, "examples": len(data.y), "loss": round(loss, 6),
            "accuracy": round(accuracy, 6), "algorithm": saved.get("algorithm", ""),
            "steps": saved.get("steps", 0),
            # to the microsecond: the built-in test set takes about a millisecond
            "seconds": round(seconds, 6),
            "examples_per_second": round(len(data.y) / max(seconds, 1e-9), 1)}


# Whether a user's evaluation ran in this process (it decides how the process ends).
user_code_ran = False


def own_evaluation(entrypoint: str, model_dir: Path, data_dir: Path) -> dict[str, Any]:
    """Run the user's evaluation in this process with the contract; the metrics it wrote."""
    global user_code_ran
    import os

    from sublimate.components.base.contract import DATA_DIR_ENV, RUN_DIR_ENV, locate_entrypoint
    from sublimate.components.processes.entrypoint import run

    os.environ.update({RUN_DIR_ENV: str(model_dir), DATA_DIR_ENV: str(data_dir)})
    target, pythonpath = locate_entrypoint(entrypoint)  # a local run: paths as on the laptop
    if pythonpath:
        sys.path.insert(0, pythonpath)
    written = model_dir / run_files.EVALUATION
    before = written.stat().st_mtime_ns if written.is_file() else None
    user_code_ran = True
    said = ""
    try:
        code = run(target, [])
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if exit_.code is not None and not isinstance(exit_.code, int):
            said = f": {exit_.code}"  # what Python would print as it exits: the user's reason
    if code:
        raise ValueError(f"eval-entrypoint '{entrypoint}' exited with code {code}{said}")
    if not written.is_file() or written.stat().st_mtime_ns == before:
        raise ValueError(f"eval-entrypoint '{entrypoint}' did not write {shown_path(written)}")
    return _read_metrics(written)


def _read_metrics(path: Path) -> dict[str, Any]:
    import json

    try:
        metrics = json.loads(path.read_text())
    except ValueError as error:
        raise ValueError(f"{path}: not JSON ({error})") from None
    if not isinstance(metrics, dict):
        raise ValueError(f"{path}: expected an object of named metrics")
    return metrics


def sublimate_model(model_dir: Path) -> dict[str, Any] | None:
    """The run's model.pt, loaded, if it is one the built-in evaluation can rebuild; else None.
    Loaded once for both the question and the evaluation: a model of a few GB takes seconds."""
    from sublimate.components.model import checkpoint

    saved = checkpoint.load(model_dir / run_files.MODEL)
    return saved if isinstance(saved, dict) and "architecture" in saved else None


def _publish(run_dir: Path, metrics: dict[str, Any]) -> None:
    """Test scalars into TensorBoard and the run report; never fails the step."""
    try:
        from sublimate.components.monitoring.tensorboard_log import write_scalars

        split = metrics.get("split", "test")
        write_scalars(run_dir, "evaluate", int(metrics.get("steps", 0)),
                      {f"{split}/{name}": float(value) for name, value in metrics.items()
                       if isinstance(value, int | float) and not isinstance(value, bool)
                       and name not in ("steps", "examples") and "seconds" not in name})
    except Exception as error:  # monitoring is best effort
        print(f"evaluate: no TensorBoard scalars ({error})", file=sys.stderr)
    try:
        from sublimate.components.monitoring.run_report import REPORT_DIR, ReportError, write_report

        write_report(run_dir)
        print(f"evaluate: run report in {shown_path(run_dir / REPORT_DIR)} "
              f"(sublimate report {run_dir.name})", flush=True)
    except ReportError:
        pass  # a model without training records (trained elsewhere): nothing to report
    except Exception as error:
        print(f"evaluate: no run report ({error})", file=sys.stderr)


BUILT_IN = "built-in evaluation"
# What a bad model, dataset or evaluation raises: one line for the user, not a traceback.
EVALUATION_ERRORS = (DatasetError, FileNotFoundError, ValueError)


def measure(model_dir: Path, data_dir: Path, eval_entrypoint: str = "",
            split: str = "test") -> tuple[dict[str, Any], str]:
    """The metrics of the model in ``model_dir`` on ``split`` of ``data_dir``, and where they
    came from; the first that applies of: the user's ``eval_entrypoint``, the built-in
    evaluation of a sublimate model, the ``metrics.json`` the user's training wrote.

    The evaluate step scores the challenger with this, and the retraining gate scores the
    champion with it too, so both are measured the same way on the same split.
    """
    written = model_dir / run_files.EVALUATION
    if eval_entrypoint:
        return (own_evaluation(eval_entrypoint, model_dir, data_dir),
                f"eval-entrypoint {eval_entrypoint}")
    saved = sublimate_model(model_dir)
    if saved is not None:
        return evaluate(model_dir, data_dir, split, saved), BUILT_IN
    if written.is_file():  # the user's training code evaluated itself
        return _read_metrics(written), f"{shown_path(written)}, written by the training code"
    raise ValueError(nothing_to_evaluate(model_dir))


def nothing_to_evaluate(model_dir: Path) -> str:
    """What the evaluate step needs when the run left neither a model it can rebuild nor
    metrics (own code on the library, or a plain script), in one line."""
    model = model_dir / run_files.MODEL
    found = (f"{shown_path(model)} is not a model the built-in evaluation can rebuild (saved "
             "without its architecture)") if model.is_file() \
        else f"there is no {run_files.MODEL} in {shown_path(model_dir)}"
    return (f"{found}, and the training wrote no {run_files.EVALUATION}: write it from your "
            "training (job.write_metrics({'accuracy': ...}) on the library, or a JSON object "
            f"of named metrics in $SUBLIMATE_RUN_DIR/{run_files.EVALUATION}), or give "
            "-p eval-entrypoint= to evaluate the model")


def chosen_metric(metrics: dict[str, Any], metric: str, written: Path) -> Any:
    """``metrics[metric]``; a ValueError naming the metrics there are when it is missing."""
    if metric not in metrics:
        known = ", ".join(sorted(metrics)) or "nothing"
        raise ValueError(f"metric '{metric}' is not in {written} (it has: {known}); "
                         "set -p metric to one of those")
    return metrics[metric]


@disk_full_in_one_line("evaluate")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True,
                        help="run folder on the shared volume holding model.pt")
    parser.add_argument("--data-dir", type=Path, required=True, help="staged dataset folder")
    parser.add_argument("--split", default="test")
    parser.add_argument("--eval-entrypoint", default="",
                        help="your evaluation: module, module:function or script")
    parser.add_argument("--metric", default="accuracy", help="the metric to output")
    parser.add_argument("--accuracy-path", type=Path, help="file to write the accuracy to")
    parser.add_argument("--metric-path", type=Path, help="file to write the chosen metric to")
    args = parser.parse_args(argv)
    started = perf_counter()
    written = args.model_dir / run_files.EVALUATION
    try:
        metrics, source = measure(args.model_dir, args.data_dir, args.eval_entrypoint,
                                  args.split)
        chosen_metric(metrics, args.metric, written)
    except EVALUATION_ERRORS as error:
        print(f"evaluate: error: {error}", file=sys.stderr)
        return 2
    from sublimate.components.base.durable_files import write_json

    if source == BUILT_IN:
        # The step's own cost beside the evaluation's: importing torch, loading model and data.
        metrics["total_seconds"] = round(perf_counter() - started, 3)
        # Evaluation is over in a second or two: too short-lived to scrape, so its metrics are
        # the metrics.json below, the TensorBoard scalars and the run report.
        write_json(metrics, written)
    _publish(args.model_dir, metrics)
    for path, value in ((args.accuracy_path, metrics.get("accuracy", "")),
                        (args.metric_path, metrics[args.metric])):
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{value}")
    print(f"evaluate: {args.metric} {metrics[args.metric]} ({source}) -> {shown_path(written)}",
          flush=True)
    if (args.model_dir / run_files.MLFLOW_RUN).is_file():  # the train step tracked this run
        from sublimate.components.monitoring.mlflow_tracking import log_evaluation

        problem = log_evaluation(args.model_dir, metrics, {
            "metric": args.metric, "eval-entrypoint": args.eval_entrypoint, "split": args.split})
        if problem is not None:
            from sublimate.components.base.termination import fail

            return fail("evaluate", problem)
    return 0


if __name__ == "__main__":
    status = main()
    if user_code_ran:  # its objects may hold writes that only the interpreter's end flushes
        sys.exit(status)
    # The built-in evaluation closed all it wrote; tearing down an interpreter holding torch,
    # matplotlib and TensorBoard took 0.55 of the step's 2.6 CPU-s (and as much wall time).
    exit_now(status)


def template(name: str = "evaluate", **step_options: object):
    """The ``evaluate`` step: inputs ``data-dir``, ``model-dir``, ``eval-entrypoint`` and
    ``metric``; outputs ``metric`` and ``accuracy`` (empty when the metrics have none)."""
    from hera.workflows import Parameter

    from sublimate.components.base import settings
    from sublimate.components.base.mlflow_connection import credentials_env as mlflow_env
    from sublimate.components.base.runtime import python_step

    own = {setting.name: setting.default_text() for setting in settings.settings(step="evaluate")}
    step = python_step(
        name, "sublimate.components.steps.evaluate",
        inputs={"data-dir": "--data-dir", "model-dir": "--model-dir",
                **{name: f"--{name}" for name in own}},
        outputs={"accuracy": "--accuracy-path", "metric": "--metric-path"},
        env=mlflow_env(),  # tracking's server: a Secret, optional
        **step_options,  # type: ignore[arg-type]
    )
    # Inputs added after the first release default to the step's own default, so a pipeline
    # written against the first inputs still passes Argo's argument check.
    step.inputs = [Parameter(name=p.name, default=own[p.name]) if p.name in own else p
                   for p in step.inputs]
    return step
