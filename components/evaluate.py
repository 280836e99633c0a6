"""The ``evaluate`` step: test loss and accuracy of the trained model on the held-out split.

Writes ``metrics.json`` beside the model on the shared volume and the accuracy to
``--accuracy-path`` (the WorkflowTemplate exposes it as the ``accuracy`` output parameter).
In ``metrics.json``, ``seconds`` and ``examples_per_second`` measure the evaluation itself (the
forward pass over the split); ``total_seconds`` adds importing torch and loading model and data.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from time import perf_counter

from sublimate.components import run_files
from sublimate.components.datasets import DatasetError


def evaluate(model_dir: Path, data_dir: Path, split: str = "test") -> dict[str, float | int | str]:
    import torch

    from sublimate.components import checkpoint
    from sublimate.components.datasets import read_split
    from sublimate.components.models import build_model

    saved = checkpoint.load(model_dir / run_files.MODEL)
    if saved is None:
        raise FileNotFoundError(f"no trained model at {model_dir / run_files.MODEL}; "
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


def _publish(run_dir: Path, metrics: dict[str, float | int | str]) -> None:
    """Test scalars into TensorBoard and the run report; never fails the step."""
    try:
        from sublimate.components.tensorboard_log import write_scalars

        write_scalars(run_dir, "evaluate", int(metrics["steps"]),
                      {f"{metrics['split']}/accuracy": float(metrics["accuracy"]),
                       f"{metrics['split']}/loss": float(metrics["loss"])})
    except Exception as error:  # monitoring is best effort
        print(f"evaluate: no TensorBoard scalars ({error})", file=sys.stderr)
    try:
        from sublimate.components.report import REPORT_DIR, ReportError, write_report

        write_report(run_dir)
        print(f"evaluate: run report in {run_dir / REPORT_DIR} "
              f"(sublimate report {run_dir.name})", flush=True)
    except ReportError:
        pass  # a model without training records (trained elsewhere): nothing to report
    except Exception as error:
        print(f"evaluate: no run report ({error})", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True,
                        help="run folder on the shared volume holding model.pt")
    parser.add_argument("--data-dir", type=Path, required=True, help="staged dataset folder")
    parser.add_argument("--split", default="test")
    parser.add_argument("--accuracy-path", type=Path, help="file to write the accuracy to")
    args = parser.parse_args(argv)
    started = perf_counter()
    try:
        metrics = evaluate(args.model_dir, args.data_dir, args.split)
    except (DatasetError, FileNotFoundError, ValueError) as error:
        print(f"evaluate: error: {error}", file=sys.stderr)
        return 2
    from sublimate.components import checkpoint

    # The step's own cost beside the evaluation's: importing torch, loading model and data.
    metrics["total_seconds"] = round(perf_counter() - started, 3)
    # Evaluation is over in a second or two: too short-lived to scrape, so its metrics are the
    # metrics.json below, the TensorBoard scalars and the run report.
    checkpoint.write_json(metrics, args.model_dir / run_files.EVALUATION)
    _publish(args.model_dir, metrics)
    if args.accuracy_path:
        args.accuracy_path.parent.mkdir(parents=True, exist_ok=True)
        args.accuracy_path.write_text(f"{metrics['accuracy']}")
    print(f"evaluate: {args.split} accuracy {metrics['accuracy']:.4f} loss {metrics['loss']:.4f} "
          f"on {metrics['examples']} examples -> {args.model_dir / run_files.EVALUATION}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def template(name: str = "evaluate", **step_options: object):
    """The ``evaluate`` step: inputs ``data-dir`` and ``model-dir``; output ``accuracy``."""
    from sublimate.components.runtime import python_step

    return python_step(
        name, "sublimate.components.evaluate",
        inputs={"data-dir": "--data-dir", "model-dir": "--model-dir"},
        outputs={"accuracy": "--accuracy-path"},
        **step_options,  # type: ignore[arg-type]
    )
