"""CPU and start-up of a local train step: nodes forked from one server, or started afresh.

Interleaved, ``--repeat`` rounds, on the digits dataset staged once: the pipeline's train step
(``python -m sublimate.components.steps.train``, TorchX ``local_cwd``, or ``local_netns`` with
``--scheduler local_netns`` (root), N nodes x 1 process, ``--epochs 1``) with its agents forked
from the launcher's fork server (the default, ``launch.forked_agents``) and with
``SUBLIMATE_FORK_AGENTS=0`` (every agent a new interpreter that imports torch itself, as
before the server). For each: the CPU time of the whole step (the
launcher and every process under it: each waits for its children, so the kernel's accounting of
waited-for children holds them all), its wall time, and launch to first step. Medians, spreads
(min-max) and the ratios forked / afresh are printed, never asserted.

``--replacements R`` also runs R interleaved pairs of a per-step job (``sublimate run``, 3
nodes, 10 epochs) whose node 0 is killed at step 100, and prints how long its replacement took
from its start to training again (``replacement_trained_after_seconds``), forked and afresh.

``--smoke`` (tests/test_benchmarks.py): one round at 2 nodes without the warm-up, and one
replacement, forked only (node 0 killed at step 5 of 1 epoch; afresh runs the same code, in a
whole run of its own): seconds, figures that mean nothing.

Usage: python benchmarks/forked_agents.py [--repeat 7] [--nodes 2,4] [--replacements 3]
                                         [--scheduler local_cwd|local_netns]
       python benchmarks/forked_agents.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "LOGLEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
MODES = {"afresh": "0", "forked": "1"}
SMOKE = {"repeat": 1, "nodes": "2", "replacements": 1}  # --smoke's sizes
SMOKE_LINE = "smoke mode: sizes too small for the figures to mean anything"


def train_step(data_dir: Path, run_dir: Path, nodes: int, forked: str,
               scheduler: str) -> tuple[float, float, float]:
    """(CPU seconds, wall seconds, launch to first step) of one train step."""
    command = [sys.executable, "-m", "sublimate.components.steps.train", "--data-dir",
               str(data_dir), "--run-dir", str(run_dir), "--nodes", str(nodes), "--epochs", "1",
               "--scheduler", scheduler]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    env = {**ENV, "SUBLIMATE_LAUNCH_TIME": f"{started:.3f}", "SUBLIMATE_FORK_AGENTS": forked}
    completed = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.time() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if completed.returncode:
        raise SystemExit(f"train step failed:\n{completed.stdout}\n{completed.stderr}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    summary = json.loads((run_dir / "train-summary.json").read_text())
    return cpu, wall, summary["launch_to_first_step_seconds"]


def replacement(home: Path, forked: str, scheduler: str, kill_at: int = 100,
                epochs: int = 10) -> float:
    """Seconds from node 0's replacement's start to its training again, in a per-step job."""
    env = {**ENV, "SUBLIMATE_HOME": str(home)}
    # the step's variables are passed (--env): the shell's own do not reach the steps
    passed = {"SUBLIMATE_FORK_AGENTS": forked, "SUBLIMATE_FAIL_AT_STEP": str(kill_at),
              "SUBLIMATE_FAIL_RANK": "0"}
    completed = subprocess.run(
        [sys.executable, "-m", "sublimate.pipelines", "run", "-q", "-p", "recovery=per-step",
         *[flag for pair in passed.items() for flag in ("--env", "=".join(pair))],
         "-p", "nodes=3:3", "-p", "global-batch-size=60", "-p", f"epochs={epochs}",
         "-p", f"scheduler={scheduler}"],
        env=env, capture_output=True, text=True, check=False)
    if completed.returncode:
        raise SystemExit(f"per-step run failed:\n{completed.stdout}\n{completed.stderr}")
    (summary,) = home.glob("volumes/*/runs/*/train-summary.json")
    (failure,) = json.loads(summary.read_text())["fault_tolerance"]["failures"]
    return failure["replacement_trained_after_seconds"]


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f}  ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--nodes", default="2,4")
    parser.add_argument("--replacements", type=int, default=0)
    parser.add_argument("--scheduler", choices=["local_cwd", "local_netns"], default="local_cwd")
    parser.add_argument("--smoke", action="store_true",
                        help="every code path at tiny sizes, in seconds (tests)")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
        print(SMOKE_LINE, flush=True)
    # node 0 killed at step 100 of 10 epochs (smoke: step 5 of 1; nodes=3:3 keeps the others
    # waiting for the replacement, so it trains again before the job ends)
    kill_at, epochs = (5, 1) if args.smoke else (100, 10)
    from sublimate.components.data.datasets import build_builtin

    counts = [int(n) for n in args.nodes.split(",")] if args.repeat else []
    with tempfile.TemporaryDirectory() as folder:
        data_dir = build_builtin("digits", Path(folder) / "digits")
        if not args.smoke:  # page cache
            train_step(data_dir, Path(folder) / "warm-up", 2, "1", args.scheduler)
        results: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
        for attempt in range(args.repeat):  # interleaved, so drift hits both alike
            for nodes in counts:
                for mode, value in MODES.items():
                    run_dir = Path(folder) / f"{nodes}-{mode}-{attempt}"
                    results.setdefault((nodes, mode), []).append(
                        train_step(data_dir, run_dir, nodes, value, args.scheduler))
        healed: dict[str, list[float]] = {}
        replaced = {"forked": MODES["forked"]} if args.smoke else MODES
        for attempt in range(args.replacements):
            for mode, value in replaced.items():
                healed.setdefault(mode, []).append(
                    replacement(Path(folder) / f"per-step-{mode}-{attempt}", value,
                                args.scheduler, kill_at, epochs))
    print(f"digits, train step on {args.scheduler}, 1 epoch, median (min-max) of {args.repeat}, "
          f"{os.cpu_count()} CPUs")
    for nodes in counts:
        for mode in MODES:
            cpu, wall, first = zip(*results[(nodes, mode)], strict=True)
            print(f"  {nodes} nodes, {mode:6}  CPU {_spread(list(cpu))} s   wall "
                  f"{_spread(list(wall))} s   launch to first step {_spread(list(first))} s")
        ratios = [statistics.median(column[i] for column in results[(nodes, "forked")]) /
                  statistics.median(column[i] for column in results[(nodes, "afresh")])
                  for i in range(3)]
        print(f"  {nodes} nodes, forked / afresh: CPU {ratios[0]:.2f}, wall {ratios[1]:.2f}, "
              f"launch to first step {ratios[2]:.2f}")
    for mode, seconds in healed.items():
        print(f"  per-step, 3 nodes, node 0 killed at step {kill_at}, {mode:6}: its replacement "
              f"trained again after {_spread(seconds)} s")


if __name__ == "__main__":
    main()
