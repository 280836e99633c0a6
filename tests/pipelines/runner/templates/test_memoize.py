"""Memoization (``templates/memoize``): a template's ``memoize`` looked up before it runs, its
outputs restored on a hit (the node Succeeded, ``memoizationStatus.hit``), saved on success
only, as Argo's controller does (operator.go executeTemplate, controller/cache)."""

from __future__ import annotations

import json
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sublimate.pipelines.argo_terms import NodePhase, NodeType
from sublimate.pipelines.runner import (
    ManifestError,
    RunEvent,
    RunOptions,
    RunResult,
    format_table,
    load_manifest,
    run_workflow,
)
from sublimate.pipelines.runner.preview import format_preview, preview_workflow

# gen writes a value that differs on every run (nanoseconds): a hit shows the first run's.
MANIFEST = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: memo-}
spec:
  entrypoint: main
  arguments:
    parameters: [{name: k, value: a}, {name: age, value: 1h}]
  templates:
  - name: main
    steps:
    - - name: gen
        template: gen
        arguments: {parameters: [{name: k, value: "{{workflow.parameters.k}}"}]}
    - - name: use
        template: use
        arguments: {parameters: [{name: v, value: "{{steps.gen.outputs.parameters.v}}"}]}
  - name: gen
    inputs: {parameters: [{name: k}]}
    memoize:
      key: "gen-{{inputs.parameters.k}}"
      maxAge: "{{workflow.parameters.age}}"
      cache: {configMap: {name: memo-cache}}
    script:
      command: [sh]
      source: |
        date +%s%N > /tmp/v
        test "{{inputs.parameters.k}}" != fail
    outputs:
      parameters: [{name: v, globalName: gv, valueFrom: {path: /tmp/v}}]
  - name: use
    inputs: {parameters: [{name: v}]}
    container: {command: [echo, "{{inputs.parameters.v}}"]}
"""


MOUNTS = "auto"


def run(home: Path, params: dict[str, str] | None = None, text: str = MANIFEST,
        events: list[RunEvent] | None = None) -> RunResult:
    reporter = (events if events is not None else []).append
    return run_workflow(load_manifest(textwrap.dedent(text)), params or {},
                        RunOptions(home=home, reporter=reporter, mounts=MOUNTS))


def entry_file(home: Path, key: str = "gen-a") -> Path:
    return home / "memo" / "memo-cache" / key


def test_a_miss_runs_and_saves_then_a_hit_restores_outputs_without_running(
        tmp_path: Path) -> None:
    first = run(tmp_path)
    assert first.phase == NodePhase.SUCCEEDED
    gen = first.node("gen")
    assert gen.memoization == {"hit": False, "key": "gen-a", "cacheName": "memo-cache"}
    entry = json.loads(entry_file(tmp_path).read_text())
    # cache.go Entry, as the ConfigMap holds it
    assert set(entry) == {"nodeID", "outputs", "creationTimestamp", "lastHitTimestamp"}
    assert entry["nodeID"] == gen.id
    assert entry["outputs"]["parameters"] == [
        {"name": "v", "value": gen.parameters["v"], "globalName": "gv"}]

    events: list[RunEvent] = []
    second = run(tmp_path, events=events)
    assert second.phase == NodePhase.SUCCEEDED
    hit = second.node("gen")
    assert hit.memoization == {"hit": True, "key": "gen-a", "cacheName": "memo-cache"}
    assert hit.phase == NodePhase.SUCCEEDED and hit.log is None  # never ran
    assert hit.parameters["v"] == gen.parameters["v"]
    assert second.node("use").log is not None
    assert second.outputs["parameters"]["gv"] == gen.parameters["v"]  # globalName restored
    status = json.loads((second.run_dir / "status.json").read_text())
    shown = next(n for n in status["nodes"] if n["display_name"] == "gen")
    assert shown["memoizationStatus"] == {"hit": True, "key": "gen-a",
                                          "cacheName": "memo-cache"}
    assert "Succeeded (cached)" in next(line for line in format_table(second).splitlines()
                                        if line.strip().startswith("gen"))
    # a hit stamps lastHitTimestamp (cache.go load)
    stamped = json.loads(entry_file(tmp_path).read_text())
    assert stamped["creationTimestamp"] == entry["creationTimestamp"]
    assert stamped["lastHitTimestamp"] >= entry["lastHitTimestamp"]


def test_a_different_key_is_a_miss(tmp_path: Path) -> None:
    first = run(tmp_path)
    other = run(tmp_path, {"k": "b"})
    gen = other.node("gen")
    assert gen.memoization == {"hit": False, "key": "gen-b", "cacheName": "memo-cache"}
    assert gen.parameters["v"] != first.node("gen").parameters["v"]
    assert entry_file(tmp_path, "gen-b").is_file()


def test_an_entry_older_than_max_age_is_a_miss(tmp_path: Path) -> None:
    first = run(tmp_path)
    path = entry_file(tmp_path)
    entry = json.loads(path.read_text())
    old = datetime.now(UTC) - timedelta(hours=2)
    entry["creationTimestamp"] = old.strftime("%Y-%m-%dT%H:%M:%SZ")
    path.write_text(json.dumps(entry))
    no_limit = run(tmp_path, {"age": ""})  # an empty maxAge never expires
    assert no_limit.node("gen").memoization["hit"] is True  # type: ignore[index]
    expired = run(tmp_path, {"age": "1h"})
    gen = expired.node("gen")
    assert gen.memoization["hit"] is False  # type: ignore[index]
    assert gen.parameters["v"] != first.node("gen").parameters["v"]
    # saved again, fresh: the next run hits
    assert run(tmp_path).node("gen").memoization["hit"] is True  # type: ignore[index]


def test_a_failed_node_is_not_saved(tmp_path: Path) -> None:
    result = run(tmp_path, {"k": "fail"})
    assert result.node("gen").phase == NodePhase.FAILED
    assert not entry_file(tmp_path, "gen-fail").exists()


@pytest.mark.parametrize("corrupt", [
    "{not json", "[]", '{"nodeID": "x", "outputs": {"parameters": ["v"]}, '
    '"creationTimestamp": "2026-01-01T00:00:00Z"}', '{"nodeID": "x", "outputs": {}}'])
def test_a_corrupt_entry_is_a_miss_with_a_note(tmp_path: Path, corrupt: str) -> None:
    path = entry_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(corrupt)
    events: list[RunEvent] = []
    result = run(tmp_path, events=events)
    assert result.phase == NodePhase.SUCCEEDED
    assert result.node("gen").memoization["hit"] is False  # type: ignore[index]
    notes = [e.message for e in events if e.kind == "note"]
    assert any("unreadable" in n and "treated as a miss" in n for n in notes), notes
    assert json.loads(path.read_text())["nodeID"] == result.node("gen").id  # rewritten


@pytest.mark.parametrize(("change", "to", "field"), [
    ('maxAge: "{{workflow.parameters.age}}"', "maxAge: soon", "maxAge: invalid duration"),
    ('key: "gen-{{inputs.parameters.k}}"', "key: gen_a", "key: invalid cache key: gen_a"),
    ("configMap: {name: memo-cache}", "configMap: {name: Memo_Cache}",
     "cache.configMap.name: 'Memo_Cache' is not a ConfigMap name"),
    ("configMap: {name: memo-cache}", "configMap: {}", "cache.configMap.name: missing"),
])
def test_bad_memoize_fields_are_refused_naming_the_field(tmp_path: Path, change: str, to: str,
                                                         field: str) -> None:
    with pytest.raises(ManifestError, match=rf"templates\[1\]\.memoize\.{field}"):
        run(tmp_path, text=MANIFEST.replace(change, to))


def test_a_key_invalid_once_substituted_errors_the_node(tmp_path: Path) -> None:
    result = run(tmp_path, {"k": "a/b"})
    gen = result.node("gen")
    assert gen.phase == NodePhase.ERROR
    assert gen.message.startswith("templates.gen.memoize.key: invalid cache key: gen-a/b")
    assert not (tmp_path / "memo" / "memo-cache").exists()


def test_a_bad_max_age_from_a_parameter_errors_the_node(tmp_path: Path) -> None:
    gen = run(tmp_path, {"age": "soon"}).node("gen")
    assert gen.phase == NodePhase.ERROR
    assert gen.message.startswith("templates.gen.memoize.maxAge: invalid duration 'soon'")


STEPS = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: memo-steps-}
spec:
  entrypoint: main
  templates:
  - name: main
    steps:
    - - {name: outer, template: outer}
  - name: outer
    memoize: {key: outer, maxAge: "", cache: {configMap: {name: memo-cache}}}
    steps:
    - - {name: inner, template: inner}
    outputs:
      parameters:
      - name: v
        valueFrom: {parameter: "{{steps.inner.outputs.parameters.v}}"}
  - name: inner
    retryStrategy: {limit: 1}
    script:
      command: [sh]
      source: date +%s%N > /tmp/v
    outputs:
      parameters: [{name: v, valueFrom: {path: /tmp/v}}]
"""


def test_a_steps_template_is_memoized_as_argo_does(tmp_path: Path) -> None:
    # operator.go checks the cache for every template kind; steps.go saves a steps node
    first = run(tmp_path, text=STEPS)
    second = run(tmp_path, text=STEPS)
    outer = second.node("outer")
    assert outer.memoization == {"hit": True, "key": "outer", "cacheName": "memo-cache"}
    assert outer.parameters["v"] == first.node("outer").parameters["v"]
    assert not any(n.display_name.startswith("inner") for n in second.nodes)


def test_a_hit_on_a_retried_template_is_no_retry_node(tmp_path: Path) -> None:
    text = STEPS.replace("- {name: outer, template: outer}", "- {name: outer, template: inner}")
    text = text.replace("  - name: inner\n", "  - name: inner\n    memoize: {key: inner, "
                        "maxAge: 1h, cache: {configMap: {name: memo-cache}}}\n")
    assert run(tmp_path, text=text).node("outer").type == NodeType.RETRY
    hit = run(tmp_path, text=text).node("outer")
    assert hit.memoization["hit"] is True and hit.type == NodeType.POD  # type: ignore[index]
    assert hit.children == []


VOLUME = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: memo-vol-}
spec:
  entrypoint: main
  volumes: [{name: shared, persistentVolumeClaim: {claimName: memo-data}}]
  templates:
  - name: main
    steps: [[{name: stage, template: stage}]]
  - name: stage
    memoize: {key: stage, maxAge: 1h, cache: {configMap: {name: memo-cache}}}
    script:
      command: [sh]
      source: |
        mkdir -p /mnt/shared/ds && date +%s%N > /mnt/shared/ds/x
        echo /mnt/shared/ds > /tmp/dir
      volumeMounts: [{name: shared, mountPath: /mnt/shared}]
    outputs:
      parameters: [{name: dir, valueFrom: {path: /tmp/dir}}]
"""


def test_a_hit_whose_volume_path_is_gone_runs_again(tmp_path: Path) -> None:
    # a staged folder someone removed: the entry names it, so the hit would hand on a path to
    # nothing; it is a miss, with a note, and the node makes it again
    run(tmp_path, text=VOLUME)
    assert run(tmp_path, text=VOLUME).node("stage").memoization["hit"] is True  # type: ignore
    data = tmp_path / "volumes" / "memo-data" / "ds"
    for child in data.iterdir():
        child.unlink()
    data.rmdir()
    events: list[RunEvent] = []
    again = run(tmp_path, text=VOLUME, events=events)
    assert again.node("stage").memoization["hit"] is False  # type: ignore[index]
    assert (data / "x").is_file()
    notes = [e.message for e in events if e.kind == "note"]
    assert any("/mnt/shared/ds" in n and "no longer exists" in n for n in notes), notes


def test_the_harness_shows_a_hit_as_cached(tmp_path: Path) -> None:
    from sublimate.pipelines.runner.harness import run as harness_run

    workflow = load_manifest(textwrap.dedent(MANIFEST))
    assert not harness_run(workflow, home=tmp_path).nodes["gen"].cached
    view = harness_run(workflow, home=tmp_path).nodes["gen"]
    assert view.cached and view.memoization == {"hit": True, "key": "gen-a",
                                                 "cacheName": "memo-cache"}


def test_the_dry_run_says_where_a_node_is_looked_up(tmp_path: Path) -> None:
    workflow = load_manifest(textwrap.dedent(MANIFEST))
    text = format_preview(preview_workflow(workflow, {}, tmp_path))
    assert "memoized: looked up in cache memo-cache under key gen-a (no entry" in text
    run(tmp_path)
    text = format_preview(preview_workflow(workflow, {}, tmp_path))
    assert "it would not run" in text
