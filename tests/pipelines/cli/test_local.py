"""`sublimate run` end to end: real torchrun workers through TorchX, as a user runs it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import env_flags, run_cli

PASSES = "Succeeded"


def _run_json(home: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    # the faults reach the steps only when passed (--env), as a user passes them
    completed = run_cli("run", "-q", "-o", "json", *args, *env_flags(env), home=home)
    assert completed.stdout, completed.stderr
    result = json.loads(completed.stdout)
    result["_exit"], result["_stderr"] = completed.returncode, completed.stderr
    return result


def _nodes(result: dict) -> dict[str, dict]:
    return {node["display_name"]: node for node in result["nodes"]}


def _volume(home: Path) -> Path:
    return home / "volumes" / "sublimate-data"


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    home = tmp_path_factory.mktemp("default") / "home"
    return home, _run_json(home)


def test_default_pipeline_trains_digits_on_two_nodes(default_run: tuple[Path, dict]) -> None:
    home, result = default_run
    assert result["phase"] == PASSES and result["_exit"] == 0, result["_stderr"]
    nodes = _nodes(result)
    assert [nodes[n]["phase"] for n in ("stage-data", "train", "evaluate")] == [PASSES] * 3
    accuracy = float(nodes["evaluate"]["outputs"]["parameters"]["accuracy"])
    assert accuracy >= 0.95
    run_dir = _volume(home) / "runs" / result["name"]
    assert nodes["train"]["outputs"]["parameters"]["run-dir"] == \
        f"/mnt/sublimate/runs/{result['name']}"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["accuracy"] == pytest.approx(accuracy) and metrics["examples"] == 359
    summary = json.loads((run_dir / "train-summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 440
    # two simulated nodes really ran: TorchX kept one log folder per replica
    replicas = list((run_dir / "logs").glob("*/*/worker/*"))
    assert sorted(p.name for p in replicas) == ["0", "1"]
    assert (home / "runs" / result["name"] / "status.json").is_file()


def test_the_run_folder_links_the_results_and_json_agrees_with_the_table(
        default_run: tuple[Path, dict]) -> None:
    home, result = default_run
    run_folder = Path(result["run_dir"])
    assert run_folder == home / "runs" / result["name"]
    # the workflow's own outputs (Argo's status.outputs), the same the table prints
    outputs = result["outputs"]["parameters"]
    assert outputs["accuracy"] == _nodes(result)["evaluate"]["outputs"]["parameters"]["accuracy"]
    assert outputs["results"] == f"/mnt/sublimate/runs/{result['name']}"
    results = run_folder / "outputs" / "results"
    assert results.is_symlink() and result["links"] == {"results": str(results)}
    assert results.resolve() == (_volume(home) / "runs" / result["name"]).resolve()
    for held in ("model.pt", "metrics.json", "train-summary.json", "report/report.json"):
        assert (results / held).is_file(), held
    # node folders say which step they belong to
    assert {p.name.rsplit("-", 1)[0] for p in (run_folder / "nodes").iterdir()} == \
        {"stage-data-0", "train-0", "evaluate-0"}
    for reference in (str(run_folder), result["name"], str(results)):
        completed = run_cli("report", "--no-plots", reference, home=home)
        assert completed.returncode == 0, (reference, completed.stderr)
        assert f"{result['name']}: sync on 2 workers" in completed.stdout


def test_table_output_and_live_progress(tmp_path: Path, default_run: tuple[Path, dict]) -> None:
    home, _ = default_run
    completed = run_cli("run", "-p", "epochs=2", home=home)
    assert completed.returncode == 0, completed.stderr
    # the second run of the same dataset: staging is memoized by the built-in's content, so
    # it is not run again but finished from the cache (Argo's memoizationStatus.hit)
    assert re.search(r"stage-data: Succeeded \(cached: stage-data-digits-[0-9a-f]{16}\)",
                     completed.stderr), completed.stderr
    assert "stage-data(0) |" not in completed.stderr  # never ran: no log line
    assert "stage-data: nothing to transfer" not in completed.stdout  # logs go to stderr
    # the step runs as attempt train(0) of its retry strategy
    assert "train(0) | [node0] epoch 2/2" in completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0].split() == ["NODE", "PHASE", "DURATION", "OUTPUTS"]
    assert any(line.split()[:2] == ["evaluate", PASSES] for line in lines)
    assert any(line.split()[:3] == ["stage-data", PASSES, "(cached)"] for line in lines)
    outputs = next(line for line in lines if line.startswith("outputs: "))
    name = next(line for line in lines if line.endswith(": Succeeded")).split(":")[0]
    assert outputs.startswith("outputs: accuracy=")
    assert outputs.endswith(f"results=/mnt/sublimate/runs/{name}")  # paths are never cut
    folder = home / "runs" / name
    assert f"run folder: {folder} (" in completed.stdout
    volume = (_volume(home) / "runs" / name).resolve()
    assert f"  outputs/results -> {volume}  (" in completed.stdout
    assert f"report: sublimate report {folder}" in completed.stdout
    # two runs compared: their differences side by side, not only both summaries
    first = default_run[1]["name"]
    compared = run_cli("report", "--no-plots", first, name, home=home)
    assert compared.returncode == 0, compared.stderr
    table = compared.stdout.split("compared:\n", 1)[1].splitlines()
    assert re.fullmatch(r" +A: .+ B: .+ B - A", table[0]), table
    accuracy = next(row for row in table if row.strip().startswith("test accuracy"))
    assert re.fullmatch(r"  test accuracy +0\.\d+ +0\.\d+ +[+-]\S+( \((better|worse)\))?",
                        accuracy), accuracy


@pytest.mark.parametrize("algorithm", ["async", "bmuf", "easgd"])
def test_every_paradigm_reaches_the_accuracy_floor(tmp_path: Path, algorithm: str) -> None:
    result = _run_json(tmp_path / "home", "-p", f"algorithm={algorithm}", "-p", "nodes=2")
    assert result["phase"] == PASSES, result["_stderr"]
    assert float(_nodes(result)["evaluate"]["outputs"]["parameters"]["accuracy"]) >= 0.93
    summary = json.loads((_volume(tmp_path / "home") / "runs" / result["name"]
                          / "train-summary.json").read_text())
    assert summary["algorithm"] == algorithm
    if algorithm == "async":
        assert summary["updates_applied"] == 2 * 440 and summary["pushes_per_trainer"] == [440] * 2
    else:
        assert summary["communication_ops_per_worker"] == 440 // 8


def test_a_killed_worker_is_restarted_and_resumes_from_its_checkpoint(
        tmp_path: Path, default_run: tuple[Path, dict]) -> None:
    home = tmp_path / "home"
    result = _run_json(home, "-p", "recovery=restart", "-p", "max-restarts=1",
                       "-p", "checkpoint-every=50",
                       env={"SUBLIMATE_FAIL_AT_STEP": "130", "SUBLIMATE_FAIL_RANK": "1"})
    assert result["phase"] == PASSES, result["_stderr"]
    run_dir = _volume(home) / "runs" / result["name"]
    summary = json.loads((run_dir / "train-summary.json").read_text())
    assert summary["steps"] == 440 and summary["resumed_from_step"] == 100
    log = next((run_dir / "logs").glob("*/*/worker/1/stdout.log")).read_text()
    assert "fault injection: killing rank 1 at step 130" in log
    baseline = float(_nodes(default_run[1])["evaluate"]["outputs"]["parameters"]["accuracy"])
    accuracy = float(_nodes(result)["evaluate"]["outputs"]["parameters"]["accuracy"])
    assert abs(accuracy - baseline) <= 0.01
    # A kill between checkpoints leaves no half-written file to look for; a kill during a
    # checkpoint write does: tests/components/training/test_resume_exact.py covers that case.


def test_a_resubmitted_run_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    home = tmp_path / "home"
    fault = {"SUBLIMATE_FAIL_AT_STEP": "130", "SUBLIMATE_FAIL_RANK": "0"}
    first = _run_json(home, "-p", "run-id=nightly", "-p", "checkpoint-every=50",
                      "-p", "recovery=restart", env=fault)
    assert first["phase"] == "Failed" and first["_exit"] == 1
    assert _nodes(first)["train"]["phase"] == "Failed"
    assert _nodes(first)["evaluate"]["phase"] == "Omitted"
    run_dir = _volume(home) / "runs" / "nightly"
    assert json.loads((run_dir / "checkpoints" / "latest.json").read_text())["step"] == 100
    # Why, in one line, the run's last: rank 0 was killed (it could write no error of its own),
    # named before the connection errors of its peer that followed.
    assert re.search(r"local rank 0 of node\d was killed by SIGKILL \(from outside, or out of "
                     r"memory\); its log: \S+/worker/\d/stderr\.log",
                     first["_stderr"].strip().splitlines()[-1]), first["_stderr"][-3000:]

    second = _run_json(home, "-p", "run-id=nightly", "-p", "checkpoint-every=50",
                       "-p", "recovery=restart")
    assert second["phase"] == PASSES, second["_stderr"]
    summary = json.loads((run_dir / "train-summary.json").read_text())
    assert summary["resumed_from_step"] == 100 and summary["steps"] == 440


@pytest.mark.parametrize(("flag", "message"), [
    ("nodes", "-p 'nodes': expected name=value"),
    ("bogus=1", "unknown parameter 'bogus'"),
    ("epoch=3", "unknown parameter 'epoch' (did you mean 'epochs'?"),
    ("nodes=two", "parameter 'nodes': 'two' does not match pattern '^[0-9]+(:[0-9]+)?$'"),
    ("nodes=0", "nodes: 0 is below the minimum 1"),
    ("nodes=4:2", "nodes: 4:2: the minimum is above the maximum"),
    ("algorithm=hogwild", "parameter 'algorithm': 'hogwild' is not one of sync, async"),
    ("run-id=../elsewhere", "parameter 'run-id'"),
    ("learning-rate=fast", "parameter 'learning-rate'"),
    ("global-batch-size=65", "global-batch-size 65 is not divisible by nodes x procs-per-node = 2"),
])
def test_bad_parameters_fail_before_anything_runs(tmp_path: Path, flag: str,
                                                  message: str) -> None:
    completed = run_cli("run", "-p", flag, home=tmp_path)
    assert completed.returncode == 2
    assert message in completed.stderr
    assert len(completed.stderr.strip().splitlines()) == 1, "one clear error"
    assert not (tmp_path / "runs").exists()


def test_settings_are_checked_together_before_anything_runs(tmp_path: Path) -> None:
    for flags, message in [
        (["algorithm=bmuf", "sync-period=0"], "parameter 'sync-period': 0 is below the minimum 1"),
        (["nodes=3", "accumulation-steps=2"], "global-batch-size 64 is not divisible by nodes x "
                                              "procs-per-node x accumulation-steps = 3 x 1 x 2"),
        # elastic runs relaunch 3 times unless told otherwise (max-restarts auto); an explicit 0
        # cannot work
        (["nodes=2:3", "global-batch-size=60", "max-restarts=0", "recovery=restart"],
         "nodes 2:3: elastic training needs max-restarts of at least 1"),
    ]:
        completed = run_cli("run", *[f"-p{flag}" for flag in flags], home=tmp_path)
        assert completed.returncode == 2
        assert completed.stderr.strip().splitlines() == [f"error: {message}"] or \
            completed.stderr.startswith(f"error: {message}"), completed.stderr
        assert len(completed.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "runs").exists()


def test_parameter_file_and_flags(tmp_path: Path) -> None:
    manifest = tmp_path / "echo.yaml"
    manifest.write_text("""
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: echo-}
spec:
  entrypoint: echo
  arguments:
    parameters: [{name: greeting, value: hi}, {name: name, value: you}, {name: loud, value: "no"}]
  templates:
  - name: echo
    script:
      image: python
      command: [python]
      source: |
        print("{{workflow.parameters.greeting}} {{workflow.parameters.name}}",
              "{{workflow.parameters.loud}}")
""")
    params = tmp_path / "params.yaml"
    params.write_text("greeting: hello\nname: file\nloud: true\n")
    result = _run_json(tmp_path / "home", str(manifest), "--parameter-file", str(params),
                       "-p", "name=flag")
    assert result["phase"] == PASSES
    assert _nodes(result)[result["name"]]["outputs"]["result"] == "hello flag true"
    params.write_text("- not\n- a mapping\n")
    completed = run_cli("run", str(manifest), "--parameter-file", str(params), home=tmp_path)
    assert completed.returncode == 2 and "expected a mapping" in completed.stderr


def test_malformed_manifests_are_refused_with_the_field(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: Workflow\nspec: {entrypoint: main\n")
    completed = run_cli("run", str(broken), home=tmp_path)
    assert completed.returncode == 2 and str(broken) in completed.stderr
    dangling = tmp_path / "dangling.yaml"
    dangling.write_text("""
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: d-}
spec:
  entrypoint: main
  templates:
  - name: main
    dag:
      tasks: [{name: a, template: missing}]
""")
    completed = run_cli("run", str(dangling), home=tmp_path)
    assert completed.returncode == 2
    assert "missing" in completed.stderr and "spec.templates[0].dag.tasks[0]" in completed.stderr
    completed = run_cli("run", "no-such-pipeline", home=tmp_path)
    assert completed.returncode == 2
    assert "'no-such-pipeline' is neither a pipeline (retrain, sweep, train)" in completed.stderr
    assert not (tmp_path / "runs").exists()


def test_a_missing_dataset_fails_the_run_and_names_the_path(tmp_path: Path) -> None:
    result = _run_json(tmp_path / "home", "-p", f"dataset={tmp_path}/absent")
    assert result["phase"] == "Failed" and result["_exit"] == 1
    nodes = _nodes(result)
    assert nodes["stage-data"]["phase"] == "Failed"
    assert nodes["train"]["phase"] == "Omitted"
    message = f"dataset '{tmp_path}/absent': no such directory"
    assert message in result["_stderr"]
    # one line, on the step's node and repeated by the run's final message; no traceback
    assert nodes["stage-data"]["message"] == f"Error (exit code 2): {message}"
    assert message in result["message"]
    assert "Traceback" not in result["_stderr"]


def test_a_batch_larger_than_the_dataset_fails_in_one_line(tmp_path: Path) -> None:
    result = _run_json(tmp_path / "home", "-p", "global-batch-size=4096", "-p", "epochs=1")
    assert result["phase"] == "Failed" and result["_exit"] == 1
    train = _nodes(result)["train"]
    assert train["phase"] == "Failed"
    assert "global-batch-size 4096" in train["message"] and "1438" in train["message"]
    assert train["message"] in result["message"] or train["message"].split(": ", 1)[1] \
        in result["message"]
    assert "Traceback" not in result["_stderr"]
    assert len(result["_stderr"].splitlines()) < 30, result["_stderr"]


def test_run_help_lists_the_pipeline_parameters(tmp_path: Path) -> None:
    completed = run_cli("run", "--help", home=tmp_path)
    assert completed.returncode == 0
    assert "epochs (default: 20)" in completed.stdout
    assert "algorithm (default: sync) [sync|async|bmuf|easgd|diloco]" in completed.stdout


def test_render_check_and_lint_say_what_they_did_not_check(tmp_path: Path) -> None:
    completed = run_cli("render", "--check", home=tmp_path, cwd=tmp_path)
    assert completed.returncode == 2
    assert "there is no argo/ folder here" in completed.stderr and "stale" not in completed.stderr
    completed = run_cli("lint", "argo", home=tmp_path)
    assert completed.returncode == 0, completed.stdout
    assert "argo/namespace.yaml: skipped (no Workflow" in completed.stderr


def test_a_users_model_by_entry_point_trains_and_evaluates(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = _run_json(home, "-p", "model=sublimate.components.examples.example_models:small_cnn",
                       "-p", "epochs=12")
    assert result["phase"] == PASSES, result["_stderr"]
    assert float(_nodes(result)["evaluate"]["outputs"]["parameters"]["accuracy"]) >= 0.9
    saved = _volume(home) / "runs" / result["name"] / "model.pt"
    import torch

    assert torch.load(saved, weights_only=False)["architecture"] == \
        "sublimate.components.examples.example_models:small_cnn"
    typo = _run_json(home, "-p", "model=sublimate.components.examples.example_models:tiny_cnn")
    assert typo["phase"] == "Failed"
    message = ("model 'sublimate.components.examples.example_models:tiny_cnn': module "
               "'sublimate.components.examples.example_models' has no function 'tiny_cnn'")
    # the run's last line, as the step's own message
    assert typo["_stderr"].strip().splitlines()[-1].endswith(f"Error (exit code 2): {message}")
    assert typo["message"].endswith(message)  # the step's one line is the run's final message


def test_a_run_failed_at_evaluate_is_retried_running_evaluate_only(tmp_path: Path) -> None:
    # the user's own evaluation fails until the user has mended what it needs (here: a file)
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_eval.py").write_text(
        "import json, os, pathlib, sys\n"
        "if not pathlib.Path(sys.argv[0]).with_name('mended').exists():\n"
        "    sys.exit('my_eval: the labels are not there yet')\n"
        "out = pathlib.Path(os.environ['SUBLIMATE_RUN_DIR']) / 'metrics.json'\n"
        "out.write_text(json.dumps({'accuracy': 0.5}))\n")
    home = tmp_path / "home"
    first = run_cli("run", "-q", "-o", "json", "-p", "epochs=1",
                    "-p", "eval-entrypoint=my_eval.py", home=home, cwd=project)
    failed = json.loads(first.stdout)
    assert failed["phase"] == "Failed" and first.returncode == 1, first.stderr
    before = _nodes(failed)
    assert [before[n]["phase"] for n in ("stage-data", "train", "evaluate")] == \
        [PASSES, PASSES, "Failed"]
    # the user's own reason, in the run's last line (Python prints it as the script exits)
    assert "exited with code 1: my_eval: the labels are not there yet" in \
        first.stderr.strip().splitlines()[-1]

    (project / "mended").touch()
    second = run_cli("retry", failed["name"], "-q", "-o", "json", home=home, cwd=project)
    assert second.returncode == 0, second.stderr
    retried = json.loads(second.stdout)
    after = _nodes(retried)
    assert retried["name"] == failed["name"] and retried["phase"] == PASSES
    assert "kept from the earlier run (not run again): stage-data, train" in second.stderr
    assert "run again: evaluate" in second.stderr
    # staging and training did not run again: their nodes are the earlier ones, as they ended
    for kept in ("stage-data", "train"):
        assert after[kept]["started_at"] == before[kept]["started_at"], kept
        assert after[kept]["outputs"] == before[kept]["outputs"], kept
    assert after["evaluate"]["phase"] == PASSES
    assert after["evaluate"]["started_at"] > before["evaluate"]["finished_at"]
    assert after["evaluate"]["outputs"]["parameters"]["accuracy"] == "0.5"
    assert retried["outputs"]["parameters"]["accuracy"] == "0.5"
    # the earlier attempt's status and the evaluate step's log are kept beside the run
    folder = home / "runs" / failed["name"]
    earlier = json.loads((folder / "retries" / "1" / "status.json").read_text())
    assert earlier["phase"] == "Failed"
    # (evaluate runs as attempt evaluate(0) of its retry strategy)
    log = next(n["log"] for n in earlier["nodes"] if n["display_name"] == "evaluate(0)")
    assert "the labels are not there yet" in Path(log).read_text()
    # nothing left to retry: said in one line
    again = run_cli("retry", failed["name"], home=home, cwd=project)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines()[-1] == (
        f"error: run {failed['name']} succeeded: to run some of its nodes again, give "
        "--restart-successful and --node-field-selector")
