"""The local template library: WorkflowTemplates a manifest refers to, found in its folder and
in ``--templates DIR``; CronWorkflows run once as Argo's cron controller starts them."""

from __future__ import annotations

import re
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sublimate.pipelines.cli import main
from sublimate.pipelines.runner import ManifestError, RunOptions, load_manifest, run_workflow
from sublimate.pipelines.runner.manifest.library import join_specs
from tests.conftest import REPO

ROOT = REPO
TEMPLATES = ROOT / "tests" / "manifests" / "templates"
LIBRARY, EXTRA = TEMPLATES / "library", TEMPLATES / "extra"
RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d)")


def _run(workflow: dict, home: Path):
    return run_workflow(workflow, {}, RunOptions(home=home, reporter=lambda event: None))


def test_workflow_template_ref_from_a_sibling_file_and_template_ref_from_templates_dir(
        tmp_path: Path) -> None:
    workflow = load_manifest(LIBRARY / "greet-once.yaml", template_dirs=[EXTRA])
    spec = workflow["spec"]
    assert "workflowTemplateRef" not in spec and spec["entrypoint"] == "greet"
    # Argo's JoinWorkflowSpec: the workflow's argument replaces the template's whole
    assert spec["arguments"]["parameters"] == [{"name": "who", "value": "sublimate"},
                                               {"name": "punctuation", "value": "!"}]
    assert {"shared-steps.echo-twice", "shared-steps.echo"} <= {t["name"]
                                                                  for t in spec["templates"]}
    result = _run(workflow, tmp_path)
    assert result.phase == "Succeeded"
    assert result.node(f"{result.name}.say").result == "hello sublimate!"
    assert result.node(f"{result.name}.shared[1].second").result == "shared sublimate"


def test_template_ref_without_its_folder_names_the_folders_searched() -> None:
    with pytest.raises(ManifestError) as info:
        load_manifest(LIBRARY / "greet-once.yaml")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("spec.templates[0].dag.tasks[1].templateRef.name: "
                              "WorkflowTemplate 'shared-steps' not found in the manifest, ")
    assert str(LIBRARY) in message


def test_missing_workflow_template_names_every_folder(tmp_path: Path) -> None:
    (tmp_path / "wf.yaml").write_text(
        "apiVersion: argoproj.io/v1alpha1\nkind: Workflow\nmetadata: {generateName: x-}\n"
        "spec: {workflowTemplateRef: {name: nowhere}}\n")
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path / "wf.yaml", template_dirs=[EXTRA])
    assert str(info.value) == (f"spec.workflowTemplateRef.name: WorkflowTemplate 'nowhere' not "
                               f"found in the manifest, {tmp_path}/, {EXTRA}/")
    with pytest.raises(ManifestError, match=r"--templates .*absent: not a folder"):
        load_manifest(tmp_path / "wf.yaml", template_dirs=[tmp_path / "absent"])


def test_a_template_defined_twice_names_both_files(tmp_path: Path) -> None:
    shutil.copy(LIBRARY / "greet-once.yaml", tmp_path)
    shutil.copy(LIBRARY / "greeter.yaml", tmp_path)
    other = tmp_path / "more"
    other.mkdir()
    shutil.copy(LIBRARY / "greeter.yaml", other / "copy.yml")
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path / "greet-once.yaml", template_dirs=[other, EXTRA])
    assert str(info.value) == (
        f"spec.workflowTemplateRef.name: WorkflowTemplate 'greeter' is defined twice: in "
        f"{tmp_path / 'greeter.yaml'} and {other / 'copy.yml'}")


def test_cluster_scope_finds_cluster_workflow_templates_only(tmp_path: Path) -> None:
    text = ("apiVersion: argoproj.io/v1alpha1\nkind: Workflow\nmetadata: {generateName: c-}\n"
            "spec: {workflowTemplateRef: {name: cluster-hello, clusterScope: %s}}\n")
    (tmp_path / "cluster.yaml").write_text(text % "true")
    result = _run(load_manifest(tmp_path / "cluster.yaml", template_dirs=[EXTRA]), tmp_path)
    assert result.node(result.name).result == "cluster hello"
    (tmp_path / "cluster.yaml").write_text(text % "false")
    with pytest.raises(ManifestError, match="WorkflowTemplate 'cluster-hello' not found"):
        load_manifest(tmp_path / "cluster.yaml", template_dirs=[EXTRA])


def test_join_specs_follows_argo_merge_rules() -> None:
    template = {"entrypoint": "a", "parallelism": 2,
                "arguments": {"parameters": [{"name": "p", "value": "1", "enum": ["1", "2"]},
                                             {"name": "q", "value": "t"}]},
                "volumes": [{"name": "v", "emptyDir": {}}],
                "templates": [{"name": "a", "container": {"command": ["a"], "args": ["x"]}}]}
    workflow = {"workflowTemplateRef": {"name": "t"}, "entrypoint": "b",
                "arguments": {"parameters": [{"name": "p", "value": "2"},
                                             {"name": "r", "value": "new"}]},
                "volumes": [{"name": "w", "emptyDir": {}}],
                "templates": [{"name": "a", "container": {"args": ["y"]}},
                              {"name": "b", "container": {"command": ["b"]}}]}
    joined = join_specs(workflow, template)
    assert joined["entrypoint"] == "b" and joined["parallelism"] == 2
    assert joined["arguments"]["parameters"] == [
        {"name": "p", "value": "2"}, {"name": "q", "value": "t"}, {"name": "r", "value": "new"}]
    assert [v["name"] for v in joined["volumes"]] == ["v", "w"]
    assert joined["templates"] == [{"name": "a", "container": {"command": ["a"], "args": ["y"]}},
                                   {"name": "b", "container": {"command": ["b"]}}]
    assert "workflowTemplateRef" not in joined


def test_cron_workflow_runs_once_as_argo_starts_it(tmp_path: Path) -> None:
    notes: list[str] = []
    before = time.time()
    workflow = load_manifest(LIBRARY / "nightly-greeting.yaml", notes=notes)
    meta = workflow["metadata"]
    assert re.fullmatch(r"nightly-greeting-\d+", meta["name"])
    assert abs(int(meta["name"].rsplit("-", 1)[1]) - before) < 60
    assert meta["labels"] == {"workflows.argoproj.io/cron-workflow": "nightly-greeting",
                              "kind-of-run": "nightly"}
    # The cron note, then the runner's one note on cluster-only fields (the step's image).
    assert notes[0] == ("CronWorkflow nightly-greeting: schedules, timezone, concurrencyPolicy, "
                        "successfulJobsHistoryLimit not applied (cron scheduling; this is one "
                        "run, started now)")
    assert [note for note in notes[1:] if "not applied locally" not in note] == []
    result = _run(workflow, tmp_path)
    assert result.phase == "Succeeded"
    stamp, name = result.node(result.name).result.split()
    assert name == result.name == meta["name"]
    assert RFC3339.fullmatch(stamp) and stamp.endswith("Z")
    scheduled = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert abs(scheduled.timestamp() - before) < 60
    assert scheduled.tzinfo is not None


def test_cron_workflow_time_zone_and_unknown_fields(tmp_path: Path) -> None:
    text = (LIBRARY / "nightly-greeting.yaml").read_text()
    moment = datetime(2026, 1, 2, 3, 4, 5, 678, tzinfo=UTC)
    berlin = load_manifest(text.replace("timezone: UTC", "timezone: Europe/Berlin"), now=moment)
    assert berlin["metadata"]["annotations"]["workflows.argoproj.io/scheduled-time"] == \
        "2026-01-02T04:04:05+01:00"
    assert berlin["metadata"]["name"] == f"nightly-greeting-{int(moment.timestamp())}"
    with pytest.raises(ManifestError, match=r"spec\.timezone: unknown time zone 'Mars/Base'"):
        load_manifest(text.replace("timezone: UTC", "timezone: Mars/Base"))
    with pytest.raises(ManifestError, match=r"^spec\.frequency: not a CronWorkflow field$"):
        load_manifest(text.replace("timezone: UTC", "frequency: daily"))


def test_the_nightly_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    nightly = str(ROOT / "argo" / "sublimate-train-nightly.yaml")
    home = ["--home", str(tmp_path)]
    assert main(["run", nightly, "--dry-run", *home]) == 0
    out, err = capsys.readouterr()
    assert "dry run of sublimate-train-nightly-" in out and "stage-data" in out
    assert err.count("note: CronWorkflow sublimate-train-nightly: ") == 1
    assert not (tmp_path / "runs").exists()
    assert main(["run", nightly, "-p", "epochs=2", "-q", "-o", "json", *home]) == 0
    out, err = capsys.readouterr()
    assert '"phase": "Succeeded"' in out
    (run,) = (tmp_path / "runs").iterdir()
    assert re.fullmatch(r"sublimate-train-nightly-\d+", run.name)
    assert "workflows.argoproj.io/cron-workflow: sublimate-train-nightly" in \
        (run / "workflow.yaml").read_text()
