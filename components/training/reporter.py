"""Where one training process reports: Prometheus, the epoch log and TensorBoard, stragglers,
the watchdog's heartbeat, and the split of step time into data wait, compute and communication."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from sublimate.components.base.runtime import shown_path
from sublimate.components.monitoring import metrics as monitoring
from sublimate.components.monitoring import stragglers, watchdog
from sublimate.components.monitoring.traffic import Traffic, tensor_bytes
from sublimate.components.training.process_group import ProcessGroup, log

# Steps between hand-overs of the step timings to Prometheus: a step only adds floats.
METRICS_FLUSH_STEPS = 16


class CommClock:
    """Seconds during which DDP's gradient all-reduce is in flight (it runs inside
    ``backward()``).

    A model large enough for several gradient buckets has several all-reduces in flight at
    once; the clock counts the union of their intervals, not their sum, which would exceed the
    step itself on a slow link.
    """

    __slots__ = ("_in_flight", "_lock", "_since", "seconds")

    def __init__(self) -> None:
        self.seconds = 0.0
        self._in_flight = 0
        self._since = 0.0
        self._lock = threading.Lock()  # buckets start in autograd's thread, end in gloo's

    def begin(self) -> None:
        with self._lock:
            if self._in_flight == 0:
                self._since = time.perf_counter()
            self._in_flight += 1

    def end(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self.seconds += time.perf_counter() - self._since

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def time_ddp_allreduce(model: nn.Module, clock: CommClock, traffic: Traffic | None = None,
                       ) -> bool:
    """Wrap DDP's default all-reduce in a comm hook that times it on ``clock`` (and counts
    each bucket's bytes on ``traffic``: where synchronous SGD's traffic is sent).

    The future's callback runs when the bucket's all-reduce completes, and DDP waits for it
    before ``backward()`` returns, so the clock is complete at the end of every step. The
    all-reduce overlaps the rest of the backward pass; that overlap counts as comm.
    """
    parallel = sys.modules.get("torch.nn.parallel")
    if parallel is None or not isinstance(model, parallel.DistributedDataParallel):
        return False  # (a model that is not DDP's: no need to import DDP to tell)
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    world = dist.get_world_size()

    # No annotations: DDP checks them against the real classes, and this module's are strings.
    def timed_allreduce(state, bucket):
        clock.begin()
        if traffic is not None:
            traffic.all_reduce(tensor_bytes(bucket.buffer()), world)

        def finished(future: torch.futures.Future) -> torch.Tensor:
            clock.end()
            return future.value()

        return default_hooks.allreduce_hook(state, bucket).then(finished)

    model.register_comm_hook(None, timed_allreduce)
    return True


@dataclass(slots=True)
class EpochResult:
    """An epoch as the whole job saw it (from :meth:`Reporter.end_epoch`)."""

    mean_loss: float
    samples_per_second: float
    split: dict[str, float]  # mean share of data wait, compute and communication
    local: list[float] = field(default_factory=list)  # this rank's loss and phase seconds


class Reporter:
    """Where one training process reports: Prometheus, the epoch log (JSONL + TensorBoard, read
    by the run report) and the split of step time into data wait, compute and communication.

    Per step, :meth:`step` adds three floats (and every :data:`METRICS_FLUSH_STEPS` steps hands
    them to Prometheus); per epoch, :meth:`end_epoch` makes one all-reduce and writes one record.
    """

    def __init__(self, run_dir: Path, group: ProcessGroup, total_steps: int,
                 samples_per_step: int, training_model: nn.Module | None = None,
                 metrics_addr: str | None = None, metrics_port: int | None = None,
                 progress_every: float = watchdog.EVERY_SECONDS, first_step: int = 0,
                 traffic: Traffic | None = None) -> None:
        from sublimate.components.monitoring.tensorboard_log import EpochLog

        self.run_dir, self.group, self.total_steps = Path(run_dir), group, total_steps
        self.samples_per_step = samples_per_step  # this rank's examples per optimizer step
        rank = group.slot  # names this process's files: unique in the job, under any recovery
        self.node_index = group.node
        self.node = f"node{self.node_index}"
        # The heartbeat the launcher's watchdog reads (a step every few seconds, on the volume).
        self.progress = watchdog.ProgressReporter(self.run_dir, rank, self.node, progress_every,
                                                  step=first_step)
        self.metrics = monitoring.serve_worker(
            self.run_dir, str(rank), self.node, local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            gpu_index=group.device.index if group.device.type == "cuda" else None,
            addr=metrics_addr, port=metrics_port, key=f"rank-{rank}")
        if self.metrics is not None and self.metrics.address:
            log(rank, f"metrics: http://{self.metrics.address}/metrics (every rank: "
                      f"{shown_path(self.run_dir / monitoring.ENDPOINTS_FILE)})")
        # Every node's first process may lead (per-step recovery: the quorum's first group).
        self.epoch_log = EpochLog(self.run_dir, f"rank-{rank}", aggregate=group.rank == 0)
        self.comm_clock = CommClock()
        # ``traffic``: the paradigm's count, which DDP's bucket all-reduces add to
        if (self.metrics is not None or traffic is not None) and training_model is not None:
            time_ddp_allreduce(training_model, self.comm_clock, traffic)
        self.times = monitoring.StepTimes()

    def step(self, step: int, data_seconds: float, compute_seconds: float,
             comm_seconds: float) -> None:
        """One optimizer step's time split (``step`` counts from the run's start)."""
        times = self.times
        times.data += data_seconds
        times.compute += compute_seconds
        times.comm += comm_seconds
        times.steps += 1
        if times.steps == METRICS_FLUSH_STEPS:
            self.flush(step)
        self.progress.step(step)

    def pause(self, step: int, what: str) -> None:
        """Tell the watchdog a long non-step phase starts (evaluation, checkpoint)."""
        self.progress.pause(step, what)

    def flush(self, step: int) -> None:
        """Hand the steps since the last flush to Prometheus (the loop calls this in bulk)."""
        self.times.flush(self.metrics, self.comm_clock.take(), self.samples_per_step, step,
                         self.total_steps)

    def end_epoch(self, epoch: int, step: int, loss: float | torch.Tensor, seconds: float,
                  steps: int, *, total_epochs: int | None = None, accuracy: float | None = None,
                  learning_rate: float | None = None,
                  extra: Mapping[str, Any] | None = None,
                  leader: bool | None = None,
                  between: Callable[[torch.Tensor], torch.Tensor | None] | None = None
                  ) -> EpochResult:
        """Close epoch ``epoch`` (0-based) at ``step`` after ``steps`` steps in ``seconds``: one
        all-reduce of the mean loss and the time split, the leader's log line, the epoch's record.

        A collective: every rank calls it. ``loss`` is this rank's mean over the epoch's steps;
        ``accuracy`` (rank 0's evaluation, if any) goes into the line, the record and the
        report's accuracy curve; ``extra`` is added to the record. ``leader`` (default: rank 0)
        logs the job's line and writes its aggregate view; under per-step recovery it is the
        quorum's first group, the collective spans one node, and ``between`` gathers the nodes'
        rows from the other groups alive (None when it could not: the node's rows alone then).
        """
        group = self.group
        leader = group.rank == 0 if leader is None else leader
        self.flush(step)
        loss_tensor = loss.detach().reshape(1).to(group.device, torch.float32) \
            if isinstance(loss, torch.Tensor) \
            else torch.tensor([float(loss)], device=group.device)
        # The epoch's one collective: every rank's loss, time split, epoch time and node, so
        # that every rank knows the mean and rank 0 can name a straggler.
        local = torch.cat([loss_tensor, torch.tensor(
            [*self.times.take_epoch(), seconds, self.node_index, group.slot],
            device=group.device)])
        gathered = [torch.empty_like(local) for _ in range(group.world)]
        dist.all_gather(gathered, local)
        node_rows = torch.stack(gathered)
        job_rows = between(node_rows.cpu()) if between is not None else None
        rows = (job_rows if job_rows is not None else node_rows).tolist()
        rows.sort(key=lambda row: row[6])  # by slot, the rank a straggler is named by
        local_values = node_rows[group.rank][:4].tolist()
        mean_values = [sum(column) / len(rows) for column in zip(*(row[:4] for row in rows),
                                                                 strict=True)]
        # Without metrics DDP's all-reduce is not timed and waiting would read as compute.
        finding = stragglers.find_stragglers(stragglers.timings_from_rows(rows, steps)) \
            if self.metrics is not None else None
        samples_per_second = steps * self.samples_per_step * group.slots / max(seconds, 1e-9)
        split = monitoring.time_split(*mean_values[1:])
        epochs = f"/{total_epochs}" if total_epochs else ""
        message = (f"epoch {epoch + 1}{epochs} step {step}/{self.total_steps} "
                   f"loss {mean_values[0]:.4f}"
                   + (f" lr {learning_rate:.4g}" if learning_rate is not None else "")
                   + f" samples/s {samples_per_second:.0f} | {monitoring.format_split(split)}")
        if accuracy is not None:
            message += f" test-accuracy {accuracy:.4f}"
        if finding is not None:
            if finding.line():
                message += f" | {finding.line()}"
            self.metrics.observe_step_ratio(finding.ratio_of(group.slot),  # type: ignore[union-attr]
                                            finding.is_straggler(group.slot))
        if leader:
            print(message, flush=True)
        record_extra = dict(extra or {})
        if finding is not None and leader:
            record_extra["stragglers"] = finding.records()
        self._record(epoch + 1, step, learning_rate, local_values, mean_values,
                     samples_per_second, steps * self.samples_per_step / max(seconds, 1e-9),
                     seconds, accuracy, record_extra, leader)
        return EpochResult(mean_values[0], samples_per_second, split, local_values)

    def _record(self, epoch: int, step: int, lr: float | None, local: list[float],
                mean: list[float], samples_per_second: float, local_samples_per_second: float,
                seconds: float, accuracy: float | None,
                extra: Mapping[str, Any] | None, leader: bool = True) -> None:
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
        record.update(extra or {})
        scalars = {"train/loss": local[0], "train/samples_per_second": local_samples_per_second,
                   **({"train/learning_rate": lr} if lr is not None else {}),
                   **{f"time/{phase}_fraction": value for phase, value in local_split.items()}}
        aggregate = {"train/loss": mean[0], "train/samples_per_second": samples_per_second,
                     **({"train/learning_rate": lr} if lr is not None else {}),
                     **{f"time/{phase}_fraction": value for phase, value in mean_split.items()}}
        if accuracy is not None:
            aggregate["test/accuracy"] = accuracy
        self.epoch_log.write(record, step, scalars,
                             aggregate if self.epoch_log.aggregate and leader else None)
        if self.metrics is not None:
            self.metrics.observe_epoch(epoch, mean[0], lr)

    def close(self, step: int | None = None) -> None:
        """Close the epoch log and stop serving metrics; with ``step``, tell the watchdog this
        rank finished there."""
        if step is not None:
            self.progress.finish(step)
        self.epoch_log.close()
        if self.metrics is not None:
            self.metrics.close()
