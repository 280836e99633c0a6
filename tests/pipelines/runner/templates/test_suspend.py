"""Suspend templates: an approval gate a person resumes from another terminal (`sublimate
resume`, with a supplied parameter checked against its enum), answers given up front by a test,
a timed wait, and `sublimate stop` on a suspend node or the whole run."""

from __future__ import annotations

import getpass
import json
import signal
import time
from pathlib import Path

from sublimate.pipelines.runner import NodePhase, RunEvent
from sublimate.pipelines.runner.harness import SuspendAnswer, run
from tests.conftest import finish_run, run_cli, start_run, stop_run

# The approval gate as the Argo UI shows it: an input parameter with an enum and a default, the
# output of the same name supplied by whoever resumes (docs: intermediate-parameters.yaml).
GATE = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: release-}
spec:
  entrypoint: release
  arguments:
    parameters: [{name: soak, value: "1"}]
  templates:
  - name: release
    steps:
    - - name: build
        template: build
    - - name: soak
        template: soak
    - - name: approve
        template: approval
    - - name: deploy
        template: deploy
        when: "{{steps.approve.outputs.parameters.approve}} == YES"
        arguments:
          parameters: [{name: note, value: "{{steps.approve.outputs.parameters.note}}"}]
  - name: build
    script: {command: [sh], source: echo built}
  - name: soak
    suspend: {duration: "{{workflow.parameters.soak}}"}
  - name: approval
    inputs:
      parameters:
      - {name: approve, default: "NO", enum: ["YES", "NO"], description: deploy to production?}
    suspend: {}
    outputs:
      parameters:
      - name: approve
        globalName: approved
        valueFrom: {supplied: {}}
      - name: note
        valueFrom: {supplied: {}, default: none}
  - name: deploy
    inputs:
      parameters: [{name: note}]
    script: {command: [sh], source: 'echo "deploying ({{inputs.parameters.note}})"'}
"""


def _wait_for_node(home: Path, display: str, phase: str, timeout: float = 60) -> tuple[str, dict]:
    """The run's name and status once its node ``display`` is in ``phase``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for status_file in (home / "runs").glob("*/status.json"):
            try:
                status = json.loads(status_file.read_text())
            except ValueError:
                continue  # being replaced: read it again
            if any(n["display_name"] == display and n["phase"] == phase
                   for n in status["nodes"]):
                return status["name"], status
        time.sleep(0.05)
    raise AssertionError(f"no node {display} {phase} within {timeout}s")


def test_an_approval_gate_resumed_from_another_terminal(tmp_path: Path, home: Path) -> None:
    manifest = tmp_path / "release.yaml"
    manifest.write_text(GATE)
    runner = start_run(home, str(manifest))
    try:
        name, status = _wait_for_node(home, "approve", "Running")
        assert [n["type"] for n in status["nodes"] if n["display_name"] == "approve"] == \
            ["Suspend"]
        # while it waits, it says how to resume it (its message, which Argo's API shows too)
        hint = (f"waiting: sublimate resume {name} --node-field-selector displayName=approve "
                f"-p approve=YES|NO -p note=VALUE (or sublimate stop {name} "
                "--node-field-selector displayName=approve)")
        assert [n["message"] for n in status["nodes"] if n["display_name"] == "approve"] == \
            [hint]
        refused = run_cli("resume", name, "-p", "approve=maybe", home=home)
        assert refused.returncode == 1
        assert "output parameter 'approve': 'maybe' is not one of YES, NO" in refused.stderr
        unknown = run_cli("resume", name, "-p", "colour=red", home=home)
        assert "node is not expecting output parameter 'colour'" in unknown.stderr
        nobody = run_cli("resume", name, "--node-field-selector", "displayName=nobody",
                         home=home)
        assert nobody.returncode == 1 and "no suspend nodes matching nodeFieldSelector: " \
            "displayName=nobody" in nobody.stderr
        # argo node set's unquoting: -p 'note="ship it"' supplies: ship it
        resumed = run_cli("resume", name, "-p", "approve=YES", "-p", 'note="ship it"',
                          "--node-field-selector", "templateName=approval", home=home)
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.strip() == f"run {name}: resumed {name}[2].approve"
        output = finish_run(runner, timeout=60)
    finally:
        if runner.poll() is None:
            stop_run(runner)
    assert runner.returncode == 0, output
    assert "outputs: approved=YES" in output
    assert f"approve: Running ({hint})" in output  # said in the live output
    assert "deploy | deploying (ship it)" in output
    status = json.loads((home / "runs" / name / "status.json").read_text())
    approve = next(n for n in status["nodes"] if n["display_name"] == "approve")
    assert approve["message"] == f"Resumed by: {getpass.getuser()}"
    soak = next(n for n in status["nodes"] if n["display_name"] == "soak")
    assert soak["phase"] == "Succeeded" and "waiting" not in soak["message"]  # resumed itself
    assert approve["outputs"]["parameters"] == {"approve": "YES", "note": "ship it"}
    # the run is over: nothing to resume, said in one line
    late = run_cli("resume", name, home=home)
    assert late.returncode == 2
    assert late.stderr.strip() == f"error: run {name} is not running: it ended Succeeded"


def test_answers_given_up_front_and_a_timed_wait(tmp_path: Path) -> None:
    events: list[RunEvent] = []
    done = run(GATE, {"soak": "1s"}, home=tmp_path, reporter=events.append, timeout=60,
               answers={"templateName=approval": {"approve": "YES"}})
    assert done.phase == NodePhase.SUCCEEDED, done.message
    # the timed suspend showed Running, then Succeeded once its duration had passed
    soak = [e.phase for e in events if e.kind == "node" and e.node is not None
            and e.node.display_name == "soak"]
    assert soak == [NodePhase.RUNNING, NodePhase.SUCCEEDED]
    waited = done.node("soak")
    assert waited.finished is not None and waited.started is not None
    assert (waited.finished - waited.started).total_seconds() >= 1.0
    # the unsupplied output took its default; the supplied one is a workflow output
    assert done.node("approve").outputs == {"approve": "YES", "note": "none"}
    assert done.outputs == {"approved": "YES"}
    assert done.node("deploy").result == "deploying (none)"

    declined = run(GATE, {"soak": "0"}, home=tmp_path, echo=False, timeout=60,
                   answers={"approve": None})  # resumed with the defaults: approve=NO
    assert declined.node("approve").outputs == {"approve": "NO", "note": "none"}
    assert declined.node("deploy").phase == NodePhase.SKIPPED

    stopped = run(GATE, {"soak": "0"}, home=tmp_path, echo=False, timeout=60,
                  answers={"approve": SuspendAnswer(stop=True, message="not today")})
    assert (stopped.phase, stopped.node("approve").phase) == ("Failed", "Failed")
    assert stopped.node("approve").message == "not today"


def test_an_unanswered_gate_waits_until_the_deadline(tmp_path: Path) -> None:
    waited = run(GATE, {"soak": "0"}, home=tmp_path, echo=False, timeout=2)
    assert waited.phase == NodePhase.FAILED
    assert waited.node("approve").phase == NodePhase.FAILED
    assert waited.message == "workflow exceeded its deadline of 2s"
    assert "deploy" not in waited.nodes  # never reached


def test_a_supplied_output_without_a_default_is_argos_error(tmp_path: Path) -> None:
    timed = """
    apiVersion: argoproj.io/v1alpha1
    kind: Workflow
    metadata: {generateName: timed-}
    spec:
      entrypoint: wait
      templates:
      - name: wait
        suspend: {duration: 0s}
        outputs:
          parameters: [{name: answer, valueFrom: {supplied: {}}}]
    """
    expired = run(timed.replace("\n    ", "\n"), home=tmp_path, echo=False, timeout=60)
    node = expired.node(expired.name)  # the entrypoint's node bears the workflow's name
    assert (node.type, node.phase) == ("Suspend", NodePhase.ERROR)
    assert node.message == (
        "raw output parameter 'answer' has not been set and does not have a default value")


def test_stop_a_gate_by_selector_or_the_whole_run(tmp_path: Path, home: Path) -> None:
    manifest = tmp_path / "release.yaml"
    manifest.write_text(GATE.replace('value: "1"', 'value: "0"'))
    runner = start_run(home, str(manifest))
    try:
        name, _ = _wait_for_node(home, "approve", "Running")
        stopped = run_cli("stop", name, "--node-field-selector",
                          "inputs.parameters.approve.value=NO", "-m", "rejected", home=home)
        assert stopped.returncode == 0, stopped.stderr
        output = finish_run(runner, timeout=60)
    finally:
        if runner.poll() is None:
            stop_run(runner)
    assert runner.returncode == 1, output
    status = json.loads((home / "runs" / name / "status.json").read_text())
    approve = next(n for n in status["nodes"] if n["display_name"] == "approve")
    assert (approve["phase"], approve["message"]) == ("Failed", "rejected")

    runner = start_run(home, str(manifest))
    try:
        name, _ = _wait_for_node(home, "approve", "Running")
        whole = run_cli("stop", name, home=home)
        assert whole.returncode == 0, whole.stderr
        output = finish_run(runner, timeout=60)
    finally:
        if runner.poll() is None:
            stop_run(runner)
    assert runner.returncode == 128 + signal.SIGTERM, output  # as Ctrl-C: stopped
    assert "stopped by SIGTERM" in output
