"""Training throughput of every paradigm, against a hand-written DDP script, in one run.

For the same model (sublimate's MLP), data (digits, staged once), global batch and epochs:

1. the baseline: benchmarks/ddp_baseline.py under plain `torchrun` (2 workers);
2. each paradigm through sublimate's own train step (TorchX `local_cwd`, 2 simulated nodes).

It prints samples/s (training loop only, start-up excluded), the sync/baseline ratio (the
component's abstraction must cost < 5%: ratio >= 0.95), the cost of monitoring (sync with
metrics on against sync with ``SUBLIMATE_METRICS=off``: within 3%), collective or push/pull
operations per epoch, and time-to-target accuracy from a second, evaluated run of each paradigm.

Last, the cost of per-epoch evaluation (on by default in the pipeline): sync on the pipeline's
default settings (2 nodes, global batch 64, 20 epochs, MLP 128) with ``--eval-every-epoch true``
against ``false``, ``--eval-repeat`` times interleaved. It compares the training loop's time
(rank 0's ``train_seconds``, plus its ``evaluation_seconds`` while its peers wait) and the whole
train step's wall time, with medians and spread; ``--eval-cost-only`` runs just this part.

``--smoke`` (tests/test_benchmarks.py) goes through all of it at the tiniest sizes (1 epoch, one
repeat, the timed runs evaluated for their curves instead of a second run each): seconds, and
figures that mean nothing.

Usage: python benchmarks/paradigms.py [--epochs 30] [--hidden 512] [--repeat 3] [--target 0.95]
       python benchmarks/paradigms.py --eval-cost-only [--eval-repeat 5]
       python benchmarks/paradigms.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sublimate.components.base.settings import COLLECTIVE_PARADIGMS
from sublimate.components.base.settings import PARADIGM_NAMES as PARADIGMS
from sublimate.components.data.datasets import build_builtin

HERE = Path(__file__).resolve().parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "LOGLEVEL": "WARNING"}
SMOKE = {"epochs": 1, "repeat": 1, "eval_repeat": 1}  # --smoke's sizes (explicit flags win)
SMOKE_LINE = "smoke mode: sizes too small for the figures to mean anything"


def baseline(data_dir: Path, args: argparse.Namespace) -> float:
    completed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
         str(HERE / "ddp_baseline.py"), str(data_dir), str(args.epochs), str(args.batch),
         str(args.hidden)], env=ENV, capture_output=True, text=True, check=True)
    line = next(line for line in completed.stdout.splitlines() if line.startswith("{"))
    return json.loads(line)["samples_per_second"]


def component(algorithm: str, data_dir: Path, run_dir: Path, args: argparse.Namespace,
              evaluate: bool = False, epochs: int | None = None, metrics: bool = True,
              extra: tuple[str, ...] = ("--checkpoint-every", "0"),
              python: str = sys.executable) -> dict:
    command = [python, "-m", "sublimate.components.steps.train", "--algorithm", algorithm,
               "--data-dir", str(data_dir), "--run-dir", str(run_dir), "--nodes", "2",
               "--epochs", str(epochs or args.epochs), "--global-batch-size", str(args.batch),
               "--hidden", str(args.hidden), *extra, "--scheduler", "local_cwd",
               "--eval-every-epoch", "true" if evaluate else "false"]
    env = ENV if metrics else {**ENV, "SUBLIMATE_METRICS": "off"}
    started = time.perf_counter()
    subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    summary = json.loads((run_dir / "train-summary.json").read_text())
    return {**summary, "step_wall_seconds": time.perf_counter() - started}


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.3f} s ({min(values):.3f}-{max(values):.3f})"


def evaluation_cost(data_dir: Path, folder: Path, repeat: int, epochs: int = 20) -> None:
    """Sync on the pipeline's defaults (``epochs``: 20, 1 in smoke mode), evaluating after every
    epoch or not."""
    defaults = argparse.Namespace(epochs=epochs, batch=64, hidden=128)
    loop: dict[bool, list[float]] = {True: [], False: []}
    wall: dict[bool, list[float]] = {True: [], False: []}
    evaluating: list[float] = []  # rank 0's seconds in evaluation, all epochs together
    for attempt in range(repeat):  # interleaved, so drift hits both alike
        for evaluate in (False, True):
            summary = component("sync", data_dir, folder / f"eval-{evaluate}-{attempt}",
                                defaults, evaluate=evaluate, extra=())  # default checkpoints
            loop[evaluate].append(summary["train_seconds"] + summary["evaluation_seconds"])
            wall[evaluate].append(summary["step_wall_seconds"])
            if evaluate:
                evaluating.append(summary["evaluation_seconds"])
    print(f"per-epoch evaluation, sync on the pipeline's defaults (2 nodes, batch 64, {epochs} "
          f"epochs, MLP 128), median (min-max) of {repeat}")
    print(f"  training loop, eval off   {_spread(loop[False])}")
    print(f"  training loop, eval on    {_spread(loop[True])}   (rank 0's train + evaluation)")
    print(f"  evaluation itself         {_spread(evaluating)}   ({epochs} evaluations of 359 "
          "examples)")
    print(f"  train step wall, eval off {_spread(wall[False])}")
    print(f"  train step wall, eval on  {_spread(wall[True])}")
    print(f"  eval on / off: training loop "
          f"{statistics.median(loop[True]) / statistics.median(loop[False]):.3f} x, "
          f"train step {statistics.median(wall[True]) / statistics.median(wall[False]):.3f} x")


def time_to_target(curve: list[list[float]], target: float) -> str:
    for seconds, _, accuracy in curve:
        if accuracy >= target:
            return f"{seconds:.2f} s"
    return f"not reached (best {max(a for _, _, a in curve):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--eval-repeat", type=int, default=5)
    parser.add_argument("--eval-cost-only", action="store_true",
                        help="measure only the cost of per-epoch evaluation")
    parser.add_argument("--smoke", action="store_true",
                        help="every code path at tiny sizes, in seconds (tests)")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
        print(SMOKE_LINE, flush=True)
    if not args.eval_cost_only:
        compare_paradigms(args)
    with tempfile.TemporaryDirectory() as folder:
        data_dir = build_builtin("digits", Path(folder) / "digits")
        evaluation_cost(data_dir, Path(folder), args.eval_repeat, 1 if args.smoke else 20)


def compare_paradigms(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as folder:
        data_dir = build_builtin("digits", Path(folder) / "digits")
        throughput: dict[str, list[float]] = {
            "baseline": [], "sync-metrics-off": [], **{p: [] for p in PARADIGMS}}
        ops: dict[str, float] = {}
        curves: dict[str, list[list[float]]] = {}
        for attempt in range(args.repeat):  # interleaved, so drift hits every contender alike
            throughput["baseline"].append(baseline(data_dir, args))
            for paradigm in PARADIGMS:
                # smoke: the timed run evaluates too and gives the curve (no second run)
                summary = component(paradigm, data_dir, Path(folder) / f"{paradigm}-{attempt}",
                                    args, evaluate=args.smoke)
                throughput[paradigm].append(summary["samples_per_second"])
                ops[paradigm] = summary["communication_ops_per_epoch"]
                curves[paradigm] = summary["accuracy_curve"]
            quiet = component("sync", data_dir, Path(folder) / f"sync-off-{attempt}", args,
                              metrics=False)
            throughput["sync-metrics-off"].append(quiet["samples_per_second"])
        if not args.smoke:
            curves = {p: component(p, data_dir, Path(folder) / f"{p}-eval", args,
                                   evaluate=True, epochs=args.epochs)["accuracy_curve"]
                      for p in PARADIGMS}
    medians = {name: statistics.median(values) for name, values in throughput.items()}
    print(f"digits, MLP hidden={args.hidden}, 2 workers, global batch {args.batch}, "
          f"{args.epochs} epochs, median of {args.repeat}")
    print(f"{'contender':<22}{'samples/s':>11}{'vs baseline':>13}{'comm ops/epoch':>16}"
          f"{'time to ' + str(args.target):>20}")
    print(f"{'ddp baseline (torchrun)':<22}{medians['baseline']:>11.0f}{1.0:>13.3f}"
          f"{'22 all-reduce':>16}{'-':>20}")
    for paradigm in PARADIGMS:  # every paradigm of settings.PARADIGMS, a new one included
        kind = "all-reduce" if paradigm in COLLECTIVE_PARADIGMS else "push/pull"
        print(f"{paradigm:<22}{medians[paradigm]:>11.0f}"
              f"{medians[paradigm] / medians['baseline']:>13.3f}"
              f"{f'{ops[paradigm]:g} {kind}':>16}"
              f"{' ' + time_to_target(curves[paradigm], args.target):>20}")
    print(f"{'sync, metrics off':<22}{medians['sync-metrics-off']:>11.0f}"
          f"{medians['sync-metrics-off'] / medians['baseline']:>13.3f}")
    # The loops are short (~1 s), so say how far the repeats were apart before reading ratios.
    print("spread over repeats (samples/s): " + ", ".join(
        f"{name} {min(values):.0f}-{max(values):.0f}" for name, values in throughput.items()))
    ratio = medians["sync"] / medians["baseline"]
    print(f"sync component / hand-written DDP: {ratio:.3f} "
          f"({'meets' if ratio >= 0.95 else 'MISSES'} the >= 0.95 target)")
    monitoring = medians["sync"] / medians["sync-metrics-off"]
    print(f"sync metrics on / metrics off: {monitoring:.3f} "
          f"({'meets' if monitoring >= 0.97 else 'MISSES'} the within-3% target)")


if __name__ == "__main__":
    main()
