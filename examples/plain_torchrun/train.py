"""A plain torchrun script that knows nothing about sublimate: DDP over a folder of .npz shards.

It is what a team already has: ``torchrun --nproc-per-node 2 train.py --data DIR --out DIR``.
sublimate runs it as it is, on every node, and tells it where the staged data and the run folder
are through its own flags::

    sublimate run -p entrypoint=examples/plain_torchrun/train.py \
        -p entrypoint-args='--data $SUBLIMATE_DATA_DIR --out $SUBLIMATE_RUN_DIR'

It writes ``metrics.json`` (test accuracy and loss) into ``--out``, which the evaluate step
reports; the model is its own ``model-state.pt``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def load(folder: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = [], []
    for path in sorted(glob.glob(os.path.join(folder, f"{split}-*.npz"))):
        with np.load(path) as shard:
            xs.append(shard["x"])
            ys.append(shard["y"])
    return torch.from_numpy(np.concatenate(xs)).flatten(1), torch.from_numpy(np.concatenate(ys))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x, y = load(args.data, "train")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(
        nn.Linear(x.shape[1], 64), nn.ReLU(), nn.Linear(64, int(y.max()) + 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = 0.0
        for features, labels in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(features), labels)
            loss.backward()
            optimizer.step()
            total += loss.item()
        if rank == 0:
            print(f"epoch {epoch + 1} loss {total / len(loader):.4f}", flush=True)

    if rank == 0:
        test_x, test_y = load(args.data, "test")
        with torch.no_grad():
            logits = model.module(test_x)
        metrics = {"accuracy": (logits.argmax(1) == test_y).float().mean().item(),
                   "loss": nn.functional.cross_entropy(logits, test_y).item(),
                   "examples": len(test_y)}
        os.makedirs(args.out, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(args.out, "model-state.pt"))
        with open(os.path.join(args.out, "metrics.json"), "w") as handle:
            json.dump(metrics, handle)
        print(f"test accuracy {metrics['accuracy']:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
