"""Lifecycle hooks (``hooks``) and step/task-level ``onExit``, against the fake executor.

The manifests are written from Argo's field reference (``LifecycleHook``: template, arguments,
expression); the expected node names, phases and order are those of Argo's controller
(workflow/controller/hooks.go, exit_handler.go, operator.go, steps.go, dag.go).
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from sublimate.pipelines.runner import (
    ManifestError,
    NodePhase,
    PodOutcome,
    PodRequest,
    load_manifest,
    run_workflow,
)
from sublimate.pipelines.runner.expressions.conditions import ExpressionError
from sublimate.pipelines.runner.manifest.load import unsupported_fields
from sublimate.pipelines.runner.templates.hooks import (
    evaluate_hook_expression,
)
from tests.pipelines.runner.test_plan import ECHO, FakeExecutor, run, wf

FAIL = PodOutcome(exit_code=1)


@pytest.fixture(autouse=True)
def no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", forbidden)


def waits_for(display: str, fake: FakeExecutor, outcome: PodOutcome | None = None):
    """A pod script that ends only once a pod whose display name ends with ``display`` has
    started: proof that the hook ran while this pod was Running."""
    def script(request: PodRequest) -> PodOutcome:
        for _ in range(500):
            if any(name.endswith(display) for name in fake.names()):
                return outcome or PodOutcome(stdout="done")
            threading.Event().wait(0.01)
        raise AssertionError(f"{display} never started; started: {fake.names()}")
    return script


SAY = """
- name: say
  inputs: {parameters: [{name: m, value: ""}]}
  container: {command: [say, "{{inputs.parameters.m}}"]}
"""


# ------------------------------------------------------------------ workflow level


def test_workflow_exit_hook_runs_last_with_the_workflow_status(tmp_path: Path) -> None:
    fake = FakeExecutor({"bad": FAIL})
    result = run(wf(ECHO, SAY, """
    - name: main
      steps: [[{name: bad, template: echo, arguments: {parameters: [{name: m, value: x}]}}]]
    """, extra="""
    hooks:
      exit:
        template: say
        arguments: {parameters: [{name: m, value: "{{workflow.status}}"}]}
    """), tmp_path, fake)
    assert fake.names() == ["bad", "onExit"]
    assert fake.request("onExit").argv == ["say", "Failed"]
    handler = result.node("onExit")
    assert handler.name == f"{result.name}.onExit" and handler.parent is None
    assert handler.phase == NodePhase.SUCCEEDED
    assert result.phase == NodePhase.FAILED


def test_workflow_exit_hook_without_arguments_gets_the_workflow_arguments(tmp_path: Path
                                                                        ) -> None:
    # workflow_types.go GetExitHook(spec.arguments) / WithArgs
    fake = FakeExecutor()
    run(wf(SAY, "- name: main\n  container: {command: [work]}\n", """
    - name: bye
      inputs: {parameters: [{name: who}]}
      container: {command: [bye, "{{inputs.parameters.who}}"]}
    """, extra="""
    arguments: {parameters: [{name: who, value: team}]}
    hooks: {exit: {template: bye}}
    """), tmp_path, fake)
    assert fake.request("onExit").argv == ["bye", "team"]


def test_workflow_expression_hook_fires_once_while_running(tmp_path: Path) -> None:
    fake = FakeExecutor()
    fake.scripts["a"] = waits_for(".hooks.running", fake)
    result = run(wf(SAY, """
    - name: main
      steps: [[{name: a, template: work}], [{name: b, template: work}]]
    - name: work
      container: {command: [work]}
    """, extra="""
    hooks:
      running:
        expression: workflow.status == "Running"
        template: say
        arguments: {parameters: [{name: m, value: "started {{workflow.status}}"}]}
      failed:
        expression: workflow.status == "Failed"
        template: say
      exit: {template: say, arguments: {parameters: [{name: m, value: bye}]}}
    """), tmp_path, fake)
    assert result.phase == NodePhase.SUCCEEDED, result.message
    hook_name = f"{result.name}.hooks.running"
    # fired once, as the workflow started running (step a waits for it); never the Failed
    # one; the exit handler last
    names = fake.names()
    assert sorted(names[:2]) == sorted(["a", hook_name]) and names[2:] == ["b", "onExit"]
    assert fake.request(hook_name).argv == ["say", "started Running"]
    assert fake.request("onExit").argv == ["say", "bye"]
    hook = result.node(hook_name)
    assert hook.display_name == hook_name  # no boundary: the display name is the node name
    assert hook.parent == result.node(result.name).id
    assert hook.id in result.node(result.name).children
    assert hook.phase == NodePhase.SUCCEEDED
    assert all(".hooks.failed" not in n.name for n in result.nodes)


def test_workflow_hook_on_its_final_status_runs_before_the_exit_handler(tmp_path: Path
                                                                        ) -> None:
    fake = FakeExecutor({"say": FAIL})
    result = run(wf(SAY, "- name: main\n  container: {command: [work]}\n", extra="""
    hooks:
      done:
        expression: workflow.status == "Succeeded" || workflow.status == "Failed"
        template: say
      exit: {template: say}
    """), tmp_path, fake)
    done = f"{result.name}.hooks.done"
    assert fake.names() == [result.name, done, "onExit"]
    # a failed named hook leaves the workflow's phase alone; a failed exit handler does not
    assert result.node(done).phase == NodePhase.FAILED
    assert result.phase == NodePhase.FAILED
    assert result.message.startswith("exit handler failed")


def test_a_failed_workflow_hook_does_not_fail_the_workflow(tmp_path: Path) -> None:
    fake = FakeExecutor({"say": FAIL})
    result = run(wf(SAY, "- name: main\n  container: {command: [work]}\n", extra="""
    hooks:
      done: {expression: workflow.status == "Succeeded", template: say}
    """), tmp_path, fake)
    assert result.node(f"{result.name}.hooks.done").phase == NodePhase.FAILED
    assert result.phase == NodePhase.SUCCEEDED, result.message


# ------------------------------------------------------------------ task level


def test_task_exit_hook_sees_the_task_status_and_outputs(tmp_path: Path) -> None:
    def produce(request: PodRequest) -> PodOutcome:
        request.output_files()["p"].write_text("42")
        return PodOutcome(exit_code=3)

    fake = FakeExecutor({"A": produce})
    result = run(wf(SAY, """
    - name: main
      dag:
        tasks:
        - name: A
          template: produce
          continueOn: {failed: true}
          hooks:
            exit:
              template: say
              arguments:
                parameters:
                - {name: m, value: "{{tasks.A.status}} {{tasks.A.outputs.parameters.p}}"}
        - {name: B, template: say, depends: A.Failed}
    - name: produce
      container: {command: [produce]}
      outputs: {parameters: [{name: p, valueFrom: {path: /tmp/p}}]}
    """), tmp_path, fake)
    # the dependent waits for A's exit hook (dag.go: CheckAllHooksFullfilled)
    assert fake.names() == ["A", "A.onExit", "B"]
    assert fake.request("A.onExit").argv == ["say", "Failed 42"]
    task, hook = result.node("A"), result.node("A.onExit")
    assert hook.name == f"{result.name}.A.onExit" and hook.parent == task.id
    assert hook.id in task.children
    assert task.phase == NodePhase.FAILED and hook.phase == NodePhase.SUCCEEDED
    assert result.phase == NodePhase.SUCCEEDED, result.message  # continueOn


def test_task_expression_hook_fires_while_the_task_runs(tmp_path: Path) -> None:
    fake = FakeExecutor()
    fake.scripts["A"] = waits_for("A.hooks.running", fake)
    result = run(wf(SAY, """
    - name: main
      dag:
        tasks:
        - name: A
          template: work
          hooks:
            running:
              expression: tasks.A.status == "Running"
              template: say
              arguments: {parameters: [{name: m, value: "{{tasks.A.status}}"}]}
            ok:
              expression: tasks.A.status == "Succeeded" && workflow.status == "Running"
              template: say
            failed: {expression: tasks.A.status == "Failed", template: say}
        - {name: B, template: work, depends: A}
    - name: work
      container: {command: [work]}
    """), tmp_path, fake)
    assert result.phase == NodePhase.SUCCEEDED, result.message
    names = fake.names()
    assert names[:2] == ["A", "A.hooks.running"] and names[-1] == "B"
    assert sorted(names) == sorted(["A", "A.hooks.running", "A.hooks.ok", "B"])
    assert fake.request("A.hooks.running").argv == ["say", "Running"]
    running = result.node("A.hooks.running")
    assert running.name == f"{result.name}.A.hooks.running"
    assert running.parent == result.node("A").id


def test_a_failing_task_hook_leaves_the_task_and_dag_succeeded(tmp_path: Path) -> None:
    fake = FakeExecutor({"say": FAIL})
    result = run(wf(SAY, """
    - name: main
      dag:
        tasks:
        - name: A
          template: work
          hooks:
            ok: {expression: tasks.A.status == "Succeeded", template: say}
            exit: {template: say}
        - {name: B, template: work, depends: A}
    - name: work
      container: {command: [work]}
    """), tmp_path, fake)
    assert result.node("A.hooks.ok").phase == NodePhase.FAILED
    assert result.node("A.onExit").phase == NodePhase.FAILED
    assert result.node("A").phase == NodePhase.SUCCEEDED
    assert result.node("B").phase == NodePhase.SUCCEEDED
    assert result.phase == NodePhase.SUCCEEDED, result.message


# ------------------------------------------------------------------ step level


def test_step_on_exit_runs_after_the_step_before_the_next_group(tmp_path: Path) -> None:
    fake = FakeExecutor({"one": FAIL})
    result = run(wf(SAY, """
    - name: main
      steps:
      - - {name: one, template: work, onExit: cleanup, continueOn: {failed: true}}
      - - name: two
          template: work
          hooks:
            exit:
              template: say
              arguments: {parameters: [{name: m, value: "{{steps.two.status}}"}]}
    - name: work
      container: {command: [work]}
    - name: cleanup
      inputs: {parameters: [{name: who}]}
      container: {command: [cleanup, "{{inputs.parameters.who}}"]}
    """, extra="arguments: {parameters: [{name: who, value: team}]}\n"), tmp_path, fake)
    # the next group waits for the exit handler (steps.go: the group is not complete until
    # the onExit node is fulfilled)
    assert fake.names() == ["one", "one.onExit", "two", "two.onExit"]
    # onExit has no arguments of its own: it gets the workflow's (GetExitHook(spec.arguments))
    assert fake.request("one.onExit").argv == ["cleanup", "team"]
    assert fake.request("two.onExit").argv == ["say", "Succeeded"]
    hook = result.node("one.onExit")
    assert hook.name == f"{result.name}[0].one.onExit"
    assert hook.parent == result.node("one").id
    assert result.node("one").phase == NodePhase.FAILED
    assert result.phase == NodePhase.SUCCEEDED, result.message


def test_step_expression_hook_with_index_access(tmp_path: Path) -> None:
    fake = FakeExecutor()
    fake.scripts["step-1"] = waits_for("step-1.hooks.running", fake)
    result = run(wf(SAY, """
    - name: main
      steps:
      - - name: step-1
          template: work
          hooks:
            running: {expression: 'steps["step-1"].status == "Running"', template: say}
    - name: work
      container: {command: [work]}
    """), tmp_path, fake)
    assert fake.names() == ["step-1", "step-1.hooks.running"]
    assert result.node("step-1.hooks.running").name == f"{result.name}[0].step-1.hooks.running"
    assert result.phase == NodePhase.SUCCEEDED, result.message


def test_a_skipped_step_runs_no_exit_hook(tmp_path: Path) -> None:
    fake = FakeExecutor()
    result = run(wf(SAY, """
    - name: main
      steps: [[{name: s, template: say, when: "a == b", onExit: say}]]
    """), tmp_path, fake)
    assert fake.names() == [] and result.node("s").phase == NodePhase.SKIPPED


def test_an_expression_error_errs_the_hooked_node(tmp_path: Path) -> None:
    fake = FakeExecutor()
    result = run(wf(SAY, """
    - name: main
      dag:
        tasks:
        - name: A
          template: say
          hooks: {h: {expression: tasks.B.status == "Running", template: say}}
    """), tmp_path, fake)
    task = result.node("A")
    assert task.phase == NodePhase.ERROR
    assert "cannot fetch status from <nil>" in task.message
    assert result.phase == NodePhase.FAILED


# ------------------------------------------------------------------ checks


def test_hooks_the_runner_cannot_run_are_refused_by_path() -> None:
    problems = "\n".join(unsupported_fields(load_manifest(wf(SAY, """
    - name: main
      dag:
        tasks:
        - {name: A, template: say, withItems: [1], hooks: {exit: {template: say}}}
        - name: B
          template: say
          hooks:
            n: {template: say}
            m: {expression: 'sprig.regexFind("a", "b") == ""', template: say}
            r: {expression: 'true', templateRef: {name: x, template: y}}
            o: {expression: 'tasks.B.status == "x"', template: nope}
    """, extra="""
    onExit: say
    hooks: {exit: {template: say, expression: "true"}}
    """))))
    for expected in [
        "spec: use either onExit or hooks.exit",
        "spec.hooks.exit.expression: Argo runs the workflow's exit hook",
        "dag.tasks[0].hooks: hooks and onExit on a looped step or task are not supported",
        "dag.tasks[1].hooks.n.expression: required",
        "dag.tasks[1].hooks.m.expression: ",  # the function the runner lacks, by name
        "dag.tasks[1].hooks.r.templateRef: templateRef in a hook is not supported",
        "dag.tasks[1].hooks.o.template: template 'nope' not found",
    ]:
        assert expected in problems, f"{expected!r} not in\n{problems}"
    with pytest.raises(ManifestError):
        run_workflow(load_manifest(wf(SAY, "- name: main\n  container: {command: [x]}\n",
                                      extra="hooks: {h: {template: say}}\n")), {},
                     None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("expression", "expected"), [
    ('steps["step-1"].status == "Running"', True),
    ("tasks.A.status == 'Succeeded' and not (workflow.status != 'Running')", True),
    ('tasks.A.status == "Failed" || tasks.A.status == "Error"', False),
    ("tasks.C == nil", True),
    ("(1 == 1.0) && true", True),
])
def test_hook_expressions_follow_expr(expression: str, expected: bool) -> None:
    scope = {"steps.step-1.status": "Running", "tasks.A.status": "Succeeded",
             "workflow.status": "Running"}
    assert evaluate_hook_expression(expression, scope) is expected


@pytest.mark.parametrize(("expression", "message"), [
    ("nobody == 1", "unknown name nobody"),
    ("tasks.B.status == 'x'", "tasks.B.status"),
    ("tasks.A.status", "unable to cast expression result"),
    ("sprig.regexFind('S.*', tasks.A.status) == 'S'", "regexFind"),
])
def test_hook_expression_errors_name_the_problem(expression: str, message: str) -> None:
    """Hooks share the runner's expr evaluator with {{=...}} tags: its errors, by name."""
    with pytest.raises(ExpressionError) as info:
        evaluate_hook_expression(expression, {"tasks.A.status": "Succeeded"})
    assert message in str(info.value)
