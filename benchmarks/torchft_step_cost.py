"""What per-step recovery's transaction costs a step by itself: torchft's quorum, its all-reduce
wrapper and its commit, for one replica group alone (no peer: no network, no waiting).

A Lighthouse (sublimate's role, as a training job starts it) and one torchft Manager over gloo
on loopback; each step is ``start_quorum`` (answered in the background), ``wait_quorum``, an
all-reduce of a tensor of ``--values`` floats (the digits MLP's gradient: 26,122) and
``should_commit``, as per-step recovery's loop does (``training/fault_tolerance.py``). Prints,
per step, the wall time and this process's CPU time (the Manager's Rust threads included) for
each of ``--repeat`` rounds of ``--steps`` steps, then their median and range.

    python benchmarks/torchft_step_cost.py [--steps 500] [--repeat 5] [--values 26122]
    python benchmarks/torchft_step_cost.py --smoke   # 2 rounds of 5 steps after 5 of warm-up:
                                                     # seconds, figures that mean nothing
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta

PHASES = ("start quorum", "wait quorum", "all-reduce", "commit")
SMOKE = {"steps": 5, "repeat": 2, "warmup": 5}  # --smoke's sizes
SMOKE_LINE = "smoke mode: sizes too small for the figures to mean anything"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--values", type=int, default=26122)
    parser.add_argument("--warmup", type=int, default=50,
                        help="steps first, not timed (the first quorum configures the group)")
    parser.add_argument("--smoke", action="store_true",
                        help="every code path at tiny sizes, in seconds (tests)")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
        print(SMOKE_LINE, flush=True)
    os.environ.setdefault("RUST_LOG", "warn")
    import torch
    from torch.distributed import TCPStore
    from torchft.checkpointing.pg_transport import PGTransport
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    from sublimate.components.base.ports import free_port

    logging.getLogger("torchft").setLevel(logging.CRITICAL)
    lighthouse_port, store_port = free_port(), free_port()
    lighthouse = subprocess.Popen(
        [sys.executable, "-m", "sublimate.components.launch.lighthouse", "--port",
         str(lighthouse_port), "--min-groups", "1", "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL)
    try:
        time.sleep(1)
        store = TCPStore("127.0.0.1", store_port, is_master=True, wait_for_workers=False)
        timeout = timedelta(seconds=30)
        group = ProcessGroupGloo(timeout=timeout)
        manager = Manager(
            pg=group, load_state_dict=lambda state: None, state_dict=lambda: {},
            min_replica_size=1, use_async_quorum=True, timeout=timeout, rank=0, world_size=1,
            store_addr="127.0.0.1", store_port=store_port,
            lighthouse_addr=f"http://127.0.0.1:{lighthouse_port}", replica_id="node0",
            hostname="127.0.0.1", init_sync=False,
            checkpoint_transport=PGTransport(group, timeout, torch.device("cpu")))
        gradient = torch.zeros(args.values)

        def step(phases: list[float]) -> None:
            marks = [time.perf_counter()]
            manager.start_quorum()
            marks.append(time.perf_counter())
            manager.wait_quorum()
            marks.append(time.perf_counter())
            manager.allreduce(gradient).wait()
            marks.append(time.perf_counter())
            manager.should_commit()
            marks.append(time.perf_counter())
            for index in range(len(PHASES)):
                phases[index] += marks[index + 1] - marks[index]

        for _ in range(args.warmup):  # the first quorum configures the group
            step([0.0] * len(PHASES))
        walls, cpus, parts = [], [], []
        for _ in range(args.repeat):
            phases = [0.0] * len(PHASES)
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(args.steps):
                step(phases)
            walls.append(1000 * (time.perf_counter() - wall) / args.steps)
            cpus.append(1000 * (time.process_time() - cpu) / args.steps)
            parts.append([1000 * value / args.steps for value in phases])
            print(f"  {args.steps} steps: wall {walls[-1]:.3f} ms, CPU {cpus[-1]:.3f} ms per "
                  "step; " + ", ".join(f"{name} {value:.3f}"
                                       for name, value in zip(PHASES, parts[-1], strict=True)),
                  flush=True)
        manager.shutdown(wait=False)
        del store
    finally:
        lighthouse.terminate()
        lighthouse.wait()
    print(f"per step: wall {statistics.median(walls):.3f} ms ({min(walls):.3f}-{max(walls):.3f}),"
          f" CPU {statistics.median(cpus):.3f} ms ({min(cpus):.3f}-{max(cpus):.3f}), n="
          f"{args.repeat}; " + ", ".join(
              f"{name} {statistics.median(part[index] for part in parts):.3f}"
              for index, name in enumerate(PHASES)))


if __name__ == "__main__":
    main()
