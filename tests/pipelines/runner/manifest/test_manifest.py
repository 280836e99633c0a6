"""Tests of manifest loading/validation, parameters and the expression evaluators."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sublimate.pipelines.runner import (
    ManifestError,
    ParameterError,
    RunOptions,
    load_manifest,
    resolve_parameters,
    run_workflow,
    unsupported_fields,
)
from sublimate.pipelines.runner.expressions.conditions import (
    ExpressionError,
    depends_references,
    evaluate_when,
    parse_depends,
)
from sublimate.pipelines.runner.manifest.durations import parse_duration
from tests.conftest import pod_pid, run_cli

HEAD = "apiVersion: argoproj.io/v1alpha1\n"


def manifest(body: str) -> str:
    return HEAD + textwrap.dedent(body)


PARAMS = manifest("""
    kind: Workflow
    metadata:
      generateName: p-
      annotations:
        sublimate.dev/parameter-types: '{"nodes": {"type": "integer", "minimum": 1, "maximum": 8},
          "lr": {"type": "number"}, "tag": {"type": "string", "pattern": "^v[0-9]+$"}}'
    spec:
      entrypoint: main
      arguments:
        parameters:
        - {name: nodes, value: "2"}
        - {name: lr, value: "0.1"}
        - {name: tag, value: v1}
        - {name: mode, value: fast, enum: [fast, slow]}
        - {name: required}
      templates:
      - name: main
        container: {command: ["true"]}
""")


def test_resolve_parameters_defaults_and_overrides() -> None:
    workflow = load_manifest(PARAMS)
    values = resolve_parameters(workflow, {"required": "x", "nodes": "4"})
    assert values == {"nodes": "4", "lr": "0.1", "tag": "v1", "mode": "fast", "required": "x"}


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"required": "x", "nodez": "1"},
         "unknown parameter 'nodez' (did you mean 'nodes'? known parameters: nodes,"),
        ({"required": "x", "mode": "medium"}, "parameter 'mode': 'medium' is not one of fast,"),
        ({"required": "x", "nodes": "abc"}, "parameter 'nodes': 'abc' is not an integer"),
        ({"required": "x", "nodes": "9"}, "parameter 'nodes': 9 is above the maximum 8"),
        ({"required": "x", "lr": "fast"}, "parameter 'lr': 'fast' is not a number"),
        ({"required": "x", "tag": "latest"}, "parameter 'tag': 'latest' does not match"),
        ({}, "parameter 'required' has no value and no default"),
    ],
)
def test_parameter_errors_name_the_parameter(overrides: dict, expected: str) -> None:
    with pytest.raises(ParameterError) as info:
        resolve_parameters(load_manifest(PARAMS), overrides)
    assert expected in str(info.value)


UNSUPPORTED = manifest("""
    kind: Workflow
    metadata: {name: u}
    spec:
      entrypoint: main
      serviceAccountName: runner
      podGC: {strategy: OnPodCompletion}
      hooks: {done: {template: main}}  # a hook not named exit needs an expression
      volumes:
      - {name: cfg, hostPath: {path: /etc}}
      templates:
      - name: main
        dag:
          tasks:
          - {name: a, template: k8s}
          - {name: b, templateRef: {name: x, template: y}}
          - {name: c, template: c, depends: "a.Succeeded &&"}
      - name: k8s
        resource: {action: create, manifest: "{}"}
      - name: c
        nodeSelector: {gpu: "true"}
        retryStrategy: {limit: 1, expression: "true"}
        script:
          image: python
          command: [python]
          source: "print('{{=sprig.regexFind(inputs.parameters.x, 'y')}}')"
          env: [{name: T, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
        outputs:
          artifacts: [{name: o, path: /o, http: {url: "http://127.0.0.1/o"}}]
      - name: noentry
        container: {image: busybox}
""")


def test_unsupported_fields_are_all_reported_with_paths() -> None:
    problems = unsupported_fields(load_manifest(UNSUPPORTED))
    text = "\n".join(problems)
    expected = [
        "spec.hooks.done.expression: required for a hook not named exit",
        "spec.volumes[0].hostPath: hostPath volumes are not supported",
        "spec.templates[0].dag.tasks[1].templateRef: templateRef are not supported",
        "spec.templates[0].dag.tasks[2].depends: unexpected end",
        "spec.templates[1].resource: resource templates are not supported by the local runner",
        "spec.templates[2].retryStrategy.expression:",
        "spec.templates[2].script.source: sprig.regexFind is not supported",
        "spec.templates[2].script.env[0].valueFrom.fieldRef:",
        "spec.templates[2].outputs.artifacts[0].http: http artifact locations",
        "spec.templates[3].container.command: required by the local runner",
    ]
    for fragment in expected:
        assert fragment in text, fragment
    assert "serviceAccountName" not in text and "podGC" not in text and "nodeSelector" not in text


def test_run_refuses_unsupported_manifest_before_running_anything(tmp_path: Path) -> None:
    with pytest.raises(ManifestError) as info:
        run_workflow(load_manifest(UNSUPPORTED), {}, RunOptions(home=tmp_path))
    assert "spec.templates[1].resource" in str(info.value)
    assert not (tmp_path / "runs").exists()


def test_unknown_field_and_template_reference_are_reported() -> None:
    workflow = load_manifest(manifest("""
        kind: Workflow
        metadata: {name: x}
        spec:
          entrypoint: missing
          templates:
          - name: main
            steps: [[{name: s, template: nope, frobnicate: 1}]]
    """))
    problems = unsupported_fields(workflow)
    assert "spec.entrypoint: template 'missing' not found" in problems
    assert "spec.templates[0].steps[0][0].template: template 'nope' not found" in problems
    assert any(p.startswith("spec.templates[0].steps[0][0].frobnicate:") for p in problems)


MULTI = manifest("""
    kind: WorkflowTemplate
    metadata: {name: base}
    spec:
      entrypoint: main
      arguments: {parameters: [{name: a, value: "1"}, {name: b, value: "2"}]}
      templates:
      - name: main
        container: {command: [echo, "{{workflow.parameters.a}}{{workflow.parameters.b}}"]}
    ---
    apiVersion: argoproj.io/v1alpha1
    kind: Workflow
    metadata: {generateName: from-ref-}
    spec:
      workflowTemplateRef: {name: base}
      arguments: {parameters: [{name: b, value: "9"}]}
    ---
    apiVersion: v1
    kind: ConfigMap
    metadata: {name: ignored}
""")


def test_workflow_template_ref_is_resolved_from_the_same_file(tmp_path: Path) -> None:
    workflow = load_manifest(MULTI)
    assert workflow["spec"]["entrypoint"] == "main"
    assert resolve_parameters(workflow, {}) == {"a": "1", "b": "9"}
    result = run_workflow(workflow, {}, RunOptions(home=tmp_path, reporter=lambda e: None))
    assert result.node(result.name).result == "19"
    base = load_manifest(MULTI, name="base")
    assert base["metadata"]["generateName"] == "base-"
    with pytest.raises(ManifestError, match="no workflow named 'zzz'"):
        load_manifest(MULTI, name="zzz")


def test_ambiguous_manifest_needs_a_name(tmp_path: Path) -> None:
    doc = "kind: Workflow\nmetadata: {name: %s}\nspec: {entrypoint: m, templates: []}\n"
    path = tmp_path / "two.yaml"
    path.write_text(HEAD + doc % "one" + "---\n" + HEAD + doc % "two")
    with pytest.raises(ManifestError, match="several workflows"):
        load_manifest(path)
    assert load_manifest(path, name="two")["metadata"]["name"] == "two"
    with pytest.raises(ManifestError, match="cannot read manifest"):
        load_manifest(tmp_path / "absent.yaml")


MINIMAL = "kind: Workflow\nmetadata: {%s}\nspec: {entrypoint: m, templates: [{name: m, " \
    "container: {image: a, command: [echo]}}]}\n"


@pytest.mark.parametrize(("kind", "said"), [
    ("latin-1", "cannot read manifest '{path}': not UTF-8 text (byte 0xe9 on line 2)"),
    ("name: a/b", "metadata.name: Invalid value: 'a/b': a lowercase RFC 1123"),
    ("name: ../../x", "metadata.name: Invalid value: '../../x': a lowercase RFC 1123"),
])
def test_a_manifest_the_runner_cannot_take_is_refused_without_a_traceback(
        tmp_path: Path, kind: str, said: str) -> None:
    # A non-UTF-8 manifest ended `sublimate run` in UnicodeDecodeError's traceback.
    path = tmp_path / "bad.yaml"
    if kind == "latin-1":
        path.write_bytes((HEAD + "# caf\xe9\n" + MINIMAL % "generateName: x-").encode("latin-1"))
        with pytest.raises(ManifestError, match="not UTF-8 text"):
            load_manifest(path)
    else:
        path.write_text(HEAD + MINIMAL % kind)
    home = tmp_path / "home"
    for command in ("run", "lint"):
        done = run_cli(command, str(path), home=home, timeout=60)
        said_there = done.stderr + done.stdout
        assert done.returncode != 0, done
        assert "Traceback" not in said_there and f"{path}: " in said_there
        if command == "run":  # lint says it in its own words, naming the file too
            assert said.format(path=path) in said_there
    assert not home.exists()  # no run folder, here or anywhere


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("heads == heads", True),
        ("heads == 'tails'", False),
        ("10 > 9", True),
        ("2.5 <= 2", False),
        ('"abc" =~ "^a.c$"', True),
        ("abc !~ b", False),
        ("!(1 == 1) || (a != b && true)", True),
        ("false", False),
    ],
)
def test_when_expressions(expr: str, expected: bool) -> None:
    assert evaluate_when(expr) is expected


@pytest.mark.parametrize("expr", ["heads", "1 == ", "(true", "a < 1"])
def test_bad_when_expressions_raise(expr: str) -> None:
    with pytest.raises(ExpressionError):
        evaluate_when(expr)


def test_depends_parsing() -> None:
    ast = parse_depends("(a.Succeeded || b) && !c-d.AllFailed")
    assert depends_references(ast) == [("a", "Succeeded"), ("b", None), ("c-d", "AllFailed")]
    with pytest.raises(ExpressionError):
        parse_depends("a &&& b")


def test_durations() -> None:
    assert parse_duration("1m30s") == 90
    assert parse_duration(5) == 5 and parse_duration("2") == 2 and parse_duration("500ms") == 0.5
    with pytest.raises(ValueError):
        parse_duration("5 minutes")


STOPPABLE = """
import sys
from pathlib import Path
from sublimate.pipelines.runner import RunOptions, load_manifest, run_workflow
wf = load_manifest(sys.argv[1])
try:
    run_workflow(wf, {}, RunOptions(home=Path(sys.argv[2]), reporter=lambda e: None))
except KeyboardInterrupt:
    sys.exit(42)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_nodes_and_writes_status(tmp_path: Path, sig: int) -> None:
    path = tmp_path / "wf.yaml"
    path.write_text(manifest("""
        kind: Workflow
        metadata: {name: stop}
        spec:
          entrypoint: main
          templates:
          - name: main
            script: {command: [sh], source: "echo $$ > pid; sleep 30"}
    """))
    proc = subprocess.Popen([sys.executable, "-c", STOPPABLE, str(path), str(tmp_path)])
    pid_file: Path | None = None
    deadline = time.monotonic() + 10
    while pid_file is None and time.monotonic() < deadline:
        # the step's working directory: / in its view (its layer fs/), else its node folder
        found = [*(tmp_path / "runs").glob("stop/nodes/*/fs/pid"),
                 *(tmp_path / "runs").glob("stop/nodes/*/pid")]
        if found and found[0].read_text().strip():
            pid_file = found[0]
        time.sleep(0.02)
    assert pid_file is not None
    assert pod_pid(int(pid_file.read_text()), f"{tmp_path}/runs/stop/nodes/") is not None
    proc.send_signal(sig)
    assert proc.wait(timeout=10) == 42
    status = json.loads((tmp_path / "runs" / "stop" / "status.json").read_text())
    assert status["phase"] == "Failed" and status["message"] == "stopped"
    time.sleep(0.1)
    assert pod_pid(int(pid_file.read_text()), f"{tmp_path}/runs/stop/nodes/") is None


def test_optional_secret_env_comes_from_the_local_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: secret-}
spec:
  entrypoint: show
  templates:
  - name: show
    script:
      image: python
      command: [python]
      env:
      - name: AWS_ACCESS_KEY_ID
        valueFrom: {secretKeyRef: {name: s3, key: access-key, optional: true}}
      - {name: PLAIN, value: here}
      source: |
        import os
        value = os.environ.get("AWS_ACCESS_KEY_ID", "unset")
        print(value, value[::-1], os.environ["PLAIN"])
"""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-local-env")
    events: list = []
    result = run_workflow(load_manifest(manifest), {},
                          RunOptions(home=tmp_path, reporter=events.append))
    assert result.phase == "Succeeded"
    # the value reached the step (reversed, it is not masked), and is masked where it shows
    assert result.nodes[0].result == "*** vne-lacol-morf here"
    assert [e.message for e in events if e.kind == "note"] == [
        "AWS_ACCESS_KEY_ID taken from this machine's environment: an optional secretKeyRef "
        "that no Secret manifest provides"]
    # A required one is no longer refused before the run: its pod fails as the kubelet's would.
    required = manifest.replace("optional: true", "optional: false")
    assert unsupported_fields(load_manifest(required)) == []
    failed = run_workflow(load_manifest(required), {}, RunOptions(home=tmp_path, reporter=None))
    assert (failed.phase, failed.nodes[0].phase) == ("Error", "Error")
    assert failed.nodes[0].message.startswith(
        'CreateContainerConfigError: secret "s3" not found (no manifests given; give it as a '
        "Secret manifest beside the workflow or in --objects DIR)")
