"""A new user's first hour with their own code and data, as docs/ tells it: each
failure says what to fix in one line (issue 29).

Every run here starts where a user starts: in a folder of their own (not this checkout), with a
fresh SUBLIMATE_HOME, relative paths, their own script, model and data.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from sublimate.components import Split, write_dataset
from tests.conftest import REPO, results_folder, run_cli, run_outputs

OUTLINE = re.compile(r"```python\n(job = training\.start\(\).*?)```", re.S)
EXAMPLE = REPO / "examples" / "own_loop" / "train.py"


def _statements(text: str) -> list[str]:
    """The code of each line, comments and indentation off (``...`` is the outline's gap)."""
    return [code for line in text.splitlines()
            if (code := line.split("  #")[0].strip()) and not code.startswith(("#", "..."))]


def test_the_documented_outline_is_the_example_that_runs() -> None:
    """Every statement of docs/own-code.md's outline of a loop on the library is in
    examples/own_loop/train.py, in the same order: what the next test runs is the outline."""
    outline = _statements(OUTLINE.search((REPO / "docs" / "own-code.md").read_text()).group(1))
    example = _statements(EXAMPLE.read_text())
    assert "job.write_metrics({\"accuracy\": accuracy})" in outline  # it says what evaluate reads
    positions = [example.index(statement) if statement in example else -1
                 for statement in outline]
    missing = [statement for statement, at in zip(outline, positions, strict=True) if at < 0]
    assert missing == [], f"the example lacks these lines of the outline: {missing}"
    assert positions == sorted(positions), "the example has the outline's lines in its order"


def test_the_outline_filled_in_trains_evaluates_and_reports(tmp_path: Path) -> None:
    """The outline, run as written: its metrics.json is what the evaluate step reports (not a
    KeyError on a model the built-in evaluation cannot rebuild), the report names what ran, and
    the paths the output gives are the ones a user can open."""
    home = tmp_path / "home"
    result = run_cli("run", "-p", f"entrypoint={EXAMPLE}", "-p", "epochs=2", home=home,
                     cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    results = results_folder(home)
    written = json.loads((results / "metrics.json").read_text())
    assert float(run_outputs(result.stdout)["metric"]) == pytest.approx(written["accuracy"])
    assert written["accuracy"] > 0.5
    # Paths in the logs are this machine's, not the container's /mnt/sublimate.
    assert "train: finished in" in output
    assert re.search(rf"model at {re.escape(str(home))}/volumes/sublimate-data/runs/\S+/model\.pt",
                     output), output[-3000:]
    assert "model at /mnt/" not in output
    report = run_cli("report", "--no-plots", str(results), home=home)
    assert report.returncode == 0, report.stderr
    # A loop on the library writes no train-summary.json: the report takes what it has.
    assert re.search(r": sync on 2 workers, 2 epochs, \d+ steps", report.stdout), report.stdout
    assert f"test accuracy {written['accuracy']:.4f}" in report.stdout
    assert "?" not in report.stdout.splitlines()[0]


def test_an_evaluation_with_nothing_it_knows_says_what_it_needs(tmp_path: Path) -> None:
    """A model.pt without its architecture and no metrics.json: one line naming both ways out,
    not a KeyError."""
    import torch

    torch.save({"state_dict": {}}, tmp_path / "model.pt")
    result = subprocess.run(
        [sys.executable, "-m", "sublimate.components.steps.evaluate", "--model-dir",
         str(tmp_path), "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"evaluate: error: {tmp_path / 'model.pt'} is not a model the "
                           "built-in evaluation can rebuild"), line
    assert "wrote no metrics.json" in line and "job.write_metrics" in line
    assert "-p eval-entrypoint=" in line


FAILING = """\
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("expected 64 features, got 10")
    dist.barrier()
"""


def test_a_failing_script_is_named_in_one_line_with_its_rank_and_log(tmp_path: Path) -> None:
    """Rank 1 raises: the output from the failure to its end is at most 15 lines, without a
    traceback, and the last line names the rank, the exception and the rank's log, which holds
    the traceback of the user's code."""
    (tmp_path / "fails.py").write_text(textwrap.dedent(FAILING))
    home = tmp_path / "home"
    # What the terminal shows: progress (stderr) and the final table (stdout), in order.
    result = subprocess.run(
        [sys.executable, "-m", "sublimate.pipelines", "run", "-p", "entrypoint=fails.py"],
        cwd=tmp_path, env={**os.environ, "SUBLIMATE_HOME": str(home)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=300, check=False)
    assert result.returncode == 1, result.stdout[-4000:]
    lines = result.stdout.splitlines()
    first = next((index for index, line in enumerate(lines) if "ValueError" in line), None)
    assert first is not None, result.stdout[-4000:]
    tail = lines[first:]
    assert len(tail) <= 15, "\n".join(tail)
    assert not any("Traceback" in line for line in lines), result.stdout[-4000:]
    # The cause is said once by the runner, on the last line (the step's own output, "train(0)
    # | ...", says it too, as its log does); the lines of the nodes and the workflow above the
    # failed one, and the table's footer, do not repeat it.
    cause = "expected 64 features, got 10"
    said = [line for line in lines if cause in line and not line.startswith("train(0) | ")
            and not line.startswith(" ")]  # the table's rows, cut at 60 characters
    assert said == [lines[-1]], "\n".join(said)
    assert "[" in tail[1] and tail[1].endswith("train(0): Failed (Error (exit code 1))"), tail
    final = lines[-1]
    found = re.search(r"rank 1 \(node1\) failed: ValueError: expected 64 features, got 10; "
                      r"its log: (\S+)", final)
    assert found, final
    log = Path(found.group(1))
    assert log.is_file() and str(log).startswith(str(home)), log  # this machine's path
    traceback = log.read_text()
    assert 'fails.py", line 5' in traceback and "ValueError: expected 64" in traceback
    # The run report names it too.
    report = run_cli("report", "--no-plots", str(results_folder(home)), home=home)
    assert report.returncode == 0, report.stderr
    assert "failed: rank 1 (node1): ValueError: expected 64 features, got 10" in report.stdout


def _tiny_model(folder: Path) -> None:
    (folder / "mymodel.py").write_text(textwrap.dedent("""\
        from torch import nn

        def tiny(num_features, num_classes):
            return nn.Sequential(nn.Linear(num_features, 16), nn.ReLU(),
                                 nn.Linear(16, num_classes))
    """))


def _rings(examples: int, seed: int, dtype: type = np.float32) -> Split:
    rng = np.random.default_rng(seed)
    ring = rng.integers(0, 2, examples)
    angle = rng.uniform(0, 2 * np.pi, examples)
    x = np.stack([(1 + 2 * ring) * np.cos(angle), (1 + 2 * ring) * np.sin(angle)], 1)
    return Split(x.astype(dtype), ring.astype(np.int64))


def test_every_relative_path_is_from_where_the_user_ran_the_command(tmp_path: Path) -> None:
    """`-p dataset=./mine` and `-p model=mymodel:tiny`, from the folder that holds them (as
    `py:` datasets and scripts always were): the run trains on that data with that model."""
    user = tmp_path / "project"
    user.mkdir()
    write_dataset(user / "mine", {"train": _rings(320, 0), "test": _rings(80, 1)}, name="mine",
                  num_classes=2)
    _tiny_model(user)
    home = tmp_path / "home"
    result = run_cli("run", "-p", "dataset=./mine", "-p", "model=mymodel:tiny", "-p", "epochs=1",
                     "-p", "global-batch-size=32", home=home, cwd=user)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert re.search(r"stage-data: mine ready at \S+ \(test=80, train=320\)", output), output
    from sublimate.components.model import checkpoint

    assert checkpoint.load(results_folder(home) / "model.pt")["architecture"] == "mymodel:tiny"
    # A path that is not there says where it looked.
    missing = run_cli("run", "-p", "dataset=./theirs", home=home, cwd=user)
    assert missing.returncode == 1
    assert f"dataset './theirs': no such directory ({user / 'theirs'})" in missing.stderr


def _hand_written_dataset(folder: Path, dtype: type) -> Path:
    """The layout written by hand, as docs/datasets.md describes it, with ``dtype`` examples."""
    import hashlib

    folder.mkdir(parents=True)
    splits = {}
    for name, split in {"train": _rings(64, 0, dtype), "test": _rings(16, 1, dtype)}.items():
        shard = folder / f"{name}-00000-of-00001.npz"
        np.savez(shard, x=split.x, y=split.y)
        splits[name] = {"examples": len(split.y), "shards": [{
            "file": shard.name, "bytes": shard.stat().st_size, "examples": len(split.y),
            "sha256": hashlib.sha256(shard.read_bytes()).hexdigest()}]}
    (folder / "metadata.json").write_text(json.dumps({
        "format_version": 1, "name": folder.name, "feature_shape": [2], "num_classes": 2,
        "splits": splits}))
    return folder


def test_a_float64_dataset_is_refused_where_the_dataset_is_checked(tmp_path: Path) -> None:
    """Not 330 lines into training: `data push` and staging name the file and the fix."""
    from sublimate.components.data.datasets import DatasetError
    from sublimate.components.steps.stage_data import stage_dataset

    source = _hand_written_dataset(tmp_path / "mine64", np.float64)
    pushed = run_cli("data", "push", "./mine64", f"file://{tmp_path / 'published'}",
                     home=tmp_path / "home", cwd=tmp_path)
    assert pushed.returncode == 2
    assert "train-00000-of-00001.npz: x is float64, the layout holds float32" in pushed.stderr
    assert "write_dataset" in pushed.stderr and not (tmp_path / "published").exists()
    with pytest.raises(DatasetError, match=re.escape(
            f"{source}/train-00000-of-00001.npz: x is float64, the layout holds float32")):
        stage_dataset(str(source), tmp_path / "data")
    assert not any((tmp_path / "data").iterdir()), "nothing is left staged"
    # The same data in float32 passes both.
    good = _hand_written_dataset(tmp_path / "mine32", np.float32)
    assert stage_dataset(str(good), tmp_path / "data").folder.is_dir()


def test_a_checksum_error_names_the_users_file_not_the_hidden_copy(tmp_path: Path) -> None:
    from sublimate.components.data.datasets import DatasetError
    from sublimate.components.steps.stage_data import stage_dataset

    source = _hand_written_dataset(tmp_path / "mine", np.float32)
    shard = source / "train-00000-of-00001.npz"
    shard.write_bytes(shard.read_bytes()[:-8] + b"corrupt!")
    with pytest.raises(DatasetError) as refused:
        stage_dataset(str(source), tmp_path / "data")
    assert str(refused.value) == f"{shard}: content does not match its checksum in metadata.json"


def test_a_help_read_in_part_ends_quietly() -> None:
    """`sublimate run --help | head`: the reader goes away; no BrokenPipeError traceback."""
    process = subprocess.Popen([sys.executable, "-m", "sublimate.pipelines", "run", "--help"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader has gone before the help is written (`| head -0`)
    errors = process.stderr.read().decode()
    assert process.wait(timeout=60) in (0, 141), errors
    assert "Traceback" not in errors and "BrokenPipe" not in errors
