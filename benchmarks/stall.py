"""What a node killed inside the all-reduce costs the others under per-step recovery, per N.

Each run is ``sublimate run -p recovery=per-step -p scheduler=local_netns -p nodes=N`` (digits,
MLP, 16 samples per node per step) with node N/2 killed by the fault injection while the
all-reduce of step ``--kill-at-step`` waits for its share
(``SUBLIMATE_FAIL_IN_ALLREDUCE_AT_STEP``). From its ``train-summary.json`` (``fault_tolerance``):

- ``stalled``: ``survivors_stalled_seconds``, from the kill to the survivors' next committed
  step (the bound the fail-fast group keeps: a dead node's neighbours close their group, and the
  failure crosses the ring);
- ``dropped``: ``survivor_steps_dropped``, group-steps the survivors dropped meanwhile;
- ``back``: ``replacement_trained_after_seconds``, the replacement's process start to its first
  committed step (it heals from a live peer);
- ``lost``: the killed node's ``steps_lost`` (its transaction in flight: up to ``commit-every``
  steps).

Needs root (network namespaces). Prints a row per run and the median (min to max) per N.

    python benchmarks/stall.py [--nodes 4,8,16] [--repeat 3] [--kill-at-step 30]
    python benchmarks/stall.py --smoke   # one run at N = 2, node 1 killed at step 5: seconds,
                                         # figures that mean nothing
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

STEPS_AFTER_KILL = 200
SMOKE = {"nodes": "2", "repeat": 1, "kill_at_step": 5}  # --smoke's sizes
SMOKE_LINE = "smoke mode: sizes too small for the figures to mean anything"
FIELDS = {"stalled": "survivors_stalled_seconds", "dropped": "survivor_steps_dropped",
          "back": "replacement_trained_after_seconds", "lost": "steps_lost"}


def run(nodes: int, kill_at: int, home: Path) -> dict[str, Any]:
    env = {**os.environ, "SUBLIMATE_HOME": str(home), "OMP_NUM_THREADS": "1"}
    batch = 16 * nodes
    steps_per_epoch = 1437 // batch  # digits' training split
    # enough steps after the kill for the replacement to start and heal (a few seconds)
    epochs = -(-(kill_at + STEPS_AFTER_KILL) // steps_per_epoch)
    done = subprocess.run(
        # the faults are passed (--env): the shell's own variables do not reach the steps
        [str(Path(sys.executable).with_name("sublimate")), "run", "-p", "recovery=per-step",
         "--env", f"SUBLIMATE_FAIL_IN_ALLREDUCE_AT_STEP={kill_at}",
         "--env", f"SUBLIMATE_FAIL_RANK={nodes // 2}", "-p", "scheduler=local_netns",
         "-p", f"nodes={nodes}", "-p", f"global-batch-size={batch}", "-p", f"epochs={epochs}"],
        env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{nodes} nodes failed:\n{(done.stdout + done.stderr)[-4000:]}")
    summary = next(home.glob("volumes/*/runs/*/train-summary.json"))
    (failure,) = json.loads(summary.read_text())["fault_tolerance"]["failures"]
    return {name: failure.get(key) for name, key in FIELDS.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="4,8,16")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kill-at-step", type=int, default=30)
    parser.add_argument("--smoke", action="store_true",
                        help="every code path at tiny sizes, in seconds (tests)")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
        print(SMOKE_LINE, flush=True)
    sizes = [int(n) for n in args.nodes.split(",")]
    results: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    with tempfile.TemporaryDirectory(prefix="sublimate-stall-") as folder:
        for repeat in range(args.repeat):  # interleaved: drift hits every N alike
            for nodes in sizes:
                figures = run(nodes, args.kill_at_step, Path(folder) / f"{nodes}-{repeat}")
                results[nodes].append(figures)
                print(f"N={nodes:2d} run {repeat + 1}: " + ", ".join(
                    f"{name} {value}" for name, value in figures.items()), flush=True)
    print("\nN   stalled s (median, min-max)   dropped      back s (median, min-max)   lost")
    for nodes, runs in results.items():
        print(f"{nodes:<3d} {spread(runs, 'stalled'):<29s} {spread(runs, 'dropped'):<12s} "
              f"{spread(runs, 'back'):<26s} {[r['lost'] for r in runs]}")


def spread(runs: list[dict[str, Any]], name: str) -> str:
    """The median of ``name`` over ``runs``, with its range."""
    values = [run[name] for run in runs if run[name] is not None]
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


if __name__ == "__main__":
    main()
