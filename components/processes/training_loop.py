"""One worker's way through the training steps (the restart mode's loop): its parts, how far it
has got, its epochs, checkpoints and the run's summary. :mod:`.per_step_loop` is the same under
per-step recovery."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from sublimate.components import training
from sublimate.components.base import run_files
from sublimate.components.base.durable_files import write_json
from sublimate.components.monitoring import metrics as monitoring
from sublimate.components.processes.fault_injection import (
    die_writing_checkpoint,
    fault_injection_step,
    freeze_self,
    kill_self,
)
from sublimate.components.processes.learning import (
    Learner,
    TrainingData,
    build_learner,
    learning_rate,
)
from sublimate.components.processes.request import WorkerRequest
from sublimate.components.training import ProcessGroup, log

METRICS_FLUSH_STEPS = training.METRICS_FLUSH_STEPS


def start_loop(request: WorkerRequest, startup: monitoring.StartupClock, group: ProcessGroup,
              data: TrainingData) -> TrainingLoop:
    """Build the model or restore it from the last checkpoint, and start monitoring (start-up
    phase ``setup``)."""
    learner = build_learner(request, group, data)
    step, extra = learner.checkpointer.restore(learner.model, learner.optimizer,
                                               learner.paradigm)
    if step:
        log(group.rank, f"resumed from checkpoint at step {step}/{data.total_steps}")
    training_model = learner.paradigm.training_model()
    reporter = training.Reporter(request.run_dir, group, data.total_steps,
                                 request.global_batch_size // group.world, training_model,
                                 request.metrics_addr, request.metrics_port, request.progress_every,
                                 first_step=step, traffic=learner.paradigm.traffic)
    learner.checkpointer.progress = reporter.progress
    startup.mark("setup")
    return TrainingLoop(request, startup, group, data, learner, training_model, reporter, step,
               extra.get("train_seconds", 0.0))


class TrainingLoop:
    """One worker's way through the training steps: its parts, and how far it has got."""

    lr: float | None
    pending_startup: monitoring.StartupClock | None

    def __init__(self, request: WorkerRequest, startup: monitoring.StartupClock,
                 group: ProcessGroup, data: TrainingData, learner: Learner,
                 training_model: nn.Module, reporter: training.Reporter, step: int,
                 train_seconds: float) -> None:
        self.request, self.startup, self.group, self.data = request, startup, group, data
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
        request, data, learner, reporter = self.request, self.data, self.learner, self.reporter
        micro_batch, local_batch = data.micro_batch, data.local_batch
        # the split in memory (data-loading memory), or empty when it streams
        features = data.features if data.features is not None else torch.empty(0)
        labels = data.labels if data.labels is not None else torch.empty(0)
        steps_per_epoch, total_steps = data.steps_per_epoch, data.total_steps
        optimizer, paradigm, training_model = learner.optimizer, learner.paradigm, \
            self.training_model
        # The reporter's per-step bookkeeping, inlined (Reporter.step does the same).
        loss_fn, metrics, times, progress = self.loss_fn, reporter.metrics, reporter.times, \
            reporter.progress
        rank, fail_at, lr = self.group.rank, self.fail_at, self.lr
        global_batch, accumulation_steps = request.global_batch_size, request.accumulation_steps
        accumulate, checkpoint_every = accumulation_steps > 1, request.checkpoint_every
        step, pending_startup = self.step, self.pending_startup
        perf_counter = time.perf_counter
        epoch, position = divmod(step, steps_per_epoch)
        device, world = self.group.device, self.group.slots
        streamed = data.reader is not None
        if streamed:  # batches from the volume; DataLoader workers read ahead
            # Without loader workers a thread reads ahead (streaming.ThreadPrefetch).
            stream = iter(data.reader.batches(
                epoch, position, num_workers=request.loader_workers, prefetch_factor=4,
                pin_memory=device.type == "cuda"))
        else:
            order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(
                request.seed * 100_003 + epoch)).to(device)
        epoch_loss = torch.zeros((), device=device)
        epoch_started = perf_counter()
        for batch_index in range(position, steps_per_epoch):
            started = perf_counter()
            step_lr = learning_rate(request, step, steps_per_epoch, world)
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
                self.launch_to_first_step = first_step_done(pending_startup, metrics)
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
            total_epochs=self.request.epochs, accuracy=accuracy, learning_rate=self.lr,
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
            die_writing_checkpoint(self.request.run_dir, step, self.group.rank,
                                    {"model": learner.model.state_dict()})
        learner.checkpointer.save(step, learner.model, learner.optimizer, learner.paradigm,
                                  train_seconds=train_seconds)

    def finish(self) -> dict[str, Any]:
        """Save the last checkpoint and, on rank 0, the model and the summary; leave the
        process group and stop monitoring. Returns the summary."""
        request, learner = self.request, self.learner
        learner.paradigm.finish(self.step)  # bmuf/easgd: the steps since the last round
        leads = self.leads()
        if leads:  # every node's ranks checkpoint together (per-step: the leading node's)
            self.save_checkpoint(self.step, self.train_seconds)
            learner.checkpointer.wait()  # a background save is committed before the job ends
        summary = self.summary()
        if self.group.rank == 0 and leads:
            training.save_model(request.run_dir, learner.paradigm.result_model(),
                                architecture=learner.architecture, config=learner.config,
                                algorithm=request.algorithm, steps=self.step,
                                dataset=self.data.metadata["name"])
            write_json(summary, request.run_dir / run_files.SUMMARY, sort_keys=False)
        dist.barrier()
        dist.destroy_process_group()
        self.reporter.close(self.step)
        return summary

    def leads(self) -> bool:
        """Whether this process's node checkpoints and, on its rank 0, writes the model and the
        summary: every node in the restart mode (checkpoints are a collective of all ranks);
        one under per-step recovery."""
        return True

    def summary(self) -> dict[str, Any]:
        """What this launch did (train-summary.json). A collective: every rank calls it."""
        request, world = self.request, self.group.slots
        step, first_step = self.step, self.first_step
        traffic = self.learner.paradigm.traffic
        ops = torch.tensor([self.learner.paradigm.communication_ops, traffic.payload_bytes,
                            traffic.wire_bytes], dtype=torch.float64)
        dist.all_reduce(ops)  # the benchmark reports the total over all workers
        ops *= world / self.group.world  # per-step: the node's, as if every node's alike
        ops, payload, wire = ops.tolist()
        return {
            "algorithm": request.algorithm, "backend": self.group.backend, "world_size": world,
            "steps": step, "epochs": request.epochs, "global_batch_size": request.global_batch_size,
            "final_learning_rate": learning_rate(request, step, self.data.steps_per_epoch, world),
            "train_seconds": round(self.train_seconds, 3),
            "samples_per_second": round((step - first_step) * request.global_batch_size
                                        / max(self.train_seconds, 1e-9), 1)
            if step > first_step else 0.0,
            "communication_ops_per_worker": int(ops) // world,
            "communication_ops_per_epoch": round(ops / world / request.epochs, 2),
            # counted where each collective is issued (monitoring/traffic.py): the tensors
            # sent, and what the collective's algorithm puts on the wire for them
            "sent_payload_bytes_per_worker": round(payload / world),
            "sent_wire_bytes_per_worker": round(wire / world),
            "resumed_from_step": first_step,
            "accuracy_curve": self.curve,
            # rank 0's time in per-epoch evaluation, on top of train_seconds (its peers wait)
            "evaluation_seconds": round(self.evaluation_seconds, 4),
            # None when this launch took no step (the run had already finished).
            "launch_to_first_step_seconds": self.launch_to_first_step,
            "startup": self.startup.phases() if self.launch_to_first_step is not None else {},
        }


def first_step_done(startup: monitoring.StartupClock,
                     metrics: monitoring.WorkerMetrics | None) -> float:
    """Close the start-up clock at the first step; publish it; return launch-to-first-step."""
    startup.mark("first_step")
    total = startup.total()
    if metrics is not None:
        metrics.observe_startup(total, startup.phases())
    return total


