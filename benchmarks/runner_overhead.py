"""How much the local runner adds to a workflow's own work.

Runs a three-step DAG (each step a trivial Python process) with `sublimate run FILE.yaml`, and the
same three commands by hand in sequence, in one process, several times, and prints medians:

- runner wall time: the whole `sublimate run` command, interpreter start-up included;
- steps' time: how long the three step processes ran (from the run's own node timings);
- runner overhead: wall time minus the steps' time;
- by hand: the three commands run one after another with subprocess.run;
- ratio: runner wall time / by-hand wall time.

For scale: Kubeflow Pipelines' local mode takes 0.61 s and Metaflow 0.99 s for three trivial
steps on our 2-core machines; our target is a third of the former (about 0.2 s).

Each figure is followed by its spread (interquartile range, then min-max): the machines are
shared, so a change is only a regression when it moves the median by more than that.

Usage: python benchmarks/runner_overhead.py [--repeat N]
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

STEP = [sys.executable, "-c", "print('step')"]
MANIFEST = f"""
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {{generateName: three-steps-}}
spec:
  entrypoint: main
  templates:
  - name: main
    dag:
      tasks:
      - {{name: a, template: step}}
      - {{name: b, template: step, depends: a}}
      - {{name: c, template: step, depends: b}}
  - name: step
    container:
      image: python:3.11
      command: {json.dumps(STEP)}
"""


def run_once(manifest: Path, home: Path) -> tuple[float, float]:
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-m", "sublimate.pipelines", "run", str(manifest), "-q", "-o", "json"],
        capture_output=True, text=True, check=True,
        env={**os.environ, "SUBLIMATE_HOME": str(home)})
    wall = time.perf_counter() - started
    result = json.loads(completed.stdout)
    assert result["phase"] == "Succeeded", result
    steps = sum(node["duration_s"] for node in result["nodes"] if node["type"] == "Pod")
    return wall, steps


def by_hand() -> float:
    started = time.perf_counter()
    for _ in range(3):
        subprocess.run(STEP, capture_output=True, check=True)
    return time.perf_counter() - started


def byte_compile_the_package() -> None:
    """Write .pyc files as a wheel install does; an editable install under
    PYTHONDONTWRITEBYTECODE=1 (set on our machines) would otherwise recompile on every start."""
    import compileall

    import sublimate.components
    import sublimate.pipelines

    for package in (sublimate.pipelines, sublimate.components):
        compileall.compile_dir(Path(package.__file__).parent, quiet=1)


def spread(values: list[float]) -> str:
    """``[q1-q3; min-max]`` in seconds: how far apart the repeats were."""
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
    return f"[{q1:.3f}-{q3:.3f}; {min(values):.3f}-{max(values):.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    byte_compile_the_package()
    with tempfile.TemporaryDirectory() as folder:
        manifest = Path(folder) / "three-steps.yaml"
        manifest.write_text(MANIFEST)
        run_once(manifest, Path(folder) / "home")  # warm the page cache and bytecode
        runs = [run_once(manifest, Path(folder) / "home") for _ in range(args.repeat)]
        hand = [by_hand() for _ in range(args.repeat)]
    wall = statistics.median(w for w, _ in runs)
    steps = statistics.median(s for _, s in runs)
    overhead = statistics.median(w - s for w, s in runs)
    manual = statistics.median(hand)
    print(f"three trivial steps, median of {args.repeat} runs  [IQR; min-max]")
    print(f"  sublimate run wall time   {wall:6.3f} s  {spread([w for w, _ in runs])}")
    print(f"  steps' own time           {steps:6.3f} s  {spread([s for _, s in runs])}")
    print(f"  runner overhead           {overhead:6.3f} s  {spread([w - s for w, s in runs])}"
          "  (wall - steps)")
    print(f"  by hand, in sequence      {manual:6.3f} s  {spread(hand)}")
    print(f"  ratio run / by hand       {wall / manual:6.2f} x")
    print(f"  vs KFP local (0.61 s)     {wall / 0.61:6.2f} x   vs Metaflow (0.99 s) "
          f"{wall / 0.99:6.2f} x")


if __name__ == "__main__":
    main()
