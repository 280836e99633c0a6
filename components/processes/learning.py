"""What a worker trains: the staged data on its device, the model, its optimizer and paradigm,
the learning-rate schedule, and rank 0's evaluation; built the same way by both step loops (the
restart mode's :mod:`.worker` and the per-step mode's :mod:`.per_step_loop`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sublimate.components import training
from sublimate.components.data.datasets import read_metadata, read_split, streams
from sublimate.components.model.models import build_model, model_spec
from sublimate.components.monitoring import metrics as monitoring
from sublimate.components.paradigms import Paradigm, lr_schedule
from sublimate.components.processes.request import WorkerRequest
from sublimate.components.training import ProcessGroup


def learning_rate(request: WorkerRequest, step: int, steps_per_epoch: int,
                  workers: int) -> float:
    """The rate at ``step``: lr-scaling for the paradigm, reached by gradual warmup (the rules,
    and why they differ between paradigms, are
    :mod:`sublimate.components.paradigms.lr_schedule`'s)."""
    return lr_schedule.learning_rate(request.values(), workers, step, steps_per_epoch)



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


def load_data(request: WorkerRequest, group: ProcessGroup, startup: monitoring.StartupClock,
              ) -> TrainingData:
    """Read the staged dataset onto the device (start-up phase ``data``)."""
    # Every process of the job (a lost node's included, under per-step recovery) has its slot.
    micro_batch = request.global_batch_size // (group.slots * request.accumulation_steps)
    local_batch = micro_batch * request.accumulation_steps
    metadata = read_metadata(request.data_dir)
    num_features = math.prod(int(size) for size in metadata["feature_shape"])
    features = labels = reader = None
    if streams(request.data_loading, metadata):
        from sublimate.components.data.streaming import ShardReader

        # Each rank reads its own share of the shards, one shuffle window at a time.
        reader = ShardReader(request.data_dir, "train", local_batch=local_batch, rank=group.slot,
                             world=group.slots, seed=request.seed,
                             buffer_size=request.shuffle_buffer)
        steps_per_epoch = reader.steps
    else:
        data = read_split(request.data_dir, "train")
        features = torch.from_numpy(data.x).reshape(len(data.y), -1).to(group.device)
        labels = torch.from_numpy(data.y).to(group.device)
        steps_per_epoch = len(labels) // request.global_batch_size  # main() made sure it is >= 1
    # Only rank 0 evaluates; it reads the test split once, here, not after every epoch (or
    # streams it, when the training split streams).
    test_set = (Evaluation.stream if reader is not None else Evaluation.read)(
        request.data_dir, group.device) \
        if request.eval_every_epoch and group.rank == 0 else None
    startup.mark("data")
    return TrainingData(metadata, features, labels, reader, num_features, test_set,
                        micro_batch, local_batch, steps_per_epoch, steps_per_epoch * request.epochs)


@dataclass(slots=True)
class Learner:
    """The model, its optimizer, the paradigm that trains them, and their checkpointer."""

    architecture: str
    config: dict[str, Any]
    model: nn.Module
    optimizer: torch.optim.Optimizer
    paradigm: Paradigm
    checkpointer: training.Checkpointer


def build_learner(request: WorkerRequest, group: ProcessGroup, data: TrainingData) -> Learner:
    """The seeded model, its optimizer and the paradigm, as at step 0 (not restored yet)."""
    torch.manual_seed(request.seed)
    architecture, config = model_spec(request.model, data.num_features,
                                      data.metadata["num_classes"], request.hidden)
    model = build_model(architecture, config).to(group.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=request.learning_rate,
                                momentum=request.momentum, weight_decay=request.weight_decay)
    paradigm = training.make_paradigm(request.algorithm, model, optimizer, request.values())
    return Learner(architecture, config, model, optimizer, paradigm,
                   training.checkpointer(request.checkpoint_format, request.run_dir, group.rank,
                                         group.world, request.algorithm))


