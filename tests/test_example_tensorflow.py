"""The Keras example (examples/keras_multiworker) trains on two nodes for real, TF_CONFIG and all.

Two torchrun agents meet at one rendezvous, as ``sublimate run`` simulates two nodes; each starts
one worker running this module as ``__main__`` (:func:`_wrapper_main`): the TensorFlow part of the
entry-point shim, which sets ``TF_CONFIG`` from :mod:`sublimate.components.processes.tf_config` and
then runs the example script as ``python train.py`` would.

TensorFlow is an optional extra (``pip install -e '.[tensorflow]'``): without it the test skips
with the reason outside CI, and fails in CI (``CI`` set), where it must be installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

from sublimate.components.base.ports import free_port
from tests.conftest import REPO, require

EXAMPLE = REPO / "examples" / "keras_multiworker" / "train.py"
EPOCHS = 3
TIMEOUT = 300  # seconds for the job: TensorFlow's import (~4 s) and 3 tiny epochs, 2 workers


def _require_tensorflow() -> None:
    """Skip outside CI when TensorFlow is missing; in CI (which installs it) fail instead."""
    require(importlib.util.find_spec("tensorflow") is not None,
            "tensorflow is not installed (pip install -e '.[tensorflow]' -c constraints.txt)")


def _wrapper_main(script: str, args: list[str]) -> None:
    """What the shim does for ``--framework tensorflow``, then ``python script ARGS``."""
    from sublimate.components.processes import tf_config

    reservation = tf_config.exchange(timeout=120)
    os.environ["TF_CONFIG"] = reservation.tf_config
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    reservation.release()  # the last thing before the user's code: TensorFlow binds the port
    runpy.run_path(script, run_name="__main__")


def _launch(data: Path, run_dir: Path, epochs: int) -> str:
    """Two torchrun agents (two simulated nodes) run the example; returns both nodes' output."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CONFIG", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update({
        "SUBLIMATE_DATA_DIR": str(data), "SUBLIMATE_RUN_DIR": str(run_dir),
        "SUBLIMATE_SETTINGS": json.dumps({"epochs": epochs, "global_batch_size": 64,
                                          "learning_rate": 0.05, "momentum": 0.9, "seed": 0}),
        "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
    })
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--nproc-per-node", "1", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "keras-example",
               "--monitor-interval", "0.1", "--tee", "3",
               "-m", "tests.test_example_tensorflow", str(EXAMPLE), "--hidden", "32"]
    nodes = [subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = []
    try:
        for node in nodes:
            outputs.append(node.communicate(timeout=TIMEOUT)[0])
    finally:
        for node in nodes:  # a failure or timeout above must not leave a node running
            if node.poll() is None:
                node.kill()
                node.wait()
    for node, output in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, output[-4000:]
    log = "\n".join(outputs)
    assert "2 replicas" in log, log[-4000:]  # both workers joined one cluster
    fingerprints = re.findall(r"\[worker (\d)\] done: weights fingerprint (\S+)", log)
    assert sorted(worker for worker, _ in fingerprints) == ["0", "1"], log[-4000:]
    assert fingerprints[0][1] == fingerprints[1][1], fingerprints  # the workers stayed in sync
    return log


def test_keras_example_on_two_nodes_and_resume(tmp_path: Path) -> None:
    _require_tensorflow()
    from sublimate.components.data.datasets import build_builtin

    data = build_builtin("digits", tmp_path / "digits")
    run_dir = tmp_path / "run"
    log = _launch(data, run_dir, EPOCHS)
    for epoch in range(1, EPOCHS + 1):
        assert f"epoch {epoch}/{EPOCHS}: loss" in log, log[-4000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["workers"] == 2 and metrics["epochs"] == EPOCHS
    assert metrics["accuracy"] > 0.8, metrics  # digits, 3 epochs: ~0.9
    assert (run_dir / "model.keras").stat().st_size > 0
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "checkpoints", "metrics.json", "model.keras"]

    # As after a restart: both workers resume from the chief's last checkpoint.
    log = _launch(data, run_dir, EPOCHS + 1)
    assert log.count(f"resumed after epoch {EPOCHS}") == 2, log[-4000:]
    assert "epoch 1/" not in log and f"epoch {EPOCHS + 1}/{EPOCHS + 1}: loss" in log, log[-4000:]
    assert json.loads((run_dir / "metrics.json").read_text())["epochs"] == EPOCHS + 1


if __name__ == "__main__":
    _wrapper_main(sys.argv[1], sys.argv[2:])
