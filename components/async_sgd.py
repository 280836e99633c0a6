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

import argparse
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sublimate.components import checkpoint
from sublimate.components import metrics as monitoring
from sublimate.components.paradigm import Paradigm, data_problem
from sublimate.components.settings import SettingError, check
from sublimate.components.termination import fail

PS_NAME = "ps"
SERVER_CHECKPOINT = "checkpoints/parameter-server.pt"


class AsyncSGD(Paradigm):
    """Registered so ``algorithm=async`` is known; the work happens in the two roles below."""

    name = "async"


class ParameterServer:
    """The global model; applies pushed gradients one at a time under a lock."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, num_trainers: int,
                 staleness_bound: int = 0) -> None:
        self.model, self.optimizer = model, optimizer
        self.num_trainers, self.staleness_bound = num_trainers, staleness_bound
        self.version = 0
        self.clocks = [0] * num_trainers
        self.finished: set[int] = set()
        self.staleness_total = 0
        self.staleness_max = 0
        self.staleness_histogram: dict[int, int] = {}
        self.waits = 0
        self.first_update_at: float | None = None  # wall clock, for the start-up report
        self.condition = threading.Condition()
        # each trainer's last per-epoch report (loss, time split), for the live line
        self.trainer_reports: dict[int, dict[str, float]] = {}

    def parameters(self) -> list[torch.Tensor]:
        return [parameter.detach().clone() for parameter in self.model.parameters()]

    def start(self, trainer: int) -> tuple[list[torch.Tensor], int, int]:
        """Parameters, version and the trainer's own step count (non-zero after a resume)."""
        with self.condition:
            return self.parameters(), self.version, self.clocks[trainer]

    def _too_far_ahead(self, trainer: int) -> bool:
        running = [clock for index, clock in enumerate(self.clocks) if index not in self.finished]
        return bool(self.staleness_bound) and self.clocks[trainer] - min(running) \
            >= self.staleness_bound

    def push_pull(self, trainer: int, gradients: list[torch.Tensor], version_seen: int,
                  learning_rate: float) -> tuple[list[torch.Tensor], int]:
        with self.condition:
            if self._too_far_ahead(trainer):
                self.waits += 1
                self.condition.wait_for(lambda: not self._too_far_ahead(trainer))
            staleness = self.version - version_seen
            self.staleness_total += staleness
            self.staleness_max = max(self.staleness_max, staleness)
            self.staleness_histogram[staleness] = self.staleness_histogram.get(staleness, 0) + 1
            for parameter, gradient in zip(self.model.parameters(), gradients, strict=True):
                parameter.grad = gradient
            for group in self.optimizer.param_groups:
                group["lr"] = learning_rate
            self.optimizer.step()
            if self.first_update_at is None:
                self.first_update_at = time.time()
            self.version += 1
            self.clocks[trainer] += 1
            self.condition.notify_all()
            return self.parameters(), self.version

    def report(self, trainer: int, figures: dict[str, float]) -> None:
        with self.condition:
            self.trainer_reports[trainer] = figures

    def trainer_means(self) -> dict[str, float]:
        """Mean over trainers of their latest epoch report (they may be an epoch apart)."""
        with self.condition:
            reports = list(self.trainer_reports.values())
        if not reports:
            return {}
        return {key: sum(r[key] for r in reports) / len(reports) for key in reports[0]}

    def finish(self, trainer: int) -> None:
        with self.condition:
            self.finished.add(trainer)
            self.condition.notify_all()

    def statistics(self) -> dict[str, Any]:
        return {
            "updates_applied": self.version,
            "pushes_per_trainer": list(self.clocks),
            "staleness_mean": round(self.staleness_total / max(self.version, 1), 3),
            "staleness_max": self.staleness_max,
            "staleness_histogram": {str(k): v for k, v in sorted(self.staleness_histogram.items())},
            "bound_waits": self.waits,
        }

    def state_dict(self) -> dict[str, Any]:
        with self.condition:
            return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                    "version": self.version, "clocks": list(self.clocks),
                    "staleness": [self.staleness_total, self.staleness_max,
                                  dict(self.staleness_histogram), self.waits]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version, self.clocks = state["version"], list(state["clocks"])
        self.staleness_total, self.staleness_max, histogram, self.waits = state["staleness"]
        self.staleness_histogram = dict(histogram)


# RPC targets run in the server process and reach its one ParameterServer through this global.
_SERVER: ParameterServer | None = None


def _remote_start(trainer: int) -> tuple[list[torch.Tensor], int, int]:
    assert _SERVER is not None
    return _SERVER.start(trainer)


def _remote_push_pull(trainer: int, gradients: list[torch.Tensor], version_seen: int,
                      learning_rate: float) -> tuple[list[torch.Tensor], int]:
    assert _SERVER is not None
    return _SERVER.push_pull(trainer, gradients, version_seen, learning_rate)


def _remote_report(trainer: int, figures: dict[str, float]) -> None:
    assert _SERVER is not None
    _SERVER.report(trainer, figures)


def _remote_finish(trainer: int) -> None:
    assert _SERVER is not None
    _SERVER.finish(trainer)


def _setup(args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer, Any, Any, int]:
    from sublimate.components.datasets import read_metadata, read_split
    from sublimate.components.models import build_model, model_spec

    metadata = read_metadata(args.data_dir)
    data = read_split(args.data_dir, "train")
    torch.manual_seed(args.seed)
    architecture, config = model_spec(args.model, int(data.x.reshape(len(data.y), -1).shape[1]),
                                      metadata["num_classes"], args.hidden)
    model = build_model(architecture, config)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate,
                                momentum=args.momentum, weight_decay=args.weight_decay)
    steps_per_epoch = len(data.y) // args.global_batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"global-batch-size {args.global_batch_size} exceeds the "
                         f"{len(data.y)} training examples")
    return model, optimizer, metadata, data, steps_per_epoch


def _init_rpc(args: argparse.Namespace, name: str, rank: int) -> None:
    from torch.distributed import rpc

    options = rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://{args.rpc_endpoint}", rpc_timeout=args.rpc_timeout,
        num_worker_threads=max(16, 2 * args.num_trainers))
    rpc.init_rpc(name, rank=rank, world_size=args.num_trainers + 1,
                 rpc_backend_options=options)


def update_learning_rate(args: argparse.Namespace, local_batch: int) -> float:
    # Each update carries one trainer's batch, so linear scaling uses that batch size.
    if args.lr_scaling == "linear":
        return args.learning_rate * local_batch / args.reference_batch_size
    return args.learning_rate


def run_server(args: argparse.Namespace, startup: monitoring.StartupClock) -> dict[str, Any]:
    global _SERVER
    from torch.distributed import rpc

    from sublimate.components.models import build_model, model_spec
    from sublimate.components.worker import MODEL_NAME, Evaluation

    model, optimizer, metadata, train_data, steps_per_epoch = _setup(args)
    test_set, probe = None, None
    if args.eval_every_epoch:  # read once, and one model to evaluate snapshots in
        test_set = Evaluation.read(args.data_dir, torch.device("cpu"))
        probe = build_model(*model_spec(args.model, int(train_data.x[0].size),
                                        metadata["num_classes"], args.hidden))
    startup.mark("data")
    server = ParameterServer(model, optimizer, args.num_trainers, args.staleness_bound)
    saved = checkpoint.load(args.run_dir / SERVER_CHECKPOINT)
    if saved is not None:
        server.load_state_dict(saved)
        print(f"resumed parameter server at update {server.version}", flush=True)
    first_version = server.version
    _SERVER = server
    metrics, epoch_log, staleness_gauge = _server_monitoring(args)
    startup.mark("setup")
    _init_rpc(args, PS_NAME, 0)  # returns once every trainer has joined
    startup.mark("process_group")
    launch_to_first_step: float | None = None
    total_updates = steps_per_epoch * args.epochs * args.num_trainers
    updates_per_epoch = steps_per_epoch * args.num_trainers
    local_batch = args.global_batch_size // args.num_trainers
    observed_version, epoch_started, epoch_version = server.version, time.perf_counter(), \
        server.version
    started, curve, next_report = time.perf_counter(), [], first_version + updates_per_epoch
    evaluation_seconds = 0.0
    next_checkpoint = first_version + args.checkpoint_every if args.checkpoint_every else None
    while True:
        wake_at = min(next_report, next_checkpoint or next_report)
        with server.condition:
            server.condition.wait_for(
                lambda wake_at=wake_at: len(server.finished) == args.num_trainers
                or server.version >= wake_at, timeout=1.0)
            done = len(server.finished) == args.num_trainers
        if launch_to_first_step is None and server.first_update_at is not None:
            startup.mark("first_step", at=server.first_update_at)
            launch_to_first_step = startup.total()
            if metrics is not None:
                metrics.observe_startup(launch_to_first_step, startup.phases())
        if metrics is not None and server.version > observed_version:
            updates = server.version - observed_version
            metrics.observe_steps(updates, updates * local_batch, 0.0, 0.0, 0.0,
                                  total_updates, server.version)
            staleness_gauge.set(server.statistics()["staleness_mean"])
            observed_version = server.version
        if next_checkpoint is not None and server.version >= next_checkpoint:
            checkpoint.save(server.state_dict(), args.run_dir / SERVER_CHECKPOINT)
            next_checkpoint = server.version + args.checkpoint_every
        if server.version >= next_report:
            epoch = round(server.version / updates_per_epoch)
            now = time.perf_counter()
            samples_per_second = (server.version - epoch_version) * local_batch \
                / max(now - epoch_started, 1e-9)
            epoch_started, epoch_version = now, server.version
            trainers = server.trainer_means()
            message = f"epoch {epoch}/{args.epochs} updates {server.version}/{total_updates}"
            if "loss" in trainers:
                message += f" loss {trainers['loss']:.4f}"
            message += f" samples/s {samples_per_second:.0f} staleness mean " \
                       f"{server.statistics()['staleness_mean']}"
            if trainers:
                split = monitoring.time_split(*(trainers[f"{p}_seconds"]
                                                for p in monitoring.PHASES))
                message += f" | {monitoring.format_split(split)}"
            accuracy = None
            if test_set is not None and probe is not None:
                paused = time.perf_counter()
                with server.condition:  # a consistent snapshot; trainers wait only for the copy
                    probe.load_state_dict(model.state_dict())
                accuracy = test_set.accuracy(probe)
                evaluation_seconds += time.perf_counter() - paused
                started += time.perf_counter() - paused  # evaluation is not training time
                curve.append([round(time.perf_counter() - started, 4), server.version,
                              round(accuracy, 4)])
                message += f" test-accuracy {accuracy:.4f}"
            print(message, flush=True)
            _record_server_epoch(epoch_log, metrics, epoch, server, trainers,
                                 samples_per_second, accuracy)
            next_report = (server.version // updates_per_epoch + 1) * updates_per_epoch
        if done:
            break
    seconds = time.perf_counter() - started
    rpc.shutdown()
    epoch_log.close()
    if metrics is not None:
        metrics.close()
    checkpoint.save(server.state_dict(), args.run_dir / SERVER_CHECKPOINT)
    summary = {
        "algorithm": "async", "world_size": args.num_trainers, "epochs": args.epochs,
        "global_batch_size": args.global_batch_size, "train_seconds": round(seconds, 3),
        "samples_per_second": round((server.version - first_version) * local_batch
                                    / max(seconds, 1e-9), 1),
        "push_pull_ops_per_epoch": updates_per_epoch,
        "communication_ops_per_epoch": updates_per_epoch,
        "resumed_from_update": first_version, "accuracy_curve": curve,
        "evaluation_seconds": round(evaluation_seconds, 4),
        "steps": server.version // args.num_trainers,
        # The first update applied is async SGD's first step (None: this launch applied none).
        "launch_to_first_step_seconds": launch_to_first_step,
        "startup": startup.phases() if launch_to_first_step is not None else {},
        **server.statistics(),
    }
    architecture, config = model_spec(args.model, int(train_data.x[0].size),
                                      metadata["num_classes"], args.hidden)
    checkpoint.save({"architecture": architecture, "config": config,
        "state_dict": model.state_dict(), "algorithm": "async",
        "steps": summary["steps"], "dataset": metadata["name"]}, args.run_dir / MODEL_NAME)
    checkpoint.write_json(summary, args.run_dir / "train-summary.json", sort_keys=False)
    return summary


def run_trainer(args: argparse.Namespace, startup: monitoring.StartupClock) -> None:
    from torch.distributed import rpc

    model, _, _, data, steps_per_epoch = _setup(args)
    local_batch = args.global_batch_size // args.num_trainers  # main() checked it divides
    features = torch.from_numpy(data.x).reshape(len(data.y), -1)
    labels = torch.from_numpy(data.y)
    startup.mark("data")
    _init_rpc(args, f"trainer{args.trainer_id}", args.trainer_id + 1)
    parameters, version, step = rpc.rpc_sync(PS_NAME, _remote_start, args=(args.trainer_id,))
    startup.mark("process_group")
    lr = update_learning_rate(args, local_batch)
    loss_fn = nn.CrossEntropyLoss()
    total_steps = steps_per_epoch * args.epochs
    metrics, epoch_log = _trainer_monitoring(args)
    pending_startup = startup if step < total_steps else None
    times, perf_counter = monitoring.StepTimes(), time.perf_counter
    epoch_loss, epoch_steps, epoch_started = torch.zeros(()), 0, perf_counter()
    order, order_epoch = None, -1
    while step < total_steps:
        started = perf_counter()
        epoch, batch_index = divmod(step, steps_per_epoch)
        if epoch != order_epoch:  # one permutation per epoch (it was redrawn every step)
            order, order_epoch = torch.randperm(len(labels), generator=torch.Generator()
                                                .manual_seed(args.seed * 100_003 + epoch)), epoch
        start = batch_index * args.global_batch_size + args.trainer_id * local_batch
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
        gradients = [parameter.grad for parameter in model.parameters()]
        computed = perf_counter()
        parameters, version = rpc.rpc_sync(  # the push/pull round trip is the communication
            PS_NAME, _remote_push_pull, args=(args.trainer_id, gradients, version, lr))
        step += 1
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
            times.flush(metrics, 0.0, local_batch, step, total_steps)
            seconds = perf_counter() - epoch_started
            figures = {"loss": epoch_loss.item() / epoch_steps,
                       **{f"{phase}_seconds": value for phase, value
                          in zip(monitoring.PHASES, times.take_epoch(), strict=True)}}
            rpc.rpc_sync(PS_NAME, _remote_report, args=(args.trainer_id, figures))
            _record_trainer_epoch(epoch_log, metrics, -(-step // steps_per_epoch), step, lr,
                                  figures, epoch_steps * local_batch / max(seconds, 1e-9),
                                  seconds)
            epoch_loss, epoch_steps, epoch_started = torch.zeros(()), 0, perf_counter()
    rpc.rpc_sync(PS_NAME, _remote_finish, args=(args.trainer_id,))
    rpc.shutdown()
    epoch_log.close()
    if metrics is not None:
        metrics.close()


def _server_monitoring(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from prometheus_client import Gauge

    from sublimate.components.tensorboard_log import EpochLog

    metrics = monitoring.serve_worker(args.run_dir, "0", "ps0", role="ps", addr=args.metrics_addr,
                                      port=args.metrics_port, key="ps")
    staleness = None
    if metrics is not None:
        staleness = Gauge("sublimate_async_staleness_mean", "mean staleness of applied updates",
                          list(metrics.labels), registry=metrics.registry).labels(**metrics.labels)
        print(f"metrics: http://{metrics.address}/metrics (every process: "
              f"{args.run_dir / monitoring.ENDPOINTS_FILE})", flush=True)
    return metrics, EpochLog(args.run_dir, "ps", aggregate=True), staleness


def _trainer_monitoring(args: argparse.Namespace) -> tuple[Any, Any]:
    from sublimate.components.tensorboard_log import EpochLog

    # Trainers are separate TorchX replicas; on one host they share the base port, so each
    # offsets it by its id (in a cluster each is its own pod and the offset is harmless).
    metrics = monitoring.serve_worker(
        args.run_dir, str(args.trainer_id + 1), f"trainer{args.trainer_id}", role="trainer",
        local_rank=1 + args.trainer_id, addr=args.metrics_addr, port=args.metrics_port,
        key=f"trainer-{args.trainer_id}")
    return metrics, EpochLog(args.run_dir, f"trainer-{args.trainer_id}")


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from sublimate.components.paradigm import add_training_arguments
    from sublimate.components.termination import OneLineParser
    from sublimate.components.worker import add_metrics_arguments

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
    return parser.parse_args(argv)


def refusal(args: argparse.Namespace) -> str | None:
    """Why these arguments cannot train, in one line (None if they can); the launcher refuses
    the same before it starts any process, with the same words."""
    try:  # one trainer per node, in the launcher's terms
        check({**vars(args), "algorithm": "async", "nodes": args.num_trainers,
               "procs_per_node": 1})
    except SettingError as error:
        return str(error)
    # Only the server evaluates, so only it needs the test split.
    return data_problem(args.data_dir, args.global_batch_size,
                        args.eval_every_epoch and args.role == "ps")


def main(argv: list[str] | None = None) -> int:
    # TorchX starts these processes itself (no torchrun agent): "scheduler" is that phase.
    startup = monitoring.StartupClock(STARTED, spawned_by="scheduler")
    startup.mark("imports")
    args = parse_args(argv)
    problem = refusal(args)
    if problem is not None:
        return fail("train", problem)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    # torch's RPC init warns about its own internal use of a deprecated API: noise in the live view
    warnings.filterwarnings("ignore", message="You are using a Backend", category=UserWarning)
    if args.role == "ps":
        summary = run_server(args, startup)
        print(f"training finished: {summary['updates_applied']} updates in "
              f"{summary['train_seconds']:.1f}s, {summary['samples_per_second']:.0f} samples/s, "
              f"staleness mean {summary['staleness_mean']}, model at "
              f"{args.run_dir / 'model.pt'}", flush=True)
    else:
        run_trainer(args, startup)
    return 0


if __name__ == "__main__":
    from sublimate.components.worker import exit_now

    exit_now(main())  # without the interpreter's teardown, which holds up the step's end
