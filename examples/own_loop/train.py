"""docs/own-code.md's outline of a loop on sublimate's library, filled in: an MLP on the staged
dataset.

Every line of the outline in docs/own-code.md ("The library") is here, in the same order,
around the few lines a loop of your own adds (the model, the data, the step); a test checks
that they agree and runs this file end to end::

    sublimate run -p entrypoint=examples/own_loop/train.py

It writes ``metrics.json`` through ``job.write_metrics``: its model is not one the built-in
evaluation can rebuild, so the evaluate step reports these metrics.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from sublimate.components import ShardReader, evaluation_batches, training


def test_accuracy(model: nn.Module, data_dir: str) -> float:
    with torch.inference_mode():
        hits = [(model(x.flatten(1)).argmax(1) == y).float()
                for x, y in evaluation_batches(data_dir, "test")]
    return torch.cat(hits).mean().item()


def main() -> None:
    job = training.start()  # process group, device, contract
    settings = job.settings  # the run's -p settings, typed
    local_batch = settings["global_batch_size"] // job.world
    reader = ShardReader(job.data_dir, "train", local_batch=local_batch, rank=job.rank,
                         world=job.world, seed=settings["seed"])
    features = int(torch.tensor(reader.feature_shape).prod())
    model = nn.Sequential(nn.Linear(features, 64), nn.ReLU(),
                          nn.Linear(64, reader.metadata["num_classes"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=settings["learning_rate"],
                                momentum=settings["momentum"])
    paradigm = job.paradigm(model, optimizer)
    step, extra = job.checkpoints.restore(model, optimizer, paradigm)  # noqa: RUF059 (outline)
    total_steps = reader.steps * settings["epochs"]
    reporter = job.reporter(paradigm.training_model(), total_steps, local_batch)
    while step < total_steps:
        epoch, first = divmod(step, reader.steps)  # the data position resumes with the step
        started = mark = time.perf_counter()
        for x, y in reader.batches(epoch, start_batch=first):
            loaded = time.perf_counter()
            loss = nn.functional.cross_entropy(paradigm.training_model()(x.flatten(1)), y)
            optimizer.zero_grad()
            loss.backward()
            computed = time.perf_counter()
            optimizer.step()
            step += 1
            paradigm.after_step(step)
            now = time.perf_counter()
            data_s, compute_s, comm_s = loaded - mark, computed - loaded, now - computed
            reporter.step(step, data_s, compute_s, comm_s)
            mark = now
        seconds, steps = time.perf_counter() - started, reader.steps - first
        reporter.end_epoch(epoch, step, loss, seconds, steps)
    paradigm.finish(step)
    job.checkpoints.save(step, model, optimizer, paradigm)
    accuracy = test_accuracy(paradigm.result_model(), job.data_dir)
    job.write_metrics({"accuracy": accuracy})
    job.finish(paradigm.result_model())


if __name__ == "__main__":
    main()
