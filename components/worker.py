"""The training process that ``torchrun`` starts on every worker.

It joins the process group, reads its slice of every global batch from the staged dataset, runs
the chosen paradigm's step loop, checkpoints to the shared volume and, on rank 0, writes the final
model. Every worker walks the same seeded permutation of the training set and takes its own
contiguous slice of each global batch, so N workers with batch b see exactly what one process with
batch N*b would, and a resumed run continues the same sequence.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

from sublimate.components import checkpoint
from sublimate.components.datasets import read_metadata, read_split
from sublimate.components.models import build_model
from sublimate.components.paradigm import PARADIGMS, paradigm_class

CHECKPOINT_NAME = "checkpoints/latest.pt"
MODEL_NAME = "model.pt"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sublimate-worker", description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", choices=sorted(PARADIGMS), default="sync")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--global-batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=100,
                        help="steps between checkpoints (0: only at the end)")
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    return parser.parse_args(argv)


def _device_and_backend(requested: str) -> tuple[torch.device, str]:
    use_cuda = torch.cuda.is_available() and requested != "gloo"
    if requested == "nccl" and not use_cuda:
        raise RuntimeError("backend 'nccl' needs a GPU, and none is visible to this worker")
    if use_cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def _log(rank: int, message: str) -> None:
    if rank == 0:
        print(message, flush=True)


def train(args: argparse.Namespace) -> dict[str, Any]:
    device, backend = _device_and_backend(args.backend)
    dist.init_process_group(backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.global_batch_size % world:
        raise ValueError(f"global-batch-size {args.global_batch_size} is not divisible by the "
                         f"{world} workers (nodes x procs-per-node)")
    local_batch = args.global_batch_size // world

    metadata = read_metadata(args.data_dir)
    data = read_split(args.data_dir, "train")
    features = torch.from_numpy(data.x).reshape(len(data.y), -1).to(device)
    labels = torch.from_numpy(data.y).to(device)
    steps_per_epoch = len(labels) // args.global_batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"global-batch-size {args.global_batch_size} exceeds the "
                         f"{len(labels)} training examples")
    total_steps = steps_per_epoch * args.epochs

    torch.manual_seed(args.seed)
    model_config = {"num_features": features.shape[1], "num_classes": metadata["num_classes"],
                    "hidden": args.hidden}
    model = build_model("mlp", model_config).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate,
                                momentum=args.momentum, weight_decay=args.weight_decay)
    paradigm = paradigm_class(args.algorithm)(model, vars(args))

    step = 0
    state = checkpoint.load(args.run_dir / CHECKPOINT_NAME)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        paradigm.load_state_dict(state["paradigm"])
        step = state["step"]
        _log(rank, f"resumed from {args.run_dir / CHECKPOINT_NAME} at step {step}/{total_steps}")
    training_model = paradigm.training_model()
    loss_fn = nn.CrossEntropyLoss()

    def save_checkpoint() -> None:
        if rank == 0:
            checkpoint.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "paradigm": paradigm.state_dict(), "step": step,
                             "algorithm": args.algorithm}, args.run_dir / CHECKPOINT_NAME)

    started = time.perf_counter()
    first_step = step
    while step < total_steps:
        epoch, position = divmod(step, steps_per_epoch)
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(
            args.seed * 100_003 + epoch)).to(device)
        epoch_loss = torch.zeros((), device=device)
        epoch_correct = torch.zeros((), device=device)
        epoch_started = time.perf_counter()
        for batch_index in range(position, steps_per_epoch):
            start = batch_index * args.global_batch_size + rank * local_batch
            rows = order[start:start + local_batch]
            logits = training_model(features[rows])
            loss = loss_fn(logits, labels[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            paradigm.after_step(step)
            epoch_loss += loss.detach()
            epoch_correct += (logits.argmax(1) == labels[rows]).sum()
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                save_checkpoint()
        batches = steps_per_epoch - position
        totals = torch.stack([epoch_loss / batches, epoch_correct / (batches * local_batch)])
        dist.all_reduce(totals)
        totals /= world
        elapsed = time.perf_counter() - epoch_started
        _log(rank, f"epoch {epoch + 1}/{args.epochs} step {step}/{total_steps} "
                   f"loss {totals[0].item():.4f} train-accuracy {totals[1].item():.4f} "
                   f"samples/s {batches * args.global_batch_size / max(elapsed, 1e-9):.0f}")
    save_checkpoint()
    seconds = time.perf_counter() - started
    summary = {
        "algorithm": args.algorithm, "backend": backend, "world_size": world,
        "steps": step, "epochs": args.epochs, "global_batch_size": args.global_batch_size,
        "train_seconds": round(seconds, 3),
        "samples_per_second": round((step - first_step) * args.global_batch_size
                                    / max(seconds, 1e-9), 1),
    }
    if rank == 0:
        checkpoint.save({"architecture": "mlp", "config": model_config,
                         "state_dict": model.state_dict(), "algorithm": args.algorithm,
                         "steps": step, "dataset": metadata["name"]},
                        args.run_dir / MODEL_NAME)
        checkpoint.write_json(summary, args.run_dir / "train-summary.json")
    dist.barrier()
    dist.destroy_process_group()
    return summary


@record  # puts the worker's traceback into torchrun's failure summary
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = train(args)
    _log(int(os.environ.get("RANK", "0")), f"training finished: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
