"""A full disk at each stage of a run, on a real small tmpfs (issue 40): staging the dataset,
writing a checkpoint, publishing the model, and the runner's own status and logs.

Each run ends Failed in one line that names the disk (its folder on this machine) and what was
being written; its ``status.json`` parses and says so; no temporary file is left; and the next
run starts cleanly. Before, the same disks gave torch's ``unexpected pos 35520 vs 35472``, a
thread's traceback with ``internal error: OSError(28)``, a run stuck Running, and
``status.json.tmp`` files.
"""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from sublimate.components.model.registry import Registry
from tests.conftest import finish_run, run_cli, start_run, wait_for
from tests.small_disk import fill, small_disk

# The default pipeline, as small as it goes: one node, one epoch of digits (22 steps).
SMALL_RUN = ("-p", "nodes=1", "-p", "epochs=1")


def _volume(home: Path) -> Path:
    return home / "volumes" / "sublimate-data"


def _the_run(home: Path) -> Path:
    (folder,) = [path for path in (home / "runs").iterdir() if path.is_dir()]
    return folder


def assert_failed_in_one_line(home: Path, code: int, output: str, line: str) -> dict:
    """The run ended Failed (exit status 1) saying ``line`` (a regex: the disk, what was
    written): on the console, as its last word and in its ``status.json``, which parses; no
    traceback of the runner's, no temporary file in its folder. Its status, for more checks."""
    assert code == 1, output[-3000:]
    (said,) = [text for text in output.splitlines() if text.startswith("error: ")]
    assert re.search(line, said), said
    # the runner's own: the steps' lines come prefixed with their node ("train(0) | ...")
    assert not [text for text in output.splitlines() if text.startswith(
        ("Traceback", "Exception in thread", "internal error"))], output[-3000:]
    folder = _the_run(home)
    status = json.loads((folder / "status.json").read_text())
    assert status["phase"] == "Failed" and re.search(line, status["message"]), status["message"]
    assert not [path for path in folder.rglob("*") if path.name.endswith(".tmp")]
    return status


def test_a_full_disk_while_staging_fails_the_run_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with small_disk(_volume(home), "256k") as volume:  # digits takes 480 kB
        done = run_cli("run", *SMALL_RUN, home=home)
        assert_failed_in_one_line(
            home, done.returncode, done.stdout + done.stderr,
            re.escape(f"dataset 'digits': disk full: no space left on {volume} (tmpfs) while "
                      f"building it into {volume}/datasets/digits"))
        assert list(volume.rglob("*")) == [volume / "datasets"]  # its staging folder removed


def test_a_full_disk_while_checkpointing_names_the_step_not_torchs_zip_writer(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    # The logs and metrics fit (about 60 kB); the checkpoint (about 220 kB) does not.
    with small_disk(_volume(home) / "runs", "160k") as runs:
        done = run_cli("run", *SMALL_RUN, home=home)
        output = done.stdout + done.stderr
        status = assert_failed_in_one_line(
            home, done.returncode, output,
            re.escape(f"disk full: no space left on {runs} (tmpfs) while saving checkpoint "
                      f"step 22 to {runs}/{_the_run(home).name}/checkpoints/step-000000022/"))
        assert "unexpected pos" not in output
        assert "train" in {node["display_name"] for node in status["nodes"]
                           if node["phase"] == "Failed"}
        # nothing half-written, nothing committed: a resume would start over
        assert not [path for path in runs.rglob(".*") if path.is_file()]
        assert not list(runs.rglob("latest.json"))


REGISTER = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: register-}
spec:
  entrypoint: register
  arguments:
    parameters: [{name: model}]
  volumes:
  - {name: shared, persistentVolumeClaim: {claimName: sublimate-data}}
  templates:
  - name: register
    container:
      image: sublimate
      command: [python, -m, sublimate.components.steps.register_model]
      args: [--model-dir, "/mnt/sublimate/runs/{{workflow.parameters.model}}",
             --data-dir, /mnt/sublimate/datasets/digits, --dataset, digits,
             --promote, "true", --reason, better, --registry, /mnt/sublimate/registry]
      volumeMounts: [{name: shared, mountPath: /mnt/sublimate}]
"""


def _trained(home: Path, name: str, size: int) -> None:
    """A run folder with a model of ``size`` bytes and its evaluation, as train and evaluate
    leave them (the register-model step copies files; it does not load the model)."""
    folder = _volume(home) / "runs" / name
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(bytes(size))
    (folder / "metrics.json").write_text('{"accuracy": 0.9}')


def test_a_full_registry_disk_publishes_nothing_and_keeps_the_champion(tmp_path: Path) -> None:
    home, manifest = tmp_path / "home", tmp_path / "register.yaml"
    manifest.write_text(textwrap.dedent(REGISTER))
    _trained(home, "small", 8_000)
    _trained(home, "large", 300_000)
    with small_disk(_volume(home) / "registry", "128k") as disk:
        first = run_cli("run", str(manifest), "-p", "model=small", home=home)
        assert first.returncode == 0, first.stderr[-3000:]
        registry = Registry(str(disk))
        before = (registry.versions(), registry.champion())
        stored = sorted(path for path in disk.rglob("*") if path.is_file())
        subprocess.run(["rm", "-rf", str(home / "runs")], check=True)
        done = run_cli("run", str(manifest), "-p", "model=large", home=home)
        assert_failed_in_one_line(
            home, done.returncode, done.stdout + done.stderr,
            re.escape(f"disk full: no space left on {disk} (tmpfs) while uploading model.pt to "
                      "/mnt/sublimate/registry/versions/") + r".*; nothing was published$")
        assert (registry.versions(), registry.champion()) == before
        # no partial version, no temporary file: the files of the first publish, no other
        assert sorted(path for path in disk.rglob("*") if path.is_file()) == stored


PAUSE = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {{name: paused}}
spec:
  entrypoint: main
  arguments:
    parameters: [{{name: pause, value: "1"}}]
  templates:
  - name: main
    steps:
    - - {{name: wait, template: wait}}
    - - {{name: after, template: after}}
  - name: wait
    container:
      image: alpine
      command: [sh, -c, "sleep {{{{workflow.parameters.pause}}}}{then}"]
  - name: after
    container: {{image: alpine, command: ["true"]}}
"""


def _phase(status: Path, display_name: str) -> str | None:
    try:
        nodes = json.loads(status.read_text())["nodes"]
    except (OSError, ValueError):
        return None  # not written yet
    return next((node["phase"] for node in nodes if node["display_name"] == display_name
                 and node["type"] == "Pod"), None)


@pytest.mark.parametrize(("then", "written"), [
    ("", r"the run's status\.json in {folder}"),
    # The step's output fills its log, unless the status writer's next write (it rests
    # between writes) meets the full disk first: either is the line, never a hang or a crash.
    ("; seq 1 20000", r"(the log {folder}/nodes/wait-[0-9]+/main\.log"
                      r"|the run's status\.json in {folder})"),
], ids=["status", "log"])
def test_a_full_run_folder_stops_the_run_and_the_next_one_starts_cleanly(
        tmp_path: Path, then: str, written: str) -> None:
    home, manifest = tmp_path / "home", tmp_path / "paused.yaml"
    manifest.write_text(textwrap.dedent(PAUSE.format(then=then)))
    with small_disk(home / "runs", "256k") as runs:
        process = start_run(home, str(manifest))
        status = runs / "paused" / "status.json"
        # the disk fills while the step runs: its next write (status or log) does not fit
        wait_for(lambda: _phase(status, "wait") == "Running", 30, "the step to run")
        filler = fill(runs)
        output = finish_run(process, timeout=60)
        folder = runs / "paused"
        record = assert_failed_in_one_line(
            home, process.returncode, output,
            re.escape(f"disk full: no space left on {runs} (tmpfs) while writing ")
            + written.format(folder=re.escape(str(folder))))
        # stopped there (the status is written off the steps' threads: the next step may
        # have begun, and was stopped), nothing left open
        assert not [node for node in record["nodes"] if node["phase"] in ("Pending", "Running")]
        filler.unlink()
        manifest.write_text(textwrap.dedent(PAUSE.format(then="")))  # a log that fits
        again = run_cli("run", str(manifest), "-p", "pause=0", home=home)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "was interrupted" not in again.stderr  # the first run was concluded, not left
