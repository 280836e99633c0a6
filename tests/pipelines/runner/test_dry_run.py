"""``sublimate run --dry-run``: the first wave's plan and what decides the rest, nothing run."""

from __future__ import annotations

import re
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from sublimate.pipelines.runner import ManifestError, ParameterError, load_manifest
from sublimate.pipelines.runner.preview import format_preview, preview_workflow
from tests.conftest import run_cli

MANIFEST = textwrap.dedent("""
    apiVersion: argoproj.io/v1alpha1
    kind: Workflow
    metadata: {generateName: mix-}
    spec:
      entrypoint: main
      onExit: bye
      activeDeadlineSeconds: 600
      arguments: {parameters: [{name: n, value: "10"}, {name: shards, value: '["a", "b"]'}]}
      volumes: [{name: data, persistentVolumeClaim: {claimName: shared}}]
      templates:
      - name: main
        steps:
        - - {name: prep, template: prep}
          - {name: big, template: sh, when: "{{workflow.parameters.n}} > 50",
             arguments: {parameters: [{name: cmd, value: "true"}]}}
          - {name: shard, template: sh, withParam: "{{workflow.parameters.shards}}",
             arguments: {parameters: [{name: cmd, value: "echo {{item}}"}]}}
          - {name: inner, template: inner}
        - - {name: heads, template: sh, when: "{{steps.prep.outputs.result}} == heads",
             arguments: {parameters: [{name: cmd, value: "true"}]}}
      - name: inner
        dag:
          tasks:
          - {name: a, template: sh, arguments: {parameters: [{name: cmd, value: "echo a"}]}}
          - {name: b, template: sh, depends: "a.Failed || a.Errored",
             arguments: {parameters: [{name: cmd, value: "true"}]}}
          - {name: c, template: sh, depends: "a", withItems: [1, 2],
             arguments: {parameters: [{name: cmd, value: "true"}]}}
      - name: prep
        retryStrategy: {limit: 2, retryPolicy: OnError}
        timeout: 90s
        container:
          command: [python, -m, prep]
          args: [--root, /mnt/data/sets, --n, "{{workflow.parameters.n}}"]
          env: [{name: CACHE, value: /mnt/data/cache}]
          volumeMounts: [{name: data, mountPath: /mnt/data}]
      - name: sh
        inputs: {parameters: [{name: cmd}]}
        script: {command: [sh], source: "{{inputs.parameters.cmd}}"}
      - name: bye
        script: {command: [sh], source: "echo {{workflow.status}}"}
""")


@pytest.fixture
def no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", forbidden)


def test_the_first_wave_is_planned_and_nothing_is_created(tmp_path: Path,
                                                          no_processes: None) -> None:
    home = tmp_path / "home"
    preview = preview_workflow(load_manifest(MANIFEST), {"n": "3"}, home)
    assert not home.exists()  # no run folder, no volume folder
    assert preview.name.startswith("mix-") and preview.run_dir == home / "runs" / preview.name
    planned = {p.label: p for p in preview.first}
    assert list(planned) == ["prep", "big", "shard(0:a)", "shard(1:b)", "inner/a"]
    prep = planned["prep"].request
    assert prep is not None
    data = home / "volumes" / "shared"
    assert prep.argv == ["python", "-m", "prep", "--root", f"{data}/sets", "--n", "3"]
    assert prep.env == {"CACHE": f"{data}/cache"}
    assert prep.deadline_s == 90
    assert prep.display_name == "prep(0)"  # the first attempt of a retried template
    assert prep.folder.parent == preview.run_dir / "nodes"
    assert planned["prep"].notes == ["retried up to 2x (OnError)"]
    assert planned["big"].skipped == "when '3 > 50' is false" and planned["big"].request is None
    assert planned["shard(1:b)"].request.script == "echo b"  # type: ignore[union-attr]
    assert preview.then == [
        "inner/b after a fails or a errors",
        "inner/c after a succeeds (for each of [1,2])",
        "[1] after [0] succeeds: heads (if {{steps.prep.outputs.result}} == heads)",
    ]
    text = format_preview(preview)
    assert f"command: python -m prep --root {data}/sets --n 3" in text
    assert f"mount: /mnt/data -> {data} (persistentVolumeClaim shared)" in text
    assert "deadline: 90s" in text and "workflow deadline: 600s" in text
    assert "on exit: bye" in text
    assert not home.exists()


def test_bad_parameters_and_manifests_are_refused_as_by_a_run(tmp_path: Path) -> None:
    with pytest.raises(ParameterError, match="unknown parameter 'm'"):
        preview_workflow(load_manifest(MANIFEST), {"m": "1"}, tmp_path)
    broken = MANIFEST.replace("template: inner}", "template: missing}")
    with pytest.raises(ManifestError, match="missing"):
        preview_workflow(load_manifest(broken), {}, tmp_path)
    assert not (tmp_path / "runs").exists()


def test_an_unresolvable_first_node_is_shown_not_raised(tmp_path: Path) -> None:
    text = MANIFEST.replace('"echo a"', '"echo {{workflow.parameters.nope}}"')
    preview = preview_workflow(load_manifest(text), {}, tmp_path)
    [a] = [p for p in preview.first if p.label == "inner/a"]
    assert "unable to resolve {{workflow.parameters.nope}}" in a.error
    assert "inner/a (template sh): cannot start: " in format_preview(preview)


def test_dry_run_of_the_default_pipeline(tmp_path: Path) -> None:
    home = tmp_path / "home"
    completed = run_cli("run", "--dry-run", home=home)
    assert completed.returncode == 0, completed.stderr
    out = completed.stdout
    assert "python -m sublimate.components.steps.stage_data --dataset digits --output-path " in out
    assert f"--data-root {home}/volumes/sublimate-data/datasets" in out
    assert f"mount: /mnt/sublimate -> {home}/volumes/sublimate-data" in out
    assert "  train after stage-data succeeds\n" in out
    assert "  evaluate after train succeeds" in out
    # staging is memoized by the built-in dataset's content: where it would be looked up
    assert re.search(r"memoized: looked up in cache sublimate-stage-data under key "
                     r"stage-data-digits-[0-9a-f]{16} \(no entry: it runs", out), out
    assert not home.exists(), "a dry run creates nothing"
    custom = run_cli("run", "--dry-run", "-p", "dataset=file:///data/x", home=home)
    assert "--dataset file:///data/x" in custom.stdout


def test_dry_run_checks_parameters_first(tmp_path: Path) -> None:
    completed = run_cli("run", "--dry-run", "-p", "epoch=3", home=tmp_path)
    assert completed.returncode == 2
    assert completed.stderr.strip().splitlines() == [
        completed.stderr.strip().splitlines()[0]]  # one line
    assert "unknown parameter 'epoch' (did you mean 'epochs'?" in completed.stderr
    assert not (tmp_path / "runs").exists()


def test_dry_run_of_a_manifest_file(tmp_path: Path) -> None:
    path = tmp_path / "mix.yaml"
    path.write_text(MANIFEST)
    completed = run_cli("run", str(path), "--dry-run", "-p", "n=99", home=tmp_path / "home")
    assert completed.returncode == 0, completed.stderr
    assert "  big (template sh); when '99 > 50' holds\n" in completed.stdout  # planned
    assert "      | true" in completed.stdout  # its script
    assert not (tmp_path / "home").exists()


def _loop_of(count: str) -> str:
    return textwrap.dedent(f"""
        apiVersion: argoproj.io/v1alpha1
        kind: Workflow
        metadata: {{generateName: fan-}}
        spec:
          entrypoint: main
          templates:
          - name: main
            dag:
              tasks:
              - {{name: fan, template: sh, withSequence: {{count: "{count}"}},
                 arguments: {{parameters: [{{name: cmd, value: "echo {{{{item}}}}"}}]}}}}
          - name: sh
            inputs: {{parameters: [{{name: cmd}}]}}
            script: {{command: [sh], source: "{{{{inputs.parameters.cmd}}}}"}}
    """)


def test_dry_run_of_a_million_items_is_refused_at_once_as_the_run_would_be(
        tmp_path: Path) -> None:
    # Issue 40: it planned every item, past 60 s; the run refuses it with this line.
    path = tmp_path / "million.yaml"
    path.write_text(_loop_of("1000000"))
    started = time.monotonic()
    completed = run_cli("run", str(path), "--dry-run", home=tmp_path / "home", timeout=60)
    assert time.monotonic() - started < 10  # a bound, not a timing: 0.6 s seen
    assert completed.returncode == 2
    assert completed.stderr.splitlines() == [
        "error: template 'main': tasks.fan.withSequence: 1,000,000 items would take this run "
        "past its cap of 10,000 nodes (sublimate run --max-nodes N raises it)"]
    assert not (tmp_path / "home").exists()


def test_dry_run_plans_the_first_items_of_a_large_loop_and_counts_the_rest(
        tmp_path: Path, no_processes: None) -> None:
    preview = preview_workflow(load_manifest(_loop_of("5000")), {}, tmp_path / "home")
    planned = [p for p in preview.first if p.request is not None]
    assert [p.label for p in planned] == [f"fan({i}:{i})" for i in range(8)]
    assert planned[7].request.script == "echo 7"  # type: ignore[union-attr]
    [rest] = [p for p in preview.first if p.request is None]
    assert (rest.label, rest.template) == ("fan(8..4999)", "sh")
    assert rest.runs == "4,992 more items (5,000 in all), each planned as those above with " \
                        "its own item"
    assert len(format_preview(preview).splitlines()) < 100


def test_dry_run_of_a_first_wave_past_the_cap_is_refused(tmp_path: Path,
                                                         no_processes: None) -> None:
    # A template that calls itself twice: its first wave doubles at every level shown.
    text = textwrap.dedent("""
        apiVersion: argoproj.io/v1alpha1
        kind: Workflow
        metadata: {generateName: grow-}
        spec:
          entrypoint: grow
          templates:
          - name: grow
            steps:
            - - {name: left, template: grow}
              - {name: right, template: grow}
    """)
    with pytest.raises(ManifestError) as refused:
        preview_workflow(load_manifest(text), {}, tmp_path, max_nodes=500)
    assert str(refused.value) == ("template 'grow': this run reached its cap of 500 nodes "
                                  "(sublimate run --max-nodes N raises it)")
