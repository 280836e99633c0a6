"""Communication share of synchronous training as the nodes' link rate falls (`local_netns`).

Trains the same job (sync, 3 nodes, digits, global batch 60) through sublimate's train step on a
cluster on one machine, once per link rate (unlimited, then `tc tbf` on every node's link both
ways), and prints per rate: samples/s, the share of step time in communication (the run's
epoch records, every rank, all epochs but the first), and the final test accuracy, which the
rate must not change. `--repeat` runs every rate several times, interleaved, and prints the
spread of the comm share. Needs root.

``--smoke`` (tests/test_benchmarks.py): 1gbit, 1 epoch, MLP 16: seconds, figures that mean
nothing.

Usage: python benchmarks/link_rates.py [--rates none,1gbit,100mbit,20mbit] [--epochs 4]
       [--hidden 512] [--repeat 1]
       python benchmarks/link_rates.py --smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from sublimate.components.data.datasets import build_builtin

SMOKE = {"rates": "1gbit", "epochs": 1, "hidden": 16}  # --smoke's sizes
SMOKE_LINE = "smoke mode: sizes too small for the figures to mean anything"


def train(data_dir: Path, run_dir: Path, rate: str, args: argparse.Namespace) -> dict[str, float]:
    command = [sys.executable, "-m", "sublimate.components.steps.train",
               "--data-dir", str(data_dir),
               "--run-dir", str(run_dir), "--scheduler", "local_netns", "--nodes", "3",
               "--global-batch-size", "60", "--epochs", str(args.epochs),
               "--hidden", str(args.hidden), "--checkpoint-every", "0",
               "--eval-every-epoch", "true"]
    if rate != "none":
        command += ["--link-rate", rate]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=1800)
    records = [json.loads(line) for path in sorted((run_dir / "metrics").glob("rank-*.jsonl"))
               for line in path.read_text().splitlines()]
    later = [record for record in records if record["epoch"] > 1] or records
    comm = sum(record["comm_seconds"] for record in later)
    total = sum(record["data_seconds"] + record["compute_seconds"] + record["comm_seconds"]
                for record in later)
    summary = json.loads((run_dir / "train-summary.json").read_text())
    return {"samples_per_second": summary["samples_per_second"],
            "comm_share": comm / max(total, 1e-9),
            "accuracy": summary["accuracy_curve"][-1][2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="none,1gbit,100mbit,20mbit")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=512,
                        help="width of the MLP: 512 makes a 1.2 MB gradient per step")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--smoke", action="store_true",
                        help="every code path at tiny sizes, in seconds (tests)")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
        print(SMOKE_LINE, flush=True)
    rates = args.rates.split(",")
    results: dict[str, list[dict[str, float]]] = {rate: [] for rate in rates}
    with tempfile.TemporaryDirectory() as scratch:
        data_dir = build_builtin("digits", Path(scratch) / "digits")
        for round_ in range(args.repeat):
            for rate in rates:
                results[rate].append(train(data_dir, Path(scratch) / f"{rate}-{round_}", rate,
                                           args))
                print(f"  {rate}: {results[rate][-1]}", file=sys.stderr, flush=True)
    print(f"{'link rate':>10} {'samples/s':>10} {'comm share':>11} {'(min-max)':>13} "
          f"{'accuracy':>9}")
    for rate in rates:
        shares = [run["comm_share"] for run in results[rate]]
        speed = statistics.median(run["samples_per_second"] for run in results[rate])
        print(f"{rate:>10} {speed:>10.0f} {statistics.median(shares):>10.1%} "
              f"{f'{min(shares):.1%}-{max(shares):.1%}':>13} "
              f"{statistics.median(r['accuracy'] for r in results[rate]):>9.4f}")


if __name__ == "__main__":
    main()
