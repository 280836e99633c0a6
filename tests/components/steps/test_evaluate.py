"""The evaluate step's built-in evaluation: the model it scores is the run's model.pt, read once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from sublimate.components.base import run_files
from sublimate.components.data.datasets import build_builtin, read_split
from sublimate.components.model import checkpoint
from sublimate.components.model.models import build_model, model_spec
from sublimate.components.steps import evaluate


def test_the_built_in_evaluation_reads_the_model_once_and_scores_it_exactly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = build_builtin("digits", tmp_path / "digits")
    test = read_split(data, "test")
    architecture, config = model_spec("mlp", test.x.reshape(len(test.y), -1).shape[1], 10, 16)
    torch.manual_seed(3)
    model = build_model(architecture, config)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    checkpoint.save({"architecture": architecture, "config": config,
                     "state_dict": model.state_dict(), "steps": 7}, run_dir / run_files.MODEL)
    reads: list[Path] = []
    load = checkpoint.load

    def counted(path: Path) -> dict[str, Any] | None:
        reads.append(path)
        return load(path)

    monkeypatch.setattr(checkpoint, "load", counted)
    metrics, source = evaluate.measure(run_dir, data)
    # read once to know it can be rebuilt and to rebuild it: a model of a few GB takes seconds
    assert reads == [run_dir / run_files.MODEL]
    assert source == evaluate.BUILT_IN
    with torch.inference_mode():
        logits = model(torch.from_numpy(test.x).reshape(len(test.y), -1))
    labels = torch.from_numpy(test.y)
    assert metrics["accuracy"] == round((logits.argmax(1) == labels).float().mean().item(), 6)
    assert metrics["loss"] == round(torch.nn.functional.cross_entropy(logits, labels).item(), 6)
    assert metrics["examples"] == len(test.y) and metrics["steps"] == 7


# The step as its template runs it (python -m ...), with an atexit handler that says when the
# interpreter is torn down: the step passes its own arguments through.
STEP = ("import atexit, runpy, sys; atexit.register(print, 'interpreter teardown'); "
        "sys.argv[0] = 'evaluate'; "
        "runpy.run_module('sublimate.components.steps.evaluate', run_name='__main__')")


def _step(run_dir: Path, data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", STEP, "--model-dir", str(run_dir), "--data-dir", str(data),
         "--accuracy-path", str(run_dir / "out/accuracy"), *args],
        capture_output=True, text=True, timeout=120, check=False)


def test_the_built_in_evaluation_ends_without_a_teardown_and_leaves_all_it_wrote(
        tmp_path: Path) -> None:
    """Tearing down an interpreter that holds torch, matplotlib and TensorBoard took 0.55 of
    the step's 2.6 CPU-s: the step skips it once all it wrote is closed. A user's evaluation
    keeps the interpreter's end: its objects may hold writes only that end flushes."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = build_builtin("digits", tmp_path / "digits")
    architecture, config = model_spec("mlp", 64, 10, 16)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    checkpoint.save({"architecture": architecture, "config": config, "steps": 5,
                     "state_dict": build_model(architecture, config).state_dict()},
                    run_dir / run_files.MODEL)
    done = _step(run_dir, data)
    assert done.returncode == 0, done.stderr
    assert "interpreter teardown" not in done.stdout
    metrics = json.loads((run_dir / run_files.EVALUATION).read_text())
    assert (run_dir / "out/accuracy").read_text() == str(metrics["accuracy"])
    (events,) = (run_dir / run_files.TENSORBOARD / "evaluate").iterdir()
    scalars = EventAccumulator(str(events)).Reload().Scalars("test/accuracy")
    assert [(s.step, round(s.value, 6)) for s in scalars] == [(5, metrics["accuracy"])]

    own = tmp_path / "own_eval.py"
    own.write_text(
        "import json, os\n"
        "log = open(os.path.join(os.environ['SUBLIMATE_RUN_DIR'], 'own.log'), 'w')\n"
        "log.write('held in the buffer until the interpreter ends')\n"
        "with open(os.path.join(os.environ['SUBLIMATE_RUN_DIR'], 'metrics.json'), 'w') as f:\n"
        "    json.dump({'accuracy': 0.5}, f)\n")
    done = _step(run_dir, data, "--eval-entrypoint", str(own))
    assert done.returncode == 0, done.stderr
    assert "interpreter teardown" in done.stdout
    assert (run_dir / "own.log").read_text() == "held in the buffer until the interpreter ends"
