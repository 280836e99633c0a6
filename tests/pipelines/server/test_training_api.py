"""The training endpoints (``training_server``) over real runs: one `sublimate run` that lost a
node (per-step recovery) and one submitted through the API, trained once for the module: a train
step's metrics, its fault-tolerance timeline, its report's plots, two runs compared; and what a
hostile client may try (names with ``..``, a plot that is a path, a plot linked out of the
home)."""

from __future__ import annotations

import copy
import http.client
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests

from .argo_api import Server

TOKEN = "training-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NS = "sublimate"
API = "/api/sublimate/v1"


def cli_run(home: Path, *arguments: str) -> str:
    """`sublimate run` of the built-in train pipeline in ``home``; the workflow's name."""
    done = subprocess.run(
        [sys.executable, "-m", "sublimate.pipelines", "run", *arguments],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "SUBLIMATE_HOME": str(home)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # "run folder: HOME/runs/NAME (9.5s)"
    return next(line.split()[2] for line in done.stdout.splitlines()
                if line.startswith("run folder:")).rsplit("/", 1)[-1]


def train_workflow(name: str, **parameters: Any) -> dict:
    """The built-in train pipeline as a Workflow named ``name``, with ``parameters``."""
    from sublimate.pipelines.render import runnable_dict

    template = copy.deepcopy(runnable_dict("train"))
    spec = template["spec"]
    for parameter in spec["arguments"]["parameters"]:
        if parameter["name"] in parameters:
            parameter["value"] = str(parameters[parameter["name"]])
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"name": name, "labels": template["metadata"].get("labels", {})},
            "spec": spec}


def submit(server: Server, name: str, headers: dict | None = None, **parameters: Any) -> None:
    response = requests.post(f"{server.url}/api/v1/workflows/{NS}", timeout=60,
                             headers=headers or {},
                             json={"workflow": train_workflow(name, **parameters)})
    assert response.status_code == 200, response.text


def wait_ended(server: Server, name: str, headers: dict | None = None,
               timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = requests.get(f"{server.url}/api/v1/workflows/{NS}/{name}", timeout=60,
                            headers=headers or {}).json()
        if body["status"].get("phase") in ("Succeeded", "Failed", "Error"):
            return body
        assert time.monotonic() < deadline, body["status"]
        time.sleep(0.3)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str, str]]:
    """A server (with a token) over two finished runs: A, `sublimate run` on 3 nodes that lost
    node1 at step 30; B, 2 nodes at half the learning rate, submitted through the API."""
    home = tmp_path_factory.mktemp("training") / "home"
    a = cli_run(home, "-p", "epochs=3", "-p", "nodes=3", "-p", "global-batch-size=66",
                "--env", "SUBLIMATE_FAIL_AT_STEP=30", "--env", "SUBLIMATE_FAIL_RANK=1")
    server = Server(home, "--auth-token", TOKEN)
    try:
        submit(server, "run-b", AUTH, epochs=2, **{"learning-rate": "0.05"})
        assert wait_ended(server, "run-b", AUTH)["status"]["phase"] == "Succeeded"
        yield server, a, "run-b"
    finally:
        server.stop()


def get(server: Server, path: str, **kwargs: Any) -> requests.Response:
    kwargs.setdefault("headers", AUTH)
    return requests.get(server.url + path, timeout=60, **kwargs)


def test_a_train_steps_metrics_timeline_and_plots(runs: tuple[Server, str, str]) -> None:
    server, a, _ = runs
    path = f"{API}/workflows/{NS}/{a}/training"
    assert get(server, path, headers={}).status_code == 401  # the API's token, as Argo's
    answer = get(server, path).json()
    assert answer["state"] == "ended" and answer["run"] == a
    assert answer["node"]["displayName"].startswith("train") and answer["epochs_total"] == 3
    # the job's curve, one point per epoch, and every process's own records
    assert [point["epoch"] for point in answer["epochs"]] == [1, 2, 3]
    assert all(point["loss"] > 0 and 0 < point["test_accuracy"] <= 1
               for point in answer["epochs"])
    assert set(answer["processes"]) == {"rank-0", "rank-1", "rank-2"}
    for records in answer["processes"].values():
        assert {"compute_seconds", "comm_seconds", "data_seconds"} <= set(records[0])
    assert set(answer["time_split"]) == {"rank-0", "rank-1", "rank-2"}
    split = answer["time_split"]["rank-0"]
    assert split["compute"] + split["comm"] + split["data"] == pytest.approx(1, abs=0.01)
    assert answer["stragglers"]["epochs_checked"] == 3
    # per-step recovery: node1 lost at its step in flight, the others on to the end
    recovery = answer["fault_tolerance"]
    assert recovery["live"] is False and recovery["nodes_lost"] == 1
    assert [failure["node"] for failure in recovery["failures"]] == [1]
    lanes = {span["node"]: span for span in recovery["timeline"] if not span["replacement"]}
    assert set(lanes) == {0, 1, 2}
    assert lanes[1]["to_step"] < lanes[0]["to_step"] == lanes[2]["to_step"] == 63
    # what the panel shows while it runs reads the same files the same way
    from sublimate.pipelines.server.training_server import _live_fault_tolerance

    live = _live_fault_tolerance(server.home / "volumes" / "sublimate-data" / "runs" / a)
    assert live is not None
    assert [(s["node"], s["from_step"], s["to_step"]) for s in live["timeline"]] == \
        [(s["node"], s["from_step"], s["to_step"]) for s in recovery["timeline"]]
    # the report's plots, served by name, as PNGs
    names = {plot["name"] for plot in answer["plots"]}
    assert {"loss", "accuracy", "throughput", "time-split", "recovery", "overview"} <= names
    loss = get(server, f"{path}/plots/loss")
    assert loss.status_code == 200 and loss.headers["Content-Type"] == "image/png"
    assert loss.content.startswith(b"\x89PNG")
    assert get(server, f"{path}/plots/loss", headers={}).status_code == 401
    assert answer["not_recorded"]


def test_the_train_node_is_chosen_by_its_id(runs: tuple[Server, str, str]) -> None:
    server, _, b = runs
    workflow = get(server, f"/api/v1/workflows/{NS}/{b}").json()
    nodes = workflow["status"]["nodes"].values()
    train = next(n for n in nodes if n["type"] == "Pod" and n["templateName"] == "train")
    stage = next(n for n in nodes if n["type"] == "Pod" and n["templateName"] == "stage-data")
    path = f"{API}/workflows/{NS}/{b}/training"
    answer = get(server, path, params={"node": train["id"]}).json()
    assert answer["node"]["id"] == train["id"] and answer["run"] == b
    assert answer["settings"]["learning-rate"] == "0.05"
    assert [point["epoch"] for point in answer["epochs"]] == [1, 2]
    # 2 nodes: per-step recovery by default, nothing lost
    assert answer["fault_tolerance"]["nodes_lost"] == 0
    assert {plot["name"] for plot in answer["plots"]} >= {"loss", "recovery"}
    assert all(f"node={train['id']}" in plot["url"] for plot in answer["plots"])
    assert get(server, answer["plots"][0]["url"]).status_code == 200
    status = get(server, path, params={"node": stage["id"]})
    assert (status.status_code, status.json()["code"]) == (400, 3)
    assert get(server, path, params={"node": "no-such-node"}).status_code == 404


def test_two_runs_compared(runs: tuple[Server, str, str]) -> None:
    server, a, b = runs
    answer = get(server, f"{API}/compare/{NS}", params={"a": a, "b": b}).json()
    assert [run["workflow"] for run in answer["runs"]] == [a, b]
    # the labels `sublimate report A B` gives them: what differs between them
    assert answer["labels"] == ["3 workers, batch 66, 3 epochs, final lr 0.103125",
                                "2 workers, batch 64, 2 epochs, final lr 0.05"]
    assert "sync" in answer["shared"]
    settings = {s["name"]: (s["a"], s["b"]) for s in answer["settings"]}
    assert settings["epochs"] == ("3", "2") and settings["learning-rate"] == ("0.1", "0.05")
    assert settings["nodes"] == ("3", "2") and "dataset" not in settings
    figures = {figure["key"]: figure for figure in answer["figures"]}
    accuracy = figures["test.accuracy"]
    assert accuracy["delta"] == pytest.approx(accuracy["b"] - accuracy["a"], abs=1e-6)
    assert accuracy["better"] == "higher" and figures["final_loss"]["better"] == "lower"
    assert (figures["fault_tolerance.nodes_lost"]["a"],
            figures["fault_tolerance.nodes_lost"]["b"]) == (1, 0)
    assert [len(run["epochs"]) for run in answer["runs"]] == [3, 2]
    for query, status in (({"a": a}, 400), ({"a": a, "b": "absent"}, 404),
                          ({"a": a, "b": "../../etc"}, 404)):
        assert get(server, f"{API}/compare/{NS}", params=query).status_code == status, query
    assert get(server, f"{API}/compare/other", params={"a": a, "b": b}).status_code == 404


def raw_get(server: Server, path: str) -> int:
    """A GET of ``path`` exactly as written (no client normalising its dots)."""
    url = urlsplit(server.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        connection.request("GET", path, headers=AUTH)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def test_hostile_names_reach_nothing(runs: tuple[Server, str, str]) -> None:
    server, a, _ = runs
    base = f"{API}/workflows/{NS}/{a}/training"
    for path in (f"{API}/workflows/{NS}/..%2F..%2F{a}/training",
                 f"{API}/workflows/{NS}/a..b/training",
                 f"{API}/workflows/{NS}/../training",
                 f"{API}/workflows/..%2Fsublimate/{a}/training",
                 f"{base}/plots/..%2Freport.json", f"{base}/plots/..%2F..%2Fmodel.pt",
                 f"{base}/plots/../../../model.pt", f"{base}/plots/report.json",
                 f"{base}/plots/%2Fetc%2Fpasswd", f"{base}/plots/.hidden",
                 f"{base}/plots/loss.png", f"{base}/plots/LOSS"):
        assert raw_get(server, path) in (400, 404, 501), path
    # a plot linked to a file outside the home is neither listed nor served
    report = server.home / "volumes" / "sublimate-data" / "runs" / a / "report"
    outside = server.home.parent / "secret.png"
    outside.write_bytes(b"\x89PNG secret")
    (report / "leak.png").symlink_to(outside)
    (report / "inside.png").symlink_to(server.home / "server")  # a folder, not a file
    try:
        answer = get(server, base).json()
        assert not {"leak", "inside"} & {plot["name"] for plot in answer["plots"]}
        assert get(server, f"{base}/plots/leak").status_code == 404
        assert get(server, f"{base}/plots/inside").status_code == 404
    finally:
        (report / "leak.png").unlink()
        (report / "inside.png").unlink()
    # a workflow without a train step, and one that is not there
    assert get(server, f"{API}/workflows/{NS}/absent/training").status_code == 404
