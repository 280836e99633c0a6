"""Template-level failFast and in-process synchronization (mutexes, semaphores) of the runner.

Semantics: operator.go checkParallelism (failFast), workflow/sync (locks and their messages).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from sublimate.pipelines.argo_terms import NodePhase
from sublimate.pipelines.runner import ManifestError, RunOptions, load_manifest, run_workflow
from sublimate.pipelines.runner.records.run_types import RunEvent

FAIL_FAST = "template has failed or errored children and failFast enabled"


def wf(templates: str, extra: str = "") -> str:
    return ("apiVersion: argoproj.io/v1alpha1\nkind: Workflow\nmetadata: {name: sync}\n"
            f"spec:\n  entrypoint: main\n{textwrap.indent(textwrap.dedent(extra), '  ')}"
            f"  templates:\n{textwrap.indent(textwrap.dedent(templates), '  ')}")


def run(text: str, home: Path, semaphores: dict[str, int] | None = None,
        events: list[RunEvent] | None = None):
    sink: list[RunEvent] = [] if events is None else events
    return run_workflow(load_manifest(text), {}, RunOptions(
        home=home, reporter=sink.append, semaphores=semaphores or {}))


def _windows(folder: Path) -> list[tuple[float, float]]:
    spans = []
    # each task is a pod with files of its own: they log on a volume (home/volumes/<claim>)
    for line in (folder / "home" / "volumes" / "windows" / "log").read_text().split("\n"):
        if line.strip():
            start, end = line.split()
            spans.append((float(start), float(end)))
    return spans


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    most = current = 0
    for _, step in points:
        current += step
        most = max(most, current)
    return most


LOCKED = """
- name: main
  dag:
    tasks:
{tasks}
- name: work
  synchronization: {sync}
  volumes: [{{name: windows, persistentVolumeClaim: {{claimName: windows}}}}]
  container:
    command: [sh, -c, 'a=$(date +%s.%N); sleep 0.4; echo "$a $(date +%s.%N)" >> /log/log']
    volumeMounts: [{{name: windows, mountPath: /log}}]
"""


def test_a_mutex_lets_one_task_run_at_a_time(tmp_path: Path) -> None:
    tasks = "\n".join(f"    - {{name: t{i}, template: work}}" for i in range(2))
    events: list[RunEvent] = []
    result = run(wf(LOCKED.format(tasks=tasks, sync="{mutexes: [{name: one}]}")),
                 tmp_path / "home", events=events)
    assert result.phase == NodePhase.SUCCEEDED
    spans = _windows(tmp_path)
    assert len(spans) == 2 and _most_at_once(spans) == 1
    # sync/semaphore.go checkAcquire: the waiting node's message while Pending
    assert any(e.phase == NodePhase.PENDING and e.message ==
               "Waiting for default/Mutex/one lock. Lock status: 0/1" for e in events)


def test_pending_timeout_fails_a_node_still_waiting_for_its_lock(tmp_path: Path) -> None:
    # operator.go checkTemplateTimeouts: Pending past StartedAt + pendingTimeout -> Failed
    # "timeout". Two tasks want one mutex: the first holds it for 2 s, the second may wait 0.5 s.
    text = wf("""
        - name: main
          dag:
            tasks:
            - {name: a, template: work}
            - {name: b, template: work}
        - name: work
          pendingTimeout: 500ms
          synchronization: {mutexes: [{name: one}]}
          container: {command: [sleep, "2"]}
        """)
    result = run(text, tmp_path / "home")
    ran, waited = sorted((result.node("a"), result.node("b")),
                         key=lambda n: n.phase != NodePhase.SUCCEEDED)
    assert ran.phase == NodePhase.SUCCEEDED
    assert waited.phase == NodePhase.FAILED and waited.message == "timeout", result.nodes
    assert waited.finished_at < ran.finished_at  # gave up while the lock was still held


def test_pending_timeout_is_refused_on_a_dag_template(tmp_path: Path) -> None:
    text = wf("""
        - name: main
          pendingTimeout: 1m
          dag: {tasks: [{name: a, template: leaf}]}
        - name: leaf
          container: {command: [echo]}
        """)
    with pytest.raises(ManifestError, match="DAG template doesn't support pendingTimeout field"):
        run(text, tmp_path / "home")


def test_a_semaphore_of_two_runs_at_most_two(tmp_path: Path) -> None:
    tasks = "\n".join(f"    - {{name: t{i}, template: work}}" for i in range(4))
    sync = "{semaphores: [{configMapKeyRef: {name: limits, key: work}}]}"
    result = run(wf(LOCKED.format(tasks=tasks, sync=sync)), tmp_path / "home",
                 semaphores={"limits/work": 2})
    assert result.phase == NodePhase.SUCCEEDED
    spans = _windows(tmp_path)
    assert len(spans) == 4 and _most_at_once(spans) == 2


def test_a_semaphore_without_a_limit_is_refused_by_name(tmp_path: Path) -> None:
    sync = "{semaphores: [{configMapKeyRef: {name: limits, key: work}}]}"
    text = wf(LOCKED.format(tasks="    - {name: t, template: work}", sync=sync))
    with pytest.raises(ManifestError, match=r"semaphore 'limits/work' has no limit.*--semaphore"):
        run(text, tmp_path / "home")
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").rglob("status.json"))


def test_a_semaphore_limit_from_a_configmap_next_to_the_manifest(tmp_path: Path) -> None:
    from sublimate.pipelines.runner.pods.k8s_objects import manifest_objects
    from sublimate.pipelines.runner.templates.synchronization import configmap_limits

    (tmp_path / "limits.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: limits}\ndata: {work: '3'}\n")
    manifest = tmp_path / "wf.yaml"
    manifest.write_text("kind: Workflow\n")
    assert configmap_limits(manifest_objects(manifest)) == {"limits/work": 3}


def test_workflow_level_mutex_is_held_by_the_run(tmp_path: Path) -> None:
    text = wf("- name: main\n  container: {command: [echo, hi]}\n",
              extra="synchronization: {mutexes: [{name: whole}]}\n")
    assert run(text, tmp_path).phase == NodePhase.SUCCEEDED


def test_dag_template_fail_fast_starts_no_new_task(tmp_path: Path) -> None:
    # A failure continueOn handles still counts (node_counters.go getUnsuccessfulChildren).
    result = run(wf("""
    - name: main
      failFast: true
      dag:
        tasks:
        - {name: bad, template: fail, continueOn: {failed: true}}
        - {name: later, template: ok, depends: bad}
    - name: fail
      container: {command: [sh, -c, "exit 1"]}
    - name: ok
      container: {command: [echo]}
    """), tmp_path)
    assert result.phase == NodePhase.FAILED
    assert result.node("sync").message == FAIL_FAST
    assert result.node("later").phase == NodePhase.OMITTED


def test_steps_template_fail_fast_fails_the_group(tmp_path: Path) -> None:
    result = run(wf("""
    - name: main
      failFast: true
      parallelism: 1
      steps:
      - - {name: a, template: fail, continueOn: {failed: true}}
        - {name: b, template: ok}
      - - {name: c, template: ok}
    - name: fail
      container: {command: [sh, -c, "exit 1"]}
    - name: ok
      container: {command: [echo]}
    """), tmp_path)
    assert result.phase == NodePhase.FAILED
    assert result.node("sync").message == FAIL_FAST
    assert result.node("[0]").message == FAIL_FAST
    assert result.node("b").phase == NodePhase.OMITTED
    assert not any(n.display_name == "c" for n in result.nodes)


def test_without_template_fail_fast_a_handled_failure_goes_on(tmp_path: Path) -> None:
    result = run(wf("""
    - name: main
      steps:
      - - {name: a, template: fail, continueOn: {failed: true}}
      - - {name: c, template: ok}
    - name: fail
      container: {command: [sh, -c, "exit 1"]}
    - name: ok
      container: {command: [echo]}
    """), tmp_path)
    assert result.phase == NodePhase.SUCCEEDED
