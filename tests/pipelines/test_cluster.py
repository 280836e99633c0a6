"""The cluster path, proven offline: install objects, kustomize, validators, Argo Server API.

No live cluster is exercised: requests to Argo Server go to a local HTTP endpoint that records
them, so the test checks what goes on the wire.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from sublimate.pipelines.cli import main
from tests.conftest import REPO, require

ARGO = REPO / "argo"


def _tool(name: str) -> str:
    """A validator CI installs (.ci/run); outside CI a missing one skips, never silently in CI."""
    path = shutil.which(name) or next(
        (str(p) for p in [REPO / ".tools" / "bin" / name] if p.exists()), None)
    require(path is not None, f"{name} is not installed (run .ci/run to install the validators)")
    assert path is not None  # for the type checker: require() returned
    return path


def _kustomize(folder: Path) -> list[dict]:
    built = subprocess.run([_tool("kubectl"), "kustomize", str(folder)], capture_output=True,
                           text=True, check=True)
    return list(yaml.safe_load_all(built.stdout))


def test_kustomization_installs_everything_in_one_namespace() -> None:
    documents = _kustomize(ARGO)
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in documents)
    assert kinds == [
        ("ConfigMap", "sublimate-defaults"), ("CronWorkflow", "sublimate-train-nightly"),
        ("Namespace", "sublimate"), ("PersistentVolumeClaim", "sublimate-data"),
        ("Role", "sublimate-workflow"), ("RoleBinding", "sublimate-workflow"),
        ("ServiceAccount", "sublimate-workflow"), ("WorkflowTemplate", "sublimate-retrain"),
        ("WorkflowTemplate", "sublimate-sweep"), ("WorkflowTemplate", "sublimate-train")]
    assert all(d["metadata"].get("namespace") == "sublimate"
               for d in documents if d["kind"] != "Namespace")
    cron = next(d for d in documents if d["kind"] == "CronWorkflow")["spec"]
    assert cron["concurrencyPolicy"] == "Forbid" and cron["timezone"] == "UTC"
    # the nightly retrains: gate, publish, notify (sublimate-train stays the interactive job)
    assert cron["workflowSpec"]["workflowTemplateRef"]["name"] == "sublimate-retrain"
    claim = next(d for d in documents if d["kind"] == "PersistentVolumeClaim")["spec"]
    assert claim["accessModes"] == ["ReadWriteMany"]


def test_an_overlay_changes_image_queue_and_storage_class_in_one_place(tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(ARGO, overlay)],
        # as docs/cluster.md documents: the settings first, then the defaults re-applied
        "components": ["settings", os.path.relpath(ARGO / "defaults", overlay)],
    }))
    (overlay / "settings").mkdir()
    (overlay / "settings" / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1alpha1", "kind": "Component",
        "patches": [{"target": {"kind": "ConfigMap", "name": "sublimate-defaults"},
                     "patch": yaml.safe_dump({
                         "apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": "sublimate-defaults"},
                         "data": {"image": "registry.example/sublimate:2.0", "queue": "gpu",
                                  "storage-class": "cephfs"}})}],
    }))
    documents = {d["kind"]: d for d in _kustomize(overlay)}
    template = documents["WorkflowTemplate"]["spec"]
    assert {t["container"]["image"] for t in template["templates"] if "container" in t} == \
        {"registry.example/sublimate:2.0"}
    parameters = {p["name"]: p["value"] for p in template["arguments"]["parameters"]}
    assert parameters["queue"] == "gpu" and parameters["image"] == "registry.example/sublimate:2.0"
    assert documents["PersistentVolumeClaim"]["spec"]["storageClassName"] == "cephfs"


def test_core_objects_pass_kubernetes_validate_strict() -> None:
    files = [str(ARGO / name) for name in ("namespace.yaml", "serviceaccount.yaml", "role.yaml",
                                           "rolebinding.yaml", "shared-volume.yaml",
                                           "defaults.yaml")]
    completed = subprocess.run([_tool("kubernetes-validate"), "--strict", *files],
                               capture_output=True, text=True)
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_checkov_finds_no_issue_in_the_built_install(tmp_path: Path) -> None:
    built = tmp_path / "install.yaml"
    built.write_text(yaml.safe_dump_all(_kustomize(ARGO)))
    completed = subprocess.run(
        [_tool("checkov"), "-f", str(built), "--framework", "kubernetes", "--skip-download",
         "--compact", "--quiet", "-o", "json"], capture_output=True, text=True)
    report = json.loads(completed.stdout)
    failed = report["results"]["failed_checks"] if isinstance(report, dict) else []
    assert failed == [], [f"{c['check_id']} {c['resource']}" for c in failed]
    assert report["summary"]["passed"] >= 10


def test_role_is_least_privilege() -> None:
    rules = yaml.safe_load((ARGO / "role.yaml").read_text())["rules"]
    granted = {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    assert ("argoproj.io", "workflowtaskresults", "create") in granted
    assert ("batch.volcano.sh", "jobs", "create") in granted
    assert ("", "pods/log", "get") in granted
    assert not any(verb in ("*", "update", "escalate", "bind") or resource in ("*", "secrets")
                   for _, resource, verb in granted)


def test_dockerfiles_pass_hadolint() -> None:
    dockerfiles = sorted(str(p) for p in (REPO / "images").glob("Dockerfile*"))
    assert dockerfiles
    completed = subprocess.run([_tool("hadolint"), *dockerfiles], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stdout + completed.stderr


# ---------------------------------------------------------------- Argo Server, on the wire


class FakeArgoServer:
    """Records every request and answers from a table of (method, path) -> (status, body)."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.routes: dict[tuple[str, str], list[tuple[int, object]]] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode() if length else ""
                path = self.path.split("?")[0]
                server.requests.append({"method": self.command, "path": path,
                                        "query": self.path.partition("?")[2],
                                        "headers": dict(self.headers),
                                        "body": json.loads(body) if body else None})
                answers = server.routes.get((self.command, path)) or [
                    (404, {"code": 5, "message": f"{path} not found"})]
                status, payload = answers.pop(0) if len(answers) > 1 else answers[0]
                data = payload.encode() if isinstance(payload, str) else \
                    json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def flags(self) -> list[str]:
        return ["--argo-server", self.url, "--token", "s3cret-token", "-n", "ml"]


@pytest.fixture
def argo() -> Iterator[FakeArgoServer]:
    server = FakeArgoServer()
    server.thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


def _workflow(name: str, phase: str | None = None) -> dict:
    return {"metadata": {"name": name, "namespace": "ml"},
            "spec": {}, **({"status": {"phase": phase}} if phase else {})}


def test_submit_sends_what_argo_server_expects(argo: FakeArgoServer,
                                               capsys: pytest.CaptureFixture) -> None:
    argo.routes[("POST", "/api/v1/workflows/ml/submit")] = [(200, _workflow("sublimate-train-x1"))]
    assert main(["submit", "-p", "nodes=4", "-p", "algorithm=bmuf", *argo.flags()]) == 0
    (request,) = argo.requests
    assert request["headers"]["Authorization"] == "Bearer s3cret-token"
    assert request["body"] == {
        "namespace": "ml", "resourceKind": "WorkflowTemplate", "resourceName": "sublimate-train",
        "submitOptions": {"parameters": ["nodes=4", "algorithm=bmuf"]}}
    assert "submitted sublimate-train-x1 in namespace ml" in capsys.readouterr().out


def test_submit_wait_follows_the_workflow_to_its_end(argo: FakeArgoServer,
                                                     capsys: pytest.CaptureFixture) -> None:
    argo.routes[("POST", "/api/v1/workflows/ml/submit")] = [(200, _workflow("run-1"))]
    argo.routes[("GET", "/api/v1/workflows/ml/run-1")] = [
        (200, _workflow("run-1", "Running")), (200, _workflow("run-1", "Failed"))]
    assert main(["submit", "--wait", "--poll-seconds", "0.05", *argo.flags()]) == 1
    out = capsys.readouterr().out
    assert "run-1: Running" in out and "run-1: Failed" in out


def test_bad_parameters_never_reach_the_server(argo: FakeArgoServer,
                                               capsys: pytest.CaptureFixture) -> None:
    assert main(["submit", "-p", "nodes=many", *argo.flags()]) == 2
    assert "parameter 'nodes': 'many' does not match pattern '^[0-9]+(:[0-9]+)?$'" \
        in capsys.readouterr().err
    # the train step's cross-setting rules, with the same one line as `sublimate run`
    assert main(["submit", "-p", "global-batch-size=65", *argo.flags()]) == 2
    assert capsys.readouterr().err == \
        "error: global-batch-size 65 is not divisible by nodes x procs-per-node = 2: " \
        "use global-batch-size 64 or 66, or nodes 1\n"
    assert main(["submit", "-p", "algorithm=bmuf", "-p", "sync-period=0", *argo.flags()]) == 2
    assert capsys.readouterr().err == "error: parameter 'sync-period': 0 is below the minimum 1\n"
    assert argo.requests == []


@pytest.mark.parametrize(("status", "message"), [
    (401, "refused the token (401 Unauthorized): pass a valid --token or set ARGO_TOKEN"),
    (403, "forbids WorkflowTemplate 'sublimate-train' in namespace 'ml' (403)"),
    (404, "WorkflowTemplate 'sublimate-train': not found in namespace 'ml'"),
])
def test_server_refusals_say_what_to_fix(argo: FakeArgoServer, capsys: pytest.CaptureFixture,
                                         status: int, message: str) -> None:
    argo.routes[("POST", "/api/v1/workflows/ml/submit")] = [(status, {"message": "no"})]
    assert main(["submit", *argo.flags()]) == 1
    err = capsys.readouterr().err
    assert message in err
    assert "s3cret-token" not in err


def test_an_unreachable_server_is_one_clear_error(capsys: pytest.CaptureFixture) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = server.server_address[1]
    server.server_close()  # nothing listens there any more
    assert main(["submit", "--argo-server", f"http://127.0.0.1:{port}"]) == 1
    assert f"cannot reach Argo Server at http://127.0.0.1:{port}" in capsys.readouterr().err


def test_install_creates_then_updates_templates(argo: FakeArgoServer) -> None:
    template, cron = "/api/v1/workflow-templates/ml", "/api/v1/cron-workflows/ml"
    argo.routes[("GET", f"{template}/sublimate-train")] = [(404, {"message": "not found"})]
    argo.routes[("POST", template)] = [(200, {"metadata": {"name": "sublimate-train"},
                                               "spec": {}})]
    argo.routes[("GET", f"{template}/sublimate-retrain")] = [(404, {"message": "not found"})]
    argo.routes[("GET", f"{template}/sublimate-sweep")] = [(404, {"message": "not found"})]
    argo.routes[("GET", f"{cron}/sublimate-train-nightly")] = [
        (200, {"metadata": {"name": "sublimate-train-nightly", "resourceVersion": "42"},
               "spec": {"schedules": ["0 2 * * *"], "workflowSpec": {}}})]
    argo.routes[("PUT", f"{cron}/sublimate-train-nightly")] = [
        (200, {"metadata": {"name": "sublimate-train-nightly"},
               "spec": {"schedules": ["0 2 * * *"], "workflowSpec": {}}})]
    assert main(["install", *argo.flags()]) == 0
    calls = [(r["method"], r["path"]) for r in argo.requests]
    assert calls == [("GET", f"{template}/sublimate-train"), ("POST", template),
                     ("GET", f"{template}/sublimate-retrain"), ("POST", template),
                     ("GET", f"{template}/sublimate-sweep"), ("POST", template),
                     ("GET", f"{cron}/sublimate-train-nightly"),
                     ("PUT", f"{cron}/sublimate-train-nightly")]
    created = argo.requests[1]["body"]["template"]
    assert created["kind"] == "WorkflowTemplate" and created["metadata"]["namespace"] == "ml"
    assert len(created["spec"]["arguments"]["parameters"]) > 20
    assert argo.requests[3]["body"]["template"]["metadata"]["name"] == "sublimate-retrain"
    assert argo.requests[5]["body"]["template"]["metadata"]["name"] == "sublimate-sweep"
    updated = argo.requests[7]["body"]["cronWorkflow"]
    assert updated["metadata"]["resourceVersion"] == "42"


def test_logs_and_get(argo: FakeArgoServer, capsys: pytest.CaptureFixture) -> None:
    lines = "\n".join(json.dumps({"result": {"podName": "run-1-train", "content": text}})
                      for text in ("epoch 1/2", "epoch 2/2"))
    argo.routes[("GET", "/api/v1/workflows/ml/run-1/log")] = [(200, lines + "\n")]
    argo.routes[("GET", "/api/v1/workflows/ml/run-1")] = [(200, {
        **_workflow("run-1", "Succeeded"),
        "status": {"phase": "Succeeded", "nodes": {"a": {
            "id": "run-1-123", "name": "run-1.evaluate",
            "displayName": "evaluate", "type": "Pod", "phase": "Succeeded",
            "outputs": {"parameters": [{"name": "accuracy", "value": "0.97"}]}}}}})]
    assert main(["logs", "run-1", *argo.flags()]) == 0
    assert main(["get", "run-1", *argo.flags()]) == 0
    out = capsys.readouterr().out
    assert "run-1-train: epoch 2/2" in out and "accuracy=0.97" in out
    assert "logOptions.container=main" in argo.requests[0]["query"]


def test_ci_smoke_script_renders_and_lints_without_a_server(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARGO_")}
    completed = subprocess.run(
        [sys.executable, "-m", "sublimate.pipelines.ci_smoke", "--output-dir", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=REPO)
    assert completed.returncode == 0, completed.stderr
    assert "no Argo Server configured (ARGO_SERVER): rendered and linted only" in completed.stdout
    assert (tmp_path / "sublimate-train.yaml").is_file()
