"""Keras on several workers with ``tf.distribute.MultiWorkerMirroredStrategy``, run by sublimate.

A plain Keras classifier for any dataset in sublimate's layout (``metadata.json`` plus ``.npz``
shards of float32 ``x`` and int64 ``y``; ``docs/datasets.md``). It knows sublimate only through
the environment every training process gets (``docs/own-code.md``):

- ``TF_CONFIG``: the cluster of workers and this worker's index (``framework=tensorflow``);
  worker 0 is the chief. Without it the strategy runs one local worker.
- ``SUBLIMATE_DATA_DIR``: the staged dataset's folder.
- ``SUBLIMATE_RUN_DIR``: where the chief writes ``model.keras`` and ``metrics.json`` (the test
  accuracy and loss, which the pipeline's evaluate step reads).
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
    parser.add_argument("--hidden", type=int, default=64, help="width of the hidden layer")
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
    # sharding); repeat + steps_per_epoch gives every worker the same number of steps.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    batch = args.global_batch_size
    steps = max(1, len(y_train) // batch)
    train = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
             .shuffle(len(y_train), seed=args.seed).repeat().batch(batch, drop_remainder=True)
             .with_options(options))
    test = (tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(batch)
            .with_options(options))

    tf.keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input(shape=tuple(metadata["feature_shape"])),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(args.hidden, activation="relu"),
            tf.keras.layers.Dense(num_classes),
        ])
        model.compile(
            optimizer=tf.keras.optimizers.SGD(args.learning_rate, momentum=args.momentum),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"])

    class EpochLine(tf.keras.callbacks.Callback):
        """One line per epoch, from the chief (the metrics are the same on every worker)."""

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self.began = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            if chief:
                logs = logs or {}
                print(f"epoch {epoch + 1}/{args.epochs}: loss {logs.get('loss', 0):.4f} "
                      f"accuracy {logs.get('accuracy', 0):.4f} "
                      f"test_accuracy {logs.get('val_accuracy', 0):.4f} "
                      f"({time.perf_counter() - self.began:.2f}s)", flush=True)

    fitted = time.perf_counter()
    model.fit(train, epochs=args.epochs, steps_per_epoch=steps, validation_data=test,
              callbacks=[EpochLine()], shuffle=False, verbose=0)  # shuffled above
    fit_seconds = time.perf_counter() - fitted
    loss, accuracy = model.evaluate(test, verbose=0)

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
    return 0


if __name__ == "__main__":
    sys.exit(main())
