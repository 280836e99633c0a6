"""Tests for the offline Argo linter (sublimate.pipelines.lint)."""

# No `from __future__ import annotations`: Hera reads the script function's real annotations.
import copy
import functools
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from sublimate.pipelines.lint import (
    LintProblem,
    lint_document,
    lint_paths,
    semantic_problems,
)
from tests.conftest import REPO

GOOD = REPO / "tests" / "manifests" / "lint" / "good"


# --- documents under test ------------------------------------------------------------------------


@functools.cache
def _hera_workflow_template() -> dict[str, Any]:
    """A Hera WorkflowTemplate shaped like sublimate's training pipelines."""
    from hera.workflows import (
        DAG,
        Container,
        Parameter,
        Resources,
        RetryStrategy,
        Volume,
        WorkflowTemplate,
        script,
    )
    from hera.workflows.models import ValueFrom

    shared = Volume(
        name="shared", mount_path="/mnt/shared", access_modes=["ReadWriteMany"], size="1Gi"
    )

    @script(
        image="python:3.11",
        volumes=[shared],
        retry_strategy=RetryStrategy(limit=3),
        outputs=[Parameter(name="out", value_from=ValueFrom(path="/tmp/out"))],
    )
    def prepare(paradigm: str) -> None:
        with open("/tmp/out", "w") as f:
            f.write(paradigm)

    with WorkflowTemplate(
        name="sublimate-train",
        entrypoint="main",
        arguments=[
            Parameter(name="paradigm", value="sync", enum=["sync", "async"], description="paradigm")
        ],
    ) as wt:
        train = Container(
            name="train",
            image="python:3.11",
            command=["python", "-c"],
            args=["print('{{inputs.parameters.data}}')"],
            inputs=[Parameter(name="data")],
            volumes=[shared],
            resources=Resources(cpu_request=1, memory_request="1Gi"),
        )
        with DAG(name="main"):
            p = prepare(arguments={"paradigm": "{{workflow.parameters.paradigm}}"})
            t = train(arguments={"data": p.get_parameter("out")})
            p >> t
    return wt.to_dict()


def hera_wt() -> dict[str, Any]:
    """A fresh copy, so tests can mutate it."""
    return copy.deepcopy(_hera_workflow_template())


def steps_workflow() -> dict[str, Any]:
    return yaml.safe_load((GOOD / "steps-loop.yaml").read_text())


def _templates(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return doc["spec"]["templates"]


def _task(doc: dict[str, Any], name: str) -> dict[str, Any]:
    dag = next(t for t in _templates(doc) if "dag" in t)["dag"]
    return next(task for task in dag["tasks"] if task["name"] == name)


def _template(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in _templates(doc) if t["name"] == name)


# --- documents that must pass -------------------------------------------------------------------


def test_hera_workflow_template_passes_strict_lint() -> None:
    doc = hera_wt()
    # The things this test is meant to cover are really in the rendered YAML.
    assert _template(doc, "prepare")["retryStrategy"]["limit"] == 3  # int: needs IntOrString
    assert doc["spec"]["arguments"]["parameters"][0]["enum"] == ["sync", "async"]
    assert len(doc["spec"]["volumeClaimTemplates"]) == 1
    assert "{{tasks.prepare.outputs.parameters.out}}" in json.dumps(_task(doc, "train"))
    assert lint_document(doc, strict=True) == []


def test_hera_cron_workflow_passes() -> None:
    from hera.workflows import Container, CronWorkflow, Parameter, Steps

    with CronWorkflow(
        name="nightly-train",
        schedules=["0 3 * * *"],
        timezone="UTC",
        concurrency_policy="Forbid",
        entrypoint="main",
        arguments=[Parameter(name="epochs", value="3")],
    ) as cron:
        echo = Container(
            name="echo", image="alpine:3.20", command=["echo", "{{workflow.parameters.epochs}}"]
        )
        with Steps(name="main"):
            echo()
    doc = cron.to_dict()
    assert doc["kind"] == "CronWorkflow"
    assert lint_document(doc) == []
    # The workflowSpec really is checked: break it and the linter notices.
    doc["spec"]["workflowSpec"]["entrypoint"] = "nope"
    assert [p.path for p in lint_document(doc)] == ["spec.workflowSpec.entrypoint"]


def test_argo_style_manifests_pass_and_non_argo_documents_are_skipped() -> None:
    problems, checked = lint_paths([GOOD])
    assert [str(p) for p in problems] == []
    # steps-loop (1) + dag-artifacts (1) + cron-and-friends (2 of 3 documents); the ConfigMap
    # and kustomization.yaml are not Argo documents.
    assert checked == 4


# --- schema failures -------------------------------------------------------------------------


def test_typo_is_an_unknown_field_in_strict_mode_only() -> None:
    doc = hera_wt()
    doc["spec"]["entrypiont"] = doc["spec"].pop("entrypoint")
    strict = lint_document(doc, source="wt.yaml")
    assert any(
        p.path == "spec" and p.message.startswith("unknown field 'entrypiont'") for p in strict
    ), strict
    assert "did you mean 'entrypoint'" in str(strict)
    lax = lint_document(doc, strict=False)
    assert not any("entrypiont" in p.message for p in lax)


def test_wrong_type_reports_exact_path() -> None:
    doc = hera_wt()
    task = _task(doc, "train")
    del task["depends"]
    task["dependencies"] = "prepare"
    problems = lint_document(doc)
    path = "spec.templates[1].dag.tasks[1].dependencies"
    assert LintProblem("<string>", "WorkflowTemplate/sublimate-train", path,
                       "'prepare' is not of type 'array'") in problems  # fmt: skip


def test_bad_enum_lists_allowed_values() -> None:
    doc = hera_wt()
    _template(doc, "prepare")["retryStrategy"]["retryPolicy"] = "Sometimes"
    (problem,) = lint_document(doc)
    assert problem.path == "spec.templates[2].retryStrategy.retryPolicy"
    assert problem.message == (
        "'Sometimes' is not one of the allowed values: "
        "'Always', 'OnFailure', 'OnError', 'OnTransientError'"
    )


def test_missing_required_field_is_named() -> None:
    doc = hera_wt()
    del _template(doc, "prepare")["script"]["image"]
    (problem,) = lint_document(doc)
    assert (problem.path, problem.message) == (
        "spec.templates[2].script",
        "missing required field 'image'",
    )


# --- semantic failures -------------------------------------------------------------------------

Mutation = Callable[[dict[str, Any]], None]


def _set_entrypoint(doc: dict[str, Any]) -> None:
    doc["spec"]["entrypoint"] = "mian"


def _unknown_task_template(doc: dict[str, Any]) -> None:
    _task(doc, "prepare")["template"] = "prepar"


def _unknown_dependency(doc: dict[str, Any]) -> None:
    _task(doc, "train")["depends"] = "prepare && missing.Succeeded"


def _unknown_dependencies_entry(doc: dict[str, Any]) -> None:
    task = _task(doc, "train")
    del task["depends"]
    task["dependencies"] = ["prepare", "prep"]


def _cycle(doc: dict[str, Any]) -> None:
    _task(doc, "prepare")["depends"] = "train"


def _unresolved_workflow_parameter(doc: dict[str, Any]) -> None:
    args = _task(doc, "prepare")["arguments"]["parameters"]
    args[0]["value"] = "{{workflow.parameters.paradgm}}"


def _unresolved_input_parameter(doc: dict[str, Any]) -> None:
    _template(doc, "train")["container"]["args"] = ["{{inputs.parameters.date}}"]


def _not_an_ancestor(doc: dict[str, Any]) -> None:
    del _task(doc, "train")["depends"]


def _undeclared_output(doc: dict[str, Any]) -> None:
    args = _task(doc, "train")["arguments"]["parameters"]
    args[0]["value"] = "{{tasks.prepare.outputs.parameters.result}}"


def _item_outside_loop(doc: dict[str, Any]) -> None:
    _template(doc, "train")["container"]["args"] = ["{{item.x}}"]


def _input_not_passed(doc: dict[str, Any]) -> None:
    del _task(doc, "train")["arguments"]


def _duplicate_template(doc: dict[str, Any]) -> None:
    _templates(doc).append(copy.deepcopy(_template(doc, "train")))


def _no_template_type(doc: dict[str, Any]) -> None:
    del _template(doc, "train")["container"]


TASKS = "spec.templates[1].dag.tasks"
SEMANTIC_CASES: list[tuple[str, Mutation, str, str]] = [
    (
        "missing entrypoint template",
        _set_entrypoint,
        "spec.entrypoint",
        "entrypoint refers to unknown template 'mian' (did you mean 'main'?)",
    ),
    (
        "unknown task template",
        _unknown_task_template,
        f"{TASKS}[0].template",
        "task 'prepare' uses unknown template 'prepar'",
    ),
    (
        "unknown task in depends",
        _unknown_dependency,
        f"{TASKS}[1].depends",
        "depends refers to unknown task 'missing'",
    ),
    (
        "unknown dependency",
        _unknown_dependencies_entry,
        f"{TASKS}[1].dependencies[1]",
        "dependency 'prep' is not a task in this DAG (did you mean 'prepare'?)",
    ),
    ("cycle", _cycle, f"{TASKS}[0]", "dependency cycle: prepare -> train -> prepare"),
    (
        "unresolved workflow parameter",
        _unresolved_workflow_parameter,
        f"{TASKS}[0].arguments.parameters[0].value",
        "unresolved reference '{{workflow.parameters.paradgm}}': workflow parameter 'paradgm' "
        "is not declared in spec.arguments.parameters",
    ),
    (
        "unresolved input parameter",
        _unresolved_input_parameter,
        "spec.templates[0].container.args[0]",
        "unresolved reference '{{inputs.parameters.date}}': template 'train' declares no "
        "input parameter 'date'",
    ),
    (
        "task output that is not an ancestor",
        _not_an_ancestor,
        f"{TASKS}[1].arguments.parameters[0].value",
        "task 'prepare' is not an ancestor of task 'train'",
    ),
    (
        "undeclared task output",
        _undeclared_output,
        f"{TASKS}[1].arguments.parameters[0].value",
        "template 'prepare' (run by task 'prepare') declares no output parameter 'result'",
    ),
    (
        "item outside a loop",
        _item_outside_loop,
        "spec.templates[0].container.args[0]",
        "unresolved reference '{{item.x}}': 'item' is only defined in a task or step with "
        "withItems, withParam or withSequence",
    ),
    (
        "required input not passed",
        _input_not_passed,
        f"{TASKS}[1].arguments",
        "template 'train' needs input parameter 'data', which task 'train' does not pass",
    ),
    (
        "duplicate template",
        _duplicate_template,
        "spec.templates[3].name",
        "duplicate template name 'train'",
    ),
    ("no template type", _no_template_type, "spec.templates[0]", "template 'train' has no type"),
]


@pytest.mark.parametrize(
    ("mutate", "path", "message"),
    [case[1:] for case in SEMANTIC_CASES],
    ids=[case[0] for case in SEMANTIC_CASES],
)
def test_semantic_failure(mutate: Mutation, path: str, message: str) -> None:
    doc = hera_wt()
    mutate(doc)
    problems = lint_document(doc, source="argo/wt.yaml")
    hits = [p for p in problems if p.path == path and message in p.message]
    assert hits, "\n".join(map(str, problems)) or "no problems"
    # The same finding comes from the pure-Python layer alone.
    assert any(p.path == path and message in p.message for p in semantic_problems(doc))


def test_three_task_cycle_is_reported_once() -> None:
    doc = hera_wt()
    dag = _template(doc, "main")["dag"]
    dag["tasks"].append({"name": "third", "template": "train", "depends": "train"})
    dag["tasks"][2]["arguments"] = dag["tasks"][1]["arguments"]
    _task(doc, "prepare")["depends"] = "third"
    cycles = [p.message for p in lint_document(doc) if "cycle" in p.message]
    assert cycles == ["dependency cycle: prepare -> third -> train -> prepare"]


def test_step_reference_must_come_from_an_earlier_group() -> None:
    doc = steps_workflow()
    assert lint_document(doc) == []
    group = _template(doc, "main")["steps"][1]
    group[0]["arguments"]["parameters"][0]["value"] = "{{steps.fan-out.outputs.result}}"
    (problem,) = lint_document(doc)
    assert problem.path == "spec.templates[0].steps[1][0].arguments.parameters[0].value"
    assert "step 'fan-out' is not in an earlier step group than step 'say'" in problem.message


def test_item_is_fine_inside_a_loop_but_not_without_one() -> None:
    doc = steps_workflow()
    del _template(doc, "main")["steps"][1][1]["withParam"]
    (problem,) = lint_document(doc)
    assert problem.path == "spec.templates[0].steps[1][1].arguments.parameters[0].value"
    assert "'item' is only defined" in problem.message


def test_expression_tags_and_unknown_roots_are_not_checked() -> None:
    doc = hera_wt()
    _template(doc, "train")["container"]["args"] = [
        "{{=inputs.parameters.nope}}",  # expr-lang: evaluated by Argo at run time
        "{{ jinja_like }}",  # not an Argo variable root: Argo leaves it alone too
        "{{inputs.parameters.data}} {{pod.name}} {{workflow.creationTimestamp.Y}}",
    ]
    assert lint_document(doc) == []


def test_workflow_template_ref_skips_local_template_checks() -> None:
    doc = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": "from-template-"},
        "spec": {"workflowTemplateRef": {"name": "sublimate-train"}, "entrypoint": "elsewhere"},
    }
    assert lint_document(doc) == []
    del doc["spec"]["workflowTemplateRef"]
    assert [p.path for p in lint_document(doc)] == ["spec.entrypoint"]


# --- files, directories and output format ------------------------------------------------------


def test_yaml_syntax_error_is_a_problem(tmp_path: Path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("apiVersion: argoproj.io/v1alpha1\nkind: Workflow\nspec: [unclosed\n")
    problems, checked = lint_paths([bad])
    assert checked == 0
    (problem,) = problems
    assert problem.source == str(bad)
    assert problem.message.startswith("YAML syntax error: line ")


def test_missing_file_is_a_problem(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    problems, checked = lint_paths([missing])
    assert (checked, problems) == (
        0,
        [LintProblem(str(missing), "", "", "no such file or directory")],
    )


def test_directories_are_walked_sorted_and_non_argo_documents_skipped(tmp_path: Path) -> None:
    wt = hera_wt()
    unnamed = hera_wt()
    del unnamed["metadata"]["name"]
    unnamed["spec"]["entrypoint"] = "missing"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yml").write_text(yaml.safe_dump(wt))
    (tmp_path / "a.yaml").write_text(
        yaml.safe_dump_all([{"apiVersion": "v1", "kind": "ServiceAccount"}, unnamed, [1, 2]])
    )
    (tmp_path / "notes.txt").write_text("kind: Workflow\n")  # not YAML by extension: ignored
    (tmp_path / "kustomization.yaml").write_text("kind: Kustomization\nresources: [a.yaml]\n")

    problems, checked = lint_paths([tmp_path])

    assert checked == 2  # the unnamed WorkflowTemplate and sub/b.yml
    assert [(Path(p.source).name, p.document, p.path) for p in problems] == [
        ("a.yaml", "document 2", "spec.entrypoint"),
        ("a.yaml", "document 3", ""),
    ]
    assert problems[1].message == "document is a list, not a mapping"


def test_problem_string_format() -> None:
    problem = LintProblem(
        "argo/x.yaml",
        "WorkflowTemplate/foo",
        "spec.templates[1].dag.tasks[0].dependencies",
        "'x' is not of type 'array'",
    )
    assert str(problem) == (
        "argo/x.yaml: WorkflowTemplate/foo: spec.templates[1].dag.tasks[0].dependencies: "
        "'x' is not of type 'array'"
    )
    assert str(LintProblem("a.yaml", "Workflow/w", "", "m")) == "a.yaml: Workflow/w: m"


def test_non_argo_document_passed_directly_is_a_problem() -> None:
    (problem,) = lint_document({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}})
    assert problem.path == "kind"
    assert "not an Argo Workflows document" in problem.message


def test_import_is_cheap_and_semantic_checks_do_not_need_jsonschema() -> None:
    code = (
        "import sys\n"
        "from sublimate.pipelines import lint\n"
        "heavy = {'jsonschema', 'yaml'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
        "doc = {'kind': 'Workflow', 'metadata': {'name': 'w'},\n"
        "       'spec': {'entrypoint': 'x', 'templates': []}}\n"
        "problems = lint.semantic_problems(doc)\n"
        "assert [p.path for p in problems] == ['spec.entrypoint'], problems\n"
        "assert 'jsonschema' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(("sub_path", "refusal"), [
    ("../../../../somewhere", "Invalid value: '../../../../somewhere': must not contain '..'"),
    ("/etc", "Invalid value: '/etc': must be a relative path"),
])
def test_lint_refuses_a_sub_path_kubernetes_refuses(sub_path: str, refusal: str) -> None:
    # `sublimate lint` passed both, and the local runner wrote through them into the host.
    doc = yaml.safe_load(f"""
    apiVersion: argoproj.io/v1alpha1
    kind: Workflow
    metadata: {{generateName: escape-}}
    spec:
      entrypoint: main
      arguments: {{parameters: [{{name: user, value: alice}}]}}
      volumes: [{{name: data, persistentVolumeClaim: {{claimName: shared}}}}]
      templates:
      - name: main
        container:
          image: busybox
          command: [sh, -c, "echo pwned > /mnt/out/x"]
          volumeMounts: [{{name: data, mountPath: /mnt/out, subPath: "{sub_path}"}}]
        sidecars:
        - name: helper
          image: busybox
          command: [sleep, "1"]
          volumeMounts: [{{name: data, mountPath: /mnt/h, subPath: "{sub_path}"}}]
    """)
    problems = {(p.path, p.message) for p in semantic_problems(doc)}
    assert ("spec.templates[0].container.volumeMounts[0].subPath", refusal) in problems
    assert ("spec.templates[0].sidecars[0].volumeMounts[0].subPath", refusal) in problems
    # a parameter's value is checked once substituted, by the runner
    doc["spec"]["templates"][0]["container"]["volumeMounts"][0]["subPath"] = \
        "users/{{workflow.parameters.user}}"
    assert not [p for p in semantic_problems(doc) if p.path.endswith("container.volumeMounts[0]"
                                                                      ".subPath")]


def test_lint_refuses_a_workflow_name_kubernetes_refuses() -> None:
    doc = yaml.safe_load("""
    apiVersion: argoproj.io/v1alpha1
    kind: Workflow
    metadata: {name: ../../x}
    spec:
      entrypoint: main
      templates:
      - {name: main, container: {image: busybox, command: [echo, hi]}}
    """)
    (problem,) = [p for p in semantic_problems(doc) if p.path == "metadata.name"]
    assert problem.message.startswith("Invalid value: '../../x': a lowercase RFC 1123 subdomain")
    doc["metadata"] = {"generateName": "nightly-"}
    assert not [p for p in semantic_problems(doc) if p.path.startswith("metadata")]
