"""The training process that ``torchrun`` starts on every worker (sync, bmuf, easgd).

It joins the process group, reads its slice of every global batch from the staged dataset, runs
the chosen paradigm's step loop, checkpoints to the shared volume and, on rank 0, writes the final
model. Every worker walks the same seeded permutation of the training set and takes its own
contiguous slice of each global batch, so N workers with batch b see exactly what one process with
batch N*b would, and a resumed run continues the same sequence from its step count.
"""

# The start mark below must precede the imports it measures:
# ruff: noqa: E402
from __future__ import annotations

import time

# When this module's code began: the start-up report splits the interpreter's start from the
# imports (torch's dominates). In a worker forked by the agent (see :func:`agent`), the module
# runs again in the child, so this is the child's start.
STARTED = time.time()

import argparse
import contextlib
import importlib
import json
import logging
import math
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn

from sublimate.components import training
from sublimate.components.base import run_files
from sublimate.components.base.durable_files import replace_atomically, write_json
from sublimate.components.base.elastic_errors import recorded
from sublimate.components.base.runtime import shown_path
from sublimate.components.base.settings import (
    COLLECTIVE_PARADIGMS,
    SettingError,
    add_training_arguments,
    check,
)
from sublimate.components.base.termination import OneLineParser, fail
from sublimate.components.data.datasets import data_problem, read_metadata, read_split
from sublimate.components.model import checkpoint
from sublimate.components.model.models import build_model, model_spec
from sublimate.components.monitoring import metrics as monitoring
from sublimate.components.monitoring.watchdog import ATTEMPT_ENV
from sublimate.components.paradigms import Paradigm, lr_schedule
from sublimate.components.training import ProcessGroup, log

MODEL_NAME = run_files.MODEL  # kept for callers of the first releases
METRICS_FLUSH_STEPS = training.METRICS_FLUSH_STEPS
# The first argument that makes this module a torchrun agent rather than a worker (see agent()).
AGENT = "agent"
STEP = "train"  # the step a refused input is reported for (train: error: ...)
# What a worker imports after this module's own imports, on its way to the first step: DDP's
# constructor imports torch._dynamo (over a second of CPU), monitoring imports TensorBoard.
# They are imported in the background while the process waits for the other nodes (_preload).
PRELOAD = (
    "torch._dynamo", "torch.nn.parallel", "torch.distributed.algorithms.ddp_comm_hooks",
    "sublimate.components.monitoring.tensorboard_log", "torch.utils.tensorboard",
    "sublimate.components.paradigms.sync_sgd", "sublimate.components.paradigms.bmuf",
    "sublimate.components.paradigms.easgd",
    "prometheus_client", "prometheus_client.exposition", "prometheus_client.process_collector",
)
# What torchrun's agent imports on its way to forking the workers (rendezvous backend, agent,
# multiprocessing's fork support), imported before the preload starts so that only one thread
# imports at a time: two threads importing overlapping modules can deadlock on module locks.
AGENT_IMPORTS = (
    "torch.distributed.elastic.agent.server.local_elastic_agent",
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
    "torch.distributed.elastic.rendezvous.dynamic_rendezvous",
    "multiprocessing.popen_fork", "multiprocessing.queues", "encodings.idna",
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # Refusals read like the launcher's (same step name, same words): see OneLineParser.
    parser = OneLineParser(prog=STEP, description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", choices=COLLECTIVE_PARADIGMS, default="sync")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    add_metrics_arguments(parser)
    add_training_arguments(parser, COLLECTIVE_PARADIGMS)
    return parser.parse_args(argv)


def add_metrics_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--metrics-addr", default=None,
                        help="address the Prometheus endpoint binds (default "
                             "$SUBLIMATE_METRICS_ADDR or 127.0.0.1; 0.0.0.0 in a cluster)")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="base port; each process uses base + local rank, or an OS-chosen "
                             f"port when taken (default $SUBLIMATE_METRICS_PORT or "
                             f"{monitoring.DEFAULT_PORT}; 0: always OS-chosen)")


def learning_rate(args: argparse.Namespace, step: int, steps_per_epoch: int,
                  workers: int) -> float:
    """The rate at ``step``: lr-scaling for the paradigm, reached by gradual warmup (the rules,
    and why they differ between paradigms, are
    :mod:`sublimate.components.paradigms.lr_schedule`'s)."""
    return lr_schedule.learning_rate(vars(args), workers, step, steps_per_epoch)


def fault_injection_step(rank: int, variable: str = "SUBLIMATE_FAIL_AT_STEP") -> int | None:
    """Resilience testing: the step at which to SIGKILL this worker (first launch only).

    Set ``SUBLIMATE_FAIL_AT_STEP`` (and ``SUBLIMATE_FAIL_RANK``, default 0) in the environment;
    ``SUBLIMATE_FAIL_DURING_CHECKPOINT`` kills the rank halfway through writing its checkpoint
    file of that step instead, and ``SUBLIMATE_FREEZE_AT_STEP`` stops it (SIGSTOP) as a hung
    process would be. Only torchrun's first start of the launcher's first attempt is hit, so
    a restart or a relaunch resumes and finishes.
    """
    at_step = os.environ.get(variable)
    if (at_step is None or os.environ.get("SUBLIMATE_FAIL_RANK", "0") != str(rank)
            or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
            or launcher_attempt() > 0):
        return None
    return int(at_step)


def launcher_attempt() -> int:
    """Which of the launcher's attempts this process belongs to (0: the first; relaunches
    after a stall or a lost node count up). The attempt id is ``<pid>-<attempt>-<time>``."""
    parts = os.environ.get(ATTEMPT_ENV, "").split("-")
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else 0


def kill_self(rank: int, step: int) -> None:
    print(f"fault injection: killing rank {rank} at step {step}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def freeze_self(rank: int, step: int) -> None:
    print(f"fault injection: freezing rank {rank} (pid {os.getpid()}) at step {step}",
          flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)


def _die_writing_checkpoint(run_dir: Path, step: int, rank: int, state: dict[str, Any]) -> None:
    """Fault injection: write half of this rank's checkpoint file of ``step``, as a process
    killed mid-write leaves it, and SIGKILL this process before the file is renamed."""
    import io

    encoded = io.BytesIO()
    torch.save(state, encoded)

    def write_half_and_die(stream: Any) -> None:
        stream.write(encoded.getvalue()[:len(encoded.getvalue()) // 2])
        stream.flush()
        os.fsync(stream.fileno())
        print(f"fault injection: killing rank {rank} while it writes its checkpoint of step "
              f"{step}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    replace_atomically(checkpoint.step_path(run_dir, step, rank), write_half_and_die)


class Evaluation:
    """Rank 0's test accuracy after every epoch, in batches so that a large test split never
    needs one huge activation tensor.

    In memory (:meth:`read`) the split is read once and kept on the device: evaluating is a few
    forward passes and no files are read per epoch. Streamed (:meth:`stream`, when the training
    split streams) it is read in batches at every evaluation: memory is a few batches.
    """

    def __init__(self, batches: Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]],
                 device: torch.device) -> None:
        self.batches, self.device = batches, device

    @classmethod
    def read(cls, data_dir: Path, device: torch.device, batch_size: int = 8192) -> Evaluation:
        data = read_split(data_dir, "test")
        features = torch.from_numpy(data.x).reshape(len(data.y), -1).to(device)
        labels = torch.from_numpy(data.y).to(device)
        return cls(lambda: ((features[start:start + batch_size], labels[start:start + batch_size])
                            for start in range(0, len(labels), batch_size)), device)

    @classmethod
    def stream(cls, data_dir: Path, device: torch.device, batch_size: int = 8192) -> Evaluation:
        from sublimate.components.data.streaming import evaluation_batches

        return cls(lambda: evaluation_batches(data_dir, "test", batch_size), device)

    def accuracy(self, model: nn.Module) -> float:
        was_training = model.training
        model.eval()  # dropout and batch-norm statistics as at test time
        correct = torch.zeros((), dtype=torch.int64, device=self.device)
        total = 0
        with torch.inference_mode():
            for x, y in self.batches():
                logits = model(x.reshape(len(y), -1).to(self.device))
                correct += (logits.argmax(1) == y.to(self.device)).sum()
                total += len(y)
        model.train(was_training)
        return correct.item() / max(total, 1)


def train(args: argparse.Namespace, startup: monitoring.StartupClock | None = None,
          ) -> dict[str, Any]:
    """Train to the end (resuming from the run's last checkpoint) and return the summary.

    ``startup`` is marked as each start-up phase ends (the first step is the last phase).
    """
    startup = startup or monitoring.StartupClock(time.time())
    group = join_process_group(args, startup)
    run = start_run(args, startup, group, load_data(args, group, startup))
    while run.step < run.data.total_steps:
        run.close_epoch(*run.run_epoch())
    return run.finish()


def join_process_group(args: argparse.Namespace, startup: monitoring.StartupClock,
                       ) -> ProcessGroup:
    """Join the job's process group (start-up phase ``process_group``)."""
    # DDP's import of torch._dynamo (over a second) loads while this process waits for its
    # peers; the main thread imports nothing meanwhile. A forked worker has it already.
    preloading = _preload()
    group = training.join(args.backend, args.collective_timeout)
    if preloading is not None:
        preloading.join()
    startup.mark("process_group")
    return group


@dataclass(slots=True)
class TrainingData:
    """The training split on the device, rank 0's test split, and how batches cut them."""

    metadata: dict[str, Any]
    features: torch.Tensor | None  # the split in memory (data-loading memory), else None
    labels: torch.Tensor | None
    reader: Any  # streaming.ShardReader when the split streams from the volume, else None
    num_features: int
    test_set: Evaluation | None  # only rank 0 evaluates
    micro_batch: int  # rows in one forward and backward pass
    local_batch: int  # this worker's rows in one step: micro_batch x accumulation steps
    steps_per_epoch: int
    total_steps: int


def load_data(args: argparse.Namespace, group: ProcessGroup, startup: monitoring.StartupClock,
              ) -> TrainingData:
    """Read the staged dataset onto the device (start-up phase ``data``)."""
    micro_batch = args.global_batch_size // (group.world * args.accumulation_steps)
    local_batch = micro_batch * args.accumulation_steps
    metadata = read_metadata(args.data_dir)
    num_features = math.prod(int(size) for size in metadata["feature_shape"])
    features = labels = reader = None
    if streams(args.data_loading, metadata):
        from sublimate.components.data.streaming import ShardReader

        # Each rank reads its own share of the shards, one shuffle window at a time.
        reader = ShardReader(args.data_dir, "train", local_batch=local_batch, rank=group.rank,
                             world=group.world, seed=args.seed, buffer_size=args.shuffle_buffer)
        steps_per_epoch = reader.steps
    else:
        data = read_split(args.data_dir, "train")
        features = torch.from_numpy(data.x).reshape(len(data.y), -1).to(group.device)
        labels = torch.from_numpy(data.y).to(group.device)
        steps_per_epoch = len(labels) // args.global_batch_size  # main() made sure it is >= 1
    # Only rank 0 evaluates; it reads the test split once, here, not after every epoch (or
    # streams it, when the training split streams).
    test_set = (Evaluation.stream if reader is not None else Evaluation.read)(
        args.data_dir, group.device) \
        if args.eval_every_epoch and group.rank == 0 else None
    startup.mark("data")
    return TrainingData(metadata, features, labels, reader, num_features, test_set,
                        micro_batch, local_batch, steps_per_epoch, steps_per_epoch * args.epochs)


# A training split larger than this streams from the volume under data-loading=auto.
STREAM_ABOVE_BYTES = 1 << 30


def streams(data_loading: str, metadata: dict[str, Any]) -> bool:
    """Whether the training split streams (data-loading stream, or auto and a large split)."""
    if data_loading != "auto":
        return data_loading == "stream"
    shards = metadata["splits"]["train"]["shards"]
    return sum(int(shard.get("bytes", 0)) for shard in shards) > STREAM_ABOVE_BYTES


@dataclass(slots=True)
class Learner:
    """The model, its optimizer, the paradigm that trains them, and their checkpointer."""

    architecture: str
    config: dict[str, Any]
    model: nn.Module
    optimizer: torch.optim.Optimizer
    paradigm: Paradigm
    checkpointer: training.Checkpointer


def build_learner(args: argparse.Namespace, group: ProcessGroup, data: TrainingData) -> Learner:
    """The seeded model, its optimizer and the paradigm, as at step 0 (not restored yet)."""
    torch.manual_seed(args.seed)
    architecture, config = model_spec(args.model, data.num_features,
                                      data.metadata["num_classes"], args.hidden)
    model = build_model(architecture, config).to(group.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate,
                                momentum=args.momentum, weight_decay=args.weight_decay)
    paradigm = training.make_paradigm(args.algorithm, model, optimizer, vars(args))
    return Learner(architecture, config, model, optimizer, paradigm,
                   training.Checkpointer(args.run_dir, group.rank, group.world, args.algorithm))


def start_run(args: argparse.Namespace, startup: monitoring.StartupClock, group: ProcessGroup,
              data: TrainingData) -> Run:
    """Build the model or restore it from the last checkpoint, and start monitoring (start-up
    phase ``setup``)."""
    learner = build_learner(args, group, data)
    step, extra = learner.checkpointer.restore(learner.model, learner.optimizer,
                                               learner.paradigm)
    if step:
        log(group.rank, f"resumed from checkpoint at step {step}/{data.total_steps}")
    training_model = learner.paradigm.training_model()
    reporter = training.Reporter(args.run_dir, group, data.total_steps,
                                 args.global_batch_size // group.world, training_model,
                                 args.metrics_addr, args.metrics_port, args.progress_every,
                                 first_step=step)
    learner.checkpointer.progress = reporter.progress
    startup.mark("setup")
    return Run(args, startup, group, data, learner, training_model, reporter, step,
               extra.get("train_seconds", 0.0))


class Run:
    """One worker's way through the training steps: its parts, and how far it has got."""

    def __init__(self, args: argparse.Namespace, startup: monitoring.StartupClock,
                 group: ProcessGroup, data: TrainingData, learner: Learner,
                 training_model: nn.Module, reporter: training.Reporter, step: int,
                 train_seconds: float) -> None:
        self.args, self.startup, self.group, self.data = args, startup, group, data
        self.learner, self.training_model, self.reporter = learner, training_model, reporter
        self.loss_fn = nn.CrossEntropyLoss()
        self.fail_at = fault_injection_step(group.rank)
        self.freeze_at = fault_injection_step(group.rank, "SUBLIMATE_FREEZE_AT_STEP")
        self.fail_in_checkpoint = fault_injection_step(group.rank,
                                                       "SUBLIMATE_FAIL_DURING_CHECKPOINT")
        # Progress, counted from the run's start (a resumed launch starts at first_step).
        self.step, self.first_step, self.train_seconds = step, step, train_seconds
        self.lr: float | None = None  # what the optimizer's groups hold; set by the first step
        self.curve: list[list[float]] = []  # [train seconds, step, test accuracy] per epoch
        self.evaluation_seconds = 0.0  # rank 0's, outside train_seconds
        # Cleared once the first step is reported: the step loop's one extra check is a None test.
        self.pending_startup = startup if step < data.total_steps else None
        self.launch_to_first_step: float | None = None  # None until this launch takes a step

    def run_epoch(self) -> tuple[int, int, torch.Tensor, float]:
        """Take the current epoch's remaining steps: (epoch, first batch, summed loss, seconds).

        This loop is what the throughput benchmark measures against a hand-written torchrun
        script, so it is written like one: everything a step touches is a local bound here,
        and a step makes no call, look-up or allocation that such a script would not.
        """
        args, data, learner, reporter = self.args, self.data, self.learner, self.reporter
        features, labels, micro_batch, local_batch = (data.features, data.labels,
                                                      data.micro_batch, data.local_batch)
        steps_per_epoch, total_steps = data.steps_per_epoch, data.total_steps
        optimizer, paradigm, training_model = learner.optimizer, learner.paradigm, \
            self.training_model
        # The reporter's per-step bookkeeping, inlined (Reporter.step does the same).
        loss_fn, metrics, times, progress = self.loss_fn, reporter.metrics, reporter.times, \
            reporter.progress
        rank, fail_at, lr = self.group.rank, self.fail_at, self.lr
        global_batch, accumulation_steps = args.global_batch_size, args.accumulation_steps
        accumulate, checkpoint_every = accumulation_steps > 1, args.checkpoint_every
        step, pending_startup = self.step, self.pending_startup
        perf_counter = time.perf_counter
        epoch, position = divmod(step, steps_per_epoch)
        device, world = self.group.device, self.group.world
        streamed = data.reader is not None
        if streamed:  # batches from the volume; DataLoader workers read ahead
            # Without loader workers a thread reads ahead (streaming.ThreadPrefetch).
            stream = iter(data.reader.batches(
                epoch, position, num_workers=args.loader_workers, prefetch_factor=4,
                pin_memory=device.type == "cuda"))
        else:
            order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(
                args.seed * 100_003 + epoch)).to(device)
        epoch_loss = torch.zeros((), device=device)
        epoch_started = perf_counter()
        for batch_index in range(position, steps_per_epoch):
            started = perf_counter()
            step_lr = learning_rate(args, step, steps_per_epoch, world)
            if step_lr != lr:
                lr = step_lr
                for param_group in optimizer.param_groups:
                    param_group["lr"] = lr
            if streamed:
                x, y = next(stream)
                x = x.reshape(len(y), -1).to(device, non_blocking=True)
                y = y.to(device, non_blocking=True)
            else:
                start = batch_index * global_batch + rank * local_batch
                rows = order[start:start + local_batch]
                x, y = features[rows], labels[rows]
            if accumulate:
                batches = [(x[micro * micro_batch:(micro + 1) * micro_batch],
                            y[micro * micro_batch:(micro + 1) * micro_batch])
                           for micro in range(accumulation_steps)]
                loaded = perf_counter()
                for micro, (x, y) in enumerate(batches):
                    last = micro == accumulation_steps - 1
                    with contextlib.nullcontext() if last else paradigm.no_sync():
                        loss = loss_fn(training_model(x), y)
                        (loss / accumulation_steps).backward()
                    epoch_loss += loss.detach() / accumulation_steps
            else:  # the common case stays as lean as a hand-written loop
                loaded = perf_counter()
                loss = loss_fn(training_model(x), y)
                loss.backward()
                epoch_loss += loss.detach()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            computed = perf_counter()
            if pending_startup is not None:
                self.launch_to_first_step = _first_step_done(pending_startup, metrics)
                pending_startup = self.pending_startup = None
            paradigm.after_step(step)  # bmuf/easgd collectives happen here
            times.comm += perf_counter() - computed
            times.data += loaded - started
            times.compute += computed - loaded
            times.steps += 1
            if times.steps == METRICS_FLUSH_STEPS:
                reporter.flush(step)
            if computed >= progress.due:  # the watchdog's heartbeat, every few seconds
                progress.step(step)
            if step == fail_at:
                kill_self(rank, step)
            if step == self.freeze_at:
                freeze_self(rank, step)
            if checkpoint_every and step % checkpoint_every == 0 and step < total_steps:
                self.save_checkpoint(step, self.train_seconds + perf_counter() - epoch_started)
        self.step, self.lr = step, lr
        return epoch, position, epoch_loss, perf_counter() - epoch_started

    def close_epoch(self, epoch: int, position: int, epoch_loss: torch.Tensor,
                    epoch_seconds: float) -> None:
        """End an epoch: rank 0's evaluation, then the reporter's one all-reduce (mean loss and
        time split), log line and record."""
        data = self.data
        self.train_seconds += epoch_seconds
        epoch_steps = data.steps_per_epoch - position
        accuracy = self.evaluate()
        first = epoch == self.first_step // data.steps_per_epoch
        self.reporter.end_epoch(
            epoch, self.step, epoch_loss / epoch_steps, epoch_seconds, epoch_steps,
            total_epochs=self.args.epochs, accuracy=accuracy, learning_rate=self.lr,
            extra={"launch_to_first_step_seconds": self.launch_to_first_step}
            if first and self.launch_to_first_step is not None else None)

    def evaluate(self) -> float | None:
        """Rank 0's test accuracy after an epoch, added to the accuracy curve; None on the
        other ranks, or with per-epoch evaluation off."""
        test_set = self.data.test_set
        if test_set is None:
            return None
        # Outside the epoch's clock: evaluation is not training time.
        self.reporter.pause(self.step, "evaluation")
        started = time.perf_counter()
        accuracy = test_set.accuracy(self.learner.paradigm.result_model())
        self.evaluation_seconds += time.perf_counter() - started
        self.curve.append([round(self.train_seconds, 4), self.step, round(accuracy, 4)])
        return accuracy

    def save_checkpoint(self, step: int, train_seconds: float) -> None:
        """Checkpoint every rank's state at ``step`` and commit it (a collective)."""
        learner = self.learner
        if step == self.fail_in_checkpoint:
            _die_writing_checkpoint(self.args.run_dir, step, self.group.rank,
                                    {"model": learner.model.state_dict()})
        learner.checkpointer.save(step, learner.model, learner.optimizer, learner.paradigm,
                                  train_seconds=train_seconds)

    def finish(self) -> dict[str, Any]:
        """Save the last checkpoint and, on rank 0, the model and the summary; leave the
        process group and stop monitoring. Returns the summary."""
        args, learner = self.args, self.learner
        learner.paradigm.finish(self.step)  # bmuf/easgd: the steps since the last round
        self.save_checkpoint(self.step, self.train_seconds)
        summary = self.summary()
        if self.group.rank == 0:
            training.save_model(args.run_dir, learner.paradigm.result_model(),
                                architecture=learner.architecture, config=learner.config,
                                algorithm=args.algorithm, steps=self.step,
                                dataset=self.data.metadata["name"])
            write_json(summary, args.run_dir / run_files.SUMMARY, sort_keys=False)
        dist.barrier()
        dist.destroy_process_group()
        self.reporter.close(self.step)
        return summary

    def summary(self) -> dict[str, Any]:
        """What this launch did (train-summary.json). A collective: every rank calls it."""
        args, world, step, first_step = self.args, self.group.world, self.step, self.first_step
        ops = torch.tensor([self.learner.paradigm.communication_ops], dtype=torch.float64)
        dist.all_reduce(ops)  # the benchmark reports the total over all workers
        return {
            "algorithm": args.algorithm, "backend": self.group.backend, "world_size": world,
            "steps": step, "epochs": args.epochs, "global_batch_size": args.global_batch_size,
            "final_learning_rate": learning_rate(args, step, self.data.steps_per_epoch, world),
            "train_seconds": round(self.train_seconds, 3),
            "samples_per_second": round((step - first_step) * args.global_batch_size
                                        / max(self.train_seconds, 1e-9), 1)
            if step > first_step else 0.0,
            "communication_ops_per_worker": int(ops.item()) // world,
            "communication_ops_per_epoch": round(ops.item() / world / args.epochs, 2),
            "resumed_from_step": first_step,
            "accuracy_curve": self.curve,
            # rank 0's time in per-epoch evaluation, on top of train_seconds (its peers wait)
            "evaluation_seconds": round(self.evaluation_seconds, 4),
            # None when this launch took no step (the run had already finished).
            "launch_to_first_step_seconds": self.launch_to_first_step,
            "startup": self.startup.phases() if self.launch_to_first_step is not None else {},
        }


def _first_step_done(startup: monitoring.StartupClock,
                     metrics: monitoring.WorkerMetrics | None) -> float:
    """Close the start-up clock at the first step; publish it; return launch-to-first-step."""
    startup.mark("first_step")
    total = startup.total()
    if metrics is not None:
        metrics.observe_startup(total, startup.phases())
    return total


def refusal(args: argparse.Namespace) -> str | None:
    """Why these arguments cannot train, in one line (None if they can).

    The launcher asks the same before it starts any worker (:func:`datasets.data_problem`
    words both); this is for a worker run by hand, which should not need a traceback to say
    that its batch does not fit its dataset.
    """
    # torchrun's layout, in the launcher's terms, so that the rules word it the same way.
    procs = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    layout = {"nodes": max(int(os.environ.get("WORLD_SIZE", "1")) // procs, 1),
              "procs_per_node": procs}
    try:
        check({**vars(args), **layout})
    except SettingError as error:
        return str(error)
    return data_problem(args.data_dir, args.global_batch_size, args.eval_every_epoch)


def _preload() -> threading.Thread | None:
    """Import :data:`PRELOAD` in a background thread; None when they are all loaded already.

    The process meanwhile waits for its peers (the agent in its rendezvous, a worker in
    init_process_group), so the imports cost little wall time. The caller must not import
    anything itself until it joins the thread: two threads importing overlapping modules can
    deadlock on Python's module locks.
    """
    if all(name in sys.modules for name in PRELOAD):
        return None

    def load() -> None:
        for name in PRELOAD:
            # e.g. no tensorboard: the worker meets (and handles) that itself
            with contextlib.suppress(Exception):
                importlib.import_module(name)

    thread = threading.Thread(target=load, name="sublimate-preload", daemon=True)
    thread.start()
    return thread


def exit_now(code: int) -> NoReturn:
    """End the process without the interpreter's teardown, once all output is flushed.

    Tearing down an interpreter that holds torch (and torch._dynamo) takes 0.3-0.6 s, which
    would delay the end of the train step; everything this process wrote is on disk by now.
    multiprocessing ends its children the same way.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@recorded  # torchrun's error file: why this rank failed, for the launcher (launch.failures)
def main(argv: list[str] | None = None) -> int:
    startup = monitoring.StartupClock(STARTED)
    startup.mark("imports")
    args = parse_args(argv)
    problem = refusal(args)
    if problem is not None:
        return fail(STEP, problem)
    try:
        summary = train(args, startup)
    except checkpoint.CheckpointError as error:  # names the file and what to do
        return fail(STEP, str(error))
    log(int(os.environ.get("RANK", "0")),
         f"training finished: {summary['steps']} steps in {summary['train_seconds']:.1f}s, "
         f"{summary['samples_per_second']:.0f} samples/s, "
         f"model at {shown_path(args.run_dir / MODEL_NAME)}")
    return 0


def agent(argv: list[str]) -> None:
    """``torchrun`` whose workers are forked from this agent instead of started afresh.

    ``argv`` is torchrun's flags, ``--``, then the worker's arguments. The agent has imported
    torch (torchrun needs it) and this module's other imports before its rendezvous, so a
    forked worker starts with them in memory instead of paying the interpreter's start and
    torch's import again (about a second of CPU per worker, at every start and restart). The
    launcher uses this on CPU nodes only: CUDA must never be initialised before a fork, and on
    GPU nodes a fresh interpreter per worker is the safe default. torchrun's ``--run-path``
    re-executes this file as ``__main__`` in each child, which then runs :func:`main`.
    """
    from torch.distributed import run as torchrun

    # This agent's start-up, for its workers' report (metrics.StartupClock): TorchX started it,
    # it imported torch and torchrun, then it meets the other nodes and forks.
    marks = [("scheduler", monitoring.process_start_time())]
    for name in AGENT_IMPORTS:
        with contextlib.suppress(ImportError):  # moved in another torch: imported when needed
            importlib.import_module(name)
    marks.append(("agent_imports", time.time()))
    # The workers' remaining imports load while the agent waits for the other nodes; a fork
    # must not happen while another thread imports (the child would inherit held locks), so
    # every fork waits for the preload to end.
    preloading = _preload()

    def before_fork() -> None:  # torchrun forks its workers right after the rendezvous
        rendezvous = time.time()
        if preloading is not None:
            preloading.join()
        os.environ[monitoring.AGENT_MARKS_ENV] = json.dumps(
            [*marks, ("agent_rendezvous", rendezvous), ("preload", time.time())])

    os.register_at_fork(before=before_fork)
    split = argv.index("--")
    torchrun.main([*argv[:split], "--start-method", "fork", "--run-path",
                   str(Path(__file__).resolve()), *argv[split + 1:]])
    exit_now(0)  # a failure raised above, with torchrun's report


if __name__ == "__main__":
    if sys.argv[1:2] == [AGENT]:
        agent(sys.argv[2:])
    code = main()
    if multiprocessing.parent_process() is None:  # a process of its own, not a forked worker
        exit_now(code)
    sys.exit(code)  # a forked worker returns to torchrun's wrapper, which reports and exits
