"""The node cap of a run (``RunOptions.max_nodes``, ``sublimate run --max-nodes``): a loop whose
items alone would pass it is refused in one line before any item exists, whether its size is
known from the manifest or only as it runs; a run that grows to it some other way (a template
that calls itself) stops there, its ``status.json`` bounded with it (issue 40)."""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from sublimate.pipelines.runner import NodePhase, PodOutcome
from tests.conftest import run_cli
from tests.pipelines.runner.test_plan import FakeExecutor, run, wf

MILLION = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: million-}
spec:
  entrypoint: main
  arguments: {parameters: [{name: n, value: "3"}]}
  templates:
  - name: main
    dag:
      tasks:
      - {name: fan, template: step, LOOP}
  - name: step
    container: {image: busybox, command: ["true"]}
"""


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # A bound on a failure's wait: without the cap, such a run grew for minutes (4.2 GB).
    return run_cli("run", *args, home=home, timeout=60)


@pytest.mark.parametrize(("loop", "flags", "line"), [
    ('withSequence: {count: "1000000"}', [],
     "error: template 'main': tasks.fan.withSequence: 1,000,000 items would take this run past "
     "its cap of 10,000 nodes (sublimate run --max-nodes N raises it)"),
    ('withSequence: {start: "1", end: "{{workflow.parameters.n}}"}', ["-p", "n=20000"],
     "error: template 'main': tasks.fan.withSequence: 20,000 items would take this run past "
     "its cap of 10,000 nodes (sublimate run --max-nodes N raises it)"),
    ("withItems: [" + ", ".join(map(str, range(30))) + "]", ["--max-nodes", "20"],
     "error: template 'main': tasks.fan.withItems: 30 items would take this run past its cap "
     "of 20 nodes (sublimate run --max-nodes N raises it)"),
], ids=["million", "parameter", "items"])
def test_a_loop_over_the_cap_is_refused_in_one_line_before_the_run_starts(
        tmp_path: Path, loop: str, flags: list[str], line: str) -> None:
    manifest = tmp_path / "wf.yaml"
    manifest.write_text(MILLION.replace("LOOP", loop))
    started = time.monotonic()
    done = _cli(tmp_path / "home", str(manifest), *flags)
    assert done.returncode == 2, done.stderr
    assert [err for err in done.stderr.splitlines() if not err.startswith("note:")] == [line]
    assert time.monotonic() - started < 10  # refused at once, nothing expanded
    assert not (tmp_path / "home" / "runs").exists()  # no run folder, no status.json


def test_a_loop_sized_as_it_runs_is_refused_before_its_items_exist(tmp_path: Path) -> None:
    # withParam from a task's output: its size is known only once `gen` has run.
    text = wf("""
        - name: main
          dag:
            tasks:
            - {name: gen, template: echo, arguments: {parameters: [{name: m, value: x}]}}
            - {name: fan, template: echo, depends: gen,
               withParam: "{{tasks.gen.outputs.result}}",
               arguments: {parameters: [{name: m, value: "{{item}}"}]}}
        """, """
        - name: echo
          inputs: {parameters: [{name: m}]}
          container: {command: [echo, "{{inputs.parameters.m}}"]}
        """)
    executor = FakeExecutor({"gen": PodOutcome(exit_code=0, stdout=json.dumps(list(range(500))))})
    result = run(text, tmp_path / "home", executor, max_nodes=100)
    assert result.phase == NodePhase.FAILED
    fan = result.node("fan")
    assert fan.phase == NodePhase.ERROR
    assert fan.message == ("tasks.fan.withParam: 500 items would take this run past its cap of "
                           "100 nodes (2 made so far; sublimate run --max-nodes N raises it)")
    assert executor.names() == ["gen"]  # no item started
    assert len(result.nodes) < 10


def test_a_run_that_reaches_the_cap_stops_there_and_still_runs_its_exit_handler(
        tmp_path: Path) -> None:
    # A template that calls itself twice per level, with no pod: 2^100 nodes before Argo's
    # recursion depth would stop it. The cap stops it, and everything it started.
    text = wf("""
        - name: main
          steps:
          - - {name: left, template: main}
            - {name: right, template: main}
            - {name: leaf, template: bye, when: "1 == 2"}
        """, """
        - name: bye
          container: {command: [echo, bye]}
        """, extra="onExit: bye\n")
    executor = FakeExecutor()
    started = time.monotonic()
    result = run(text, tmp_path / "home", executor, max_nodes=300)
    assert time.monotonic() - started < 60
    assert (result.phase, result.message) == (NodePhase.FAILED, (
        "template 'main': this run reached its cap of 300 nodes (sublimate run --max-nodes N "
        "raises it)"))
    # what was starting when it stopped still gets a node each ("not started: ..."): the
    # frontier of the tree, fewer than the nodes made (558-566 nodes seen)
    assert len(result.nodes) < 2 * 300
    assert result.node("onExit").phase == NodePhase.SUCCEEDED
    assert executor.names() == ["onExit"]
    status = result.run_dir / "status.json"
    assert status.stat().st_size < 1024 * len(result.nodes)


def test_the_cap_leaves_parallelism_as_it_was(tmp_path: Path) -> None:
    # A loop the cap allows runs whole, its template's parallelism honoured.
    text = wf("""
        - name: main
          parallelism: 3
          dag:
            tasks:
            - {name: fan, template: echo, withSequence: {count: "40"},
               arguments: {parameters: [{name: m, value: "{{item}}"}]}}
        """, """
        - name: echo
          inputs: {parameters: [{name: m}]}
          container: {command: [echo, "{{inputs.parameters.m}}"]}
        """)

    def slow(request: object) -> PodOutcome:
        time.sleep(0.01)
        return PodOutcome(exit_code=0)

    executor = FakeExecutor({"fan": slow})
    result = run(text, tmp_path / "home", executor, max_nodes=50)
    assert result.phase == NodePhase.SUCCEEDED
    assert len(executor.requests) == 40 and executor.most_running <= 3


def test_the_flag_takes_a_whole_number_above_zero(tmp_path: Path) -> None:
    manifest = tmp_path / "wf.yaml"
    manifest.write_text(textwrap.dedent(MILLION.replace("LOOP", "withItems: [a]")))
    done = _cli(tmp_path / "home", str(manifest), "--max-nodes", "0")
    assert done.returncode == 2
    assert "argument --max-nodes: '0': a whole number above 0" in done.stderr


def test_an_exit_handler_that_grows_without_end_stops_at_a_cap_of_its_own(
        tmp_path: Path) -> None:
    text = wf("""
        - name: main
          container: {command: [echo, main]}
        """, """
        - name: grow
          steps:
          - - {name: left, template: grow}
            - {name: right, template: grow}
        """, extra="onExit: grow\n")
    result = run(text, tmp_path / "home", FakeExecutor(), max_nodes=100)
    assert result.node(result.name).phase == NodePhase.SUCCEEDED  # the entrypoint, main
    assert result.node("onExit").phase.failed
    capped = [node for node in result.nodes if node.message.startswith("template 'grow'")]
    assert capped and capped[0].message == (
        "template 'grow': this run reached its cap of 200 nodes (sublimate run --max-nodes N "
        "raises it)")  # the exit handler's own cap: as many again
    assert len(result.nodes) < 2 * 200
