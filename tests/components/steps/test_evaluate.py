"""The evaluate step's built-in evaluation: the model it scores is the run's model.pt, read once."""

from __future__ import annotations

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
