"""Retry and resubmit of a finished run (``templates/rerun``, ``reruns``), as ``argo retry`` and
``argo resubmit --memoized`` decide them (workflow/util/util.go FormulateRetryWorkflow): which
nodes are kept as they ended and which run again, checked on real runs of small workflows.

The oracle: a node kept from the earlier run is the same node (its id, its start time, its
outputs, which carry a value that differs on every run: nanoseconds); a node that ran again
starts after the earlier run ended. A parameter ``bad`` names the step that fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sublimate.pipelines.runner import RunOptions, RunResult, run_workflow
from sublimate.pipelines.runner.reruns import LABEL_RESUBMITTED_FROM, resubmit, retry
from sublimate.pipelines.runner.templates.rerun import RerunError

# each step writes a value unique to its run (nanoseconds) and fails when `bad` names it
STEP = """
  - name: step
    inputs: {parameters: [{name: who}, {name: got, value: ""}]}
    script:
      command: [sh]
      source: |
        date +%s%N > /tmp/v
        test "{{inputs.parameters.who}}" != "{{workflow.parameters.bad}}"
    outputs:
      parameters: [{name: v, valueFrom: {path: /tmp/v}}]
"""

DAG = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: dag-}
spec:
  entrypoint: main
  arguments: {parameters: [{name: bad, value: c}]}
  templates:
  - name: main
    dag:
      tasks:
      - {name: a, template: step, arguments: {parameters: [{name: who, value: a}]}}
      - name: b
        template: step
        depends: a
        arguments:
          parameters:
          - {name: who, value: b}
          - {name: got, value: "{{tasks.a.outputs.parameters.v}}"}
      - name: c
        template: step
        depends: b
        arguments:
          parameters:
          - {name: who, value: c}
          - {name: got, value: "{{tasks.b.outputs.parameters.v}}"}
      - {name: d, template: step, arguments: {parameters: [{name: who, value: d}]}}
""" + STEP


def _quiet(_event: object) -> None:
    pass


def _options(home: Path) -> RunOptions:
    return RunOptions(home=home, reporter=_quiet, follow_logs=False)


def _first(home: Path, manifest: str, **parameters: str) -> RunResult:
    return run_workflow(yaml.safe_load(manifest), parameters, _options(home))


def _retry(home: Path, result: RunResult, **kwargs: object) -> RunResult:
    rerun = retry(result.run_dir, _options(home), **kwargs)  # type: ignore[arg-type]
    try:
        return rerun.run.run()
    finally:
        rerun.close()


def _ran_again(before: RunResult, after: RunResult) -> set[str]:
    """The display names of after's pods that ran in it (not kept from before)."""
    earlier = {node.name: node for node in before.nodes}
    ended = before.finished_at
    assert ended is not None
    again = set()
    for node in after.nodes:
        if node.type != "Pod":
            continue
        old = earlier.get(node.name)
        if old is not None and node.started_at == old.started_at:
            assert node.parameters == old.parameters and node.id == old.id  # kept whole
        else:
            assert node.started_at is not None and node.started_at > ended
            again.add(node.display_name)
    return again


def test_a_retry_runs_the_failed_task_and_what_depends_on_it_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = _first(home, DAG)
    assert first.phase == "Failed" and first.node("c").phase == "Failed"
    second = _retry(home, first, parameters={"bad": "none"})
    assert second.name == first.name and second.run_dir == first.run_dir
    assert second.phase == "Succeeded"
    assert _ran_again(first, second) == {"c"}
    # the re-run task read the kept task's output, as the earlier run handed it on
    assert second.node("b").parameters["v"] == first.node("b").parameters["v"]
    status = json.loads((first.run_dir / "status.json").read_text())
    assert status["phase"] == "Succeeded"

    # a succeeded run again from b: b and what depends on it (c), not a nor d
    third = _retry(home, second, restart_successful=True, node_field_selector="displayName=b",
                   parameters={"bad": "none"})
    assert third.phase == "Succeeded" and _ran_again(second, third) == {"b", "c"}
    assert sorted(p.name for p in (first.run_dir / "retries").iterdir()) == ["1", "2"]


def test_retry_refuses_what_argo_refuses(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = _first(home, DAG, bad="none")
    with pytest.raises(RerunError, match="succeeded: to run some of its nodes again"):
        retry(done.run_dir, _options(home))
    with pytest.raises(RerunError, match="needs --restart-successful"):
        retry(done.run_dir, _options(home), node_field_selector="displayName=b")
    with pytest.raises(RerunError, match=r"no node of run .* matches"):
        retry(done.run_dir, _options(home), restart_successful=True,
              node_field_selector="displayName=nowhere")
    with pytest.raises(RerunError, match="not a run folder"):
        retry(tmp_path, _options(home))
    # a refused retry changed nothing
    assert not (done.run_dir / "retries").exists()


def test_two_retries_of_one_run_never_overlap(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = _first(home, DAG)
    holding = retry(first.run_dir, _options(home), parameters={"bad": "none"})
    try:
        with pytest.raises(RerunError, match="is being retried already"):
            retry(first.run_dir, _options(home))
    finally:
        holding.close()


STEPS = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: steps-}
spec:
  entrypoint: main
  arguments: {parameters: [{name: bad, value: s2}]}
  onExit: bye
  templates:
  - name: main
    steps:
    - - {name: s1, template: step, arguments: {parameters: [{name: who, value: s1}]}}
      - {name: side, template: step, arguments: {parameters: [{name: who, value: side}]}}
    - - {name: s2, template: step, arguments: {parameters: [{name: who, value: s2}]}}
    - - name: fan
        template: step
        arguments: {parameters: [{name: who, value: "{{item}}"}]}
        withItems: [x, y, z]
  - name: bye
    container: {command: [echo, bye]}
""" + STEP


def test_steps_loops_and_the_exit_handler(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = _first(home, STEPS)
    assert first.phase == "Failed" and first.node("s2").phase == "Failed"
    second = _retry(home, first, parameters={"bad": "y"})
    # s2 and the later group ran (the loop's y failed); the first group was kept
    assert second.phase == "Failed"
    assert _ran_again(first, second) == {"s2", "fan(0:x)", "fan(1:y)", "fan(2:z)", "onExit"}
    third = _retry(home, second, parameters={"bad": "none"})
    # only the failed item of the loop ran again, and the exit handler, as Argo always does
    assert third.phase == "Succeeded"
    assert _ran_again(second, third) == {"fan(1:y)", "onExit"}
    # a node selected in an earlier group: it and every later group
    fourth = _retry(home, third, restart_successful=True, node_field_selector="displayName=s1",
                    parameters={"bad": "none"})
    assert _ran_again(third, fourth) == {"s1", "s2", "fan(0:x)", "fan(1:y)", "fan(2:z)", "onExit"}


HANDLED = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: handled-}
spec:
  entrypoint: main
  arguments: {parameters: [{name: bad, value: a}, {name: also, value: e}]}
  templates:
  - name: main
    dag:
      tasks:
      - {name: a, template: step, arguments: {parameters: [{name: who, value: a}]}}
      - {name: b, template: step, depends: a.Failed,
         arguments: {parameters: [{name: who, value: b}]}}
      - {name: e, template: fails, arguments: {parameters: [{name: who, value: e}]}}
  - name: fails
    inputs: {parameters: [{name: who}]}
    retryStrategy: {limit: 1}
    script:
      command: [sh]
      source: test "{{inputs.parameters.who}}" != "{{workflow.parameters.also}}"
""" + STEP


def test_a_handled_failure_stays_and_a_retried_node_runs_whole(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = _first(home, HANDLED)
    assert first.phase == "Failed"
    assert [first.node(n).phase for n in ("a", "b", "e")] == ["Failed", "Succeeded", "Failed"]
    second = _retry(home, first, parameters={"also": "none"})
    assert second.phase == "Succeeded"
    # a's failure was handled by b, which succeeded: both stay as they ended (util.go
    # isDescendantNodeSucceeded); e (a retry node) runs again from its first attempt
    assert second.node("a").phase == "Failed"
    assert second.node("a").started_at == first.node("a").started_at
    assert _ran_again(first, second) == {"e(0)"}
    assert [n.display_name for n in second.nodes if n.display_name.startswith("e(")] == ["e(0)"]


GLOBAL = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: outs-}
spec:
  entrypoint: main
  arguments: {parameters: [{name: bad, value: check}]}
  templates:
  - name: main
    dag:
      tasks:
      - {name: make, template: make}
      - {name: check, template: step, depends: make,
         arguments: {parameters: [{name: who, value: check}]}}
  - name: make
    script:
      command: [sh]
      source: date +%s%N > /tmp/v; mkdir -p /tmp/a; date +%s%N > /tmp/a/f
    outputs:
      parameters: [{name: v, globalName: made, valueFrom: {path: /tmp/v}}]
      artifacts: [{name: a, path: /tmp/a}]
""" + STEP


def test_kept_outputs_and_resubmit_memoized(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = _first(home, GLOBAL)
    assert first.phase == "Failed"
    made = first.outputs["parameters"]["made"]
    second = _retry(home, first, parameters={"bad": "none"})
    # the kept node's global output is the workflow's again
    assert second.outputs["parameters"]["made"] == made and _ran_again(first, second) == {
        "check"}

    # resubmitted, memoized: a new run, named from the old one's generateName, keeping make
    failed = _first(home, GLOBAL)
    rerun = resubmit(failed.run_dir, _options(home), memoized=True, parameters={"bad": "none"})
    try:
        third = rerun.run.run()
    finally:
        rerun.close()
    assert third.name != failed.name and third.name.startswith("outs-")
    assert third.phase == "Succeeded" and rerun.kept == ("make",)
    kept = third.node("make")
    assert kept.parameters == failed.node("make").parameters
    assert kept.id != failed.node("make").id and kept.id.startswith(third.name)
    assert third.outputs["parameters"]["made"] == failed.outputs["parameters"]["made"]
    manifest = yaml.safe_load((third.run_dir / "workflow.yaml").read_text())
    assert manifest["metadata"]["labels"][LABEL_RESUBMITTED_FROM] == failed.name

    # an artifact a kept node made that is gone: that node runs again rather than hand on
    # a path to nothing (and what depends on it)
    gone = _first(home, GLOBAL)
    artifact = Path(gone.node("make").artifacts["a"])
    import shutil

    shutil.rmtree(artifact) if artifact.is_dir() else artifact.unlink()
    fourth = _retry(home, gone, parameters={"bad": "none"})
    assert fourth.phase == "Succeeded" and _ran_again(gone, fourth) == {"make", "check"}

    # plain resubmit: everything runs again, in a new run, with the parameters the run had
    # last (its retry's: bad=none)
    plain = resubmit(gone.run_dir, _options(home))
    try:
        fifth = plain.run.run()
    finally:
        plain.close()
    assert fifth.name != gone.name and fifth.phase == "Succeeded"
    assert {n.display_name for n in fifth.nodes if n.type == "Pod"} == {"make", "check"}
    assert all(n.started_at and n.started_at > fourth.finished_at  # type: ignore[operator]
               for n in fifth.nodes if n.type == "Pod")
    with pytest.raises(RerunError, match="--memoized resubmits a Failed or Error run only"):
        resubmit(fourth.run_dir, _options(home), memoized=True)
