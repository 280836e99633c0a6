"""MLflow tracking (issue 45), against a real tracking server the module starts on 127.0.0.1
with a SQLite store: a default run, a sweep (and MLflow's UI of it, in a real browser), a
retried run, a lost node, servers that are down, and two nights of retraining on MLflow's Model
Registry, each read back through MLflow's own client."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sublimate.components.base.mlflow_connection import public_uri, tracking_uri
from tests.conftest import REPO, env_flags, require, results_folder, run_cli
from tests.mlflow_server import closed_port, mlflow_command, mlflow_server
from tests.pipelines.server.web.conftest import browser

__all__ = ["browser"]  # the real browser of the web page's tests

QUICK = ("-p", "checkpoint-every=0")


@pytest.fixture(scope="module")
def tracking(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URI of a real MLflow server, shared by this module's tests."""
    require(mlflow_command() is not None, "mlflow is not installed (pip install -e '.[test]')")
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as uri:
        yield uri


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _runs(uri: str, **tags: str) -> list[Any]:
    client = _client(uri)
    experiment = client.get_experiment_by_name("sublimate")
    assert experiment is not None, "no run reached the server"
    query = " and ".join(f"tags.`{key}` = '{value}'" for key, value in tags.items())
    return client.search_runs([experiment.experiment_id], filter_string=query)


def _steps(uri: str, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in _client(uri).get_metric_history(run_id, key))


def _artifacts(uri: str, run_id: str) -> set[str]:
    return {a.path for a in _client(uri).list_artifacts(run_id)}


def _run(home: Path, *args: str, env: dict[str, str] | None = None,
         cwd: Path = REPO) -> tuple[int, dict, str]:
    done = run_cli("run", "-q", "-o", "json", *args, home=home, env=env, timeout=300, cwd=cwd)
    result = json.loads(done.stdout) if done.stdout.strip() else {}
    return done.returncode, result, done.stderr


# ---------------------------------------------------------------- the setting, without a server


def test_the_server_is_the_setting_else_the_environment_and_off_wins() -> None:
    assert tracking_uri("", {"MLFLOW_TRACKING_URI": "http://m:5000"}) == "http://m:5000"
    assert tracking_uri("http://other:1", {"MLFLOW_TRACKING_URI": "http://m:5000"}) == \
        "http://other:1"
    assert tracking_uri("off", {"MLFLOW_TRACKING_URI": "http://m:5000"}) is None
    assert tracking_uri("", {}) is None
    assert public_uri("https://me:s3cret@mlflow.example:443/x") == "https://mlflow.example:443/x"


def test_a_malformed_uri_is_refused_before_anything_runs(tmp_path: Path) -> None:
    done = run_cli("run", "--dry-run", "-p", "tracking=localhost:5000", home=tmp_path / "home")
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert "tracking" in line and "localhost:5000" in line, done.stderr
    assert not (tmp_path / "home" / "volumes").exists(), "nothing ran"


# ---------------------------------------------------------------- runs on a real server


def test_a_default_run_logs_its_settings_epochs_results_and_tags(tracking: str,
                                                                 tmp_path: Path) -> None:
    home = tmp_path / "home"
    # the server from the environment, as on a cluster from the Secret sublimate-mlflow
    code, result, stderr = _run(home, "-p", "epochs=3", *QUICK,
                                env={"MLFLOW_TRACKING_URI": tracking})
    assert code == 0, stderr
    (run,) = _runs(tracking, **{"sublimate.workflow": result["name"]})
    run_id = run.info.run_id
    assert run.info.status == "FINISHED" and run.info.run_name == result["name"]
    # every setting as a parameter, with its value; not where it logs to
    params = run.data.params
    assert params["epochs"] == "3" and params["algorithm"] == "sync"
    assert params["nodes"] == "2" and params["global-batch-size"] == "64"
    assert params["learning-rate"] == "0.1" and params["metric"] == "accuracy"
    assert "tracking" not in params and "tracking-required" not in params
    # one point per epoch, at the epoch's step, for each per-epoch metric
    for key in ("loss", "test_accuracy", "samples_per_second", "compute_fraction",
                "comm_fraction", "data_fraction"):
        assert _steps(tracking, run_id, key) == [1, 2, 3], key
    split = sum(run.data.metrics[f"{p}_fraction"] for p in ("compute", "comm", "data"))
    assert split == pytest.approx(1.0)
    # the evaluation, as the workflow's output says it
    accuracy = float(result["outputs"]["parameters"]["accuracy"])
    assert run.data.metrics["eval_accuracy"] == pytest.approx(accuracy)
    # at the last epoch, on the per-epoch points' axis (the UI draws them together)
    (evaluated,) = _client(tracking).get_metric_history(run.info.run_id, "eval_accuracy")
    assert evaluated.step == 3
    assert _artifacts(tracking, run_id) >= {"model.pt", "metrics.json", "train-summary.json",
                                            "report"}
    report = {a.path for a in _client(tracking).list_artifacts(run_id, "report")}
    assert "report/report.json" in report
    # tags: the workflow, the node count, the staged data's digest
    tags = run.data.tags
    metadata = home / "volumes" / "sublimate-data" / "datasets" / "digits" / "metadata.json"
    assert tags["sublimate.nodes"] == "2" and tags["sublimate.dataset"] == "digits"
    assert tags["sublimate.dataset-digest"] == hashlib.sha256(metadata.read_bytes()).hexdigest()
    # the code's version: the commit of the repository `sublimate run` started in
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert tags["mlflow.source.git.commit"] == head
    # the run folder says which MLflow run it is
    record = json.loads((results_folder(home) / "mlflow-run.json").read_text())
    assert record["run_id"] == run_id and record["uri"] == tracking


GRID = '{"algorithm": ["sync", "bmuf"], "global-batch-size": [64, 128]}'
# A folder: the MLflow UI's picture of the sweep lands there (docs/images for docs/mlflow.md:
# `SUBLIMATE_MLFLOW_SHOTS=docs/images python -m pytest tests/test_mlflow_tracking.py`)
SHOTS = os.environ.get("SUBLIMATE_MLFLOW_SHOTS")


@pytest.fixture(scope="module")
def sweep(tracking: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A sweep of four points on the server, once for the module: its `-o json` result."""
    code, result, stderr = _run(tmp_path_factory.mktemp("sweep") / "home", "sweep",
                                "-p", f"grid={GRID}", "-p", "epochs=3", *QUICK,
                                "-p", f"tracking={tracking}")
    assert code == 0, stderr
    return result


def test_a_sweep_is_a_parent_run_with_a_child_per_point(tracking: str, sweep: dict) -> None:
    (parent,) = _runs(tracking, **{"sublimate.workflow": sweep["name"],
                                   "sublimate.kind": "sweep"})
    assert parent.data.params["grid"] == GRID and parent.info.status == "FINISHED"
    assert parent.data.params["epochs"] == "3"  # the fixed settings
    children = _runs(tracking, **{"mlflow.parentRunId": parent.info.run_id})
    assert sorted((c.data.params["algorithm"], c.data.params["global-batch-size"])
                  for c in children) == [("bmuf", "128"), ("bmuf", "64"), ("sync", "128"),
                                         ("sync", "64")]
    for child in children:
        assert child.info.status == "FINISHED"
        assert _steps(tracking, child.info.run_id, "loss") == [1, 2, 3]
        assert "eval_accuracy" in child.data.metrics
    # the comparison in the parent: its report and the best point's metric
    assert "report.md" in _artifacts(tracking, parent.info.run_id)
    best = json.loads(sweep["outputs"]["parameters"]["best-point"])
    assert parent.data.metrics["best_accuracy"] == pytest.approx(best["metric"])
    assert parent.data.tags["sublimate.best-point"] == best["run-id"]


def test_the_mlflow_ui_shows_the_sweep_and_its_points(tracking: str, sweep: dict,
                                                     browser: Any) -> None:
    """MLflow's own page, in a real browser: the sweep one row, its four points under it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    experiment = _client(tracking).get_experiment_by_name("sublimate").experiment_id
    search = urllib.parse.quote(f"tags.`sublimate.workflow` = '{sweep['name']}'")
    browser.set_window_size(1600, 900)
    browser.get(f"{tracking}/#/experiments/{experiment}/runs?searchFilter={search}"
                "&compareRunsMode=CHART")
    wait = WebDriverWait(browser, 60, poll_frequency=0.2)
    wait.until(lambda driver: sweep["name"] in driver.find_element(By.TAG_NAME, "body").text)
    for close in browser.find_elements(By.CSS_SELECTOR, "button[aria-label=Close]"):
        close.click()  # MLflow's assistant panel
    # the sweep's row opens to show its points (MLflow's nested runs)
    browser.find_element(By.CSS_SELECTOR, "button[data-component-id*=runnamecellrenderer]").click()
    wait.until(lambda driver: driver.find_element(By.TAG_NAME, "body").text.count(
        f"{sweep['name']}-p0") >= 4)
    # the per-epoch curves of the points, side by side: the loss
    charts = wait.until(lambda driver: driver.find_elements(
        By.CSS_SELECTOR, "input[placeholder='Search metric charts']"))
    charts[0].send_keys("loss")
    wait.until(lambda driver: "samples_per_second" not in driver.find_element(
        By.TAG_NAME, "body").text)
    if SHOTS:
        import time

        time.sleep(2)  # the charts' drawing settles
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(SHOTS) / "mlflow-sweep.png"))


def test_a_retried_train_step_logs_into_the_same_run_once(tracking: str,
                                                          tmp_path: Path) -> None:
    home = tmp_path / "home"
    # killed in epoch 12 of 20 (22 steps an epoch) after a checkpoint at step 220 (epoch 10):
    # the retry resumes there and writes epoch 11 again
    fault = {"SUBLIMATE_FAIL_AT_STEP": "250"}
    code, failed, stderr = _run(home, *env_flags(fault), "-p", "recovery=restart",
                                "-p", "max-restarts=0", "-p", "checkpoint-every=110",
                                "-p", f"tracking={tracking}")
    assert code == 1 and failed["phase"] == "Failed", stderr
    (run,) = _runs(tracking, **{"sublimate.workflow": failed["name"]})
    assert run.info.status == "FAILED"
    logged = _steps(tracking, run.info.run_id, "loss")
    assert logged == list(range(1, len(logged) + 1)) and 10 <= len(logged) < 20

    again = run_cli("retry", failed["name"], "-q", "-o", "json", home=home)
    assert again.returncode == 0, again.stderr
    (after,) = _runs(tracking, **{"sublimate.workflow": failed["name"]})
    assert after.info.run_id == run.info.run_id and after.info.status == "FINISHED"
    # every epoch once: none of the first attempt's again, nor the epoch both attempts wrote
    for key in ("loss", "samples_per_second", "test_accuracy"):
        assert _steps(tracking, run.info.run_id, key) == list(range(1, 21)), key
    epochs = [json.loads(line)["epoch"] for line in
              (results_folder(home) / "metrics" / "rank-0.jsonl").read_text().splitlines()]
    assert len(epochs) > 20, "the retry wrote some epoch a second time (what must not repeat)"
    assert len(_client(tracking).get_metric_history(run.info.run_id, "eval_accuracy")) == 1


def test_a_lost_node_is_an_event_and_the_credentials_are_written_nowhere(
        tracking: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    password = "Pw-do-not-print-77"  # distinctive, so that a leak anywhere is found
    credentials = {"MLFLOW_TRACKING_URI": tracking, "MLFLOW_TRACKING_USERNAME": "alice",
                   "MLFLOW_TRACKING_PASSWORD": password}
    # per-step recovery (the default): node 1 killed at step 100, replaced, training goes on
    fault = {"SUBLIMATE_FAIL_AT_STEP": "100", "SUBLIMATE_FAIL_RANK": "1"}
    code, result, stderr = _run(home, *env_flags(fault), "-p", "epochs=6", *QUICK,
                                env=credentials)
    assert code == 0, stderr
    (run,) = _runs(tracking, **{"sublimate.workflow": result["name"]})
    lost = _client(tracking).get_metric_history(run.info.run_id, "recovery_node_lost")
    # at the last step its counters recorded (the kill comes after step 100's update)
    assert [m.value for m in lost] == [1.0] and 0 < lost[0].step <= 100
    assert run.data.metrics["recovery_nodes_lost"] == 1
    # the password reached MLflow's client from the Secret's variables, and no file: not a
    # log, the status, the run folder's record or the report
    leaks = [str(path) for path in home.rglob("*") if path.is_file()
             and password.encode() in path.read_bytes()]
    assert leaks == [] and password not in stderr


def test_a_server_that_is_down_is_refused_before_anything_runs(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{closed_port()}"
    for how in (["-p", f"tracking={down}"], []):  # named, or from this shell's environment
        done = run_cli("run", "-p", "epochs=1", *how, home=tmp_path / "home",
                       env={"MLFLOW_TRACKING_URI": down})
        assert done.returncode == 2, done.stderr
        line = done.stderr.strip().splitlines()[-1]
        assert line == (f"error: tracking {down}: unreachable ([Errno 111] Connection refused) "
                        "(set -p tracking-required=false to train without it)")
        assert not (tmp_path / "home").exists(), "no step ran, no run folder was made"


def test_a_shell_that_tracks_without_mlflows_client_is_refused_before_anything_runs(
        tmp_path: Path) -> None:
    """``$MLFLOW_TRACKING_URI`` exported for other tools turns tracking on here too: without
    MLflow's client the run would train to its end, then fail. It is refused at once, in one
    line that says what to install or how to turn tracking off (the client hidden from the
    `sublimate` process as if it were not installed)."""
    hidden = tmp_path / "no-mlflow"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text("import sys\nsys.modules['mlflow'] = None\n")
    done = run_cli("run", "-p", "epochs=1", home=tmp_path / "home",
                   env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
                        "PYTHONPATH": str(hidden)})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "error: tracking http://127.0.0.1:5000: MLflow's client is not installed: pip install "
        "'sublimate[mlflow]' (mlflow-skinny), or -p tracking=off (set -p "
        "tracking-required=false to train without it)")
    assert not (tmp_path / "home").exists(), "no step ran, no run folder was made"


def test_the_train_step_refuses_a_server_that_is_down_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On a cluster (`sublimate submit`) the train step is where the server is first asked."""
    from sublimate.components.base.mlflow_connection import TrackingError
    from sublimate.components.base.train_settings import TrainSettings
    from sublimate.components.monitoring.mlflow_tracking import TrainingTracker

    down = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(TrackingError) as refused:
        TrainingTracker.start(TrainSettings(tracking=down), tmp_path / "run", tmp_path, "wf")
    assert str(refused.value) == (f"tracking {down}: unreachable ([Errno 111] Connection "
                                  "refused) (set -p tracking-required=false to train without it)")
    optional = TrainSettings(tracking=down, tracking_required=False)
    assert TrainingTracker.start(optional, tmp_path / "run", tmp_path, "wf") is None
    assert capsys.readouterr().err == (
        f"tracking: warning: tracking {down}: unreachable ([Errno 111] Connection refused); "
        "training goes on without tracking (tracking-required false)\n")
    assert not (tmp_path / "run").exists()


def test_an_optional_server_that_is_down_is_a_warning(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{closed_port()}"
    code, result, stderr = _run(tmp_path / "home", "-p", "epochs=1", *QUICK,
                                "-p", f"tracking={down}", "-p", "tracking-required=false")
    assert code == 0 and result["phase"] == "Succeeded", stderr
    train_log = next(Path(n["log"]) for n in result["nodes"] if n["display_name"] == "train(0)")
    text = train_log.read_text()
    assert f"tracking: warning: tracking {down}: unreachable" in text
    assert "training goes on without tracking" in text
    assert not (results_folder(tmp_path / "home") / "mlflow-run.json").exists()


# ---------------------------------------------------------------- the model registry on MLflow


def test_two_nights_of_retraining_move_the_champion_alias_and_rollback_moves_it_back(
        tracking: str, tmp_path: Path) -> None:
    home, env = tmp_path / "home", {"MLFLOW_TRACKING_URI": tracking}
    registry = "mlflow:digits-nightly"
    nights = []
    for epochs in ("1", "4"):  # the second night trains longer: a better model
        code, night, stderr = _run(home, "argo/sublimate-retrain.yaml", "-p", f"epochs={epochs}",
                                   *QUICK, "-p", f"registry={registry}", env=env)
        assert code == 0, stderr
        nights.append(night["outputs"]["parameters"])
    assert (nights[0]["version"], nights[0]["champion"], nights[0]["promoted"]) == \
        ("1", "1", "true")
    assert (nights[1]["version"], nights[1]["champion"], nights[1]["promoted"]) == \
        ("2", "2", "true")
    assert "vs champion 1" in nights[1]["reason"], "the gate judged against the alias's version"
    mlflow = _client(tracking)
    assert mlflow.get_model_version_by_alias("digits-nightly", "champion").version == "2"
    assert mlflow.get_model_version_by_alias("digits-nightly", "challenger").version == "2"
    # the version's lineage in its tags, its files in the night's tracked training run
    second = mlflow.get_model_version("digits-nightly", "2")
    assert float(second.tags["sublimate.lineage.metrics.accuracy"]) == \
        pytest.approx(float(nights[1]["accuracy"]))
    metadata = home / "volumes" / "sublimate-data" / "datasets" / "digits" / "metadata.json"
    assert json.loads(second.tags["sublimate.lineage.dataset.metadata_sha256"]) == \
        hashlib.sha256(metadata.read_bytes()).hexdigest()
    (trained,) = _runs(tracking, **{"sublimate.workflow": nights[1]["results"].split("/")[-1]})
    assert second.run_id == trained.info.run_id
    files = {a.path for a in mlflow.list_artifacts(trained.info.run_id, "registered-model")}
    assert "registered-model/model.pt" in files

    # `sublimate models` on it, as on a folder registry: the champion moved back, then listed
    back = run_cli("models", "rollback", "--registry", registry, "--reason", "a bad night",
                   home=home, env=env)
    assert back.returncode == 0, back.stderr
    assert "1 is the champion of mlflow:digits-nightly again (was 2)" in back.stdout
    assert mlflow.get_model_version_by_alias("digits-nightly", "champion").version == "1"
    listed = run_cli("models", "ls", "--registry", registry, "-o", "json", home=home, env=env)
    assert listed.returncode == 0, listed.stderr
    assert [(v["id"], v["champion"]) for v in json.loads(listed.stdout)] == \
        [("1", True), ("2", False)]
    history = run_cli("models", "history", "--registry", registry, home=home, env=env)
    assert history.returncode == 0 and "a bad night" in history.stdout, history.stderr
