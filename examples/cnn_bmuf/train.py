"""A training loop of your own on sublimate's library: a small CNN on images, BMUF, resumable.

The loop is the user's (model, loss, optimizer, what to log); sublimate's library gives it the
paradigm (``job.paradigm``: BMUF here, across however many nodes the run has), checkpoints that
resume model, optimizer, paradigm and data position (``job.checkpoints``), streaming batches
that each rank reads from its own shards (``ShardReader``), and the monitoring of the built-in
loop: Prometheus, TensorBoard, the run report's curves and step-time split (``job.reporter``)::

    sublimate run -p entrypoint=examples.cnn_bmuf.train \
        -p dataset=py:sublimate.components.examples.example_datasets:digit_images \
        -p algorithm=bmuf -p sync-period=4 -p max-restarts=1 -p metric=accuracy

The dataset is the digits as 1x8x8 images (``feature_shape`` [1, 8, 8]): the convolution sees
images, with no reshaping in the loop. Rank 0 evaluates after every epoch and writes
``metrics.json`` at the end, which the evaluate step reports.
"""

from __future__ import annotations

import json
import time

import torch
from torch import nn

from sublimate.components import ShardReader, evaluation_batches, training


class SmallCNN(nn.Module):
    def __init__(self, channels: int, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(2))
        self.head = nn.Linear(32 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def evaluate(model: nn.Module, data_dir: str) -> dict[str, float]:
    model.eval()
    correct, total, loss = 0, 0, 0.0
    with torch.inference_mode():
        for x, y in evaluation_batches(data_dir, "test"):
            logits = model(x)
            loss += nn.functional.cross_entropy(logits, y, reduction="sum").item()
            correct += int((logits.argmax(1) == y).sum())
            total += len(y)
    model.train()
    return {"accuracy": correct / total, "loss": loss / total, "examples": total}


def main() -> None:
    job = training.start()
    settings = job.settings  # the run's -p settings, typed (contract: SUBLIMATE_SETTINGS)
    local_batch = settings["global_batch_size"] // job.world
    reader = ShardReader(job.data_dir, "train", local_batch=local_batch, rank=job.rank,
                         world=job.world, seed=settings["seed"])
    model = SmallCNN(reader.feature_shape[0], reader.metadata["num_classes"]).to(job.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=settings["learning_rate"],
                                momentum=settings["momentum"])
    paradigm = job.paradigm(model, optimizer)  # the run's algorithm (bmuf) and its settings
    step, _ = job.checkpoints.restore(model, optimizer, paradigm)
    if step:
        training.log(job.rank, f"resumed from checkpoint at step {step}")
    total_steps = reader.steps * settings["epochs"]
    reporter = job.reporter(paradigm.training_model(), total_steps, local_batch)
    net = paradigm.training_model()
    while step < total_steps:
        epoch, first = divmod(step, reader.steps)  # the data position resumes with the step
        epoch_loss, started = torch.zeros(()), time.perf_counter()
        mark = started
        for x, y in reader.batches(epoch, start_batch=first):
            loaded = time.perf_counter()
            loss = nn.functional.cross_entropy(net(x.to(job.device)), y.to(job.device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            computed = time.perf_counter()
            step += 1
            paradigm.after_step(step)  # BMUF's block sync every sync-period steps
            epoch_loss += loss.detach()
            now = time.perf_counter()
            reporter.step(step, loaded - mark, computed - loaded, now - computed)
            mark = now
            if settings["checkpoint_every"] and step % settings["checkpoint_every"] == 0:
                job.checkpoints.save(step, model, optimizer, paradigm)
        accuracy = evaluate(paradigm.result_model(), job.data_dir)["accuracy"] \
            if job.rank == 0 else None
        reporter.end_epoch(epoch, step, epoch_loss / (reader.steps - first),
                           time.perf_counter() - started, reader.steps - first,
                           total_epochs=settings["epochs"], accuracy=accuracy)
    paradigm.finish(step)  # BMUF's round for the steps after the last full block
    job.checkpoints.save(step, model, optimizer, paradigm)
    if job.rank == 0:
        metrics = evaluate(paradigm.result_model(), job.data_dir)
        (job.run_dir / "metrics.json").write_text(json.dumps(metrics))
        print(f"test accuracy {metrics['accuracy']:.4f}", flush=True)
    job.finish(paradigm.result_model())


if __name__ == "__main__":
    main()
