"""Asynchronous SGD with a parameter server (Downpour-style, Dean et al. 2012).

A TorchX app with two roles: one ``ps`` process holds the model and the optimizer; ``trainer``
processes compute gradients on their shard of each batch and call the server over
``torch.distributed.rpc`` to push the gradient and pull the new parameters in one round trip,
without waiting for each other. The server applies every pushed gradient exactly once, in arrival
order, and records its staleness (how many other updates landed since the trainer pulled).

``staleness-bound`` > 0 turns this into stale-synchronous parallel SGD: a trainer that is that
many pushes ahead of the slowest running trainer waits before its push is applied.

Checkpoints hold the server's whole state (model, optimizer, version, every trainer's position)
and are written by the server alone; a re-submitted run resumes from the last one. Trainers are
plain processes in a fixed RPC group, so a crashed trainer fails the app (torchrun restarts apply
to the collective paradigms).
"""

# The start mark below must precede the imports it measures:
# ruff: noqa: E402
from __future__ import annotations

import time

STARTED = time.time()  # this module's code began: the start-up report's end of "interpreter"

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from sublimate.components.base import run_files
from sublimate.components.base.durable_files import write_json
from sublimate.components.base.runtime import shown_path
from sublimate.components.base.settings import SettingError, check
from sublimate.components.base.termination import fail
from sublimate.components.model import checkpoint
from sublimate.components.monitoring import metrics as monitoring
from sublimate.components.paradigms import lr_schedule
from sublimate.components.paradigms.async_sgd import (  # noqa: F401  (re-exported)
    AsyncSGD,
    ParameterServer,
)
from sublimate.components.processes.request import ParameterServerRequest

if TYPE_CHECKING:
    from sublimate.components.processes.learning import Evaluation

PS_NAME = "ps"
SERVER_CHECKPOINT = run_files.SERVER_CHECKPOINT


# RPC targets run in the server process and reach its one ParameterServer through this global.
_SERVER: ParameterServer | None = None


def _remote_start(trainer: int) -> tuple[list[torch.Tensor], int, int]:
    assert _SERVER is not None
    return _SERVER.start(trainer)


def _remote_push_pull(trainer: int, gradients: list[torch.Tensor], version_seen: int,
                      learning_rate: float, buffers: list[torch.Tensor] | None = None,
                      ) -> tuple[list[torch.Tensor], int]:
    assert _SERVER is not None
    return _SERVER.push_pull(trainer, gradients, version_seen, learning_rate, buffers)


def _remote_report(trainer: int, figures: dict[str, float]) -> None:
    assert _SERVER is not None
    _SERVER.report(trainer, figures)


def _remote_alive() -> bool:
    """Run in a trainer when the server asks whether it is still there."""
    return True


# Seconds without an update after which the server asks its trainers whether they are there.
QUIET_SECONDS = 5.0


class TrainerLost(RuntimeError):
    """A trainer stopped answering: the run cannot finish (async has no elastic trainers)."""


def _remote_finish(trainer: int) -> None:
    assert _SERVER is not None
    _SERVER.finish(trainer)


def _setup(request: ParameterServerRequest,
           ) -> tuple[nn.Module, torch.optim.Optimizer, Any, Any, int]:
    from sublimate.components.data.datasets import read_metadata, read_split
    from sublimate.components.model.models import build_model, model_spec

    metadata = read_metadata(request.data_dir)
    data = read_split(request.data_dir, "train")
    torch.manual_seed(request.seed)
    architecture, config = model_spec(request.model, int(data.x.reshape(len(data.y), -1).shape[1]),
                                      metadata["num_classes"], request.hidden)
    model = build_model(architecture, config)
    optimizer = torch.optim.SGD(model.parameters(), lr=request.learning_rate,
                                momentum=request.momentum, weight_decay=request.weight_decay)
    steps_per_epoch = len(data.y) // request.global_batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"global-batch-size {request.global_batch_size} exceeds the "
                         f"{len(data.y)} training examples")
    return model, optimizer, metadata, data, steps_per_epoch


# TensorPipe's transports, by name: TCP only. Between processes of one machine it would pick
# its shared-memory transport, whose reactor thread spins even when nothing is sent: each role
# burnt a whole core (an idle one 1.0 CPU-s a second), and on a machine whose nodes share its
# cores the parameter server and trainers ran at half speed (a default async run on 2 cores:
# 1.9 s of training against 3.8 s). Nodes of a cluster talk over TCP anyway.
RPC_TRANSPORTS = ["uv"]


def init_rpc(endpoint: str, name: str, rank: int, world_size: int, timeout: float) -> None:
    """Join the job's RPC group as ``name`` (rank 0: the parameter server)."""
    from torch.distributed import rpc

    options = rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://{endpoint}", rpc_timeout=timeout,
        num_worker_threads=max(16, 2 * (world_size - 1)), _transports=RPC_TRANSPORTS)
    rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=options)


# A store key every role adds 1 to once its rpc.shutdown() has returned (see shutdown_rpc).
LEFT_KEY = "sublimate/left-rpc"


def shutdown_rpc(rank: int, world_size: int, timeout: float) -> None:
    """``rpc.shutdown()``, and rank 0 (the parameter server, whose process hosts the group's
    store) keeps the store up until every role's shutdown has returned.

    The shutdown ends with a count taken on that store: every role waits until all have
    arrived, then reads the total. Rank 0 destroyed the store with its agent as soon as it had
    read it, so a role that read later (a busy core, a millisecond) failed with "Connection
    reset by peer" after training had ended (seen once in a test run). Each role holds the
    store past its agent here and says on it that it has left; rank 0 waits for all of them
    (``timeout`` at most: a role that died has nothing more to read)."""
    from torch.distributed import rpc

    agent: Any = rpc.api._get_current_rpc_agent()
    store = agent.store  # torch's own handle on the group's store (not in its type stubs)
    rpc.shutdown()
    left = store.add(LEFT_KEY, 1)
    deadline = time.monotonic() + timeout
    while rank == 0 and left < world_size and time.monotonic() < deadline:
        time.sleep(0.005)
        left = store.add(LEFT_KEY, 0)


def _init_rpc(request: ParameterServerRequest, name: str, rank: int) -> None:
    init_rpc(request.rpc_endpoint, name, rank, request.num_trainers + 1, request.rpc_timeout)


def trainer_learning_rate(request: ParameterServerRequest, step: int,
                          steps_per_epoch: int) -> float:
    """A trainer's rate at its ``step``: each update carries one trainer's batch, so linear
    scaling uses that batch; warmup counts the trainer's own steps
    (:mod:`sublimate.components.paradigms.lr_schedule`)."""
    return lr_schedule.learning_rate({**request.values(), "algorithm": "async"},
                                     request.num_trainers, step, steps_per_epoch)


def trainer_device() -> torch.device:
    """The GPU a trainer replica was given (TorchX shows each replica its own), else the CPU.
    The server keeps the model on the CPU: it only adds gradients, and RPC moves CPU tensors
    without per-device maps."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def run_server(request: ParameterServerRequest, startup: monitoring.StartupClock) -> dict[str, Any]:
    """The ``ps`` role: apply the trainers' pushes until every trainer has finished (resuming
    from the server's checkpoint), save the model and return the summary."""
    run = start_server(request, startup)
    run.serve()
    return run.finish()


def start_server(request: ParameterServerRequest, startup: monitoring.StartupClock) -> ServerRun:
    """Build the server or restore it from its checkpoint, start monitoring and wait for every
    trainer to join (start-up phases ``data``, ``setup`` and ``process_group``)."""
    global _SERVER
    from sublimate.components.model.models import build_model, model_spec
    from sublimate.components.processes.learning import Evaluation

    model, optimizer, metadata, train_data, steps_per_epoch = _setup(request)
    num_features = int(train_data.x[0].size)
    test_set, probe = None, None
    if request.eval_every_epoch:  # read once, and one model to evaluate snapshots in
        test_set = Evaluation.read(request.data_dir, torch.device("cpu"))
        probe = build_model(*model_spec(request.model, num_features, metadata["num_classes"],
                                        request.hidden))
    startup.mark("data")
    server = ParameterServer(model, optimizer, request.num_trainers, request.staleness_bound)
    saved = checkpoint.load(request.run_dir / SERVER_CHECKPOINT)
    if saved is not None:
        server.load_state_dict(saved)
        print(f"resumed parameter server at update {server.version}", flush=True)
    _SERVER = server
    metrics, epoch_log, staleness_gauge = _server_monitoring(request)
    startup.mark("setup")
    _init_rpc(request, PS_NAME, 0)  # returns once every trainer has joined
    startup.mark("process_group")
    return ServerRun(request, startup, server, metadata, num_features, steps_per_epoch, test_set,
                     probe, metrics, epoch_log, staleness_gauge)


@dataclass
class ServerRun:
    """The parameter server's run: what it serves, where it reports, and its clocks, which
    count applied updates (``server.version``) from the run's start."""

    request: ParameterServerRequest
    startup: monitoring.StartupClock
    server: ParameterServer
    metadata: dict[str, Any]
    num_features: int
    steps_per_epoch: int  # per trainer
    test_set: Evaluation | None
    probe: nn.Module | None  # the model that snapshots are evaluated in (with test_set)
    metrics: monitoring.WorkerMetrics | None
    epoch_log: Any  # tensorboard_log.EpochLog
    staleness_gauge: Any  # a prometheus Gauge (None with metrics off)

    def __post_init__(self) -> None:
        request, version = self.request, self.server.version
        self.local_batch = request.global_batch_size // request.num_trainers  # one update's rows
        self.updates_per_epoch = self.steps_per_epoch * request.num_trainers
        self.total_updates = self.steps_per_epoch * request.epochs * request.num_trainers
        self.first_version = self.observed_version = self.epoch_version = version
        self.epoch_started = time.perf_counter()
        # Training time starts here; every evaluation moves it on by its own duration.
        self.started = time.perf_counter()
        self.next_report = version + self.updates_per_epoch
        self.next_checkpoint = version + request.checkpoint_every if request.checkpoint_every \
            else None
        self.curve: list[list[float]] = []  # [train seconds, update, test accuracy] per epoch
        self.evaluation_seconds = 0.0
        self.launch_to_first_step: float | None = None  # None until an update is applied
        # (version, monotonic time) of the last update seen: trainers are checked when quiet
        self.quiet_since = (version, time.monotonic())

    def serve(self) -> None:
        """Until every trainer has finished, wake at the next epoch's end, checkpoint or second
        (whichever is first) and publish, checkpoint and report what has come due."""
        server, num_trainers = self.server, self.request.num_trainers
        while True:
            wake_at = min(self.next_report, self.next_checkpoint or self.next_report)
            with server.condition:
                def due(wake_at: float = wake_at) -> bool:
                    return len(server.finished) == num_trainers or server.version >= wake_at

                server.condition.wait_for(due, timeout=1.0)
                done = len(server.finished) == num_trainers
            self.observe()
            if self.next_checkpoint is not None and server.version >= self.next_checkpoint:
                self.save_checkpoint()
                self.next_checkpoint = server.version + self.request.checkpoint_every
            if server.version >= self.next_report:
                self.report_epoch()
            if done:
                return
            self.check_trainers()

    def check_trainers(self) -> None:
        """After :data:`QUIET_SECONDS` without an update, ask every running trainer whether it
        is there; raise :class:`TrainerLost` naming one that is not.

        A trainer that dies leaves the server waiting for its pushes; on one machine TorchX
        calls the app running while any process runs, so without this the job would hang.
        """
        from torch.distributed import rpc

        server = self.server
        now = time.monotonic()
        if server.version != self.quiet_since[0]:
            self.quiet_since = (server.version, now)
            return
        if now - self.quiet_since[1] < QUIET_SECONDS:
            return
        for trainer in range(self.request.num_trainers):
            if trainer in server.finished:
                continue
            try:
                rpc.rpc_sync(f"trainer{trainer}", _remote_alive, timeout=QUIET_SECONDS)
            except RuntimeError as error:
                if trainer in server.finished:  # it finished while asked
                    continue
                # torch's text ends in where in tensorpipe it noticed: not the user's concern
                reason = " ".join(str(error).split("(this error")[0].split())[:120]
                raise TrainerLost(
                    f"trainer {trainer} is gone (no answer: {reason}); the "
                    f"parameter server stops at update {server.version} (its last checkpoint "
                    "resumes the run)") from None
        self.quiet_since = (server.version, time.monotonic())

    def observe(self) -> None:
        """Publish the first applied update (the end of start-up) and the updates since the
        last call to Prometheus."""
        server, metrics, startup = self.server, self.metrics, self.startup
        if self.launch_to_first_step is None and server.first_update_at is not None:
            startup.mark("first_step", at=server.first_update_at)
            self.launch_to_first_step = startup.total()
            if metrics is not None:
                metrics.observe_startup(self.launch_to_first_step, startup.phases())
        if metrics is not None and server.version > self.observed_version:
            updates = server.version - self.observed_version
            metrics.observe_steps(updates, updates * self.local_batch, 0.0, 0.0, 0.0,
                                  self.total_updates, server.version)
            self.staleness_gauge.set(server.statistics()["staleness_mean"])
            self.observed_version = server.version

    def report_epoch(self) -> None:
        """An epoch's updates are in: its log line (with the trainers' mean loss and time
        split), the evaluation and the epoch's record."""
        server, request = self.server, self.request
        epoch = round(server.version / self.updates_per_epoch)
        now = time.perf_counter()
        samples_per_second = (server.version - self.epoch_version) * self.local_batch \
            / max(now - self.epoch_started, 1e-9)
        self.epoch_started, self.epoch_version = now, server.version
        trainers = server.trainer_means()
        message = f"epoch {epoch}/{request.epochs} updates {server.version}/{self.total_updates}"
        if "loss" in trainers:
            message += f" loss {trainers['loss']:.4f}"
        message += f" samples/s {samples_per_second:.0f} staleness mean " \
                   f"{server.statistics()['staleness_mean']}"
        if trainers:
            split = monitoring.time_split(*(trainers[f"{p}_seconds"] for p in monitoring.PHASES))
            message += f" | {monitoring.format_split(split)}"
        accuracy = self.evaluate()
        if accuracy is not None:
            message += f" test-accuracy {accuracy:.4f}"
        print(message, flush=True)
        _record_server_epoch(self.epoch_log, self.metrics, epoch, server, trainers,
                             samples_per_second, accuracy)
        self.next_report = (server.version // self.updates_per_epoch + 1) * self.updates_per_epoch

    def evaluate(self) -> float | None:
        """The test accuracy of a snapshot of the server's model, added to the accuracy curve
        (None with per-epoch evaluation off). Its time is not training time."""
        if self.test_set is None or self.probe is None:
            return None
        paused = time.perf_counter()
        # A consistent snapshot; trainers wait only for the copy.
        self.probe.load_state_dict(self.server.snapshot())
        accuracy = self.test_set.accuracy(self.probe)
        self.evaluation_seconds += time.perf_counter() - paused
        self.started += time.perf_counter() - paused
        self.curve.append([round(time.perf_counter() - self.started, 4), self.server.version,
                           round(accuracy, 4)])
        return accuracy

    def save_checkpoint(self) -> None:
        """The server's whole state, which a re-submitted run resumes from."""
        path = self.request.run_dir / SERVER_CHECKPOINT
        checkpoint.save(self.server.state_dict(), path,
                        f"saving the parameter server's checkpoint to {shown_path(path)}")

    def finish(self) -> dict[str, Any]:
        """Shut the RPC group down, stop monitoring, save the last checkpoint, the model and
        the summary; return the summary."""
        from sublimate.components.model.models import model_spec

        request, server = self.request, self.server
        seconds = time.perf_counter() - self.started
        shutdown_rpc(0, request.num_trainers + 1, request.rpc_timeout)
        self.epoch_log.close()
        if self.metrics is not None:
            self.metrics.close()
        self.save_checkpoint()
        summary = self.summary(seconds)
        architecture, config = model_spec(request.model, self.num_features,
                                          self.metadata["num_classes"], request.hidden)
        checkpoint.save({"architecture": architecture, "config": config,
            "state_dict": server.snapshot(), "algorithm": "async",
            "steps": summary["steps"], "dataset": self.metadata["name"]},
            request.run_dir / run_files.MODEL,
            f"saving the model to {shown_path(request.run_dir / run_files.MODEL)}")
        write_json(summary, request.run_dir / run_files.SUMMARY, sort_keys=False)
        return summary

    def summary(self, seconds: float) -> dict[str, Any]:
        """What this launch did (train-summary.json), ``seconds`` being its training time."""
        request, server = self.request, self.server
        return {
            "algorithm": "async", "world_size": request.num_trainers, "epochs": request.epochs,
            "global_batch_size": request.global_batch_size, "train_seconds": round(seconds, 3),
            "samples_per_second": round((server.version - self.first_version) * self.local_batch
                                        / max(seconds, 1e-9), 1),
            "push_pull_ops_per_epoch": self.updates_per_epoch,
            "communication_ops_per_epoch": self.updates_per_epoch,
            "resumed_from_update": self.first_version, "accuracy_curve": self.curve,
            "evaluation_seconds": round(self.evaluation_seconds, 4),
            "steps": server.version // request.num_trainers,
            # The first update applied is async SGD's first step (None: this launch applied none).
            "launch_to_first_step_seconds": self.launch_to_first_step,
            "startup": self.startup.phases() if self.launch_to_first_step is not None else {},
            **server.statistics(),
        }


def run_trainer(request: ParameterServerRequest, startup: monitoring.StartupClock) -> None:
    """The ``trainer`` role: push gradients and pull parameters until the last step."""
    trainer = start_trainer(request, startup)
    trainer.run()
    trainer.finish()


def start_trainer(request: ParameterServerRequest, startup: monitoring.StartupClock) -> TrainerRun:
    """Read the data, join the RPC group and pull the server's parameters and this trainer's
    position (start-up phases ``data`` and ``process_group``); start monitoring."""
    from torch.distributed import rpc

    model, _, _, data, steps_per_epoch = _setup(request)
    device = trainer_device()
    model = model.to(device)
    features = torch.from_numpy(data.x).reshape(len(data.y), -1).to(device)
    labels = torch.from_numpy(data.y).to(device)
    startup.mark("data")
    _init_rpc(request, f"trainer{request.trainer_id}", request.trainer_id + 1)
    parameters, version, step = rpc.rpc_sync(PS_NAME, _remote_start, args=(request.trainer_id,))
    startup.mark("process_group")
    metrics, epoch_log = _trainer_monitoring(request)
    return TrainerRun(request, startup, model, features, labels, steps_per_epoch, metrics,
                      epoch_log, parameters, version, step)


@dataclass
class TrainerRun:
    """One async trainer: its model replica and data, monitoring, and where it stands (the
    parameters it last pulled, their version, the steps it has taken)."""

    request: ParameterServerRequest
    startup: monitoring.StartupClock
    model: nn.Module
    features: torch.Tensor
    labels: torch.Tensor
    steps_per_epoch: int
    metrics: monitoring.WorkerMetrics | None
    epoch_log: Any  # tensorboard_log.EpochLog
    parameters: list[torch.Tensor]
    version: int
    step: int

    def __post_init__(self) -> None:
        request = self.request
        # main() checked that it divides
        self.local_batch = request.global_batch_size // request.num_trainers
        self.lr = trainer_learning_rate(request, self.step, self.steps_per_epoch)
        self.total_steps = self.steps_per_epoch * request.epochs
        self.times = monitoring.StepTimes()

    def run(self) -> None:
        """The step loop: copy in the pulled parameters, compute this trainer's gradient, push
        it and pull the next parameters in one round trip; report each epoch to the server.

        Like the collective workers' loop (training_loop.TrainingLoop.run_epoch) it works on
        locals only, so a step costs what a hand-written loop's would.
        """
        from torch.distributed import rpc

        request, model, features, labels = self.request, self.model, self.features, self.labels
        metrics, times, local_batch = self.metrics, self.times, self.local_batch
        device, on_gpu = labels.device, labels.is_cuda
        buffers = list(model.buffers())  # BatchNorm statistics: sent with every push
        schedule = {**request.values(), "algorithm": "async"}  # what trainer_learning_rate reads
        steps_per_epoch, total_steps = self.steps_per_epoch, self.total_steps
        trainer_id, global_batch = request.trainer_id, request.global_batch_size
        parameters, version, step = self.parameters, self.version, self.step
        loss_fn, perf_counter = nn.CrossEntropyLoss(), time.perf_counter
        pending_startup = self.startup if step < total_steps else None
        from sublimate.components.processes.fault_injection import fault_injection_step, kill_self

        fail_at = fault_injection_step(trainer_id)  # resilience tests: SIGKILL at that step
        epoch_loss, epoch_steps, epoch_started = torch.zeros((), device=device), 0, perf_counter()
        order, order_epoch = torch.empty(0, dtype=torch.long), -1  # drawn at the first step
        while step < total_steps:
            started = perf_counter()
            epoch, batch_index = divmod(step, steps_per_epoch)
            if epoch != order_epoch:  # one permutation per epoch (it was redrawn every step)
                generator = torch.Generator().manual_seed(request.seed * 100_003 + epoch)
                order, order_epoch = torch.randperm(len(labels), generator=generator), epoch
                order = order.to(device)
            lr = lr_schedule.learning_rate(schedule, request.num_trainers, step, steps_per_epoch)
            start = batch_index * global_batch + trainer_id * local_batch
            rows = order[start:start + local_batch]
            x, y = features[rows], labels[rows]
            loaded = perf_counter()
            with torch.no_grad():
                for parameter, value in zip(model.parameters(), parameters, strict=True):
                    parameter.copy_(value)
            model.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            epoch_loss += loss.detach()
            # a parameter the loss does not reach has no gradient: it moves by none
            gradients = [torch.zeros_like(parameter) if parameter.grad is None else parameter.grad
                         for parameter in model.parameters()]
            pushed = [buffer.detach().clone() for buffer in buffers]
            if on_gpu:  # RPC carries CPU tensors (no device maps to configure)
                gradients = [gradient.cpu() for gradient in gradients]
                pushed = [buffer.cpu() for buffer in pushed]
            computed = perf_counter()
            parameters, version = rpc.rpc_sync(  # the push/pull round trip is the communication
                PS_NAME, _remote_push_pull, args=(trainer_id, gradients, version, lr, pushed))
            step += 1
            if step == fail_at:
                kill_self(trainer_id, step)
            if pending_startup is not None:  # this trainer's first update is applied
                pending_startup.mark("first_step")
                if metrics is not None:
                    metrics.observe_startup(pending_startup.total(), pending_startup.phases())
                pending_startup = None
            epoch_steps += 1
            times.comm += perf_counter() - computed
            times.data += loaded - started
            times.compute += computed - loaded
            times.steps += 1
            if times.steps == 16:
                times.flush(metrics, 0.0, local_batch, step, total_steps)
            if step % steps_per_epoch == 0 or step == total_steps:
                self.lr = lr  # the epoch's record shows the rate its last step used
                self.report_epoch(step, epoch_loss, epoch_steps, epoch_started)
                epoch_loss, epoch_steps = torch.zeros((), device=device), 0
                epoch_started = perf_counter()
        self.parameters, self.version, self.step = parameters, version, step

    def report_epoch(self, step: int, epoch_loss: torch.Tensor, epoch_steps: int,
                     epoch_started: float) -> None:
        """Send the epoch's mean loss and time split to the server, and record them here."""
        from torch.distributed import rpc

        self.times.flush(self.metrics, 0.0, self.local_batch, step, self.total_steps)
        seconds = time.perf_counter() - epoch_started
        figures = {"loss": epoch_loss.item() / epoch_steps,
                   **{f"{phase}_seconds": value for phase, value
                      in zip(monitoring.PHASES, self.times.take_epoch(), strict=True)}}
        rpc.rpc_sync(PS_NAME, _remote_report, args=(self.request.trainer_id, figures))
        _record_trainer_epoch(self.epoch_log, self.metrics, -(-step // self.steps_per_epoch),
                              step, self.lr, figures,
                              epoch_steps * self.local_batch / max(seconds, 1e-9), seconds)

    def finish(self) -> None:
        """Tell the server this trainer is done, leave the RPC group and stop monitoring."""
        from torch.distributed import rpc

        rpc.rpc_sync(PS_NAME, _remote_finish, args=(self.request.trainer_id,))
        request = self.request
        shutdown_rpc(request.trainer_id + 1, request.num_trainers + 1, request.rpc_timeout)
        self.epoch_log.close()
        if self.metrics is not None:
            self.metrics.close()


def _server_monitoring(request: ParameterServerRequest) -> tuple[Any, Any, Any]:
    from prometheus_client import Gauge

    from sublimate.components.monitoring.tensorboard_log import EpochLog

    metrics = monitoring.serve_worker(request.run_dir, "0", "ps0", role="ps",
                                      addr=request.metrics_addr, port=request.metrics_port,
                                      key="ps")
    staleness = None
    if metrics is not None:
        staleness = Gauge("sublimate_async_staleness_mean", "mean staleness of applied updates",
                          list(metrics.labels), registry=metrics.registry).labels(**metrics.labels)
        print(f"metrics: http://{metrics.address}/metrics (every process: "
              f"{request.run_dir / monitoring.ENDPOINTS_FILE})", flush=True)
    return metrics, EpochLog(request.run_dir, "ps", aggregate=True), staleness


def _trainer_monitoring(request: ParameterServerRequest) -> tuple[Any, Any]:
    from sublimate.components.monitoring.tensorboard_log import EpochLog

    # Trainers are separate TorchX replicas; on one host they share the base port, so each
    # offsets it by its id (in a cluster each is its own pod and the offset is harmless).
    metrics = monitoring.serve_worker(
        request.run_dir, str(request.trainer_id + 1), f"trainer{request.trainer_id}",
        role="trainer", local_rank=1 + request.trainer_id, addr=request.metrics_addr,
        port=request.metrics_port,
        key=f"trainer-{request.trainer_id}")
    return metrics, EpochLog(request.run_dir, f"trainer-{request.trainer_id}")


def _record_server_epoch(epoch_log: Any, metrics: Any, epoch: int, server: ParameterServer,
                         trainers: dict[str, float], samples_per_second: float,
                         accuracy: float | None) -> None:
    statistics = server.statistics()
    record: dict[str, Any] = {"epoch": epoch, "step": server.version, "time": round(time.time(), 3),
                              "samples_per_second": round(samples_per_second, 1),
                              "staleness_mean": statistics["staleness_mean"]}
    if "loss" in trainers:
        record["loss"] = round(trainers["loss"], 6)
    if accuracy is not None:
        record["test_accuracy"] = round(accuracy, 4)
    aggregate = {"train/samples_per_second": samples_per_second,
                 "async/staleness_mean": statistics["staleness_mean"]}
    if trainers:
        aggregate["train/loss"] = trainers["loss"]
        split = monitoring.time_split(*(trainers[f"{p}_seconds"] for p in monitoring.PHASES))
        aggregate.update({f"time/{phase}_fraction": value for phase, value in split.items()})
    if accuracy is not None:
        aggregate["test/accuracy"] = accuracy
    epoch_log.write(record, server.version, {key: aggregate[key] for key in (
        "train/samples_per_second", "async/staleness_mean")}, aggregate)
    if metrics is not None:
        metrics.observe_epoch(epoch, trainers.get("loss"), None)


def _record_trainer_epoch(epoch_log: Any, metrics: Any, epoch: int, step: int, lr: float,
                          figures: dict[str, float], samples_per_second: float,
                          seconds: float) -> None:
    phases = [figures[f"{phase}_seconds"] for phase in monitoring.PHASES]
    split = monitoring.time_split(*phases)
    record = {"epoch": epoch, "step": step, "time": round(time.time(), 3),
              "seconds": round(seconds, 4), "loss": round(figures["loss"], 6),
              "local_loss": round(figures["loss"], 6), "learning_rate": lr,
              "local_samples_per_second": round(samples_per_second, 1),
              **{f"{phase}_seconds": round(figures[f"{phase}_seconds"], 5)
                 for phase in monitoring.PHASES}}
    epoch_log.write(record, step, {
        "train/loss": figures["loss"], "train/samples_per_second": samples_per_second,
        "train/learning_rate": lr,
        **{f"time/{phase}_fraction": value for phase, value in split.items()}})
    if metrics is not None:
        metrics.observe_epoch(epoch, figures["loss"], lr)


def parse_args(argv: list[str] | None = None) -> ParameterServerRequest:
    from sublimate.components.base.settings import add_training_arguments
    from sublimate.components.base.termination import OneLineParser
    from sublimate.components.processes.worker import add_metrics_arguments

    parser = OneLineParser(prog="train", description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["ps", "trainer"])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--num-trainers", type=int, required=True)
    parser.add_argument("--trainer-id", type=int, default=0)
    parser.add_argument("--rpc-endpoint", required=True, help="host:port of the ps process")
    parser.add_argument("--rpc-timeout", type=float, default=300.0)
    add_metrics_arguments(parser)
    add_training_arguments(parser, ("async",))
    return ParameterServerRequest.from_values(vars(parser.parse_args(argv)))


def refusal(request: ParameterServerRequest) -> str | None:
    """Why these arguments cannot train, in one line (None if they can); the launcher refuses
    the same before it starts any process, with the same words."""
    try:  # one trainer per node, in the launcher's terms
        check({**request.values(), "algorithm": "async", "nodes": request.num_trainers,
               "procs_per_node": 1})
    except SettingError as error:
        return str(error)
    from sublimate.components.data.datasets import data_problem  # as _setup: deferred

    # Only the server evaluates, so only it needs the test split.
    return data_problem(request.data_dir, request.global_batch_size,
                        request.eval_every_epoch and request.role == "ps")


def main(argv: list[str] | None = None) -> int:
    # TorchX starts these processes itself (no torchrun agent): "scheduler" is that phase.
    startup = monitoring.StartupClock(STARTED, spawned_by="scheduler")
    startup.mark("imports")
    request = parse_args(argv)
    problem = refusal(request)
    if problem is not None:
        return fail("train", problem)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    # torch's RPC init warns about its own internal use of a deprecated API: noise in the live view
    warnings.filterwarnings("ignore", message="You are using a Backend", category=UserWarning)
    if request.role == "ps":
        try:
            summary = run_server(request, startup)
        except (checkpoint.CheckpointError, TrainerLost) as error:  # one line says it all
            return fail("train", str(error), code=1)
        print(f"training finished: {summary['updates_applied']} updates in "
              f"{summary['train_seconds']:.1f}s, {summary['samples_per_second']:.0f} samples/s, "
              f"staleness mean {summary['staleness_mean']}, model at "
              f"{request.run_dir / 'model.pt'}", flush=True)
    else:
        run_trainer(request, startup)
    return 0


if __name__ == "__main__":
    from sublimate.components.base.termination import exit_now

    exit_now(main())  # without the interpreter's teardown, which holds up the step's end
