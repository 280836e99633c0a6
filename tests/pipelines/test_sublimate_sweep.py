"""Sweeps (issue 14): the ``sweep-grid`` step's expansion and checks, the ``sublimate-sweep``
manifest's shape (sublimate-train's own steps by templateRef, a capped fan-out that survives a
failed point), and real local runs: a two-point sweep on digits with its report and best point,
a sweep with a point that fails at run time, and one where every point fails."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from sublimate.components.base import settings as declared
from sublimate.components.base.settings import SettingError
from sublimate.components.steps import sweep_grid
from tests.conftest import REPO, run_cli

MANIFEST = REPO / "argo" / "sublimate-sweep.yaml"
# Small and quick: one epoch of digits.
QUICK = ("-p", "epochs=1", "-p", "checkpoint-every=0")
# digits has 1,438 training examples: a larger global batch passes every check made before
# the data is staged and fails the train step, which is what a point failing at run time is.
TOO_LARGE = 2048


def _volume(home: Path) -> Path:
    return home / "volumes" / "sublimate-data"


def _sweep(home: Path, *parameters: str, target: str = "sweep") -> tuple[int, dict, str]:
    """`sublimate run TARGET -o json` with these parameters: exit status, result, stderr."""
    completed = run_cli("run", target, "-q", "-o", "json", *QUICK, *parameters, home=home,
                        timeout=240)
    result = json.loads(completed.stdout) if completed.stdout.strip() else {}
    return completed.returncode, result, completed.stderr


def _points(result: dict) -> dict[str, dict]:
    """The fan-out's children (one sweep-point DAG each) by point id, each with its own
    nodes by display name."""
    nodes = {node["id"]: node for node in result["nodes"]}
    points = {}
    for node in result["nodes"]:
        if node["template"] != "sweep-point" or node["type"] != "DAG":
            continue  # the fan-out's TaskGroup has the template too
        point_id = node["display_name"].split(",id:", 1)[1].split(",", 1)[0]
        inside = {}
        pending = list(node["children"])
        while pending:
            child = nodes[pending.pop()]
            inside.setdefault(child["display_name"], child)
            pending += child["children"]
        points[point_id] = {**node, "steps": inside}
    return points


# ---------------------------------------------------------------- the expansion


def test_points_are_the_product_of_the_axes_in_order_with_every_setting() -> None:
    fixed = {"epochs": "3", "nodes": "1", "learning-rate": "0.05"}
    points = sweep_grid.expand(
        '{"algorithm": ["sync", "bmuf", "easgd"], "global-batch-size": [64, 128]}', fixed,
        "my-sweep")
    assert [p.id for p in points] == ["p00", "p01", "p02", "p03", "p04", "p05"]
    assert [p.run_id for p in points] == [f"my-sweep-p0{i}" for i in range(6)]
    # the last axis varies fastest, values keep their JSON types for the report
    assert [tuple(p.params.values()) for p in points] == [
        ("sync", 64), ("sync", 128), ("bmuf", 64), ("bmuf", 128), ("easgd", 64),
        ("easgd", 128)]
    names = {s.name for s in declared.SETTINGS if s.in_pipeline and s.step in ("train",
                                                                             "evaluate")}
    for point in points:
        run = point.run()
        assert set(run) == names | {"id"}, "an item carries every train and evaluate setting"
        assert run["run-id"] == point.run_id and run["id"] == point.id
        assert run["algorithm"] == point.params["algorithm"]
        assert run["global-batch-size"] == str(point.params["global-batch-size"])
        assert run["epochs"] == "3" and run["learning-rate"] == "0.05"  # the fixed values
        assert run["momentum"] == declared.BY_NAME["momentum"].default_text()  # defaults
        assert all(isinstance(value, str) for value in run.values())
        assert point.summary() == {"id": point.id, "run-id": point.run_id,
                                   "params": point.params}


def test_point_ids_sort_in_grid_order() -> None:
    assert sweep_grid.point_id(0, 1) == "p00"
    assert sweep_grid.point_id(7, 64) == "p07"
    assert sweep_grid.point_id(5, 101) == "p005"  # wider grids than MAX_POINTS still sort
    ids = [sweep_grid.point_id(i, 64) for i in range(64)]
    assert ids == sorted(ids)


def test_values_are_normalised_by_their_settings() -> None:
    (point,) = sweep_grid.expand('{"nesterov": [false]}', {}, "s")
    assert point.settings["nesterov"] == "false" and point.params == {"nesterov": False}
    elastic = sweep_grid.expand('{"nodes": ["1:2", 1]}', {"max-restarts": "1"}, "s")
    assert [p.params["nodes"] for p in elastic] == ["1:2", 1]
    auto = sweep_grid.expand('{"block-momentum": ["auto", 0.5]}', {"algorithm": "bmuf"}, "s")
    assert [p.settings["block-momentum"] for p in auto] == ["auto", "0.5"]


@pytest.mark.parametrize(("grid", "message"), [
    ("algorithm=sync", "grid: not JSON"),
    ('["sync", "bmuf"]', "grid: expected a JSON object of axis -> list of values, got list"),
    ("{}", "grid: no axis"),
    ('{"algoritm": ["sync"]}', "grid: unknown axis 'algoritm' (did you mean algorithm?); "
                               "an axis is a train or evaluate setting: accumulation-steps,"),
    ('{"run-id": ["a", "b"]}', "grid: run-id cannot be an axis"),
    ('{"dataset": ["digits"]}', "grid: dataset cannot be an axis"),
    ('{"registry": ["/tmp/r"]}', "grid: unknown axis 'registry'"),
    ('{"algorithm": "sync"}', 'grid: algorithm: expected a list of values, got "sync"'),
    ('{"algorithm": []}', "grid: algorithm: the list of values is empty"),
    ('{"algorithm": ["sync", "adam"]}',
     "grid: algorithm: 'adam' is not one of sync, async, bmuf, easgd"),
    ('{"epochs": [1, "two"]}', "grid: epochs: 'two' is not an integer"),
    ('{"epochs": [0]}', "grid: epochs: 0 is below the minimum 1"),
    ('{"nesterov": [null]}', "grid: nesterov: null is not a value"),
    ('{"learning-rate": [0.1, 0.10]}', "grid: learning-rate: 0.1 is listed twice"),
    ('{"seed": [0, 1, 2, 3, 4, 5, 6, 7, 8], "epochs": [1, 2, 3, 4, 5, 6, 7, 8]}',
     "grid: 9 seed x 8 epochs = 72 points, more than the 64 a sweep runs"),
    ('{"global-batch-size": [64, 63]}',
     "grid point p01 (global-batch-size=63): global-batch-size 63 is not divisible by "
     "nodes x procs-per-node = 2"),
])
def test_a_bad_grid_is_refused_in_one_line_naming_what_is_wrong(grid: str, message: str) -> None:
    with pytest.raises(SettingError) as refused:
        sweep_grid.expand(grid, {}, "s")
    assert str(refused.value).startswith(message), str(refused.value)
    assert "\n" not in str(refused.value)


def test_the_step_writes_its_outputs_and_refuses_a_bad_grid(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    outputs = {name: tmp_path / "out" / name for name in ("runs", "points", "size", "sweep-dir")}
    flags = [arg for name, path in outputs.items() for arg in (f"--{name}-output", str(path))]
    common = ["--workflow-name", "sublimate-sweep-ab12c", "--sweeps-root", str(tmp_path / "sw"),
              "--nodes", "1", *flags]
    assert sweep_grid.main(["--grid", '{"seed": [1, 2]}', *common]) == 0
    runs = json.loads(outputs["runs"].read_text())
    assert [(r["id"], r["run-id"], r["seed"], r["nodes"]) for r in runs] == [
        ("p00", "sublimate-sweep-ab12c-p00", "1", "1"),
        ("p01", "sublimate-sweep-ab12c-p01", "2", "1")]
    assert json.loads(outputs["points"].read_text()) == [
        {"id": "p00", "run-id": "sublimate-sweep-ab12c-p00", "params": {"seed": 1}},
        {"id": "p01", "run-id": "sublimate-sweep-ab12c-p01", "params": {"seed": 2}}]
    assert outputs["size"].read_text() == "2"
    assert outputs["sweep-dir"].read_text() == str(tmp_path / "sw" / "sublimate-sweep-ab12c")
    # run-id names the points and the report's folder instead of the workflow
    assert sweep_grid.main(["--grid", '{"seed": [1]}', "--run-id", "lr-study", *common]) == 0
    assert json.loads(outputs["runs"].read_text())[0]["run-id"] == "lr-study-p00"
    assert outputs["sweep-dir"].read_text().endswith("/sw/lr-study")

    termination = tmp_path / "termination-log"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SUBLIMATE_TERMINATION_LOG", str(termination))
        assert sweep_grid.main(["--grid", '{"seed": [-1]}', *common]) == 2
    assert termination.read_text() == "grid: seed: -1 is below the minimum 0"
    assert "sweep-grid: error: grid: seed: -1 is below the minimum 0" in capsys.readouterr().err


def test_run_refuses_a_bad_grid_before_any_step_runs(home: Path) -> None:
    # --dry-run: the check comes first, and a check that let a grid through starts nothing
    completed = run_cli("run", "sweep", "--dry-run", "-p", 'grid={"algorithm": ["sync", "sgd"]}',
                        home=home)
    assert completed.returncode == 2
    assert "grid: algorithm: 'sgd' is not one of sync, async, bmuf, easgd" in completed.stderr
    completed = run_cli("run", "sweep", "--dry-run", "-p", 'grid={"global-batch-size": [64, 90]}',
                        "-p", "nodes=4", home=home)
    assert completed.returncode == 2
    assert "grid point p01 (global-batch-size=90): global-batch-size 90 is not divisible by " \
           "nodes x procs-per-node = 4" in completed.stderr
    completed = run_cli("run", "sweep", "--dry-run", "-p", 'grid={"global-batch-size": [64]}',
                        "-p", "nodes=4", home=home)
    assert completed.returncode == 0, completed.stderr
    assert "for each item of {{tasks.sweep-grid.outputs.parameters.runs}}" in completed.stdout


# ---------------------------------------------------------------- the manifest


@pytest.fixture(scope="module")
def manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def _templates(document: dict) -> dict[str, dict]:
    return {template["name"]: template for template in document["spec"]["templates"]}


def test_the_sweep_calls_sublimate_trains_own_steps(manifest: dict) -> None:
    train = _templates(yaml.safe_load((REPO / "argo" / "sublimate-train.yaml").read_text()))
    templates = _templates(manifest)
    assert not {"stage-data", "train", "evaluate"} & set(templates), "no copies"
    calls = [task for template in templates.values()
             for task in (template.get("dag") or {}).get("tasks", [])]
    referred = {task["name"]: task["templateRef"] for task in calls if "templateRef" in task}
    assert referred == {name: {"name": "sublimate-train", "template": name}
                        for name in ("stage-data", "train", "evaluate")}
    # every input those templates need is passed (the ones without a default above all)
    for task in calls:
        if "templateRef" in task:
            needed = {p["name"] for p in train[task["name"]]["inputs"]["parameters"]}
            given = {p["name"] for p in task["arguments"]["parameters"]}
            assert given == needed, (task["name"], needed ^ given)
    # a templateRef'd template sees the caller's workflow.parameters: sublimate-train's steps
    # must read their inputs only, or a sweep would train its fixed settings, not its points
    for name in ("stage-data", "train", "evaluate"):
        assert "workflow.parameters" not in json.dumps(train[name])


def test_the_fan_out_passes_every_setting_of_a_point_and_survives_a_failure(
        manifest: dict) -> None:
    templates = _templates(manifest)
    main = templates[manifest["spec"]["entrypoint"]]
    assert main["parallelism"] == 2
    tasks = {task["name"]: task for task in main["dag"]["tasks"]}
    assert [(name, task.get("depends")) for name, task in tasks.items()] == [
        ("stage-data", None), ("sweep-grid", None), ("sweep", "stage-data && sweep-grid"),
        ("compare", "sweep")]
    sweep = tasks["sweep"]
    assert sweep["withParam"] == "{{tasks.sweep-grid.outputs.parameters.runs}}"
    assert sweep["continueOn"] == {"failed": True}
    (item,) = (p.run() for p in sweep_grid.expand('{"seed": [1]}', {}, "s"))
    arguments = {p["name"]: p["value"] for p in sweep["arguments"]["parameters"]}
    assert arguments.pop("data-dir") == "{{tasks.stage-data.outputs.parameters.dataset-dir}}"
    assert arguments == {name: f"{{{{item.{name}}}}}" for name in item if name != "id"}
    compare = {p["name"]: p["value"] for p in tasks["compare"]["arguments"]["parameters"]}
    assert compare == {"points": "{{tasks.sweep-grid.outputs.parameters.points}}",
                       "sweep-dir": "{{tasks.sweep-grid.outputs.parameters.sweep-dir}}",
                       "metric": "{{workflow.parameters.metric}}",
                       "metric-goal": "{{workflow.parameters.metric-goal}}",
                       "target": "{{workflow.parameters.target}}"}
    outputs = {p["name"]: p for p in main["outputs"]["parameters"]}
    assert {name: p["globalName"] for name, p in outputs.items()} == {
        "best-point": "best-point", "report": "report"}
    parameters = {p["name"]: p for p in manifest["spec"]["arguments"]["parameters"]}
    assert json.loads(parameters["grid"]["value"]) == {"algorithm": ["sync", "bmuf"]}
    assert sweep_grid.expand(parameters["grid"]["value"], {}, "s")  # the default is valid
    assert {"target", "metric-goal", "metric", "dataset", "run-id"} <= set(parameters)


# ---------------------------------------------------------------- real runs


def test_a_sweep_trains_every_point_and_reports_the_best(home: Path) -> None:
    status, result, stderr = _sweep(
        home, "-p", 'grid={"algorithm": ["sync", "bmuf"]}', "-p", "nodes=2")
    assert status == 0, stderr[-3000:]
    assert result["phase"] == "Succeeded"
    name = result["name"]
    points = _points(result)
    assert sorted(points) == ["p00", "p01"]
    metrics = {}
    for point_id, point in points.items():
        assert point["phase"] == "Succeeded"
        assert {"train", "evaluate"} <= set(point["steps"])
        run = _volume(home) / "runs" / f"{name}-{point_id}"
        assert point["steps"]["train"]["outputs"]["parameters"]["run-dir"] == \
            f"/mnt/sublimate/runs/{name}-{point_id}"
        evaluation = json.loads((run / "metrics.json").read_text())
        metrics[point_id] = evaluation["accuracy"]
        assert evaluation["algorithm"] == {"p00": "sync", "p01": "bmuf"}[point_id]
    outputs = result["outputs"]["parameters"]
    best = json.loads(outputs["best-point"])
    assert best["id"] in points and best["run-id"] == f"{name}-{best['id']}"
    assert best["params"] == {"algorithm": {"p00": "sync", "p01": "bmuf"}[best["id"]]}
    assert metrics[best["id"]] == max(metrics.values())
    assert outputs["report"] == f"/mnt/sublimate/sweeps/{name}/report.md"
    report = _volume(home) / "sweeps" / name / "report.md"
    text = report.read_text()
    assert "p00" in text and "p01" in text and "bmuf" in text
    assert list(report.parent.glob("*.png")), "the report has its plots"
    # `sublimate report` on the sweep's name: its points and the best one.
    printed = run_cli("report", name, home=home)
    assert printed.returncode == 0, printed.stderr
    assert f"  best {best['id']} (run {name}-{best['id']}): accuracy " in printed.stdout
    assert "  p00  algorithm=sync: accuracy " in printed.stdout
    assert "  p01  algorithm=bmuf: accuracy " in printed.stdout


def test_a_failed_point_is_reported_and_the_sweep_goes_on(home: Path) -> None:
    status, result, stderr = _sweep(
        home, "-p", f'grid={{"global-batch-size": [64, {TOO_LARGE}]}}', "-p", "nodes=1",
        target=str(MANIFEST))  # the rendered file: sublimate-train's steps come from argo/
    assert status == 0, stderr[-3000:]
    assert result["phase"] == "Succeeded"
    points = _points(result)
    assert points["p00"]["phase"] == "Succeeded"
    failed = points["p01"]
    assert failed["phase"] == "Failed"
    assert f"global-batch-size {TOO_LARGE} is larger than the" in \
        failed["steps"]["train"]["message"]
    assert failed["steps"]["evaluate"]["phase"] == "Omitted"
    best = json.loads(result["outputs"]["parameters"]["best-point"])
    assert best["id"] == "p00" and best["params"] == {"global-batch-size": 64}
    report = (_volume(home) / "sweeps" / result["name"] / "report.md").read_text()
    assert "p01" in report and "fail" in report.lower()


def test_a_sweep_whose_every_point_fails_fails_and_runs_two_points_at_a_time(
        home: Path) -> None:
    sizes = [TOO_LARGE, TOO_LARGE * 2, TOO_LARGE * 4]
    status, result, _ = _sweep(
        home, "-p", f'grid={{"global-batch-size": {json.dumps(sizes)}}}', "-p", "nodes=1")
    assert status == 1 and result["phase"] == "Failed"
    points = _points(result)
    assert sorted(points) == ["p00", "p01", "p02"]
    assert all(point["phase"] == "Failed" for point in points.values())
    compare = next(node for node in result["nodes"]
                   if node["display_name"] == "compare" and node["template"] == "compare")
    assert compare["phase"] == "Failed"
    # parallelism 2: while a point runs, at most one other does
    spans = [(datetime.fromisoformat(p["started_at"]), datetime.fromisoformat(p["finished_at"]))
             for p in points.values()]
    for start, _ in spans:
        assert sum(1 for s, f in spans if s <= start < f) <= 2
