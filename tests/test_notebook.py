"""The interactive-mode notebook runs headless, top to bottom, as a new user would run it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO

NOTEBOOK = REPO / "notebooks" / "getting-started.ipynb"


def test_notebook_outputs_are_not_committed() -> None:
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None


def test_getting_started_notebook_executes(home: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # the kernel inherits SUBLIMATE_HOME (the `home` fixture), so nothing lands in ~/.sublimate
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO)}}).execute()
    text = "\n".join(output.get("text", "") for cell in notebook.cells
                     for output in cell.get("outputs", []))
    assert "Succeeded" in text and "test accuracy" in text
    runs = home / "volumes" / "sublimate-data" / "runs"
    assert (runs / "nb-sync" / "report" / "overview.png").is_file()
    assert (runs / "nb-bmuf" / "report" / "report.json").is_file()
    assert (home / "reports" / "sync-vs-bmuf.png").is_file()
    assert (home / "my-train.yaml").read_text().startswith("apiVersion: argoproj.io/v1alpha1")
