"""DAG, steps, loops, retries, exit handlers and pods' plans, checked against a fake executor.

The fake executor starts nothing: it records every ``PodRequest`` it is given and returns a
scripted outcome (by default it "echoes" its arguments, so results flow from node to node as
with real processes). ``subprocess.Popen`` is made to fail in this module, so a test that
started a process would fail. Tests with real processes are in test_engine.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sublimate.pipelines.runner import (
    ManifestError,
    NodePhase,
    NodeType,
    PodHooks,
    PodOutcome,
    PodRequest,
    RunEvent,
    RunOptions,
    RunResult,
    load_manifest,
    run_workflow,
)
from sublimate.pipelines.runner.errors import NodeError
from sublimate.pipelines.runner.expressions.conditions import parse_depends
from sublimate.pipelines.runner.pods.artifacts import input_source
from sublimate.pipelines.runner.templates.dag import DagPlan, describe_depends

Script = PodOutcome | list[PodOutcome] | Callable[[PodRequest], PodOutcome]


class _Handle:
    """What the fake gives the engine to stop a pod with: a deadline or Ctrl-C sets it."""

    def __init__(self) -> None:
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()


class FakeExecutor:
    """Records requests and returns scripted outcomes, keyed by display name, task name
    (``fan`` scripts every ``fan(i:item)``, ``x`` every attempt ``x(i)``) or template name; a
    list is used up one outcome per call. Unscripted pods "echo": stdout is their arguments."""

    def __init__(self, scripts: dict[str, Script] | None = None) -> None:
        self.scripts = dict(scripts or {})
        self.requests: list[PodRequest] = []
        self.lock = threading.Lock()
        self.running = 0
        self.most_running = 0

    def run(self, request: PodRequest, hooks: PodHooks) -> PodOutcome:
        with self.lock:
            self.requests.append(request)
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            script = self._script(request)
        handle = _Handle()
        hooks.on_start(handle)
        try:
            if callable(script):
                return script(request) if not _takes_handle(script) else script(request, handle)
            if script is not None:
                return script
            return PodOutcome(exit_code=0, stdout=" ".join(request.argv[1:]))
        finally:
            hooks.on_exit(handle)
            with self.lock:
                self.running -= 1

    def _script(self, request: PodRequest) -> PodOutcome | Callable | None:
        display = request.display_name
        for key in (display, display.split("(")[0], request.template):
            script = self.scripts.get(key)
            if isinstance(script, list):
                return script.pop(0) if script else None
            if script is not None:
                return script
        return None

    def names(self) -> list[str]:
        return [r.display_name for r in self.requests]

    def request(self, display: str) -> PodRequest:
        return next(r for r in self.requests if r.display_name == display)


def _takes_handle(script: Callable) -> bool:
    return getattr(script, "takes_handle", False)


def with_handle(script: Callable[[PodRequest, _Handle], PodOutcome]) -> Callable:
    script.takes_handle = True  # type: ignore[attr-defined]
    return script


@pytest.fixture(autouse=True)
def no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", forbidden)


def run(text: str, home: Path, executor: FakeExecutor, params: dict[str, str] | None = None,
        events: list[RunEvent] | None = None, **options: object) -> RunResult:
    workflow = load_manifest(textwrap.dedent(text))
    sink = events if events is not None else []
    return run_workflow(workflow, params or {}, RunOptions(
        home=home, reporter=sink.append, executor=executor, **options))  # type: ignore[arg-type]


def wf(*parts: str, extra: str = "") -> str:
    templates = "".join(textwrap.dedent(part).strip("\n") + "\n" for part in parts)
    return (
        "apiVersion: argoproj.io/v1alpha1\nkind: Workflow\n"
        "metadata: {generateName: t-}\n"
        f"spec:\n  entrypoint: main\n{textwrap.indent(textwrap.dedent(extra), '  ')}"
        f"  templates:\n{textwrap.indent(textwrap.dedent(templates), '  ')}"
    )


ECHO = """
- name: echo
  inputs: {parameters: [{name: m}]}
  container: {command: [echo, "{{inputs.parameters.m}}"]}
"""


def task(name: str, message: str, **fields: str) -> str:
    extra = "".join(f", {key}: {json.dumps(value)}" for key, value in fields.items())
    return (f"- {{name: {name}, template: echo{extra}, "
            f"arguments: {{parameters: [{{name: m, value: {json.dumps(message)}}}]}}}}")


def dag(*tasks: str, **fields: str) -> str:
    extra = "".join(f"    {key}: {value}\n" for key, value in fields.items())
    body = textwrap.indent("\n".join(tasks), "    ")
    return f"- name: main\n  dag:\n{extra}    tasks:\n{body}\n"


FAIL = PodOutcome(exit_code=1)


# --------------------------------------------------------------------------------- DAGs


def test_diamond_runs_in_waves_and_passes_results(tmp_path: Path) -> None:
    both_started = threading.Barrier(2, timeout=5)

    def meet(request: PodRequest) -> PodOutcome:
        both_started.wait()  # B and C must be in flight together, or this times out
        return PodOutcome(stdout=request.argv[1])

    fake = FakeExecutor({"B": meet, "C": meet})
    result = run(wf(ECHO, dag(
        task("A", "{{workflow.parameters.msg}}"),
        task("B", "{{tasks.A.outputs.result}}-b", depends="A"),
        task("C", "c", depends="A"),
        task("D", "{{tasks.B.outputs.result}}+{{tasks.C.outputs.result}}", depends="B && C"),
    ), extra="arguments: {parameters: [{name: msg, value: hi}]}\n"), tmp_path, fake)
    assert result.phase == NodePhase.SUCCEEDED, result.message
    names = fake.names()
    assert names[0] == "A" and sorted(names[1:3]) == ["B", "C"] and names[3] == "D"
    assert fake.request("B").argv == ["echo", "hi-b"]
    assert fake.request("D").argv == ["echo", "hi-b+c"]
    assert result.node("D").result == "hi-b+c"
    assert result.node(result.name).type == NodeType.DAG
    # the run folder is still written as with real processes
    status = json.loads((result.run_dir / "status.json").read_text())
    assert status["phase"] == "Succeeded" and len(status["nodes"]) == 5


def test_failed_branch_omits_downstream_which_never_reach_the_executor(tmp_path: Path) -> None:
    fake = FakeExecutor({"bad": PodOutcome(exit_code=3, message="disk full")})
    result = run(wf(ECHO, dag(
        task("bad", "x"),
        task("after", "y", depends="bad"),
        task("later", "z", depends="after"),
    )), tmp_path, fake)
    assert result.phase == NodePhase.FAILED
    assert fake.names() == ["bad"]
    bad = result.node("bad")
    assert bad.phase == NodePhase.FAILED and bad.exit_code == 3
    assert bad.message == "Error (exit code 3): disk full"
    assert result.message == "task 'bad' failed: Error (exit code 3): disk full"
    for name in ("after", "later"):
        node = result.node(name)
        assert node.phase == NodePhase.OMITTED and node.type == NodeType.SKIPPED
    assert result.node("after").message == "not started: task 'bad' failed (failFast)"


def test_depends_expressions_handle_failures(tmp_path: Path) -> None:
    fake = FakeExecutor({"bad": FAIL})
    result = run(wf(ECHO, dag(
        task("bad", "x"),
        task("cleanup", "cleaned", depends="bad.Failed || bad.Errored"),
        task("happy", "h", depends="bad"),
        task("either", "e", depends="!happy.Succeeded && (cleanup || happy)"),
        task("errored", "e", depends="bad.Errored"),
    )), tmp_path, fake)
    assert result.phase == NodePhase.SUCCEEDED, result.message  # bad's failure is handled
    assert fake.names()[0] == "bad" and sorted(fake.names()[1:]) == ["cleanup", "either"]
    assert result.node("happy").phase == NodePhase.OMITTED
    assert result.node("errored").phase == NodePhase.OMITTED
    assert result.node("either").phase == NodePhase.SUCCEEDED


def test_an_error_is_not_a_failure_for_depends(tmp_path: Path) -> None:
    fake = FakeExecutor({"broken": PodOutcome(exit_code=None, error="failed to start 'x'")})
    result = run(wf(ECHO, dag(
        task("broken", "x"),
        task("on-error", "e", depends="broken.Errored"),
        task("on-failure", "f", depends="broken.Failed"),
    )), tmp_path, fake)
    assert result.node("broken").phase == NodePhase.ERROR
    assert result.node("broken").message == "failed to start 'x'"
    assert result.node("on-error").phase == NodePhase.SUCCEEDED
    assert result.node("on-failure").phase == NodePhase.OMITTED
    assert "on-failure" not in fake.names()


def test_dependencies_list_and_continue_on(tmp_path: Path) -> None:
    fake = FakeExecutor({"bad": FAIL})
    text = wf(ECHO, """
    - name: main
      dag:
        tasks:
        - {name: bad, template: echo, continueOn: {failed: true},
           arguments: {parameters: [{name: m, value: x}]}}
        - {name: ok, template: echo, arguments: {parameters: [{name: m, value: y}]}}
        - {name: next, template: echo, dependencies: [bad, ok],
           arguments: {parameters: [{name: m, value: "{{tasks.bad.status}}"}]}}
    """)
    result = run(text, tmp_path, fake)
    assert result.phase == NodePhase.SUCCEEDED
    assert fake.request("next").argv == ["echo", "Failed"]


@pytest.mark.parametrize("fail_fast", [True, False])
def test_fail_fast_stops_new_tasks_but_lets_running_ones_finish(tmp_path: Path,
                                                                fail_fast: bool) -> None:
    bad_failed = threading.Event()

    def slow(request: PodRequest) -> PodOutcome:
        assert bad_failed.wait(5)
        time.sleep(0.2)  # ends well after the DAG has seen bad's failure
        return PodOutcome()

    def watch(event: RunEvent) -> None:
        node = event.node
        if node is not None and node.display_name == "bad" and node.phase.failed:
            bad_failed.set()

    fake = FakeExecutor({"bad": FAIL, "slow": slow})
    events: list[RunEvent] = []
    text = wf(ECHO, dag(task("bad", "x"), task("slow", "s"), task("late", "l", depends="slow"),
                        failFast=str(fail_fast).lower()))
    workflow = load_manifest(textwrap.dedent(text))
    result = run_workflow(workflow, {}, RunOptions(
        home=tmp_path, reporter=lambda e: (events.append(e), watch(e)), executor=fake))
    assert result.phase == NodePhase.FAILED
    assert result.node("slow").phase == NodePhase.SUCCEEDED  # running tasks finish
    if fail_fast:
        assert "late" not in fake.names()
        assert result.node("late").phase == NodePhase.OMITTED
        assert result.node("late").message == "not started: task 'bad' failed (failFast)"
    else:
        assert result.node("late").phase == NodePhase.SUCCEEDED


def test_dag_plan_decides_without_running_anything() -> None:
    plan = DagPlan({"tasks": [
        {"name": "a", "template": "t"},
        {"name": "b", "template": "t", "depends": "a"},
        {"name": "c", "template": "t", "depends": "a.Failed"},
        {"name": "d", "template": "t", "depends": "b || c"},
        {"name": "loop1", "template": "t", "depends": "loop2"},
        {"name": "loop2", "template": "t", "depends": "loop1"},
    ]})
    assert plan.roots() == ["a"]
    assert [(d.task, d.runs) for d in plan.next()] == [("a", True)]
    assert plan.next() == []  # a is running: nothing else can be decided
    plan.finished("a", NodePhase.SUCCEEDED)
    decisions = plan.next()
    assert [(d.task, d.runs) for d in decisions] == [("b", True), ("c", False)]
    assert "'a.Failed' is false" in decisions[1].message
    plan.finished("b", NodePhase.SUCCEEDED)
    assert [(d.task, d.runs) for d in plan.next()] == [("d", True)]
    plan.finished("d", NodePhase.SUCCEEDED)
    # only once nothing runs can the tasks still waiting be known to wait on each other
    assert [(d.task, d.runs, d.message) for d in plan.next()] == [
        ("loop1", False, "dependency cycle"), ("loop2", False, "dependency cycle")]
    assert plan.complete and not plan.unhandled


def test_dag_plan_fail_fast_and_loop_results() -> None:
    plan = DagPlan({"tasks": [
        {"name": "fan", "template": "t"},
        {"name": "any", "template": "t", "depends": "fan.AnySucceeded"},
        {"name": "all", "template": "t", "depends": "fan.AllFailed"},
        {"name": "x", "template": "t"},
        {"name": "after-x", "template": "t", "depends": "x"},
    ]})
    assert [d.task for d in plan.next()] == ["fan", "x"]
    plan.finished("x", NodePhase.FAILED)
    assert plan.unhandled == ["x"] and plan.halted == "task 'x' failed (failFast)"
    assert [(d.task, d.runs) for d in plan.next()] == [("after-x", False)]
    plan.finished("fan", NodePhase.FAILED, (NodePhase.SUCCEEDED, NodePhase.FAILED))
    decisions = plan.next()
    # failFast: nothing new starts, whatever the conditions say
    assert [(d.task, d.runs) for d in decisions] == [("any", False), ("all", False)]
    # fan's failure is handled by the tasks that test it
    assert plan.unhandled == ["x"]


def test_depends_in_words() -> None:
    assert describe_depends(parse_depends("train")) == "train succeeds"
    assert describe_depends(parse_depends("B && C")) == "B and C succeed"
    assert describe_depends(parse_depends("a && b && c")) == "a, b and c succeed"
    assert describe_depends(parse_depends("a.Failed || (b && !c.Skipped)")) == \
        "a fails or (b succeeds and not (c is skipped))"
    assert describe_depends(parse_depends("fan.AnySucceeded")) == "any of fan succeeds"


# ---------------------------------------------------------------------------------- steps


def test_steps_run_group_by_group_and_stop_after_a_failed_group(tmp_path: Path) -> None:
    fake = FakeExecutor({"fail": FAIL})
    text = wf(ECHO, """
    - name: main
      steps:
      - - {name: one, template: echo, arguments: {parameters: [{name: m, value: "1"}]}}
        - {name: two, template: echo, arguments: {parameters: [{name: m, value: "2"}]}}
      - - name: sum
          template: echo
          arguments:
            parameters:
            - {name: m, value: "{{steps.one.outputs.result}}+{{steps.two.outputs.result}}"}
        - {name: fail, template: echo, arguments: {parameters: [{name: m, value: x}]}}
      - - {name: never, template: echo, arguments: {parameters: [{name: m, value: x}]}}
    """)
    result = run(text, tmp_path, fake)
    assert result.phase == NodePhase.FAILED
    assert sorted(fake.names()[:2]) == ["one", "two"]
    assert sorted(fake.names()[2:]) == ["fail", "sum"]
    assert fake.request("sum").argv == ["echo", "1+2"]
    groups = [n for n in result.nodes if n.type == NodeType.STEP_GROUP]
    assert [(g.display_name, g.phase) for g in groups] == [
        ("[0]", NodePhase.SUCCEEDED), ("[1]", NodePhase.FAILED)]
    assert result.message == "step 'fail' failed: Error (exit code 1)"


def test_when_conditions_skip_nodes_before_the_executor(tmp_path: Path) -> None:
    fake = FakeExecutor({"flip": PodOutcome(stdout="heads")})
    text = wf(ECHO, """
    - name: main
      steps:
      - - {name: flip, template: echo, arguments: {parameters: [{name: m, value: x}]}}
      - - {name: heads, template: echo, when: "{{steps.flip.outputs.result}} == heads",
           arguments: {parameters: [{name: m, value: x}]}}
        - {name: tails, template: echo, when: "{{steps.flip.outputs.result}} == tails",
           arguments: {parameters: [{name: m, value: x}]}}
        - {name: big, template: echo, when: "{{workflow.parameters.n}} > 5",
           arguments: {parameters: [{name: m, value: x}]}}
        - {name: broken, template: echo, when: "{{steps.nope.outputs.result}} == 1",
           arguments: {parameters: [{name: m, value: x}]}}
    """, extra="arguments: {parameters: [{name: n, value: '3'}]}\n")
    result = run(text, tmp_path, fake)
    assert sorted(fake.names()) == ["flip", "heads"]
    assert result.node("tails").phase == NodePhase.SKIPPED
    assert result.node("tails").message == "when 'heads == tails' evaluated false"
    assert result.node("big").phase == NodePhase.SKIPPED
    assert result.node("broken").phase == NodePhase.ERROR
    assert "unable to resolve {{steps.nope.outputs.result}}" in result.node("broken").message


# ---------------------------------------------------------------------------------- loops


def test_loops_expand_items_params_and_sequences(tmp_path: Path) -> None:
    fake = FakeExecutor({"gen": PodOutcome(stdout='[{"os": "linux"}, {"os": "mac"}]')})
    text = wf(ECHO, dag(
        task("scalars", "{{item}}", withItems=["a", "b"]),
        task("gen", "x"),
        task("fan", "{{item.os}}", depends="gen", withParam="{{tasks.gen.outputs.result}}"),
        task("seq", "{{item}}", withSequence={"start": "1", "end": "3", "format": "w%02d"}),
        task("down", "{{item}}", withSequence={"start": "2", "end": "0"}),
        task("none", "{{item}}", withItems=[]),
        task("collect", "{{tasks.fan.outputs.result}}", depends="fan && scalars"),
    ))
    result = run(text, tmp_path, fake)
    assert result.phase == NodePhase.SUCCEEDED, result.message
    assert {"scalars(0:a)", "scalars(1:b)", "fan(0:os:linux)", "fan(1:os:mac)",
            "seq(0:w01)", "seq(2:w03)", "down(0:2)", "down(2:0)"} <= set(fake.names())
    assert fake.request("fan(1:os:mac)").argv == ["echo", "mac"]
    assert result.node("fan").type == NodeType.TASK_GROUP
    assert result.node("none").phase == NodePhase.SKIPPED
    assert fake.request("collect").argv == ["echo", '["linux", "mac"]']


def test_a_failed_loop_child_fails_the_group(tmp_path: Path) -> None:
    fake = FakeExecutor({"fan(1:b)": FAIL})
    result = run(wf(ECHO, dag(
        task("fan", "{{item}}", withItems=["a", "b", "c"]),
        task("any", "x", depends="fan.AnySucceeded"),
    )), tmp_path, fake)
    assert result.node("fan").phase == NodePhase.FAILED
    assert result.node("fan").message == "child 'fan(1:b)' failed"
    assert result.node("any").phase == NodePhase.SUCCEEDED
    assert result.phase == NodePhase.SUCCEEDED  # AnySucceeded handles fan's failure


def test_bad_with_param_is_an_error_that_never_reaches_the_executor(tmp_path: Path) -> None:
    fake = FakeExecutor({"gen": PodOutcome(stdout="not json")})
    result = run(wf(ECHO, dag(
        task("gen", "x"),
        task("fan", "{{item}}", depends="gen", withParam="{{tasks.gen.outputs.result}}"),
    )), tmp_path, fake)
    assert fake.names() == ["gen"]
    assert result.node("fan").phase == NodePhase.ERROR
    assert "is not a JSON list" in result.node("fan").message


# -------------------------------------------------------------------------------- retries


def test_retries_until_success_and_each_attempt_sees_its_number(tmp_path: Path) -> None:
    fake = FakeExecutor({"main": [FAIL, PodOutcome(exit_code=None, error="no"),
                                  PodOutcome(stdout="done")]})
    result = run(wf("""
    - name: main
      retryStrategy: {limit: "3", retryPolicy: Always, backoff: {duration: "0.05s", factor: 2}}
      container: {command: [echo, "attempt {{retries}}"]}
    """), tmp_path, fake)
    assert result.phase == NodePhase.SUCCEEDED
    root = result.node(result.name)
    assert root.type == NodeType.RETRY and root.result == "done"
    assert fake.names() == [f"{result.name}({i})" for i in range(3)]
    assert [r.argv[1] for r in fake.requests] == ["attempt 0", "attempt 1", "attempt 2"]
    attempts = [result.node(f"{result.name}({i})") for i in range(3)]
    assert [a.phase for a in attempts] == [NodePhase.FAILED, NodePhase.ERROR, NodePhase.SUCCEEDED]
    gap = (attempts[2].started_at - attempts[1].finished_at).total_seconds()
    assert gap >= 0.09  # 0.05s x 2 after the second attempt


@pytest.mark.parametrize(("policy", "outcome", "attempts"), [
    ("OnFailure", FAIL, 3),
    ("OnFailure", PodOutcome(exit_code=None, error="cannot start"), 1),
    ("OnError", FAIL, 1),
    ("OnError", PodOutcome(exit_code=None, error="cannot start"), 3),
    ("OnTransientError", FAIL, 1),
])
def test_retry_policy_says_what_is_retried(tmp_path: Path, policy: str, outcome: PodOutcome,
                                           attempts: int) -> None:
    fake = FakeExecutor({"main": outcome})
    result = run(wf(f"""
    - name: main
      retryStrategy: {{limit: 2, retryPolicy: {policy}}}
      container: {{command: [echo]}}
    """), tmp_path, fake)
    assert len(fake.requests) == attempts
    assert result.phase == outcome_phase(outcome)


def outcome_phase(outcome: PodOutcome) -> NodePhase:
    return NodePhase.ERROR if outcome.error else NodePhase.FAILED


# ------------------------------------------------------------------------- exit handlers


def test_exit_handler_sees_status_and_failures(tmp_path: Path) -> None:
    fake = FakeExecutor({"bad": PodOutcome(exit_code=2, message="no data")})
    result = run(wf(ECHO, dag(task("bad", "x")), """
    - name: exit
      container: {command: [echo, "{{workflow.status}}", "{{workflow.failures}}"]}
    """, extra="onExit: exit\n"), tmp_path, fake)
    assert fake.names() == ["bad", "onExit"]
    status, failures = fake.request("onExit").argv[1:]
    assert status == "Failed"
    # Argo quotes it (decode twice) and lists every failed node, the DAG's too
    failure = next(f for f in json.loads(json.loads(failures)) if f["displayName"] == "bad")
    assert failure["displayName"] == "bad" and failure["phase"] == "Failed"
    assert failure["message"] == "Error (exit code 2): no data"
    assert result.phase == NodePhase.FAILED and result.node("onExit").parent is None


def test_a_failed_exit_handler_fails_a_successful_workflow(tmp_path: Path) -> None:
    fake = FakeExecutor({"onExit": FAIL})
    result = run(wf(ECHO, dag(task("ok", "x")), """
    - name: exit
      container: {command: [echo, "{{workflow.status}}"]}
    """, extra="onExit: exit\n"), tmp_path, fake)
    assert fake.request("onExit").argv == ["echo", "Succeeded"]
    assert result.phase == NodePhase.FAILED
    assert result.message == "exit handler failed: Error (exit code 1)"


# ------------------------------------------------------------------ pods: the plan itself


ESCAPE = """
- name: main
  container:
    command: [sh, -c, "echo pwned > /mnt/out/x"]
    image: ignored
    volumeMounts: [{name: data, mountPath: /mnt/out, subPath: "SUB"}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: shared}}]
"""


@pytest.mark.parametrize("how", ["parameter", "link"])
def test_a_sub_path_that_leaves_its_volume_is_refused_before_the_pod_runs(
        tmp_path: Path, how: str) -> None:
    # The runner wrote, as root, into host folders outside SUBLIMATE_HOME through a subPath that
    # a parameter filled with ../.. , or through a link an earlier step left on the volume.
    home, outside = tmp_path / "home", tmp_path / "outside"
    outside.mkdir()
    if how == "parameter":
        sub_path = "users/{{workflow.parameters.user}}"
        params = {"user": f"../../../../{outside.name}"}
        refusal = "must not contain '..'"
    else:
        volume = home / "volumes" / "shared"
        volume.mkdir(parents=True)
        (volume / "trap").symlink_to(outside)
        sub_path, params = "trap/inner", {}
        refusal = "'trap/inner' leaves volume 'data' through a link on it"
    fake = FakeExecutor()
    result = run(wf(ESCAPE.replace("SUB", sub_path),
                    extra="arguments: {parameters: [{name: user, value: alice}]}\n"),
                 home, fake, params=params)
    assert fake.requests == []  # no pod ran
    node = result.node(result.name)
    assert node.phase == NodePhase.ERROR
    assert node.message.startswith("volumeMounts[0].subPath: ") and refusal in node.message
    assert list(outside.iterdir()) == []


def test_a_sub_path_written_out_that_kubernetes_refuses_fails_the_check(tmp_path: Path) -> None:
    for sub_path, refusal in [("../../elsewhere", "must not contain '..'"),
                              ("/etc", "must be a relative path")]:
        with pytest.raises(ManifestError) as info:
            run(wf(ESCAPE.replace("SUB", sub_path)), tmp_path, FakeExecutor())
        assert f"spec.templates[0].container.volumeMounts[0].subPath: Invalid value: " \
            f"{sub_path!r}: {refusal}" in str(info.value)
        assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("meta", ["name: ../../escaped", "name: a/b",
                                  "generateName: ../../escaped-"])
def test_a_workflow_name_kubernetes_refuses_names_no_run_folder(tmp_path: Path,
                                                                 meta: str) -> None:
    # metadata.name ../../x put the run folder outside SUBLIMATE_HOME; a/b ended in a traceback
    home = tmp_path / "home"
    text = wf(ECHO, dag(task("a", "x"))).replace("metadata: {generateName: t-}",
                                                 f"metadata: {{{meta}}}")
    key, _, value = meta.partition(": ")
    with pytest.raises(ManifestError, match=re.escape(f"metadata.{key}: Invalid value: "
                                                      f"{value!r}: a lowercase RFC 1123")):
        run(text, home, FakeExecutor())
    assert list(tmp_path.iterdir()) == []  # no run folder, here or above


def test_an_input_artifact_sub_path_stays_inside_its_artifact(tmp_path: Path) -> None:
    stored = tmp_path / "artifacts" / "repository" / "run" / "model"  # the home's repository
    stored.mkdir(parents=True)
    with pytest.raises(NodeError, match=re.escape("input artifact 'm': subPath: Invalid value: "
                                                  "'../../../etc': must not contain '..'")):
        input_source({"name": "m", "from": str(stored), "subPath": "../../../etc"}, tmp_path)
    (stored / "link").symlink_to(tmp_path)
    with pytest.raises(NodeError, match=re.escape("'link/x' leaves the artifact through a link")):
        input_source({"name": "m", "from": str(stored), "subPath": "link/x"}, tmp_path)
    assert input_source({"name": "m", "from": str(stored), "subPath": "a/b"}, tmp_path) == \
        stored / "a" / "b"


def test_a_pod_request_is_resolved_and_rewritten(tmp_path: Path) -> None:
    fake = FakeExecutor()
    result = run(wf("""
    - name: main
      inputs: {parameters: [{name: lr, value: "0.1"}]}
      timeout: "1m"
      activeDeadlineSeconds: 30
      container:
        command: [python, -m, trainer]
        args: [--lr, "{{inputs.parameters.lr}}", --data, /mnt/data/set, --out, /tmp/o/model]
        workingDir: /work
        env:
        - {name: ROOT, value: /mnt/data}
        - {name: RUN, value: "{{workflow.name}}"}
        - name: TOKEN
          valueFrom: {secretKeyRef: {name: s, key: t, optional: true}}
        volumeMounts: [{name: data, mountPath: /mnt/data, subPath: part}]
        image: ignored
      volumes: [{name: data, persistentVolumeClaim: {claimName: shared}}]
      outputs: {parameters: [{name: model, valueFrom: {path: /tmp/o/model}}]}
    """), tmp_path, fake)
    [request] = fake.requests
    data = tmp_path / "volumes" / "shared" / "part"
    node = result.node(result.name)
    fs = request.folder / "fs"
    assert request.folder.parent == result.run_dir / "nodes"
    assert request.argv == ["python", "-m", "trainer", "--lr", "0.1", "--data", f"{data}/set",
                            "--out", f"{fs}/tmp/o/model"]
    assert request.env == {"ROOT": str(data), "RUN": result.name}
    assert request.from_environment == ["TOKEN"]
    assert request.cwd == fs / "work" and request.cwd.is_dir()
    assert request.deadline_s == 30
    assert [(m.path, m.local, m.kind, m.shared) for m in request.mounts] == [
        ("/mnt/data", data, "persistentVolumeClaim shared", True),
        ("/tmp/o/model", fs / "tmp/o/model", "", False),
        ("/work", fs / "work", "", False),
    ]
    assert request.runner_env["SUBLIMATE_TERMINATION_LOG"] == str(request.termination_log)
    assert request.runner_env["SUBLIMATE_LOCAL_RUN_FOLDER"] == str(result.run_dir)
    assert node.log == request.log
    # the pod wrote no output: the node errs, as with a real process
    assert node.phase == NodePhase.ERROR
    assert node.message == "output parameter 'model': /tmp/o/model not found"


def test_outputs_written_by_the_pod_flow_on_and_paths_read_as_container_paths(
        tmp_path: Path) -> None:
    def produce(request: PodRequest) -> PodOutcome:
        where = request.output_files()["where"]
        where.write_text(str(request.local("/mnt/work/data")))  # a step reports a local path
        (request.local("/mnt/work/data")).mkdir(parents=True)
        return PodOutcome(stdout=f"wrote {request.local('/mnt/work/data')}\n")

    fake = FakeExecutor({"produce": produce})
    result = run(wf("""
    - name: main
      dag:
        tasks:
        - {name: produce, template: produce}
        - name: use
          template: use
          depends: produce
          arguments:
            parameters: [{name: w, value: "{{tasks.produce.outputs.parameters.where}}"}]
      outputs:
        parameters:
        - {name: where, globalName: where,
           valueFrom: {parameter: "{{tasks.produce.outputs.parameters.where}}"}}
    - name: produce
      container: {command: [make], volumeMounts: [{name: work, mountPath: /mnt/work}]}
      outputs: {parameters: [{name: where, valueFrom: {path: /tmp/where}}]}
    - name: use
      inputs: {parameters: [{name: w}]}
      container: {command: [use, "{{inputs.parameters.w}}"],
                  volumeMounts: [{name: work, mountPath: /mnt/work}]}
    """, extra="volumes: [{name: work, persistentVolumeClaim: {claimName: vol}}]\n"),
        tmp_path, fake)
    assert result.phase == NodePhase.SUCCEEDED, result.message
    produced = result.node("produce")
    assert produced.parameters == {"where": "/mnt/work/data"}
    assert produced.result == "wrote /mnt/work/data"
    local = tmp_path / "volumes" / "vol" / "data"
    assert fake.request("use").argv == ["use", str(local)]  # rewritten again for the next pod
    assert result.outputs["parameters"] == {"where": "/mnt/work/data"}
    assert result.links == {"where": result.run_dir / "outputs" / "where"}


def test_termination_message_paths_are_restored(tmp_path: Path) -> None:
    def fail(request: PodRequest) -> PodOutcome:
        return PodOutcome(exit_code=2, message=f"{request.local('/data/x')} is empty")

    fake = FakeExecutor({"main": fail})
    result = run(wf("""
    - name: main
      container: {command: [check], volumeMounts: [{name: d, mountPath: /data}]}
      volumes: [{name: d, emptyDir: {}}]
    """), tmp_path, fake)
    assert result.node(result.name).message == "Error (exit code 2): /data/x is empty"


def test_input_artifacts_are_placed_before_the_executor_runs(tmp_path: Path) -> None:
    def make(request: PodRequest) -> PodOutcome:
        request.artifact_paths()["f"].write_text("data")
        return PodOutcome()

    def use(request: PodRequest) -> PodOutcome:
        return PodOutcome(stdout=request.local("/in/f").read_text()
                          + request.local("/in/raw").read_text())

    fake = FakeExecutor({"make": make, "use": use})
    result = run(wf("""
    - name: main
      steps:
      - - {name: make, template: make}
      - - name: use
          template: use
          arguments: {artifacts: [{name: f, from: "{{steps.make.outputs.artifacts.f}}"}]}
    - name: make
      container: {command: [make]}
      outputs: {artifacts: [{name: f, path: /out/f}]}
    - name: use
      inputs: {artifacts: [{name: f, path: /in/f}, {name: r, path: /in/raw, raw: {data: "+raw"}}]}
      container: {command: [use]}
    """), tmp_path, fake)
    assert result.phase == NodePhase.SUCCEEDED, result.message
    assert result.node("use").result == "data+raw"


# ------------------------------------------------------------- scheduling and stopping


def test_parallelism_limits_pods_in_flight(tmp_path: Path) -> None:
    def slow(request: PodRequest) -> PodOutcome:
        time.sleep(0.1)
        return PodOutcome()

    loop = task("p", "x", withItems=[1, 2, 3, 4])
    one = FakeExecutor({"p": slow})
    run(wf(ECHO, dag(loop)), tmp_path, one, parallelism=1)  # the workflow's, from the options
    assert one.most_running == 1
    two = FakeExecutor({"p": slow})
    run(wf(ECHO, dag(loop).replace("  dag:", "  parallelism: 2\n  dag:")), tmp_path, two)
    assert two.most_running == 2  # the template's


def test_a_deadline_stops_the_pod_through_its_handle(tmp_path: Path) -> None:
    @with_handle
    def hang(request: PodRequest, handle: _Handle) -> PodOutcome:
        assert handle.stopped.wait(5), "the deadline never stopped the pod"
        return PodOutcome(exit_code=-15, stopped=True)

    fake = FakeExecutor({"hang": hang})
    began = time.monotonic()
    result = run(wf("""
    - name: main
      steps:
      - - {name: hang, template: hang}
      - - {name: next, template: hang}
    - name: hang
      timeout: "0.2s"
      container: {command: [sleep]}
    """), tmp_path, fake)
    assert time.monotonic() - began < 3
    assert fake.names() == ["hang"]
    assert result.node("hang").phase == NodePhase.FAILED
    assert result.node("hang").message == "'hang' exceeded its deadline of 0.2s"
    assert result.phase == NodePhase.FAILED
