"""Launch-to-first-step of the train step, against a bare torchrun script, in one run.

Interleaved, ``--repeat`` times, on the digits dataset staged once:

1. the baseline: plain ``python -m torch.distributed.run`` started twice (``--nnodes 2``, c10d
   rendezvous, one process each, as our two simulated nodes are), running the bare minimum in
   this file (:func:`bare_worker`): import torch, init a gloo process group, wrap the same MLP in
   DDP, take one SGD step on one batch. It reports when that step is done;
2. the train component as the pipeline's train step runs it: ``python -m
   sublimate.components.steps.train`` (TorchX ``local_cwd``, 2 nodes x 1 process, the pipeline's
   defaults, per-epoch evaluation included), ``--epochs 1``. Its workers write
   ``launch_to_first_step_seconds`` and the per-phase ``startup`` to ``train-summary.json``.

Both are timed from the moment their first process starts. It prints median and spread (min-max)
of launch-to-first-step and of the whole command's wall time, their ratios (our overhead over
the bare minimum), and the median of each start-up phase. Ratios are printed, never asserted.

``--launcher FILE.py`` runs another copy of the launcher instead (e.g. a previous version of
components/steps/train.py saved elsewhere), to compare versions in one run.

``--smoke`` (tests/test_benchmarks.py): one round, no warm-up: seconds, figures that mean
nothing.

Usage: python benchmarks/startup.py [--repeat 5] [--launcher FILE.py]
       python benchmarks/startup.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "LOGLEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
HIDDEN = 128
BATCH = 64
SMOKE_LINE = "smoke mode: sizes too small for the figures to mean anything"


def bare_worker(data_dir: str) -> None:
    """The baseline's worker: the least a DDP job does before its first step."""
    # benchmarks/ is sys.path[0] when torchrun runs this file; torch loads here, timed.
    import torch.distributed as dist
    from ddp_baseline import setup
    from torch import nn

    rank, world, x, y, model, optimizer = setup(data_dir, HIDDEN)
    local = BATCH // world
    rows = slice(rank * local, (rank + 1) * local)
    nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
    optimizer.step()
    if rank == 0:
        print(json.dumps({"first_step_at": time.time()}), flush=True)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def baseline(data_dir: Path) -> tuple[float, float]:
    """(launch to first step, wall time) of two bare torchrun nodes."""
    endpoint, run_id = f"localhost:{_free_port()}", uuid.uuid4().hex[:8]
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
               "--rdzv-id", run_id, str(Path(__file__).resolve()), "--bare-worker",
               str(data_dir)]
    started = time.time()
    nodes = [subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outputs = [node.communicate(timeout=300) for node in nodes]
    wall = time.time() - started
    for node, (_, stderr) in zip(nodes, outputs, strict=True):
        if node.returncode:
            raise SystemExit(f"baseline failed:\n{stderr}")
    line = next(line for out, _ in outputs for line in out.splitlines()
                if line.startswith('{"first_step_at"'))
    return json.loads(line)["first_step_at"] - started, wall


def component(data_dir: Path, run_dir: Path, launcher: str | None,
              ) -> tuple[float, float, dict[str, float], float]:
    """(launch to first step, wall time, start-up phases, training seconds) of the train step."""
    target = [launcher] if launcher else ["-m", "sublimate.components.steps.train"]
    command = [sys.executable, *target, "--data-dir", str(data_dir), "--run-dir", str(run_dir),
               "--nodes", "2", "--epochs", "1", "--scheduler", "local_cwd"]
    started = time.time()
    # A launcher that does not time itself (an older version) is timed from here.
    env = {**ENV, "SUBLIMATE_LAUNCH_TIME": f"{started:.3f}"}
    completed = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.time() - started
    if completed.returncode:
        raise SystemExit(f"train step failed:\n{completed.stdout}\n{completed.stderr}")
    summary = json.loads((run_dir / "train-summary.json").read_text())
    return (summary["launch_to_first_step_seconds"], wall, summary["startup"],
            summary["train_seconds"])


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} s  ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--launcher", help="a launcher file to run instead of the installed one")
    parser.add_argument("--bare-worker", metavar="DATA_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true",
                        help="every code path at tiny sizes, in seconds (tests)")
    args = parser.parse_args()
    if args.bare_worker:
        bare_worker(args.bare_worker)
        return
    if args.smoke:
        parser.set_defaults(repeat=1)
        args = parser.parse_args()
        print(SMOKE_LINE, flush=True)
    from sublimate.components.data.datasets import build_builtin

    with tempfile.TemporaryDirectory() as folder:
        data_dir = build_builtin("digits", Path(folder) / "digits")
        if not args.smoke:  # page cache, bytecode
            component(data_dir, Path(folder) / "warm-up", args.launcher)
        bare_first, bare_wall, ours_first, ours_wall, train = [], [], [], [], []
        phases: dict[str, list[float]] = {}
        for attempt in range(args.repeat):  # interleaved, so drift hits both alike
            first, wall = baseline(data_dir)
            bare_first.append(first)
            bare_wall.append(wall)
            first, wall, startup, seconds = component(data_dir, Path(folder) / f"run-{attempt}",
                                                      args.launcher)
            ours_first.append(first)
            ours_wall.append(wall)
            train.append(seconds)
            for name, value in startup.items():
                phases.setdefault(name, []).append(value)
    print(f"digits, 2 nodes x 1 process, 1 epoch, median (min-max) of {args.repeat}, "
          f"{os.cpu_count()} CPUs")
    print(f"  bare torchrun + DDP, launch to first step   {_spread(bare_first)}")
    print(f"  train step,          launch to first step   {_spread(ours_first)}")
    print(f"  bare torchrun + DDP, wall time              {_spread(bare_wall)}")
    print(f"  train step,          wall time              {_spread(ours_wall)}"
          f"   (training itself {statistics.median(train):.2f} s)")
    first_ratio = statistics.median(ours_first) / statistics.median(bare_first)
    wall_ratio = statistics.median(ours_wall) / statistics.median(bare_wall)
    print(f"  ratio train step / bare: first step {first_ratio:.2f} x, wall {wall_ratio:.2f} x")
    print("  train step's phases (median): " + ", ".join(
        f"{name.replace('_', ' ')} {statistics.median(values):.2f} s"
        for name, values in phases.items()))


if __name__ == "__main__":
    main()
