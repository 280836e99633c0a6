"""The ``register-model`` step (components/steps/register_model.py), in process: a retried
attempt reuses the version its workflow already published instead of publishing another."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sublimate.components.model.registry import Registry
from sublimate.components.steps import register_model

UID = "7c1e5a32-0b7f-4c3e-9d55-3f2b8a61c0de"


def _run_folder(folder: Path, model: bytes = b"weights") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.pt").write_bytes(model)
    (folder / "metrics.json").write_text(json.dumps({"accuracy": 0.93, "loss": 0.2}))
    (folder / "checkpoints").mkdir(exist_ok=True)  # bookkeeping: never published
    return folder


def _register(tmp_path: Path, run: Path, registry: Path, uid: str = UID,
              promote: str = "true") -> int:
    return register_model.main([
        "--model-dir", str(run), "--data-dir", str(tmp_path / "data"), "--dataset", "digits",
        "--promote", promote, "--reason", "no champion yet", "--workflow-name", "retrain-x",
        "--workflow-uid", uid, "--registry", str(registry),
        "--version-path", str(tmp_path / "out" / "version")])


def test_a_retried_step_reuses_the_version_its_workflow_published(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run, registry = _run_folder(tmp_path / "run"), tmp_path / "registry"
    assert _register(tmp_path, run, registry) == 0
    first = (tmp_path / "out" / "version").read_text()
    assert _register(tmp_path, run, registry) == 0  # the retry, e.g. after a lost pod
    assert (tmp_path / "out" / "version").read_text() == first
    assert "published by an earlier attempt of this workflow" in capsys.readouterr().out
    reg = Registry(registry)
    assert [v.id for v in reg.versions()] == [first]
    assert reg.champion().id == first and len(reg.history()) == 1  # type: ignore[union-attr]


def test_a_new_model_or_another_workflow_is_published_anew(tmp_path: Path) -> None:
    run, registry = _run_folder(tmp_path / "run"), tmp_path / "registry"
    assert _register(tmp_path, run, registry, promote="false") == 0
    _run_folder(run, model=b"retrained weights")  # `argo retry` ran training again
    assert _register(tmp_path, run, registry, promote="false") == 0
    other = "0f3d9a8e-1111-4a2b-8c3d-4e5f60718293"
    assert _register(tmp_path, run, registry, uid=other, promote="false") == 0
    assert _register(tmp_path, run, registry, uid="", promote="false") == 0  # run by hand
    assert len(Registry(registry).versions()) == 4
