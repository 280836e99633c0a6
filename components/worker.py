"""The training process that ``torchrun`` starts on every worker (sync, bmuf, easgd).

It joins the process group, reads its slice of every global batch from the staged dataset, runs
the chosen paradigm's step loop, checkpoints to the shared volume and, on rank 0, writes the final
model. Every worker walks the same seeded permutation of the training set and takes its own
contiguous slice of each global batch, so N workers with batch b see exactly what one process with
batch N*b would, and a resumed run continues the same sequence from its step count.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

from sublimate.components import checkpoint
from sublimate.components import metrics as monitoring
from sublimate.components.datasets import read_metadata, read_split
from sublimate.components.models import build_model, model_spec
from sublimate.components.paradigm import Paradigm, paradigm_class

MODEL_NAME = "model.pt"
COLLECTIVE_PARADIGMS = ("sync", "bmuf", "easgd")
# Steps between hand-overs of the step timings to Prometheus: the loop itself only adds floats.
METRICS_FLUSH_STEPS = 16


def _auto_float(value: str) -> float | None:
    return None if value == "auto" else float(value)


def _boolean(value: str) -> bool:
    if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false, got '{value}'")
    return value.lower() in ("true", "1", "yes")


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    """Hyper-parameters shared by every paradigm's worker (and passed through by the launcher)."""
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--global-batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.1,
                        help="learning rate at the reference batch size")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--model", default="mlp",
                        help="mlp, or module:function(num_features, num_classes) -> nn.Module")
    parser.add_argument("--hidden", type=int, default=128, help="width of the built-in mlp")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=100,
                        help="steps between checkpoints (0: only at the end)")
    parser.add_argument("--lr-scaling", choices=["none", "linear"], default="linear",
                        help="scale the learning rate with global-batch-size / reference-batch")
    parser.add_argument("--reference-batch-size", type=int, default=64)
    parser.add_argument("--warmup-epochs", type=float, default=0.0,
                        help="epochs of gradual warmup from the reference learning rate")
    parser.add_argument("--accumulation-steps", type=int, default=1)
    parser.add_argument("--sync-period", type=int, default=8,
                        help="local steps between synchronisations (bmuf, easgd)")
    parser.add_argument("--block-momentum", type=_auto_float, default=None,
                        help="BMUF block momentum eta (auto: 1 - 1/N)")
    parser.add_argument("--block-lr", type=float, default=1.0, help="BMUF block learning rate")
    parser.add_argument("--nesterov", type=_boolean, default=True,
                        help="BMUF Nesterov-style look-ahead")
    parser.add_argument("--moving-rate", type=_auto_float, default=None,
                        help="EASGD moving rate alpha (auto: 0.9 / N)")
    parser.add_argument("--eval-every-epoch", action="store_true",
                        help="evaluate on the test split after every epoch (for benchmarks)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sublimate-worker", description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", choices=COLLECTIVE_PARADIGMS, default="sync")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    add_metrics_arguments(parser)
    add_training_arguments(parser)
    return parser.parse_args(argv)


def add_metrics_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-addr", default=None,
                        help="address the Prometheus endpoint binds (default "
                             "$SUBLIMATE_METRICS_ADDR or 127.0.0.1; 0.0.0.0 in a cluster)")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="base port; each process uses base + local rank, or an OS-chosen "
                             f"port when taken (default $SUBLIMATE_METRICS_PORT or "
                             f"{monitoring.DEFAULT_PORT}; 0: always OS-chosen)")


def learning_rate(args: argparse.Namespace, step: int, steps_per_epoch: int) -> float:
    """Goyal et al.'s rules: linear scaling with the global batch, reached by gradual warmup."""
    base = args.learning_rate
    target = base * args.global_batch_size / args.reference_batch_size \
        if args.lr_scaling == "linear" else base
    warmup_steps = round(args.warmup_epochs * steps_per_epoch)
    if step < warmup_steps:
        return base + (target - base) * step / warmup_steps
    return target


def _device_and_backend(requested: str) -> tuple[torch.device, str]:
    use_cuda = torch.cuda.is_available() and requested != "gloo"
    if requested == "nccl" and not use_cuda:
        raise RuntimeError("backend 'nccl' needs a GPU, and none is visible to this worker")
    if use_cuda:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


class CommClock:
    """Seconds spent in DDP's gradient all-reduce, which runs inside ``backward()``."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def time_ddp_allreduce(model: nn.Module, clock: CommClock) -> bool:
    """Wrap DDP's default all-reduce in a comm hook that adds its in-flight time to ``clock``.

    The future's callback runs when the bucket's all-reduce completes, and DDP waits for it
    before ``backward()`` returns, so the clock is complete at the end of every step. With
    several buckets the all-reduce overlaps the backward pass; that overlap counts as comm.
    """
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return False
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    # No annotations: DDP checks them against the real classes, and this module's are strings.
    def timed_allreduce(state, bucket):  # type: ignore[no-untyped-def]
        started = time.perf_counter()

        def finished(future: torch.futures.Future) -> torch.Tensor:
            clock.seconds += time.perf_counter() - started
            return future.value()

        return default_hooks.allreduce_hook(state, bucket).then(finished)

    model.register_comm_hook(None, timed_allreduce)
    return True


def _log(rank: int, message: str) -> None:
    if rank == 0:
        print(message, flush=True)


def fault_injection_step(rank: int) -> int | None:
    """Resilience testing: the step at which to SIGKILL this worker (first attempt only).

    Set ``SUBLIMATE_FAIL_AT_STEP`` (and ``SUBLIMATE_FAIL_RANK``, default 0) in the environment.
    """
    at_step = os.environ.get("SUBLIMATE_FAIL_AT_STEP")
    if (at_step is None or os.environ.get("SUBLIMATE_FAIL_RANK", "0") != str(rank)
            or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"):
        return None
    return int(at_step)


def _kill_self(rank: int, step: int) -> None:
    print(f"fault injection: killing rank {rank} at step {step}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def test_accuracy(model: nn.Module, data_dir: Path, device: torch.device) -> float:
    data = read_split(data_dir, "test")
    model.eval()
    with torch.inference_mode():
        logits = model(torch.from_numpy(data.x).reshape(len(data.y), -1).to(device))
        accuracy = (logits.argmax(1).cpu() == torch.from_numpy(data.y)).float().mean().item()
    model.train()
    return accuracy


class Checkpointer:
    """Saves and restores one worker's full training state at committed steps."""

    def __init__(self, args: argparse.Namespace, rank: int, world: int) -> None:
        self.args, self.rank, self.world = args, rank, world

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
             paradigm: Paradigm, train_seconds: float) -> None:
        checkpoint.save_rank(self.args.run_dir, step, self.rank, {
            "step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "paradigm": paradigm.state_dict(), "rng": torch.get_rng_state(),
            "train_seconds": train_seconds,
        })
        dist.barrier()  # every rank's file is on the volume before the step is committed
        if self.rank == 0:
            checkpoint.commit(self.args.run_dir, step, self.world, self.args.algorithm)

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                paradigm: Paradigm) -> tuple[int, float]:
        state = checkpoint.load_rank(self.args.run_dir, self.rank, self.world,
                                     self.args.algorithm)
        if state is None:
            return 0, 0.0
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        paradigm.load_state_dict(state["paradigm"])
        torch.set_rng_state(state["rng"])
        return state["step"], state["train_seconds"]


def train(args: argparse.Namespace) -> dict[str, Any]:
    device, backend = _device_and_backend(args.backend)
    dist.init_process_group(backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    micro_batches = world * args.accumulation_steps
    if args.global_batch_size % micro_batches:
        raise ValueError(f"global-batch-size {args.global_batch_size} is not divisible by "
                         f"{world} workers x {args.accumulation_steps} accumulation steps")
    micro_batch = args.global_batch_size // micro_batches
    local_batch = micro_batch * args.accumulation_steps

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
    architecture, model_config = model_spec(args.model, features.shape[1],
                                            metadata["num_classes"], args.hidden)
    model = build_model(architecture, model_config).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate,
                                momentum=args.momentum, weight_decay=args.weight_decay)
    paradigm = paradigm_class(args.algorithm)(model, optimizer, vars(args))
    checkpointer = Checkpointer(args, rank, world)
    step, train_seconds = checkpointer.restore(model, optimizer, paradigm)
    if step:
        _log(rank, f"resumed from checkpoint at step {step}/{total_steps}")
    training_model = paradigm.training_model()
    loss_fn = nn.CrossEntropyLoss()
    first_step, curve = step, []
    fail_at = fault_injection_step(rank)
    accumulate = args.accumulation_steps > 1
    lr = None
    metrics, epoch_log = _start_monitoring(args, rank, device)
    comm_clock = CommClock()
    if metrics is not None:
        time_ddp_allreduce(training_model, comm_clock)
    times = monitoring.StepTimes()
    perf_counter = time.perf_counter

    while step < total_steps:
        epoch, position = divmod(step, steps_per_epoch)
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(
            args.seed * 100_003 + epoch)).to(device)
        epoch_loss = torch.zeros((), device=device)
        epoch_started = time.perf_counter()
        for batch_index in range(position, steps_per_epoch):
            started = perf_counter()
            step_lr = learning_rate(args, step, steps_per_epoch)
            if step_lr != lr:
                lr = step_lr
                for group in optimizer.param_groups:
                    group["lr"] = lr
            start = batch_index * args.global_batch_size + rank * local_batch
            if accumulate:
                batches = [(features[rows], labels[rows]) for rows in (
                    order[start + micro * micro_batch:start + (micro + 1) * micro_batch]
                    for micro in range(args.accumulation_steps))]
                loaded = perf_counter()
                for micro, (x, y) in enumerate(batches):
                    last = micro == args.accumulation_steps - 1
                    with contextlib.nullcontext() if last else paradigm.no_sync():
                        loss = loss_fn(training_model(x), y)
                        (loss / args.accumulation_steps).backward()
                    epoch_loss += loss.detach() / args.accumulation_steps
            else:  # the common case stays as lean as a hand-written loop
                rows = order[start:start + local_batch]
                x, y = features[rows], labels[rows]
                loaded = perf_counter()
                loss = loss_fn(training_model(x), y)
                loss.backward()
                epoch_loss += loss.detach()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            computed = perf_counter()
            paradigm.after_step(step)  # bmuf/easgd collectives happen here
            times.comm += perf_counter() - computed
            times.data += loaded - started
            times.compute += computed - loaded
            times.steps += 1
            if times.steps == METRICS_FLUSH_STEPS:
                times.flush(metrics, comm_clock.take(), args.global_batch_size // world,
                            step, total_steps)
            if step == fail_at:
                _kill_self(rank, step)
            if args.checkpoint_every and step % args.checkpoint_every == 0 \
                    and step < total_steps:
                checkpointer.save(step, model, optimizer, paradigm,
                                  train_seconds + time.perf_counter() - epoch_started)
        epoch_seconds = time.perf_counter() - epoch_started
        train_seconds += epoch_seconds
        times.flush(metrics, comm_clock.take(), args.global_batch_size // world, step,
                    total_steps)
        # Loss and the time split travel in the one all-reduce the epoch already had.
        local = torch.cat([(epoch_loss / (steps_per_epoch - position)).reshape(1),
                           torch.tensor(times.take_epoch(), device=device)])
        reduced = local.clone()
        dist.all_reduce(reduced)
        local_values, mean_values = local.tolist(), [v / world for v in reduced.tolist()]
        epoch_steps = steps_per_epoch - position
        samples_per_second = epoch_steps * args.global_batch_size / max(epoch_seconds, 1e-9)
        split = monitoring.time_split(*mean_values[1:])
        message = (f"epoch {epoch + 1}/{args.epochs} step {step}/{total_steps} "
                   f"loss {mean_values[0]:.4f} lr {lr:.4g} "
                   f"samples/s {samples_per_second:.0f} | {monitoring.format_split(split)}")
        accuracy = None
        if args.eval_every_epoch and rank == 0:
            accuracy = test_accuracy(paradigm.result_model(), args.data_dir, device)
            curve.append([round(train_seconds, 4), step, round(accuracy, 4)])
            message += f" test-accuracy {accuracy:.4f}"
        _log(rank, message)
        _record_epoch(epoch_log, metrics, epoch + 1, step, lr, local_values, mean_values,
                      samples_per_second, epoch_steps * local_batch / max(epoch_seconds, 1e-9),
                      epoch_seconds, accuracy)

    checkpointer.save(step, model, optimizer, paradigm, train_seconds)
    ops = torch.tensor([paradigm.communication_ops], dtype=torch.float64)
    dist.all_reduce(ops)  # the benchmark reports the total over all workers
    summary = {
        "algorithm": args.algorithm, "backend": backend, "world_size": world,
        "steps": step, "epochs": args.epochs, "global_batch_size": args.global_batch_size,
        "final_learning_rate": learning_rate(args, step, steps_per_epoch),
        "train_seconds": round(train_seconds, 3),
        "samples_per_second": round((step - first_step) * args.global_batch_size
                                    / max(train_seconds, 1e-9), 1) if step > first_step else 0.0,
        "communication_ops_per_worker": int(ops.item()) // world,
        "communication_ops_per_epoch": round(ops.item() / world / args.epochs, 2),
        "resumed_from_step": first_step,
        "accuracy_curve": curve,
    }
    if rank == 0:
        checkpoint.save({"architecture": architecture, "config": model_config,
                         "state_dict": paradigm.result_model().state_dict(),
                         "algorithm": args.algorithm, "steps": step,
                         "dataset": metadata["name"]}, args.run_dir / MODEL_NAME)
        checkpoint.write_json(summary, args.run_dir / "train-summary.json")
    dist.barrier()
    dist.destroy_process_group()
    epoch_log.close()
    if metrics is not None:
        metrics.close()
    return summary


def _start_monitoring(args: argparse.Namespace, rank: int, device: torch.device,
                      ) -> tuple[monitoring.WorkerMetrics | None, Any]:
    from sublimate.components.tensorboard_log import EpochLog

    metrics = monitoring.serve_worker(
        args.run_dir, str(rank), f"node{os.environ.get('GROUP_RANK', '0')}",
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        gpu_index=device.index if device.type == "cuda" else None,
        addr=args.metrics_addr, port=args.metrics_port, key=f"rank-{rank}")
    if metrics is not None and metrics.address:
        _log(rank, f"metrics: http://{metrics.address}/metrics (every rank: "
                   f"{args.run_dir / monitoring.ENDPOINTS_FILE})")
    return metrics, EpochLog(args.run_dir, f"rank-{rank}", aggregate=rank == 0)


def _record_epoch(epoch_log: Any, metrics: monitoring.WorkerMetrics | None, epoch: int,
                  step: int, lr: float, local: list[float], mean: list[float],
                  samples_per_second: float, local_samples_per_second: float,
                  seconds: float, accuracy: float | None) -> None:
    """The epoch's JSONL record, TensorBoard scalars and Prometheus gauges."""
    local_split = monitoring.time_split(*local[1:])
    mean_split = monitoring.time_split(*mean[1:])
    record = {"epoch": epoch, "step": step, "time": round(time.time(), 3),
              "seconds": round(seconds, 4), "loss": round(mean[0], 6),
              "local_loss": round(local[0], 6), "learning_rate": lr,
              "samples_per_second": round(samples_per_second, 1),
              "local_samples_per_second": round(local_samples_per_second, 1),
              **{f"{phase}_seconds": round(value, 5)
                 for phase, value in zip(monitoring.PHASES, local[1:], strict=True)}}
    if accuracy is not None:
        record["test_accuracy"] = round(accuracy, 4)
    scalars = {"train/loss": local[0], "train/samples_per_second": local_samples_per_second,
               "train/learning_rate": lr,
               **{f"time/{phase}_fraction": value for phase, value in local_split.items()}}
    aggregate = {"train/loss": mean[0], "train/samples_per_second": samples_per_second,
                 "train/learning_rate": lr,
                 **{f"time/{phase}_fraction": value for phase, value in mean_split.items()}}
    if accuracy is not None:
        aggregate["test/accuracy"] = accuracy
    epoch_log.write(record, step, scalars, aggregate if epoch_log.aggregate else None)
    if metrics is not None:
        metrics.observe_epoch(epoch, mean[0], lr)


@record  # puts the worker's traceback into torchrun's failure summary
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summary = train(args)
    _log(int(os.environ.get("RANK", "0")),
         f"training finished: {summary['steps']} steps in {summary['train_seconds']:.1f}s, "
         f"{summary['samples_per_second']:.0f} samples/s, model at {args.run_dir / MODEL_NAME}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
