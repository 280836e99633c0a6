"""How long a checkpoint keeps training waiting: checkpoint-format files (every rank writes its
whole state, then a barrier and the commit) against dcp (torch.distributed.checkpoint, sharded and
asynchronous), with the project's own checkpointers, on a model big enough to matter.

    python benchmarks/checkpoints.py [--repeat 4] [--between 4] [--width 3200] [--depth 10]

Two ranks (torchrun, gloo, CPU, one thread each) train a DDP model of ``depth`` x
``Linear(width, width)`` (102.4M parameters by default) with SGD and momentum: 410 MB of
weights and 410 MB of momentum per rank. For each format, in turn: ``between`` steps without a
checkpoint give the step time of this run (the baseline), then ``repeat`` checkpoints, each
followed by ``between`` steps. What a checkpoint costs training, per format:

- ``blocked``: until ``save`` returns, on the slower rank (dcp: the copy into the stager's
  memory; files: writing both ranks' files, fsync, barrier, commit);
- ``waited``: dcp only, at the next checkpoint or the end, for the background write if it had
  not finished (at most one save is in flight);
- ``overlap``: the steps after the save, less ``between`` baseline steps (the background write
  competes with training for the cores and the disk);
- ``cost`` = the three; ``share`` = cost / (between x the baseline step); and the
  ``checkpoint-every`` at which the cost is 1% of the time between checkpoints.

The first checkpoint of either format is reported apart (it faults fresh memory in); the others
give a median and their range. Files go to a temporary folder on local disk, fsync'ed. Timings
on a shared machine are noisy: read the ratios against this run's own baseline, with the load.

``--smoke`` (tests/test_benchmarks.py): both formats on a 2 x ``Linear(64, 64)`` model, two
checkpoints one step apart: seconds, figures that mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SMOKE = {"repeat": 2, "between": 1, "width": 64, "depth": 2}  # --smoke's sizes
SMOKE_LINE = "smoke mode: sizes too small for the figures to mean anything"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--between", type=int, default=4)
    parser.add_argument("--width", type=int, default=3200)
    parser.add_argument("--depth", type=int, default=10)
    parser.add_argument("--formats", default="files,dcp")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true",
                        help="every code path at tiny sizes, in seconds (tests)")
    args = parser.parse_args()
    if args.smoke:  # the workers get --smoke too, and the same sizes
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.smoke:
        print(SMOKE_LINE, flush=True)
    with tempfile.TemporaryDirectory(prefix="checkpoints-bench-") as folder:
        results = Path(folder) / "results.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "BENCH_RESULTS": str(results),
               "BENCH_FOLDER": folder}
        load_before = os.getloadavg()[0]
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", __file__, "--worker",
                        *sys.argv[1:]], check=True, env=env)
        report(json.loads(results.read_text()), load_before, os.getloadavg()[0])


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from sublimate.components.training import checkpointer

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(args.width, args.width) for _ in range(args.depth)])
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)

    def step() -> float:
        started = time.perf_counter()
        ddp(torch.randn(8, args.width)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        return time.perf_counter() - started

    def slowest(seconds: float) -> float:
        value = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return float(value.item())

    for _ in range(2):  # warm up
        step()
    measured: dict[str, object] = {
        "parameters": sum(p.numel() for p in model.parameters()), "between": args.between,
        "formats": {}}
    for checkpoint_format in args.formats.split(","):
        run_dir = Path(os.environ["BENCH_FOLDER"]) / checkpoint_format
        saver = checkpointer(checkpoint_format, run_dir, rank, 2, "sync")
        baseline = statistics.median(slowest(step()) for _ in range(args.between))
        saves, waits = [], []
        for repetition in range(args.repeat):
            started = time.perf_counter()
            saver.wait()  # the previous background save, if it is still going
            waits.append(slowest(time.perf_counter() - started))
            started = time.perf_counter()
            saver.save(repetition + 1, model, optimizer)
            blocked = slowest(time.perf_counter() - started)
            steps = slowest(sum(step() for _ in range(args.between)))
            saves.append({"blocked": blocked,
                          "overlap": max(steps - args.between * baseline, 0.0)})
        started = time.perf_counter()
        saver.wait()
        waits.append(slowest(time.perf_counter() - started))
        for save, waited in zip(saves, waits[1:], strict=True):  # a wait is for the save before
            save["waited"] = waited
        written = sum(path.stat().st_size for path in (run_dir / "checkpoints").rglob("*")
                      if path.is_file()) / 2  # KEEP_STEPS step folders are kept
        measured["formats"][checkpoint_format] = {  # type: ignore[index]
            "baseline_step": baseline, "saves": saves, "bytes_per_checkpoint": written}
        dist.barrier()
    if rank == 0:
        Path(os.environ["BENCH_RESULTS"]).write_text(json.dumps(measured))
    dist.destroy_process_group()


def report(measured: dict, load_before: float, load_after: float) -> None:
    print(f"\n{measured['parameters'] / 1e6:.1f}M parameters, 2 ranks, gloo on CPU; "
          f"1-minute load {load_before:.1f} -> {load_after:.1f}\n")
    print("| format | step (baseline) | first: cost | blocked (median, range) | waited | overlap "
          "| cost (median, range) | share of 'between' | checkpoint-every for 1% | written |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    costs = {}
    for name, result in measured["formats"].items():
        saves, step = result["saves"], result["baseline_step"]
        for save in saves:
            save["cost"] = save["blocked"] + save["waited"] + save["overlap"]
        rest = saves[1:] or saves
        cost = statistics.median(save["cost"] for save in rest)
        costs[name] = cost
        print(f"| {name} | {step:.2f} s | {saves[0]['cost']:.2f} s "
              f"| {spread([s['blocked'] for s in rest])} | {spread([s['waited'] for s in rest])} "
              f"| {spread([s['overlap'] for s in rest])} | {spread([s['cost'] for s in rest])} "
              f"| {cost / (measured['between'] * step):.1%} | {math.ceil(100 * cost / step)} "
              f"| {result['bytes_per_checkpoint'] / 1e9:.2f} GB |")
    if "files" in costs and "dcp" in costs and costs["dcp"]:
        print(f"\nfiles / dcp cost per checkpoint: {costs['files'] / costs['dcp']:.1f}x")


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


if __name__ == "__main__":
    main()
