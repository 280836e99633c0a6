"""Per-step recovery against restarting, under the same failures, in one run.

On a cluster on one machine (``local_netns``, 4 nodes, mnist1d, fixed seeds):

1. **Failure-free cost**: samples/s of ``recovery=per-step`` against ``recovery=restart`` with no
   failure, ``--repeat`` pairs interleaved (so drift hits both alike): the ratio per pair, its
   median and spread. The training loop's own figure (``train-summary.json``'s
   ``samples_per_second``: start-up excluded).
2. **Under chaos**: the same kill schedule (``chaos-seed``: the same intervals and nodes) against
   each mode: wall time from the train step's start to ``--target`` test accuracy (the leading
   group's per-epoch evaluation), final accuracy, relaunches, and per-step's losses (steps lost
   per failure, seconds until each replacement trained again, group-steps committed against the
   bound). Also a failure-free per-step run with the same seed, for the accuracy it should keep.

``--smoke`` (tests/test_benchmarks.py): both parts on 2 nodes and digits, one pair (whose
per-step run gives the failure-free accuracy too: the same run), one kill, in a temporary folder
removed afterwards: seconds, figures that mean nothing.

Needs root (network namespaces). Usage:
    python benchmarks/fault_tolerance.py [--nodes 4] [--epochs 8] [--mtbf 6] [--kills 5]
        [--seed 3] [--target 0.80] [--repeat 3] [--batch 128] [--commit-every K]
        [--algorithm sync|bmuf|easgd]
        [--skip-throughput | --skip-chaos]
    python benchmarks/fault_tolerance.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sublimate.components.data.datasets import build_builtin

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "LOGLEVEL": "WARNING"}
# --smoke's sizes: digits (mnist1d takes ~18 s to generate), long enough for one kill to land
SMOKE = {"dataset": "digits", "nodes": 2, "epochs": 10, "batch": 64, "mtbf": 0.5, "kills": 1,
         "target": 0.5, "repeat": 1}
SMOKE_LINE = "smoke mode: sizes too small for the figures to mean anything"


def train(data_dir: Path, run_dir: Path, args: argparse.Namespace, recovery: str,
          chaos: bool) -> dict[str, Any]:
    command = [sys.executable, "-m", "sublimate.components.steps.train", "--data-dir",
               str(data_dir), "--run-dir", str(run_dir), "--scheduler", "local_netns",
               "--nodes", str(args.nodes), "--epochs", str(args.epochs), "--algorithm",
               args.algorithm, "--global-batch-size",
               str(args.batch), "--recovery", recovery, "--seed", "0",
               "--checkpoint-every", str(args.checkpoint_every)]
    if recovery == "per-step" and args.commit_every:
        command += ["--commit-every", str(args.commit_every)]
    if chaos:
        command += ["--chaos-mtbf", str(args.mtbf), "--chaos-kills", str(args.kills),
                    "--chaos-seed", str(args.seed),
                    # restart relaunches once per kill at most; per-step replaces each node
                    "--max-restarts", str(args.kills)]
    started = time.time()
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{recovery}{' under chaos' if chaos else ''} failed:\n"
                         + (done.stdout + done.stderr)[-4000:])
    summary = json.loads((run_dir / "train-summary.json").read_text())
    epochs = _epochs(run_dir)
    reached = next((record["time"] - started for record in epochs
                    if record.get("test_accuracy", 0) >= args.target), None)
    return {"summary": summary, "wall": time.time() - started, "to_target": reached,
            "accuracy": epochs[-1].get("test_accuracy") if epochs else None,
            "relaunches": (done.stdout + done.stderr).count("train: relaunching "),
            "output": done.stdout + done.stderr}


def _epochs(run_dir: Path) -> list[dict[str, Any]]:
    """The job's epoch records in the order they were written (the leading group's under
    per-step recovery, rank 0's otherwise)."""
    records = []
    for path in (run_dir / "metrics").glob("rank-*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("leader") or (path.stem == "rank-0" and "leader" not in record):
                records.append(record)
    return sorted(records, key=lambda record: record["time"])


def _spread(values: list[float], unit: str = "") -> str:
    return (f"{statistics.median(values):.3f}{unit} (min {min(values):.3f}, "
            f"max {max(values):.3f}, n={len(values)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--mtbf", type=float, default=6.0)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.80)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--algorithm", default="sync",
                        help="the paradigm (bmuf, easgd: a transaction per averaging round)")
    parser.add_argument("--commit-every", type=int, default=0,
                        help="per-step's commit-every (0: its default)")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-chaos", action="store_true", help="the failure-free ratio only")
    parser.add_argument("--dataset", default="mnist1d", help="a built-in dataset")
    parser.add_argument("--smoke", action="store_true",
                        help="every code path at tiny sizes, in seconds (tests)")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
        print(SMOKE_LINE, flush=True)
    folder = Path(tempfile.mkdtemp(prefix="sublimate-ft-bench-"))
    try:
        measure(args, folder)
    finally:
        if args.smoke:  # else the runs are kept, for a look at their logs
            shutil.rmtree(folder, ignore_errors=True)


def measure(args: argparse.Namespace, folder: Path) -> None:
    data_dir = build_builtin(args.dataset, folder / args.dataset)
    print(f"load before: {os.getloadavg()[0]:.2f}; {args.nodes} nodes on local_netns, "
          f"{args.dataset}, "
          f"{args.algorithm}, batch {args.batch}, {args.epochs} epochs, per-step commit-every "
          f"{args.commit_every or 'default'}", flush=True)

    calm: dict[str, Any] | None = None  # smoke: the pair's per-step run, the same settings
    if not args.skip_throughput:
        ratios, rates = [], {"restart": [], "per-step": []}
        for attempt in range(args.repeat):
            pair = {}
            for recovery in ("restart", "per-step"):
                result = train(data_dir, folder / f"calm-{recovery}-{attempt}", args, recovery,
                               chaos=False)
                pair[recovery] = result["summary"]["samples_per_second"]
                if args.smoke and recovery == "per-step":
                    calm = result
                rates[recovery].append(pair[recovery])
            ratios.append(pair["per-step"] / pair["restart"])
            print(f"  pair {attempt + 1}: restart {pair['restart']:.0f} samples/s, per-step "
                  f"{pair['per-step']:.0f} samples/s, ratio {ratios[-1]:.3f}", flush=True)
        print("failure-free throughput, per-step / restart: " + _spread(ratios))
        for recovery, values in rates.items():
            print(f"  {recovery:9} samples/s: {_spread(values)}")

    kept = " (removed: smoke mode)" if args.smoke else ""
    if args.skip_chaos:
        print(f"load after: {os.getloadavg()[0]:.2f}; runs in {folder}{kept}")
        return
    calm = calm or train(data_dir, folder / "calm-per-step-accuracy", args, "per-step",
                         chaos=False)
    print(f"failure-free per-step: accuracy {calm['accuracy']}, {args.target} after "
          f"{calm['to_target']:.1f}s" if calm["to_target"] else
          f"failure-free per-step: accuracy {calm['accuracy']} (target not reached)")
    results = {}
    for recovery in ("restart", "per-step"):
        result = results[recovery] = train(data_dir, folder / f"chaos-{recovery}", args,
                                           recovery, chaos=True)
        kills = [line for line in result["output"].splitlines() if "chaos killed" in line]
        reached = f"{result['to_target']:.1f}s" if result["to_target"] else "never"
        print(f"under chaos, {recovery}: {kills[-1].split('train: ')[-1] if kills else ''}; "
              f"{args.target} reached after {reached}; final accuracy {result['accuracy']}; "
              f"{result['relaunches']} relaunch(es); train step {result['wall']:.1f}s",
              flush=True)
    section = results["per-step"]["summary"].get("fault_tolerance", {})
    for failure in section.get("failures", []):
        after = failure.get("replacement_trained_after_seconds")
        when = f"at step {failure['step']}" if failure.get("step") is not None \
            else "while it started (a replacement not yet training)"
        print(f"  per-step: node{failure['node']} lost {when}, "
              f"{failure.get('steps_lost')} step(s) lost, " + (
                  f"replacement trained after {after}s" if after is not None else
                  "the job ended before its replacement trained"))
    if section:
        print(f"  per-step: {section['steps_committed']} of {section['steps_attempted']} "
              f"group-steps committed ({section['committed_ratio']:.4f}; bound "
              f"{section['committed_bound']:.4f})")
    restart, per_step = results["restart"]["to_target"], results["per-step"]["to_target"]
    if restart and per_step:
        print(f"time to {args.target}: per-step {per_step:.1f}s, restart {restart:.1f}s, "
              f"ratio {per_step / restart:.3f}")
    print(f"load after: {os.getloadavg()[0]:.2f}; runs in {folder}{kept}")


if __name__ == "__main__":
    main()
