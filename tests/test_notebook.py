"""The interactive-mode notebook runs headless, top to bottom, as a new user would run it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from tests.conftest import REPO, require, require_module, run_cli

NOTEBOOK = REPO / "notebooks" / "getting-started.ipynb"
# One line of the live-metrics cell: "  1.3s rank-0: epoch 1  steps 16  samples/s 2961 ..."
LIVE_LINE = re.compile(r"^\s*\d+\.\d+s (?P<key>[\w-]+): (?P<values>.+)$")
NUMBER = r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
INSTALL = "pip install -e '.[test]'"
KERNEL = "python3"  # the notebook's kernel; ipykernel provides it in this environment


def _kernel_problem() -> str | None:
    """Why the notebook's kernel cannot start here (None if it can): nbclient would otherwise
    fail deep in its start-up with NoSuchKernel."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(KERNEL)
    except NoSuchKernel:
        return f"no Jupyter kernel named {KERNEL!r} ({INSTALL} installs ipykernel, which has it)"
    return None


def test_notebook_outputs_are_not_committed() -> None:
    nbformat = require_module("nbformat", INSTALL)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None


def test_the_notebook_builds_its_pipeline_from_the_public_api() -> None:
    nbformat = require_module("nbformat", INSTALL)
    source = "\n".join(cell.source for cell in nbformat.read(NOTEBOOK, as_version=4).cells
                       if cell.cell_type == "code")
    assert "from sublimate.components import evaluate, stage_data, train" in source
    for call in ("stage_data.template()", "train.template()", "evaluate.template()",
                 "train_pipeline()"):
        assert call in source, call
    # what the README does not show: internals a user would have to dig out of the code
    for internal in ("sublimate.pipelines.typed_parameters", "TEMPLATE_INPUTS", "PARAMETERS",
                     "tempfile"):
        assert internal not in source, internal


def _cell_text(cell: dict) -> str:
    return "".join(output.get("text", "") for output in cell.get("outputs", []))


def test_getting_started_notebook_executes(tmp_path: Path) -> None:
    nbformat = require_module("nbformat", INSTALL)
    nbclient = require_module("nbclient", INSTALL)
    require_module("ipykernel", INSTALL)
    problem = _kernel_problem()
    require(problem is None, problem or "")
    home = tmp_path / "home"
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # The kernel's own environment names the home, so nothing lands in ~/.sublimate.
    nbclient.NotebookClient(notebook, timeout=300, kernel_name=KERNEL,
                            resources={"metadata": {"path": str(REPO)}}).execute(
        env={**os.environ, "SUBLIMATE_HOME": str(home)})
    cells = {cell.get("id"): cell for cell in notebook.cells}
    text = "\n".join(_cell_text(cell) for cell in notebook.cells)
    assert f"SUBLIMATE_HOME = {home}" in text
    assert "Succeeded" in text and "test accuracy" in text

    # The live cell printed what it scraped from the workers while they trained.
    live = [match for line in _cell_text(cells["134b4b13"]).splitlines()
            if (match := LIVE_LINE.match(line))]
    assert live, _cell_text(cells["134b4b13"])
    for match in live:
        values = dict(re.findall(rf"([a-z/]+) ({NUMBER})", match["values"]))
        assert {"steps", "memory"} <= set(values), match.group(0)
        assert float(values["memory"]) > 0
    assert {match["key"] for match in live} <= {"rank-0", "rank-1"}

    # Both runs stayed in the home, where `sublimate report` finds them by workflow name.
    workflows = sorted(folder.name for folder in (home / "runs").iterdir())
    assert len(workflows) == 2 and all(name.startswith("my-train-") for name in workflows)
    algorithms = set()
    for workflow in workflows:
        result = run_cli("report", workflow, "--no-plots", home=home, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "test accuracy" in result.stdout
        algorithms.add(result.stdout.split(": ", 1)[1].split()[0])
    assert algorithms == {"sync", "bmuf"}

    runs = home / "volumes" / "sublimate-data" / "runs"
    bmuf_ids = [folder.name for folder in runs.iterdir() if folder.name.startswith("bmuf-")]
    assert len(bmuf_ids) == 1
    assert (runs / bmuf_ids[0] / "report" / "report.json").is_file()
    # the sync run's id is its workflow name; its report has the per-epoch accuracy curve
    (sync_id,) = {folder.name for folder in runs.iterdir()} & set(workflows)
    assert (runs / sync_id / "report" / "overview.png").is_file()
    epochs_log = json.loads((runs / sync_id / "report" / "report.json").read_text())["epochs_log"]
    assert epochs_log and all(0 <= point["test_accuracy"] <= 1 for point in epochs_log)
    assert (home / "reports" / f"{sync_id}-vs-{bmuf_ids[0]}.png").is_file()
    assert (home / "my-train.yaml").read_text().startswith("apiVersion: argoproj.io/v1alpha1")
