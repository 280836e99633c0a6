"""End-to-end tests of the local runner's execution semantics, with tiny script steps."""

from __future__ import annotations

import itertools
import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from sublimate.pipelines.runner import (
    RunEvent,
    RunOptions,
    RunResult,
    format_table,
    load_manifest,
    run_workflow,
)
from tests.conftest import REPO

MANIFESTS = REPO / "tests" / "manifests" / "runner"


def run(text: str, home: Path, params: dict[str, str] | None = None, **options) -> RunResult:
    events: list[RunEvent] = []
    workflow = load_manifest(textwrap.dedent(text))
    return run_workflow(
        workflow, params or {}, RunOptions(home=home, reporter=events.append, **options)
    )


def wf(*parts: str, entry: str = "main", extra: str = "") -> str:
    """A Workflow document around template YAML snippets (each dedented on its own)."""
    templates = "".join(textwrap.dedent(part).strip("\n") + "\n" for part in parts)
    return (
        "apiVersion: argoproj.io/v1alpha1\nkind: Workflow\n"
        "metadata: {generateName: t-}\n"
        f"spec:\n  entrypoint: {entry}\n{textwrap.indent(textwrap.dedent(extra), '  ')}"
        f"  templates:\n{textwrap.indent(textwrap.dedent(templates), '  ')}"
    )


SH = """
- name: sh
  inputs: {parameters: [{name: cmd}]}
  script: {command: [sh], source: "{{inputs.parameters.cmd}}"}
"""


def test_diamond_dag_runs_branches_in_parallel_and_passes_results(tmp_path: Path) -> None:
    result = run((MANIFESTS / "diamond.yaml").read_text(), tmp_path)
    assert result.phase == "Succeeded"
    b, c, d = result.node("B"), result.node("C"), result.node("D")
    assert d.result == "hi-b+c"
    assert b.started_at < c.finished_at and c.started_at < b.finished_at  # overlapped
    assert d.started_at >= max(b.finished_at, c.finished_at)
    on_exit = result.node("onExit")
    assert on_exit.log == result.run_dir / "nodes" / f"onExit-{on_exit.id.rsplit('-', 1)[1]}" \
        / "main.log"  # node folders carry the display name
    assert "status=Succeeded" in on_exit.log.read_text()


def test_failing_branch_omits_downstream_and_exit_handler_sees_failure(tmp_path: Path) -> None:
    text = wf(SH, """
    - name: main
      dag:
        tasks:
        - {name: bad, template: sh, arguments: {parameters: [{name: cmd, value: "exit 3"}]}}
        - {name: after, template: sh, dependencies: [bad],
           arguments: {parameters: [{name: cmd, value: "true"}]}}
    - name: exit
      script:
        command: [python]
        source: |
          import json
          f = json.loads({{workflow.failures}})  # a quoted JSON string, as in Argo
          print("{{workflow.status}}", *[x["displayName"] for x in f if x["templateName"] == "sh"])
    """, extra="onExit: exit\n")
    result = run(text, tmp_path)
    assert result.phase == "Failed"
    assert result.node("bad").phase == "Failed"
    assert result.node("bad").exit_code == 3
    assert result.node("after").phase == "Omitted"
    assert result.node("onExit").result == "Failed bad"


def test_depends_on_failed_is_handled(tmp_path: Path) -> None:
    text = wf(SH, """
    - name: main
      dag:
        tasks:
        - {name: bad, template: sh, arguments: {parameters: [{name: cmd, value: "exit 1"}]}}
        - {name: cleanup, template: sh, depends: "bad.Failed || bad.Errored",
           arguments: {parameters: [{name: cmd, value: "echo cleaned"}]}}
        - {name: happy, template: sh, depends: "bad",
           arguments: {parameters: [{name: cmd, value: "true"}]}}
        - {name: either, template: sh, depends: "!happy.Succeeded && (cleanup || happy)",
           arguments: {parameters: [{name: cmd, value: "true"}]}}
    """)
    result = run(text, tmp_path)
    assert result.phase == "Succeeded", result.message
    assert result.node("cleanup").result == "cleaned"
    assert result.node("happy").phase == "Omitted"
    assert result.node("either").phase == "Succeeded"


def test_fail_fast_stops_new_tasks_and_can_be_disabled(tmp_path: Path) -> None:
    tasks = """
    - name: main
      dag:
        failFast: {ff}
        tasks:
        - {{name: bad, template: sh, arguments: {{parameters: [{{name: cmd, value: "exit 1"}}]}}}}
        - {{name: slow, template: sh,
           arguments: {{parameters: [{{name: cmd, value: "sleep 0.4"}}]}}}}
        - {{name: late, template: sh, depends: slow,
           arguments: {{parameters: [{{name: cmd, value: "true"}}]}}}}
    """
    fast = run(wf(SH, tasks.format(ff="true")), tmp_path)
    assert fast.phase == "Failed"
    assert fast.node("slow").phase == "Succeeded"  # running tasks finish
    assert fast.node("late").phase == "Omitted"
    assert "failFast" in fast.node("late").message
    slow = run(wf(SH, tasks.format(ff="false")), tmp_path)
    assert slow.phase == "Failed"
    assert slow.node("late").phase == "Succeeded"


def test_continue_on_failed_keeps_workflow_green(tmp_path: Path) -> None:
    text = wf(SH, """
    - name: main
      dag:
        tasks:
        - {name: bad, template: sh, continueOn: {failed: true},
           arguments: {parameters: [{name: cmd, value: "exit 1"}]}}
        - {name: next, template: sh, dependencies: [bad],
           arguments: {parameters: [{name: cmd, value: "true"}]}}
    """)
    result = run(text, tmp_path)
    assert result.phase == "Succeeded"
    assert result.node("next").phase == "Succeeded"


def test_a_fan_out_with_a_failed_child_is_failed_yet_continue_on_lets_the_dag_go_on(
        tmp_path: Path) -> None:
    # dag.go: a TaskGroup takes its last failed child's phase whatever continueOn says; the
    # dependent still runs and the workflow still succeeds (continueOn is read by them).
    text = wf(SH, """
    - name: main
      dag:
        tasks:
        - {name: fan, template: sh, continueOn: {failed: true}, withItems: ["true", "exit 3"],
           arguments: {parameters: [{name: cmd, value: "{{item}}"}]}}
        - {name: next, template: sh, depends: fan,
           arguments: {parameters: [{name: cmd, value: "true"}]}}
    """)
    result = run(text, tmp_path)
    assert result.phase == "Succeeded"
    group = result.node("fan")
    assert group.type == "TaskGroup"
    assert group.phase == "Failed"
    assert result.node("next").phase == "Succeeded"


def test_retries_until_success_with_backoff(tmp_path: Path) -> None:
    # Each attempt is a pod of its own, with files of its own: they count on a volume.
    text = wf("""
    - name: main
      retryStrategy: {limit: "3", retryPolicy: Always, backoff: {duration: "0.2s", factor: 2}}
      volumes: [{name: tally, persistentVolumeClaim: {claimName: tally}}]
      script:
        command: [python]
        volumeMounts: [{name: tally, mountPath: /tally}]
        source: |
          from pathlib import Path
          p = Path("/tally/count")
          n = int(p.read_text()) if p.exists() else 0
          p.write_text(str(n + 1))
          print("attempt", "{{retries}}")
          raise SystemExit(0 if n >= 2 else 1)
    """)
    result = run(text, tmp_path)
    assert result.phase == "Succeeded"
    root = result.node(result.name)
    assert root.type == "Retry"
    attempts = [result.node(f"{result.name}({i})") for i in range(3)]
    assert [a.phase for a in attempts] == ["Failed", "Failed", "Succeeded"]
    assert root.result == "attempt 2"
    gap1 = (attempts[1].started_at - attempts[0].finished_at).total_seconds()
    gap2 = (attempts[2].started_at - attempts[1].finished_at).total_seconds()
    # 0.2 s, then 0.2 s * 2: each backoff is waited out; the bounds above them only catch a
    # wait of another order (a loaded machine adds tenths of seconds to a gap)
    assert 0.18 <= gap1 < 3 and 0.38 <= gap2 < 3


def test_retry_limit_exhausted_and_policy_on_error(tmp_path: Path) -> None:
    text = wf("""
    - name: main
      steps:
      - - {name: fails, template: fails}
        - {name: missing, template: missing}
    - name: fails
      retryStrategy: {limit: 1}
      script: {command: [sh], source: "exit 2"}
    - name: missing
      retryStrategy: {limit: 2, retryPolicy: OnFailure}
      container: {command: [/no/such/binary]}
    """)
    result = run(text, tmp_path)
    assert result.phase == "Failed"
    names = {n.name for n in result.nodes}
    fails = next(n for n in result.nodes if n.display_name == "fails")
    assert f"{fails.name}(1)" in names and f"{fails.name}(2)" not in names
    missing = next(n for n in result.nodes if n.display_name == "missing")
    assert missing.phase == "Error" and "failed to start" in missing.message
    assert f"{missing.name}(1)" not in names  # OnFailure does not retry errors


def test_loops_items_maps_param_and_sequence(tmp_path: Path) -> None:
    text = wf(SH, """
    - name: gen
      script: {command: [python], source: "import json; print(json.dumps([1, 2, 3]))"}
    - name: main
      dag:
        tasks:
        - {name: scalars, template: sh, withItems: [a, b],
           arguments: {parameters: [{name: cmd, value: "echo {{item}}"}]}}
        - {name: maps, template: sh, withItems: [{os: linux, v: 1}, {os: mac, v: 2}],
           arguments: {parameters: [{name: cmd, value: "echo {{item.os}}-{{item.v}}"}]}}
        - {name: gen, template: gen}
        - {name: fan, template: sh, depends: gen, withParam: "{{tasks.gen.outputs.result}}",
           arguments: {parameters: [{name: cmd, value: "echo $(({{item}} * 10))"}]}}
        - {name: seq, template: sh, withSequence: {start: "1", end: "3", format: "w%02d"},
           arguments: {parameters: [{name: cmd, value: "echo {{item}}"}]}}
        - {name: collect, template: sh, depends: fan && maps,
           arguments: {parameters: [{name: cmd,
             value: "echo '{{tasks.fan.outputs.result}}' '{{tasks.maps.outputs.result}}'"}]}}
    """)
    result = run(text, tmp_path)
    assert result.phase == "Succeeded", result.message
    displays = {n.display_name: n for n in result.nodes}
    assert displays["scalars(1:b)"].result == "b"
    assert displays["maps(0:os:linux,v:1)"].result == "linux-1"
    assert [displays[f"seq({i}:w0{i + 1})"].result for i in range(3)] == ["w01", "w02", "w03"]
    assert displays["fan"].type == "TaskGroup"
    # Argo aggregates results as a JSON list of strings (only JSON objects are parsed)
    assert displays["collect"].result == '["10", "20", "30"] ["linux-1", "mac-2"]'


def test_when_conditions(tmp_path: Path) -> None:
    text = wf(SH, """
    - name: main
      steps:
      - - {name: flip, template: sh, arguments: {parameters: [{name: cmd, value: "echo heads"}]}}
      - - {name: heads, template: sh, when: "{{steps.flip.outputs.result}} == heads",
           arguments: {parameters: [{name: cmd, value: "true"}]}}
        - {name: tails, template: sh, when: "{{steps.flip.outputs.result}} == 'tails'",
           arguments: {parameters: [{name: cmd, value: "true"}]}}
        - {name: big, template: sh, when: "{{workflow.parameters.n}} > 5 && !(1 == 2)",
           arguments: {parameters: [{name: cmd, value: "true"}]}}
        - {name: regex, template: sh, when: "'{{workflow.parameters.n}}' =~ '^1'",
           arguments: {parameters: [{name: cmd, value: "true"}]}}
    """, extra="arguments: {parameters: [{name: n, value: '10'}]}\n")
    result = run(text, tmp_path)
    assert result.phase == "Succeeded"
    assert result.node("heads").phase == "Succeeded"
    assert result.node("tails").phase == "Skipped"
    assert result.node("big").phase == "Succeeded"
    assert result.node("regex").phase == "Succeeded"
    low = run(text, tmp_path, {"n": "3"})
    assert low.node("big").phase == "Skipped"
    assert low.node("regex").phase == "Skipped"


def test_output_parameters_and_dag_template_outputs(tmp_path: Path) -> None:
    text = wf("""
    - name: produce
      script:
        command: [sh]
        source: "mkdir -p /tmp/o && printf 'v1\\n' > /tmp/o/p.txt && echo done"
      outputs:
        parameters:
        - {name: p, valueFrom: {path: /tmp/o/p.txt}}
        - {name: d, valueFrom: {path: /tmp/o/missing.txt, default: fallback}}
    - name: inner
      dag:
        tasks: [{name: produce, template: produce}]
      outputs:
        parameters:
        - name: out
          globalName: final
          valueFrom: {parameter: "{{tasks.produce.outputs.parameters.p}}"}
    - name: main
      dag:
        tasks:
        - {name: inner, template: inner}
        - {name: use, template: echo, depends: inner,
           arguments: {parameters: [{name: v, value: "{{tasks.inner.outputs.parameters.out}}"}]}}
    - name: echo
      inputs: {parameters: [{name: v}]}
      container: {command: [echo, "got {{inputs.parameters.v}}"]}
    """)
    result = run(text, tmp_path)
    assert result.phase == "Succeeded", result.message
    produce = result.node("produce")
    assert produce.parameters == {"p": "v1", "d": "fallback"}
    assert produce.result == "done"
    assert result.node("inner").parameters == {"out": "v1"}
    assert result.node("use").result == "got v1"
    assert result.outputs["parameters"] == {"final": "v1"}
    # the absolute path went to the node's private folder, not the real /tmp
    assert produce.log is not None
    assert (produce.log.parent / "fs" / "tmp/o/p.txt").exists()


def test_loop_output_parameters_aggregate_as_json(tmp_path: Path) -> None:
    text = wf("""
    - name: sq
      inputs: {parameters: [{name: n}]}
      script:
        command: [sh]
        source: "echo $(({{inputs.parameters.n}} * {{inputs.parameters.n}})) > /tmp/sq"
      outputs: {parameters: [{name: sq, valueFrom: {path: /tmp/sq}}]}
    - name: main
      dag:
        tasks:
        - {name: sq, template: sq, withItems: [2, 3],
           arguments: {parameters: [{name: n, value: "{{item}}"}]}}
        - {name: sum, template: sum, depends: sq,
           arguments: {parameters: [{name: l, value: "{{tasks.sq.outputs.parameters.sq}}"}]}}
    - name: sum
      inputs: {parameters: [{name: l}]}
      script:
        command: [python]
        source: "import json; print(sum(map(int, json.loads('{{inputs.parameters.l}}'))))"
    """)
    result = run(text, tmp_path)
    assert result.phase == "Succeeded", result.message
    assert result.node("sum").result == "13"


def test_artifacts_pass_between_nodes(tmp_path: Path) -> None:
    text = wf("""
    - name: make
      script:
        command: [sh]
        source: "mkdir -p /out/dir && echo data > /out/file.txt && echo x > /out/dir/a"
      outputs:
        artifacts:
        - {name: f, path: /out/file.txt}
        - {name: d, path: /out/dir}
        - {name: none, path: /out/nothing, optional: true}
    - name: use
      inputs:
        artifacts:
        - {name: f, path: /in/f.txt}
        - {name: d, path: /in/d}
        - {name: r, path: /in/raw.txt, raw: {data: "raw text"}}
      script:
        command: [sh]
        source: "cat {{inputs.artifacts.f.path}} /in/d/a /in/raw.txt"
    - name: main
      steps:
      - - {name: make, template: make}
      - - name: use
          template: use
          arguments:
            artifacts:
            - {name: f, from: "{{steps.make.outputs.artifacts.f}}"}
            - {name: d, from: "{{steps.make.outputs.artifacts.d}}"}
    """)
    result = run(text, tmp_path)
    assert result.phase == "Succeeded", result.message
    assert result.node("use").result == "data\nx\nraw text"
    stored = Path(result.node("make").artifacts["f"])
    # Argo's default: a tarball at {{workflow.name}}/{{pod.name}}/<name>.tgz in the repository
    assert stored.name == "f.tgz" and stored.read_bytes()[:2] == b"\x1f\x8b"
    assert stored.parent.parent.parent == tmp_path / "artifacts" / "repository" / "default"
    assert "none" not in result.node("make").artifacts


def test_missing_required_output_artifact_errors(tmp_path: Path) -> None:
    text = wf("""
    - name: main
      script: {command: [sh], source: "true"}
      outputs: {artifacts: [{name: a, path: /out/a}]}
    """)
    result = run(text, tmp_path)
    assert result.phase == "Error"
    assert "output artifact 'a'" in result.message


VOLUMES = """
- name: main
  steps:
  - - {name: write, template: write}
  - - {name: read, template: read}
- name: write
  script:
    command: [sh]
    source: "echo run >> /mnt/work/log.txt; echo tmp > /scratch/x; echo s > /mnt/sub/y"
    volumeMounts:
    - {name: work, mountPath: /mnt/work}
    - {name: scratch, mountPath: /scratch}
    - {name: work, mountPath: /mnt/sub, subPath: part}
- name: read
  script:
    command: [sh]
    source: "wc -l < /mnt/work/log.txt; cat /mnt/work/part/y; ls /scratch 2>/dev/null | wc -l"
    volumeMounts: [{name: work, mountPath: /mnt/work}, {name: scratch, mountPath: /scratch}]
"""


def test_pvc_folder_persists_across_runs(tmp_path: Path) -> None:
    text = wf(VOLUMES, extra="""
    volumes:
    - {name: work, persistentVolumeClaim: {claimName: shared}}
    - {name: scratch, emptyDir: {}}
    """)
    first = run(text, tmp_path)
    second = run(text, tmp_path)
    assert first.phase == second.phase == "Succeeded", first.message
    assert first.node("read").result.split() == ["1", "s", "0"]  # emptyDir is per node
    assert second.node("read").result.split()[0] == "2"
    assert (tmp_path / "volumes" / "shared" / "log.txt").read_text() == "run\nrun\n"
    assert first.run_dir != second.run_dir


def test_volume_claim_template_is_per_run(tmp_path: Path) -> None:
    text = wf(VOLUMES, extra="""
    volumes: [{name: scratch, emptyDir: {}}]
    volumeClaimTemplates:
    - metadata: {name: work}
      spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
    """)
    first = run(text, tmp_path)
    second = run(text, tmp_path)
    assert first.node("read").result.split()[0] == "1"
    assert second.node("read").result.split()[0] == "1"
    assert (second.run_dir / "volumes" / "work" / "log.txt").exists()


def test_template_timeout_kills_process_group_quickly(tmp_path: Path) -> None:
    text = wf("""
    - name: main
      timeout: "1s"
      script: {command: [sh], source: "sleep 30 & sleep 30; echo never"}
    """)
    began = time.monotonic()
    result = run(text, tmp_path)
    assert time.monotonic() - began < 5
    assert result.phase == "Failed"
    assert "exceeded its deadline of 1s" in result.node(result.name).message


def test_workflow_deadline_stops_running_nodes(tmp_path: Path) -> None:
    text = wf(SH, """
    - name: main
      steps:
      - - {name: long, template: sh, arguments: {parameters: [{name: cmd, value: "sleep 30"}]}}
      - - {name: next, template: sh, arguments: {parameters: [{name: cmd, value: "true"}]}}
    - name: exit
      script: {command: [sh], source: "echo {{workflow.status}}"}
    """, extra="activeDeadlineSeconds: 1\nonExit: exit\n")
    began = time.monotonic()
    result = run(text, tmp_path)
    assert time.monotonic() - began < 5
    assert result.phase == "Failed"
    assert result.message == "workflow exceeded its deadline of 1s"
    assert result.node("long").phase == "Failed"
    assert not any(n.display_name == "next" for n in result.nodes)
    assert result.node("onExit").result == "Failed"


def test_parallelism_limits_concurrent_pods(tmp_path: Path) -> None:
    text = wf(SH, """
    - name: main
      dag:
        tasks:
        - {name: p, template: sh, withItems: [1, 2, 3],
           arguments: {parameters: [{name: cmd, value: "sleep 0.2"}]}}
    """)
    result = run(text, tmp_path, parallelism=1)
    pods = sorted((n for n in result.nodes if n.type == "Pod"), key=lambda n: n.started_at)
    assert len(pods) == 3
    for before, after in itertools.pairwise(pods):
        assert after.started_at >= before.finished_at


def test_unresolved_variable_fails_the_node(tmp_path: Path) -> None:
    text = wf(SH, """
    - name: main
      dag:
        tasks:
        - {name: a, template: sh,
           arguments: {parameters: [{name: cmd, value: "echo {{tasks.nope.outputs.result}}"}]}}
    """)
    result = run(text, tmp_path)
    assert result.phase == "Failed"
    assert "unable to resolve {{tasks.nope.outputs.result}}" in result.node("a").message


def test_steps_stop_after_failed_group_and_env_and_globals(tmp_path: Path) -> None:
    text = wf("""
    - name: main
      steps:
      - - {name: env, template: env}
      - - {name: fail, template: fail}
      - - {name: never, template: env}
    - name: env
      container:
        command: [sh, -c]
        args: ["echo $GREETING $SUBLIMATE_LOCAL_RUN {{workflow.name}} {{workflow.namespace}}"]
        env: [{name: GREETING, value: "hello"}]
        image: busybox
        resources: {limits: {cpu: "1"}}
    - name: fail
      script: {command: [sh], source: "echo oops >&2; exit 1"}
    """)
    result = run(text, tmp_path)
    assert result.phase == "Failed"
    assert result.node("env").result == f"hello 1 {result.name} default"
    assert "oops" in Path(result.node("fail").log).read_text()
    assert not any(n.display_name == "never" for n in result.nodes)


def test_status_json_workflow_yaml_and_table(tmp_path: Path) -> None:
    result = run((MANIFESTS / "diamond.yaml").read_text(), tmp_path, {"msg": "yo"})
    status = json.loads((result.run_dir / "status.json").read_text())
    assert status == json.loads(json.dumps(result.to_json()))
    assert status["phase"] == "Succeeded" and status["parameters"] == {"msg": "yo"}
    node = next(n for n in status["nodes"] if n["display_name"] == "A")
    assert node["outputs"]["result"] == "yo" and node["outputs"]["exitCode"] == "0"
    assert {"name", "template", "type", "started_at", "duration_s", "log"} <= node.keys()
    assert Path(node["log"]).read_text() == "yo\n"
    manifest = (result.run_dir / "workflow.yaml").read_text()
    assert f"name: {result.name}" in manifest and "value: yo" in manifest
    table = format_table(result)
    assert table.splitlines()[0].split() == ["NODE", "PHASE", "DURATION", "OUTPUTS"]
    assert "  D" in table and table.endswith(f"{result.name}: Succeeded")
    assert result.name.startswith("diamond-") and len(result.name) == len("diamond-") + 5


def test_fixed_name_never_reuses_run_dir(tmp_path: Path) -> None:
    text = wf("- name: main\n  container: {command: ['true']}\n").replace(
        "generateName: t-", "name: fixed"
    )
    first = run(text, tmp_path)
    second = run(text, tmp_path)
    assert first.run_dir.name == "fixed"
    assert second.run_dir.name.startswith("fixed-") and second.run_dir != first.run_dir


def test_long_outputs_are_truncated_in_table(tmp_path: Path) -> None:
    text = wf("""
    - name: main
      script: {command: [sh], source: "printf '%0100d' 0 > /tmp/long"}
      outputs: {parameters: [{name: long, valueFrom: {path: /tmp/long}}]}
    """)
    result = run(text, tmp_path)
    assert len(result.node(result.name).parameters["long"]) == 100
    assert "long=" + "0" * 37 + "..." in format_table(result)


def test_a_loop_child_named_after_a_long_item_is_shortened_on_the_console_only(
        tmp_path: Path) -> None:
    import io

    from sublimate.pipelines.runner import console_reporter

    item = {f"setting-{i:02d}": "x" * 10 for i in range(20)}  # Argo names the child after it
    text = wf(SH, f"""
    - name: main
      dag:
        tasks:
        - name: fan
          template: sh
          withParam: '{json.dumps([item])}'
          arguments: {{parameters: [{{name: cmd, value: "echo {{{{item.setting-00}}}}"}}]}}
    """)
    out = io.StringIO()
    result = run_workflow(load_manifest(textwrap.dedent(text)), {},
                          RunOptions(home=tmp_path, reporter=console_reporter(out)))
    child = next(n for n in result.nodes if n.display_name.startswith("fan(0:"))
    assert len(child.display_name) > 300  # the record keeps Argo's whole name
    shown = [line for line in out.getvalue().splitlines() if "fan(0:" in line]
    assert shown and all(len(line) < 120 for line in shown)
    assert any("...): Succeeded" in line for line in shown)
    table_lines = [line for line in format_table(result).splitlines() if "fan(0:" in line]
    assert table_lines and all("...)" in line for line in table_lines)


def test_console_reporter_streams_logs(tmp_path: Path) -> None:
    import io

    from sublimate.pipelines.runner import console_reporter

    out = io.StringIO()
    workflow = load_manifest(MANIFESTS / "diamond.yaml")
    run_workflow(workflow, {}, RunOptions(home=tmp_path, reporter=console_reporter(out)))
    text = out.getvalue()
    assert "D | hi-b+c" in text
    assert "A: Succeeded" in text and "Succeeded" in text.splitlines()[-1]
    quiet = io.StringIO()
    run_workflow(workflow, {}, RunOptions(home=tmp_path,
                                          reporter=console_reporter(quiet, follow_logs=False)))
    assert " | " not in quiet.getvalue()


@pytest.mark.parametrize("kind", ["WorkflowTemplate", "CronWorkflow"])
def test_workflow_template_and_cron_run_as_submitted(tmp_path: Path, kind: str) -> None:
    spec = "entrypoint: main\ntemplates:\n- name: main\n  container: {command: [echo, ok]}\n"
    if kind == "CronWorkflow":
        body = "spec:\n  schedule: '* * * * *'\n  workflowSpec:\n" + textwrap.indent(spec, "    ")
    else:
        body = "spec:\n" + textwrap.indent(spec, "  ")
    text = f"apiVersion: argoproj.io/v1alpha1\nkind: {kind}\nmetadata: {{name: job}}\n{body}"
    result = run(text, tmp_path)
    assert result.phase == "Succeeded"
    assert result.name.startswith("job-") and result.node(result.name).result == "ok"


def test_reported_paths_read_as_container_paths(tmp_path: Path) -> None:
    """A step that reports a mounted path it was given yields the path Argo would show."""
    manifest = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: paths-}
spec:
  entrypoint: main
  volumes: [{name: work, persistentVolumeClaim: {claimName: shared}}]
  templates:
  - name: main
    dag:
      tasks:
      - {name: write, template: write}
      - name: read
        template: read
        depends: write
        arguments: {parameters: [{name: where, value: "{{tasks.write.outputs.parameters.where}}"}]}
  - name: write
    outputs: {parameters: [{name: where, valueFrom: {path: /tmp/where}}]}
    script:
      image: python
      command: [python]
      volumeMounts: [{name: work, mountPath: /mnt/work}]
      source: |
        import pathlib
        target = pathlib.Path("/mnt/work/data/x.txt")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("hello")
        pathlib.Path("/tmp/where").write_text(str(target))
        print(target)
  - name: read
    inputs: {parameters: [{name: where}]}
    script:
      image: python
      command: [python]
      volumeMounts: [{name: work, mountPath: /mnt/work}]
      source: |
        import pathlib
        print(pathlib.Path("{{inputs.parameters.where}}").read_text())
"""
    result = run_workflow(load_manifest(manifest), {}, RunOptions(home=tmp_path, reporter=None))
    assert result.phase == "Succeeded", result.message
    write = result.node("write")
    assert write.parameters["where"] == "/mnt/work/data/x.txt"
    assert write.result == "/mnt/work/data/x.txt"
    assert result.node("read").result == "hello"
    assert (tmp_path / "volumes" / "shared" / "data" / "x.txt").read_text() == "hello"


def test_a_failed_steps_termination_message_is_its_node_message(tmp_path: Path) -> None:
    """As on Kubernetes + Argo: what a container writes to its termination-message file ends
    up in the node's message, and the workflow's message repeats it."""
    result = run(wf("""
        - name: main
          dag:
            tasks: [{name: check, template: check}]
        - name: check
          script:
            command: [python]
            source: |
              import os, sys
              with open(os.environ["SUBLIMATE_TERMINATION_LOG"], "w") as f:
                  f.write("batch 4096 is larger than\\nthe 1438 examples")
              sys.exit(2)
        """), tmp_path)
    node = result.node("check")
    assert node.phase == "Failed" and node.exit_code == 2
    assert node.message == "Error (exit code 2): batch 4096 is larger than the 1438 examples"
    assert node.message in result.message
    silent = run(wf("""
        - name: main
          script: {command: [sh], source: "exit 3"}
        """), tmp_path)
    assert silent.node(silent.name).message == "Error (exit code 3)"


def test_workflow_outputs_on_a_volume_are_linked_from_the_run_folder(tmp_path: Path) -> None:
    result = run(wf("""
        - name: main
          dag:
            tasks: [{name: write, template: write}]
          outputs:
            parameters:
            - name: where
              globalName: where
              valueFrom: {parameter: "{{tasks.write.outputs.parameters.dir}}"}
            - name: scratch
              globalName: scratch
              valueFrom: {parameter: "{{tasks.write.outputs.parameters.scratch}}"}
        - name: write
          script:
            command: [sh]
            source: |
              mkdir -p /data/out /tmp/s && echo 1 > /data/out/model.pt
              echo /data/out > /tmp/dir && echo /tmp/s > /tmp/scratch
            volumeMounts: [{name: data, mountPath: /data}]
          volumes: [{name: data, persistentVolumeClaim: {claimName: vol}}]
          outputs:
            parameters:
            - {name: dir, valueFrom: {path: /tmp/dir}}
            - {name: scratch, valueFrom: {path: /tmp/scratch}}
        """), tmp_path)
    assert result.phase == "Succeeded", result.message
    assert result.outputs["parameters"] == {"where": "/data/out", "scratch": "/tmp/s"}
    link = result.run_dir / "outputs" / "where"
    assert result.links == {"where": link}
    assert link.resolve() == (tmp_path / "volumes" / "vol" / "out").resolve()
    assert (link / "model.pt").read_text() == "1\n"
    # a path private to one pod (not on a volume) is not linked
    assert not (result.run_dir / "outputs" / "scratch").exists()


def test_status_json_is_fsynced_before_each_rename_and_its_folder_at_the_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(a: object, b: object, **kwargs: object) -> None:
        events.append(("replace", f"{a} -> {b}"))
        real_replace(a, b, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    result = run((MANIFESTS / "diamond.yaml").read_text(), tmp_path, {"msg": "yo"})
    status, tmp = result.run_dir / "status.json", result.run_dir / "status.json.tmp"
    writes = [i for i, event in enumerate(events) if event == ("replace", f"{tmp} -> {status}")]
    assert len(writes) > 2  # one per transition
    for index in writes:  # a crash never leaves a torn or empty status.json
        assert events[index - 1] == ("fsync", str(tmp))
    # The last rename (the run's conclusion) is itself made durable.
    assert ("fsync", str(result.run_dir)) in events[writes[-1]:]


def test_a_template_that_calls_itself_stops_at_argos_recursion_depth(tmp_path: Path) -> None:
    # A template calling itself without end grew a run to 5,449 nodes and 394 MB before it was
    # stopped by hand; Argo's controller errors the 100th nested call (maxAllowedStackDepth).
    started = time.monotonic()
    result = run(wf("""
        - name: main
          steps:
          - - {name: again, template: main}
        """), tmp_path)
    assert result.phase in ("Error", "Failed")
    deepest = [n for n in result.nodes if n.message.startswith(
        "Maximum recursion depth exceeded. See https://argo-workflows.readthedocs.io")]
    assert len(deepest) == 1
    # the entrypoint and 98 nested calls ran (each with its step group); the 100th errored
    invocations = [n for n in result.nodes if n.type == "Steps"]
    assert len(invocations) == 100
    assert time.monotonic() - started < 30
