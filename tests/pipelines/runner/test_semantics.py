"""Semantics aligned with Argo's controller and executor (issue 10), one test per point.

Each manifest is our own; each assertion is what Argo gives, with the source it follows:
``workflow/controller/operator.go`` (global scope, ``workflow.*`` variables, failures,
timeouts, retries), ``dag.go`` (targets, ``depends``), ``workflow/executor/executor.go``
(``outputs.result``, the script file), ``workflow/validate/validate.go`` (what a template may
hold) and ``pkg/apis/workflow/v1alpha1/utils.go`` (durations). Real (tiny) processes run.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path

import pytest

from sublimate.pipelines.argo_terms import NodePhase
from sublimate.pipelines.runner import (
    ManifestError,
    RunEvent,
    RunOptions,
    RunResult,
    load_manifest,
    run_workflow,
)
from sublimate.pipelines.runner.manifest.durations import parse_duration, parse_go_duration
from tests.conftest import run_cli


def run(text: str, home: Path, params: dict[str, str] | None = None) -> RunResult:
    events: list[RunEvent] = []
    workflow = load_manifest(textwrap.dedent(text))
    return run_workflow(workflow, params or {}, RunOptions(home=home, reporter=events.append))


def wf(*parts: str, extra: str = "") -> str:
    templates = "".join(textwrap.dedent(part).strip("\n") + "\n" for part in parts)
    return (
        "apiVersion: argoproj.io/v1alpha1\nkind: Workflow\n"
        "metadata: {name: sem}\n"
        f"spec:\n  entrypoint: main\n{textwrap.indent(textwrap.dedent(extra), '  ')}"
        f"  templates:\n{textwrap.indent(textwrap.dedent(templates), '  ')}"
    )


ECHO = """
- name: echo
  inputs: {parameters: [{name: m}]}
  container: {command: [echo, "{{inputs.parameters.m}}"]}
"""


def result_of(result: RunResult, display: str) -> str | None:
    return result.node(display).result


# ------------------------------------------------- 1. global outputs, seen by later tasks


def test_global_outputs_are_visible_to_the_tasks_after_them(tmp_path: Path) -> None:
    # operator.go addOutputsToGlobalScope at the node's end; dag.go resolves a task's
    # arguments with woc.globalParams() when the task starts, steps.go likewise.
    result = run(wf("""
    - name: main
      dag:
        tasks:
        - {name: produce, template: produce}
        - name: consume
          depends: produce
          template: echo
          arguments: {parameters: [{name: m, value: "{{workflow.outputs.parameters.g}}"}]}
        - name: read
          depends: produce
          template: read
          arguments:
            artifacts: [{name: a, from: "{{workflow.outputs.artifacts.ga}}"}]
    - name: produce
      container:
        command: [sh, -c, "printf v1 > /tmp/p; printf art > /tmp/a"]
      outputs:
        parameters: [{name: p, globalName: g, valueFrom: {path: /tmp/p}}]
        artifacts: [{name: a, globalName: ga, path: /tmp/a}]
    - name: read
      inputs: {artifacts: [{name: a, path: /tmp/in}]}
      container: {command: [cat, /tmp/in]}
    """, ECHO), tmp_path)
    assert result.phase == NodePhase.SUCCEEDED, result.message
    assert result_of(result, "consume") == "v1"
    assert result_of(result, "read") == "art"


def test_global_outputs_reach_later_step_groups(tmp_path: Path) -> None:
    result = run(wf("""
    - name: main
      steps:
      - - {name: produce, template: produce}
      - - name: consume
          template: echo
          arguments: {parameters: [{name: m, value: "{{workflow.outputs.parameters.g}}"}]}
    - name: produce
      container: {command: [sh, -c, "printf v2 > /tmp/p"]}
      outputs:
        parameters: [{name: p, globalName: g, valueFrom: {path: /tmp/p}}]
    """, ECHO), tmp_path)
    assert result.phase == NodePhase.SUCCEEDED, result.message
    assert result_of(result, "consume") == "v2"


# ------------------------------------- 2. workflow.status, workflow.duration, workflow.failures


def test_status_and_duration_while_running(tmp_path: Path) -> None:
    # operator.go setGlobalRuntimeParameters: status is the workflow's phase (Running) and
    # duration its elapsed seconds as Go's "%f".
    result = run(wf("""
    - name: main
      steps:
      - - {name: first, template: echo, arguments: {parameters: [{name: m, value: x}]}}
      - - name: show
          template: echo
          arguments: {parameters: [{name: m, value: "{{workflow.status}} {{workflow.duration}}"}]}
    """, ECHO), tmp_path)
    status, duration = (result_of(result, "show") or "").split()
    assert status == "Running"
    assert re.fullmatch(r"\d+\.\d{6}", duration) and float(duration) > 0


def test_failures_list_every_failed_or_errored_node_as_argo_quotes_it(tmp_path: Path) -> None:
    # operator.go: every node Failed or Error (pods, the DAG, the retry node...), as
    # failedNodeStatus JSON, strconv.Quote'd; podName is GeneratePodName's v2 name.
    result = run(wf("""
    - name: main
      dag:
        tasks:
        - {name: bad, template: bad}
        - {name: ok, template: echo, arguments: {parameters: [{name: m, value: x}]}}
    - name: bad
      container: {command: [sh, -c, "echo 'no <data>' > $SUBLIMATE_TERMINATION_LOG; exit 3"]}
    - name: exit2
      container: {command: [printf, "%s", "{{workflow.failures}}"]}
    """, ECHO, extra="onExit: exit2\n"), tmp_path)
    assert result.phase == NodePhase.FAILED
    text = result_of(result, "onExit") or ""
    assert text.startswith('"[{') and text.endswith('}]"')  # the quoted JSON Argo passes
    failures = json.loads(json.loads(text))
    by_name = {f["displayName"]: f for f in failures}
    assert set(by_name) == {"bad", "sem"}  # the pod and the DAG (the workflow's root node)
    bad = by_name["bad"]
    assert set(bad) == {"displayName", "message", "templateName", "phase", "podName",
                        "finishedAt"}
    assert bad["phase"] == "Failed" and bad["templateName"] == "bad"
    assert bad["message"] == "Error (exit code 3): no <data>"
    assert re.fullmatch(r"sem-bad-\d+", bad["podName"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", bad["finishedAt"])
    assert by_name["sem"]["podName"] == "sem" and by_name["sem"]["templateName"] == "main"
    assert r"\\u003cdata\\u003e" in text  # json.Marshal escapes < and >, Quote the "\\"


# --------------------------------------------------- 3. AnySucceeded / AllFailed, no loop


def test_any_succeeded_and_all_failed_are_false_without_a_loop(tmp_path: Path) -> None:
    # dag.go evaluateDependsLogic: both are computed over a TaskGroup's children only;
    # for any other node they are false. AllFailed counts Failed children, not Error.
    result = run(wf("""
    - name: main
      dag:
        tasks:
        - {name: good, template: echo, arguments: {parameters: [{name: m, value: x}]}}
        - {name: bad, template: bad}
        - {name: after-any, depends: good.AnySucceeded, template: echo,
           arguments: {parameters: [{name: m, value: y}]}}
        - {name: after-all, depends: bad.AllFailed || bad.Failed, template: echo,
           arguments: {parameters: [{name: m, value: y}]}}
        - {name: only-all, depends: bad.AllFailed, template: echo,
           arguments: {parameters: [{name: m, value: y}]}}
    - name: bad
      container: {command: [sh, -c, "exit 1"]}
    """, ECHO, extra=""), tmp_path)
    phases = {n.display_name: n.phase for n in result.nodes}
    assert phases["after-any"] == NodePhase.OMITTED
    assert phases["only-all"] == NodePhase.OMITTED
    assert phases["after-all"] == NodePhase.SUCCEEDED


def test_all_failed_ignores_errored_children(tmp_path: Path) -> None:
    result = run(wf("""
    - name: main
      dag:
        failFast: false
        tasks:
        - name: fan
          template: maybe
          arguments: {parameters: [{name: how, value: "{{item}}"}]}
          withItems: [fail, error]
        - {name: after, depends: fan.AllFailed, template: echo,
           arguments: {parameters: [{name: m, value: y}]}}
    - name: maybe
      inputs: {parameters: [{name: how}]}
      container: {command: ["{{inputs.parameters.how}}-no-such-command"]}
    """, ECHO), tmp_path)
    # neither command exists: both children end Error, none Failed, so not AllFailed
    assert result.node("after").phase == NodePhase.OMITTED


# ------------------------------------------------------------- 4. outputs.result


def test_result_trims_one_newline_only(tmp_path: Path) -> None:
    # executor.go CaptureScriptResult: a single trailing "\n" is removed, nothing else.
    result = run(wf("""
    - name: main
      container: {command: [printf, "  a b \\n\\n"]}
    """), tmp_path)
    assert result_of(result, "sem") == "  a b \n"


def test_result_keeps_the_last_256_kib(tmp_path: Path) -> None:
    result = run(wf("""
    - name: main
      container: {command: [python3, -c, "print('x' * 300000 + 'END')"]}
    """), tmp_path)
    text = result_of(result, "sem") or ""
    assert len(text.encode()) == 256 * 1024 and text.endswith("xEND")


# --------------------------------------------------------------- 5. script files


def test_script_file_is_executable_and_follows_the_args(tmp_path: Path) -> None:
    # operator.go: the script's path is appended to the container's args (after them);
    # executor.go StageFiles writes it with mode 0755, so `sh -c PATH` runs it.
    result = run(wf("""
    - name: main
      steps:
      - - {name: exec, template: exec}
        - {name: order, template: order}
    - name: exec
      script:
        command: [sh, -c]
        source: |
          #!/bin/sh
          echo ran-as-file
    - name: order
      script:
        command: [sh]
        args: [-e]
        source: echo "argc=$#"
    """), tmp_path)
    assert result.phase == NodePhase.SUCCEEDED, result.message
    assert result_of(result, "exec") == "ran-as-file"
    assert result_of(result, "order") == "argc=0"


# ------------------------------------------------------------- 6. dag.target


TARGETS = """
- name: main
  dag:
    target: "{{workflow.parameters.target}}"
    tasks:
    - {name: a, template: echo, arguments: {parameters: [{name: m, value: a}]}}
    - {name: b, depends: a, template: echo, arguments: {parameters: [{name: m, value: b}]}}
    - {name: c, template: echo, arguments: {parameters: [{name: m, value: c}]}}
    - {name: d, depends: c, template: echo, arguments: {parameters: [{name: m, value: d}]}}
"""


@pytest.mark.parametrize(("target", "ran"), [("b", {"a", "b"}), ("b c", {"a", "b", "c"}),
                                             ("d", {"c", "d"})])
def test_dag_target_from_a_parameter_runs_it_and_its_ancestors_only(
        tmp_path: Path, target: str, ran: set[str]) -> None:
    # dag.go executeDAG: targetTasks = strings.Split(target, " "); executeDAGTask runs a
    # target's dependencies first; other tasks get no node at all.
    result = run(wf(TARGETS, ECHO, extra="arguments: {parameters: [{name: target, value: b}]}\n"),
                 tmp_path, {"target": target})
    assert result.phase == NodePhase.SUCCEEDED, result.message
    assert {n.display_name for n in result.nodes} - {"sem"} == ran


def test_a_parameterised_target_of_two_tasks_runs_under_sublimate_run(tmp_path: Path) -> None:
    # Shaped like Argo's examples/dag-targets.yaml: the CLI checks the manifest (lint) before
    # the runner does, and must skip a target that is a parameter tag, as validate.go does.
    manifest = tmp_path / "targets.yaml"
    manifest.write_text(wf(TARGETS, ECHO, extra="arguments: {parameters: [{name: target}]}\n"))
    done = run_cli("run", str(manifest), "-p", "target=b d", "-o", "json", "-q",
                   home=tmp_path / "home", timeout=60)
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert {n["display_name"] for n in status["nodes"]} - {"sem"} == {"a", "b", "c", "d"}
    assert "target" not in done.stderr


@pytest.mark.parametrize(("target", "named"), [("zz", "zz"), ("b  d", "")])
def test_an_unknown_target_errors_the_dag(tmp_path: Path, target: str, named: str) -> None:
    # dag.go GetTask panics "target X does not exist"; two spaces make an empty name.
    result = run(wf(TARGETS, ECHO, extra="arguments: {parameters: [{name: target}]}\n"),
                 tmp_path, {"target": target})
    assert result.phase == NodePhase.ERROR
    assert f"target {named} does not exist" in result.message
    assert not any(n.display_name in ("a", "b") for n in result.nodes)


def test_a_literal_unknown_target_is_refused_before_the_run() -> None:
    with pytest.raises(ManifestError, match="target 'zz' is not defined"):
        run_workflow(load_manifest(wf(TARGETS.replace("{{workflow.parameters.target}}", "zz"),
                                      ECHO)), {}, RunOptions(home=Path("/nonexistent")))


# --------------------------------------------------------------- 7. timeouts


@pytest.mark.parametrize(("template", "message"), [
    ("- name: main\n  timeout: 10s\n  steps: [[{name: a, template: echo, arguments: "
     "{parameters: [{name: m, value: x}]}}]]", "doesn't support timeout"),
    ("- name: main\n  activeDeadlineSeconds: 5\n  dag: {tasks: [{name: a, template: echo, "
     "arguments: {parameters: [{name: m, value: x}]}}]}", "only valid for leaf templates"),
    ("- name: main\n  timeout: '10'\n  container: {command: [echo]}",
     "invalid duration format in timeout"),
    ("- name: main\n  parallelism: 2\n  container: {command: [echo]}",
     "only valid for steps and dag templates"),
])
def test_timeouts_only_where_argo_applies_them(tmp_path: Path, template: str,
                                               message: str) -> None:
    # validate.go: timeout and activeDeadlineSeconds on leaf templates only; a timeout is a
    # duration, never a whole number; parallelism on steps and DAGs only.
    with pytest.raises(ManifestError, match=re.escape(message)):
        run_workflow(load_manifest(wf(template, ECHO)), {}, RunOptions(home=tmp_path))


# --------------------------------------------------------------- 8. durations


def test_go_durations() -> None:
    # time.ParseDuration, and ParseStringToDuration (a bare integer is seconds).
    assert parse_go_duration("1h30m") == 5400
    assert parse_go_duration("500ms") == 0.5
    assert parse_go_duration("1.5h") == 5400
    assert parse_go_duration("-1m") == -60 and parse_go_duration("0") == 0
    assert parse_go_duration(".5s") == 0.5 and parse_go_duration("2us") == 2e-6
    for bad in ("10", "1d", "", "5 s", "s", "1.s5", "."):
        with pytest.raises(ValueError):
            parse_go_duration(bad)
    assert parse_duration("10") == 10 and parse_duration(10) == 10
    assert parse_duration("1m30s") == 90
    with pytest.raises(ValueError):
        parse_duration("1d")
    with pytest.raises(ValueError):
        parse_duration("1.5")  # not an integer, not a Go duration


@pytest.mark.parametrize(("backoff", "message"), [
    ("{duration: 1d}", "backoff.duration"),
    ("{duration: 1s, factor: 1.5}", "backoff.factor"),
    ("{duration: 1s, maxDuration: 2 hours}", "backoff.maxDuration"),
])
def test_retry_backoff_durations_are_checked(tmp_path: Path, backoff: str, message: str) -> None:
    template = f"- name: main\n  retryStrategy: {{limit: 1, backoff: {backoff}}}\n" \
               "  container: {command: [echo]}"
    with pytest.raises(ManifestError, match=re.escape(message)):
        run_workflow(load_manifest(wf(template)), {}, RunOptions(home=tmp_path))


def test_backoff_cap_limits_the_wait(tmp_path: Path) -> None:
    # operator.go: timeToWait = duration * factor^n, then at most cap.
    start = os.times().elapsed
    result = run(wf("""
    - name: main
      retryStrategy: {limit: 2, backoff: {duration: 1s, factor: 30, cap: 200ms}}
      container: {command: [sh, -c, "exit 1"]}
    """), tmp_path)
    assert result.phase == NodePhase.FAILED
    assert len([n for n in result.nodes if n.display_name.startswith("sem(")]) == 3
    assert os.times().elapsed - start < 5


# ---------------------------------------- 9. template failFast, synchronization


@pytest.mark.parametrize(("field", "name"), [
    ("synchronization: {mutexes: [{name: m, database: true}]}", "database"),
])
def test_unsupported_template_fields_are_refused_by_name(tmp_path: Path, field: str,
                                                         name: str) -> None:
    template = f"- name: main\n  {field}\n  container: {{command: [echo]}}"
    with pytest.raises(ManifestError, match=name):
        run_workflow(load_manifest(wf(template)), {}, RunOptions(home=tmp_path))


def test_template_fail_fast_stops_new_children_after_a_failure(tmp_path: Path) -> None:
    # operator.go checkParallelism: a steps/DAG template with failFast true starts nothing
    # more once a child failed, and fails "template has failed or errored children and
    # failFast enabled".
    result = run(wf("""
    - name: main
      failFast: true
      parallelism: 1
      steps:
      - - name: fan
          template: maybe
          arguments: {parameters: [{name: code, value: "{{item}}"}]}
          withItems: ["1", "0", "0"]
    - name: maybe
      inputs: {parameters: [{name: code}]}
      container: {command: [sh, -c, "exit {{inputs.parameters.code}}"]}
    """), tmp_path)
    assert result.phase == NodePhase.FAILED
    started = [n for n in result.nodes if n.display_name.startswith("fan(")
               and n.phase in (NodePhase.SUCCEEDED, NodePhase.FAILED) and n.started_at]
    assert len(started) == 1
    assert "failFast" in result.node("sem").message


# ------------------------------- 10. path placeholders, and an input's value's first pass


def test_output_and_input_path_placeholders_are_the_paths_the_pod_sees(tmp_path: Path) -> None:
    # Shaped like Argo's examples/artifact-path-placeholders.yaml. SubstituteParams sets
    # {{outputs.parameters.<n>.path}}, {{outputs.artifacts.<n>.path}} and
    # {{inputs.artifacts.<n>.path}} from the template after its pass with the globals; an
    # input's own {{=...}} value is resolved in that pass too.
    result = run(wf("""
    - name: main
      inputs:
        parameters:
        - {name: lines, value: "{{=asInt(workflow.parameters.count) - 1}}"}
        artifacts:
        - {name: text, path: /inputs/text/data, raw: {data: "1\\n2\\n3\\n4\\n"}}
      outputs:
        parameters:
        - name: counted
          valueFrom: {path: "/outputs/{{workflow.name}}/count"}
        artifacts:
        - {name: head, path: /outputs/head/data, archive: {none: {}}}
      container:
        command: [sh, -c]
        args:
        - >-
          mkdir -p "$(dirname {{outputs.artifacts.head.path}})"
          "$(dirname {{outputs.parameters.counted.path}})" &&
          head -n {{inputs.parameters.lines}} {{inputs.artifacts.text.path}}
          > {{outputs.artifacts.head.path}} &&
          wc -l < {{outputs.artifacts.head.path}} > {{outputs.parameters.counted.path}} &&
          echo "{{outputs.parameters.counted.path}} {{outputs.artifacts.head.path}}"
    """, extra="arguments: {parameters: [{name: count, value: '4'}]}\n"), tmp_path)
    assert result.phase == NodePhase.SUCCEEDED, result.message
    node = result.node("sem")
    assert node.parameters["counted"].strip() == "3"
    assert Path(node.artifacts["head"]).read_text() == "1\n2\n3\n"
    # what the pod saw: the paths as declared (the runner mounts them there)
    assert node.result == "/outputs/sem/count /outputs/head/data"


def test_inputs_parameters_is_the_json_go_writes(tmp_path: Path) -> None:
    # json.Marshal of wfv1.Parameter after the first pass: struct order, empty fields left out
    result = run(wf("""
    - name: main
      inputs:
        parameters:
        - {name: a, default: "<{{workflow.name}}>"}
        - {name: b, value: "x", enum: ["x", "y"], description: "the b"}
      container: {command: [echo, "{{inputs.parameters}}"]}
    """), tmp_path)
    assert result.phase == NodePhase.SUCCEEDED, result.message
    assert result.node("sem").result == (
        '[{"name":"a","default":"\\u003csem\\u003e","value":"\\u003csem\\u003e"},'
        '{"name":"b","value":"x","enum":["x","y"],"description":"the b"}]')
