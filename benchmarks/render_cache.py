"""The rendered-pipeline cache (``pipelines/render.py``): `sublimate run NAME` with and without it.

Alternates runs with the cache (warmed first) and with ``SUBLIMATE_RENDER_CACHE=0`` (Hera
imported and the pipeline rendered every time), so drift on a shared machine hits both alike.
Each run's CPU time is its whole process tree's (``RUSAGE_CHILDREN``); prints per kind the
median, the spread (min-max) and the cached/rendered ratio.

Usage: python benchmarks/render_cache.py [--repeat 10] [--full 3]
  --repeat: `sublimate run --dry-run` (the runner's own start: parse, render, plan) per side
  --full:   whole default runs (stage, train on 2 nodes, evaluate) per side
  --smoke:  (tests/test_benchmarks.py) one of each per side, the default runs of 1 epoch:
            seconds, figures that mean nothing
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

SMOKE = {"repeat": 1, "full": 1}  # --smoke's sizes (and its default runs train 1 epoch)
SMOKE_LINE = "smoke mode: sizes too small for the figures to mean anything"


def _once(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sublimate.pipelines", "run", *args], env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime), wall


def _line(name: str, cached: list[float], rendered: list[float]) -> str:
    a, b = statistics.median(cached), statistics.median(rendered)
    return (f"{name:<22} cached {a:6.2f} ({min(cached):.2f}-{max(cached):.2f})   rendered "
            f"{b:6.2f} ({min(rendered):.2f}-{max(rendered):.2f})   ratio {a / b:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--full", type=int, default=3)
    parser.add_argument("--smoke", action="store_true",
                        help="every code path at tiny sizes, in seconds (tests)")
    options = parser.parse_args()
    if options.smoke:
        parser.set_defaults(**SMOKE)
        options = parser.parse_args()
        print(SMOKE_LINE, flush=True)
    full = ["-p", "epochs=1"] if options.smoke else []
    with tempfile.TemporaryDirectory() as folder:
        base = {**os.environ, "SUBLIMATE_HOME": folder, "XDG_CACHE_HOME": f"{folder}/cache"}
        sides = {"cached": base, "rendered": {**base, "SUBLIMATE_RENDER_CACHE": "0"}}
        _once(["--dry-run"], sides["cached"])  # warms the cache
        for kind, args, count in (("dry run: CPU-s", ["--dry-run"], options.repeat),
                                  ("default run: CPU-s", full, options.full)):
            cpu: dict[str, list[float]] = {side: [] for side in sides}
            wall: dict[str, list[float]] = {side: [] for side in sides}
            for _ in range(count):
                for side, env in sides.items():
                    used, took = _once(args, env)
                    cpu[side].append(used)
                    wall[side].append(took)
            print(_line(kind, cpu["cached"], cpu["rendered"]))
            print(_line(kind.replace("CPU-s", "wall s"), wall["cached"], wall["rendered"]))


if __name__ == "__main__":
    main()
