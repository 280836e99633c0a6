"""The sublimate-train WorkflowTemplate: its shape, its UI form, and that argo/ matches it."""

from __future__ import annotations

import json

import pytest
import yaml

from sublimate.pipelines.cli import main
from sublimate.pipelines.lint import lint_document
from sublimate.pipelines.render import render_all, render_dict
from sublimate.pipelines.typed_parameters import TYPES_ANNOTATION
from tests.conftest import REPO


@pytest.fixture(scope="module")
def manifest() -> dict:
    return render_dict("train")


def _templates(manifest: dict) -> dict[str, dict]:
    return {template["name"]: template for template in manifest["spec"]["templates"]}


def test_committed_manifests_match_the_hera_source() -> None:
    stale = [str(path) for path, changed in render_all(REPO / "argo", check=True) if changed]
    assert not stale, f"run `sublimate render`: {stale} differ from the Hera definitions"


def test_render_check_reports_drift(tmp_path, capsys: pytest.CaptureFixture) -> None:
    assert main(["render", "--output-dir", str(tmp_path)]) == 0
    target = tmp_path / "sublimate-train.yaml"
    target.write_text(target.read_text().replace("value: digits", "value: mnist"))
    assert main(["render", "--check", "--output-dir", str(tmp_path)]) == 1
    assert "differs from the Hera source" in capsys.readouterr().out
    assert "mnist" in target.read_text(), "--check must not rewrite the file"


def test_argo_folder_passes_strict_lint(capsys: pytest.CaptureFixture) -> None:
    assert main(["lint", str(REPO / "argo")]) == 0
    assert "passed lint" in capsys.readouterr().out


def test_dag_is_stage_train_evaluate_on_one_shared_volume(manifest: dict) -> None:
    templates = _templates(manifest)
    assert manifest["kind"] == "WorkflowTemplate"
    assert manifest["metadata"]["name"] == "sublimate-train"
    dag = templates[manifest["spec"]["entrypoint"]]["dag"]["tasks"]
    assert [(task["name"], task.get("depends")) for task in dag] == [
        ("stage-data", None), ("train", "stage-data"), ("evaluate", "train")]
    for name in ("stage-data", "train", "evaluate"):
        template = templates[name]
        assert template["container"]["volumeMounts"] == [
            {"name": "shared", "mountPath": "/mnt/sublimate"}]
        assert template["volumes"] == [
            {"name": "shared", "persistentVolumeClaim": {"claimName": "sublimate-data"}}]


def test_accuracy_is_an_output_of_evaluate_and_of_the_pipeline(manifest: dict) -> None:
    templates = _templates(manifest)
    evaluate_outputs = templates["evaluate"]["outputs"]["parameters"]
    assert evaluate_outputs == [
        {"name": "accuracy", "valueFrom": {"path": "/tmp/outputs/accuracy"}},
        {"name": "metric", "valueFrom": {"path": "/tmp/outputs/metric"}}]
    pipeline_outputs = {p["name"]: p for p in templates["train-pipeline"]["outputs"]["parameters"]}
    assert pipeline_outputs["accuracy"]["valueFrom"]["parameter"] == \
        "{{tasks.evaluate.outputs.parameters.accuracy}}"
    # -p metric chooses which of metrics.json's values the workflow outputs as `metric`.
    assert pipeline_outputs["metric"]["valueFrom"]["parameter"] == \
        "{{tasks.evaluate.outputs.parameters.metric}}"
    assert pipeline_outputs["metric"]["globalName"] == "metric"
    inputs = {p["name"]: p.get("value", p.get("default")) for p in
              templates["evaluate"]["inputs"]["parameters"]}
    assert inputs["metric"] == "accuracy" and inputs["eval-entrypoint"] == ""


def test_every_parameter_is_described_with_enums_for_closed_sets(manifest: dict) -> None:
    parameters = {p["name"]: p for p in manifest["spec"]["arguments"]["parameters"]}
    assert {"dataset", "algorithm", "nodes", "procs-per-node", "epochs", "global-batch-size",
            "learning-rate", "seed"} <= set(parameters)
    for parameter in parameters.values():
        assert len(parameter.get("description", "")) > 15, parameter["name"]
        assert "value" in parameter, f"{parameter['name']} has no default"
    assert parameters["algorithm"]["enum"] == ["sync", "async", "bmuf", "easgd", "diloco"]
    assert parameters["backend"]["enum"] == ["auto", "gloo", "nccl"]
    assert parameters["nodes"]["value"] == "2" and parameters["dataset"]["value"] == "digits"
    types = json.loads(manifest["metadata"]["annotations"][TYPES_ANNOTATION])
    # a count or an elastic range MIN:MAX, each bounded 1-512 (checked by the setting itself)
    assert types["nodes"] == {"type": "string", "pattern": "^[0-9]+(:[0-9]+)?$"}
    assert types["learning-rate"]["type"] == "number"
    assert set(types) <= set(parameters)


def test_a_users_own_pipeline_from_the_components_lints_clean() -> None:
    from hera.workflows import DAG, Parameter, WorkflowTemplate

    from sublimate.components.steps import evaluate, stage_data, train

    with WorkflowTemplate(name="my-train", entrypoint="main",
                          arguments=[Parameter(name="dataset", value="digits")]) as workflow:
        stage, fit, score = stage_data.template(), train.template(), evaluate.template()
        with DAG(name="main"):
            staged = stage(arguments={"dataset": "{{workflow.parameters.dataset}}"})
            trained = fit(arguments={
                **{name: "1" for name in train.TEMPLATE_INPUTS},
                "algorithm": "sync", "data-dir": staged.get_parameter("dataset-dir")})
            scored = score(arguments={"data-dir": staged.get_parameter("dataset-dir"),
                                      "model-dir": trained.get_parameter("run-dir")})
            staged >> trained >> scored
    document = yaml.safe_load(workflow.to_yaml())
    assert lint_document(document) == []
