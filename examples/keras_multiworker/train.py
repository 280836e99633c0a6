"""Keras on several workers with ``tf.distribute.MultiWorkerMirroredStrategy``, run by sublimate.

A plain Keras classifier for any dataset in sublimate's layout (``metadata.json`` plus ``.npz``
shards of float32 ``x`` and int64 ``y``; ``docs/datasets.md``), trained synchronously on every
worker by a short custom loop (Keras 3's ``model.fit`` does not run under this strategy with
more than one worker: keras-team/keras#20585). It knows sublimate only through the environment
every training process gets (``docs/own-code.md``):

- ``TF_CONFIG``: the cluster of workers and this worker's index (``framework=tensorflow``);
  worker 0 is the chief. Without it the strategy runs one local worker.
- ``SUBLIMATE_DATA_DIR``: the staged dataset's folder.
- ``SUBLIMATE_RUN_DIR``: where the chief writes ``model.keras``, ``metrics.json`` (the test
  accuracy and loss, which the pipeline's evaluate step reads) and ``checkpoints/`` (one per
  epoch; a restarted job resumes from the latest).
- ``SUBLIMATE_SETTINGS``: the train step's settings as JSON; this script uses ``epochs``,
  ``global_batch_size``, ``learning_rate``, ``momentum`` and ``seed`` (flags below override).

Run it with sublimate (README.md next to this file), or by hand on one worker::

    SUBLIMATE_DATA_DIR=path/to/dataset SUBLIMATE_RUN_DIR=/tmp/run python train.py --epochs 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def read_split(folder: Path, metadata: dict[str, Any], split: str) -> tuple[np.ndarray, np.ndarray]:
    """One split's examples, every shard concatenated, ``x`` shaped ``(N, *feature_shape)``."""
    xs, ys = [], []
    for shard in metadata["splits"][split]["shards"]:
        with np.load(folder / shard["file"]) as arrays:
            xs.append(arrays["x"].astype(np.float32, copy=False))
            ys.append(arrays["y"].astype(np.int64, copy=False))
    x = np.concatenate(xs).reshape(-1, *metadata["feature_shape"])
    return x, np.concatenate(ys)


def setting(settings: dict[str, Any], name: str, default: Any) -> Any:
    """A train-step setting by attribute name (``learning_rate``), or as spelled on the
    command line (``learning-rate``), else ``default``."""
    for key in (name, name.replace("_", "-")):
        if settings.get(key) not in (None, ""):
            return settings[key]
    return default


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    settings = json.loads(os.environ.get("SUBLIMATE_SETTINGS") or "{}")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=setting(settings, "epochs", 5))
    parser.add_argument("--global-batch-size", type=int,
                        default=setting(settings, "global_batch_size", 64))
    parser.add_argument("--learning-rate", type=float,
                        default=setting(settings, "learning_rate", 0.05))
    parser.add_argument("--momentum", type=float, default=setting(settings, "momentum", 0.9))
    parser.add_argument("--seed", type=int, default=setting(settings, "seed", 0))
    parser.add_argument("--hidden", type=int, default=setting(settings, "hidden", 64),
                        help="width of the hidden layer")
    parser.add_argument("--threads", type=int, default=1,
                        help="TensorFlow's intra- and inter-op threads per worker (0: TF's "
                             "default, all cores; 1 suits several workers on one small machine)")
    parser.add_argument("--data-dir", type=Path, default=os.environ.get("SUBLIMATE_DATA_DIR"))
    parser.add_argument("--run-dir", type=Path, default=os.environ.get("SUBLIMATE_RUN_DIR"))
    args = parser.parse_args(argv)
    if args.data_dir is None or args.run_dir is None:
        parser.error("set SUBLIMATE_DATA_DIR and SUBLIMATE_RUN_DIR (sublimate does), "
                     "or pass --data-dir and --run-dir")
    return args


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's C++ INFO lines: off
    import tensorflow as tf  # after the arguments: --help answers at once

    # Threads and the strategy come before any other TensorFlow call.
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    index = resolver.task_id if resolver and resolver.task_id is not None else 0
    workers = strategy.num_replicas_in_sync
    chief = index == 0
    print(f"[worker {index}] TensorFlow {tf.__version__}, {workers} replicas, "
          f"ready in {time.perf_counter() - started:.1f}s", flush=True)

    metadata = json.loads((args.data_dir / "metadata.json").read_text())
    x_train, y_train = read_split(args.data_dir, metadata, "train")
    x_test, y_test = read_split(args.data_dir, metadata, "test")
    num_classes = int(metadata["num_classes"])

    # Every worker reads the whole split and keeps its share of each global batch (DATA
    # sharding), so N workers with batch b/N see what one process with batch b would.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    batch = args.global_batch_size
    steps = max(1, len(y_train) // batch)
    train = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(len(y_train), seed=args.seed).repeat().batch(batch, drop_remainder=True)
        .with_options(options))
    test = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(batch).with_options(options))

    keras = tf.keras
    keras.utils.set_random_seed(args.seed)
    with strategy.scope():  # variables created here are mirrored on every worker
        model = keras.Sequential([
            keras.Input(shape=tuple(metadata["feature_shape"])),
            keras.layers.Flatten(),
            keras.layers.Dense(args.hidden, activation="relu"),
            keras.layers.Dense(num_classes),
        ])
        optimizer = keras.optimizers.SGD(args.learning_rate, momentum=args.momentum)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    # A custom loop rather than model.fit: Keras 3's fit fails under MultiWorkerMirroredStrategy
    # with more than one worker ("Attempt to convert a value (PerReplica..."; keras-team/keras
    # #20585). Each replica returns sums; strategy.reduce adds them over all workers.
    def totals(x: tf.Tensor, y: tf.Tensor, logits: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        correct = tf.cast(tf.equal(tf.argmax(logits, axis=1), y), tf.float32)
        return tf.reduce_sum(loss_fn(y, logits)), tf.reduce_sum(correct)

    def replica_train_step(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            # Averaged over the global batch: the optimizer sums the replicas' gradients.
            loss = tf.nn.compute_average_loss(loss_fn(y, logits), global_batch_size=batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return totals(x, y, logits)

    def replica_test_step(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return totals(x, y, model(x, training=False))

    def summed(values: Any) -> list[float]:
        return [float(strategy.reduce("SUM", v, axis=None)) for v in values]

    @tf.function
    def train_step(iterator: Any) -> Any:
        return strategy.run(replica_train_step, args=next(iterator))

    @tf.function
    def test_step(x: Any, y: Any) -> Any:
        return strategy.run(replica_test_step, args=(x, y))

    def evaluate() -> tuple[float, float]:
        loss_sum = correct = 0.0
        for x, y in test:
            step_loss, step_correct = summed(test_step(x, y))
            loss_sum, correct = loss_sum + step_loss, correct + step_correct
        return loss_sum / len(y_test), correct / len(y_test)

    # Checkpoints after every epoch, for torchrun's restarts (-p max-restarts=N): every worker
    # saves (saving is collective), the chief into the run folder, the others into scratch
    # folders they delete; on a restart every worker resumes from the chief's latest.
    with strategy.scope():
        done = tf.Variable(0, dtype=tf.int64, trainable=False)  # epochs finished
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epochs_done=done)
    folder = args.run_dir / "checkpoints"
    latest = tf.train.latest_checkpoint(folder)
    if latest:
        checkpoint.restore(latest)
        print(f"[worker {index}] resumed after epoch {int(done.numpy())} from {latest}",
              flush=True)
    scratch = None if chief else Path(tempfile.mkdtemp(prefix=f"worker{index}-"))
    manager = tf.train.CheckpointManager(checkpoint, folder if chief else scratch, max_to_keep=2)

    fitted = time.perf_counter()
    iterator = iter(train)
    for epoch in range(int(done.numpy()) + 1, args.epochs + 1):
        began = time.perf_counter()
        loss_sum = correct = 0.0
        for _ in range(steps):
            step_loss, step_correct = summed(train_step(iterator))
            loss_sum, correct = loss_sum + step_loss, correct + step_correct
        test_loss, test_accuracy = evaluate()  # every worker takes part: it is collective
        done.assign(epoch)
        manager.save()
        if chief:
            print(f"epoch {epoch}/{args.epochs}: loss {loss_sum / (steps * batch):.4f} "
                  f"accuracy {correct / (steps * batch):.4f} test_loss {test_loss:.4f} "
                  f"test_accuracy {test_accuracy:.4f} ({time.perf_counter() - began:.2f}s)",
                  flush=True)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
    fit_seconds = time.perf_counter() - fitted
    loss, accuracy = evaluate()

    # Every worker saves (saving may involve every replica); only the chief's copy is kept.
    args.run_dir.mkdir(parents=True, exist_ok=True)
    target = args.run_dir if chief else Path(tempfile.mkdtemp(prefix=f"worker{index}-"))
    model.save(target / "model.keras")
    if chief:
        metrics = {"accuracy": round(float(accuracy), 6), "loss": round(float(loss), 6),
                   "examples": len(y_test), "epochs": args.epochs, "workers": workers,
                   "framework": f"tensorflow {tf.__version__}",
                   "train_seconds": round(fit_seconds, 3)}
        (args.run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        print(f"test accuracy {accuracy:.4f}, loss {loss:.4f}; wrote "
              f"{args.run_dir / 'model.keras'} and metrics.json "
              f"({time.perf_counter() - started:.1f}s in all)", flush=True)
    else:
        shutil.rmtree(target, ignore_errors=True)
    # Mirrored training leaves the same weights on every worker: the same fingerprint.
    fingerprint = sum(float(np.abs(w).sum()) for w in model.get_weights())
    print(f"[worker {index}] done: weights fingerprint {fingerprint:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
