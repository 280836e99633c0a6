"""A minimal hand-written DDP training script: the baseline the `sync` component is held to.

Same model, data, batch and data order as sublimate's worker, no abstractions. Launched with
plain torchrun by benchmarks/paradigms.py; prints one JSON line with its training throughput.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def setup(data_dir: str, hidden: int) -> tuple[int, int, torch.Tensor, torch.Tensor,
                                               nn.Module, torch.optim.Optimizer]:
    """What every DDP job does before its first step: join the gloo process group, read the
    training split, build the MLP (seeded) in DDP and its optimizer. benchmarks/startup.py
    times exactly this, plus one step, as its bare minimum."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    metadata = json.loads((Path(data_dir) / "metadata.json").read_text())
    shards = [np.load(Path(data_dir) / s["file"]) for s in metadata["splits"]["train"]["shards"]]
    x = torch.from_numpy(np.concatenate([s["x"] for s in shards]))
    y = torch.from_numpy(np.concatenate([s["y"] for s in shards]))
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(
        nn.Linear(x.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, metadata["num_classes"])))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    return rank, world, x, y, model, optimizer


def main(data_dir: str, epochs: int, global_batch: int, hidden: int) -> None:
    rank, world, x, y, model, optimizer = setup(data_dir, hidden)
    local = global_batch // world
    steps = len(y) // global_batch
    started = time.perf_counter()
    for epoch in range(epochs):
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(epoch))
        for step in range(steps):
            start = step * global_batch + rank * local
            rows = order[start:start + local]
            loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    seconds = time.perf_counter() - started
    if rank == 0:
        print(json.dumps({"samples_per_second": steps * epochs * global_batch / seconds,
                          "train_seconds": seconds}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
