"""The runner's own files on a full disk (``run_folder``, ``control``): the run is stopped in one
line naming the disk, its ``status.json`` stays whole and says how it ended, and no temporary
file is left. On a real small tmpfs, filled to its last block."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from sublimate.pipelines.argo_terms import NodePhase, NodeType
from sublimate.pipelines.runner import RunOptions, load_manifest
from sublimate.pipelines.runner.engine import run_workflow
from sublimate.pipelines.runner.records.control import ControlError, send
from sublimate.pipelines.runner.records.run_folder import (
    BLOCK_BYTES,
    STATUS_ROOM,
    RunRecord,
    write_durably,
)
from sublimate.pipelines.runner.records.run_types import RunEvent
from tests.conftest import wait_for
from tests.small_disk import fill, small_disk


def _status(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


def _leftovers(folder: Path) -> list[Path]:
    return [path for path in folder.rglob("*") if path.name.endswith(".tmp")]


def _record(run_dir: Path, events: list[RunEvent]) -> tuple[RunRecord, list[str]]:
    run_dir.mkdir()
    record = RunRecord("run", run_dir, {"p": "v"}, events.append)
    stops: list[str] = []
    record.on_disk_full = stops.append
    record.started()
    wait_for(lambda: (run_dir / "status.json").is_file(), 10, "the first status")
    return record, stops


def test_the_status_keeps_room_for_the_last_word(tmp_path: Path) -> None:
    record, _ = _record(tmp_path / "run", [])
    record.conclude(NodePhase.SUCCEEDED, "")
    text = (tmp_path / "run" / "status.json").read_text()
    assert len(text) % BLOCK_BYTES == 0 and text.endswith(" " * STATUS_ROOM + "\n")
    assert json.loads(text)["phase"] == "Succeeded"


@pytest.mark.parametrize("ending", [NodePhase.SUCCEEDED, NodePhase.FAILED])
def test_a_status_that_does_not_fit_stops_the_run_and_the_last_one_is_written_in_place(
        tmp_path: Path, ending: NodePhase) -> None:
    events: list[RunEvent] = []
    with small_disk(tmp_path / "disk", "64k") as disk:
        run_dir = disk / "run"
        record, stops = _record(run_dir, events)
        fill(disk)
        node = record.add_node("run", "run", "main", NodeType.POD, None)
        record.transition(node, NodePhase.RUNNING)  # its status cannot be written
        line = (f"disk full: no space left on {disk} (tmpfs) while writing the run's "
                f"status.json in {run_dir}")
        wait_for(lambda: stops, 10, "the engine to be told")
        record.transition(node, NodePhase.SUCCEEDED)  # nor this one: told once only
        time.sleep(0.2)
        assert stops == [line]
        assert _status(run_dir)["phase"] == "Running"  # the last good one, whole
        record.conclude(ending, "" if ending == NodePhase.SUCCEEDED else "a step failed")
        status = _status(run_dir)  # the final one, in place over the last
        # a run whose record could not be kept whole did not succeed; a failure keeps its why
        assert (status["phase"], status["message"]) == (
            ("Failed", line) if ending == NodePhase.SUCCEEDED else ("Failed", "a step failed"))
        assert [(n["name"], n["phase"]) for n in status["nodes"]] == [("run", "Succeeded")]
        assert (events[-1].phase, events[-1].message) == (status["phase"], status["message"])
        assert _leftovers(disk) == []


def test_a_durable_write_that_does_not_fit_leaves_nothing(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "16k") as disk:
        target = disk / "file.json"
        target.write_text("{}")
        with pytest.raises(OSError, match=rf"^disk full: no space left on {disk} \(tmpfs\) "
                                          "while writing it$"):
            write_durably(target, "x" * 64 * 1024, what="writing it")
        assert target.read_text() == "{}" and sorted(os.listdir(disk)) == ["file.json"]


def test_a_request_that_does_not_fit_is_refused_in_one_line(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "16k") as disk:
        (disk / "run" / "control").mkdir(parents=True)
        fill(disk)
        with pytest.raises(ControlError, match=rf"^disk full: no space left on {disk} \(tmpfs\) "
                                               "while writing .*request.json$"):
            send(disk / "run", {"action": "resume"}, timeout=1)
        assert _leftovers(disk) == [] and os.listdir(disk / "run" / "control") == []


def test_a_run_that_cannot_write_its_manifest_never_starts_and_leaves_no_folder(
        tmp_path: Path) -> None:
    workflow = load_manifest(textwrap.dedent("""
        apiVersion: argoproj.io/v1alpha1
        kind: Workflow
        metadata: {name: never}
        spec:
          entrypoint: main
          templates:
          - {name: main, container: {image: alpine, command: [touch, /tmp/ran]}}
        """))
    events: list[RunEvent] = []
    home = tmp_path / "home"
    with small_disk(home / "runs", "16k") as runs:
        fill(runs)
        result = run_workflow(workflow, {}, RunOptions(home=home, reporter=events.append))
        assert result.phase == "Failed"
        assert result.message == (f"disk full: no space left on {runs} (tmpfs) while writing "
                                  f"the run's manifest {runs / 'never'}/workflow.yaml")
        assert not result.nodes  # nothing ran
        assert sorted(os.listdir(runs)) == ["filler"]  # a folder no status fitted in is gone
    assert (events[-1].kind, events[-1].phase) == ("workflow", "Failed")
