"""Daemon templates: a server the later steps reach at `{{tasks.<name>.ip}}` once its readiness
probe passes, ended with its DAG or steps, and no process of it left however the run ends."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

from sublimate.components.base.process_identity import still_runs
from sublimate.pipelines.runner import NodePhase, RunEvent
from sublimate.pipelines.runner.harness import run
from tests.conftest import finish_run, pod_pid, start_run, stop_run

# A model server as a daemon: it answers HTTP once loaded; two clients query it in parallel.
SERVING = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: serve-}
spec:
  entrypoint: evaluate
  arguments:
    parameters: [{name: port}]
  # The daemon tells the test its pid through a volume: a pod's other writes are its own
  # (every pod has a private filesystem, as on Argo).
  volumes: [{name: scratch, persistentVolumeClaim: {claimName: scratch}}]
  templates:
  - name: evaluate
    dag:
      tasks:
      - {name: model-server, template: model-server}
      - name: score
        template: score
        depends: model-server
        arguments:
          parameters:
          - {name: address, value: "{{tasks.model-server.ip}}"}
          - {name: x, value: "{{item}}"}
        withItems: ["2", "5"]
  - name: model-server
    daemon: true
    script:
      command: [python]
      source: |
        import http.server, os, time
        open("/scratch/server.pid", "w").write(str(os.getpid()))
        time.sleep(0.3)  # loading the model: not ready yet
        class Predict(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                x = int(self.path.rsplit("=", 1)[-1]) if "=" in self.path else 0
                self.send_response(200)
                self.end_headers()
                self.wfile.write(str(3 * x + 1).encode())
        server = http.server.HTTPServer(("127.0.0.1", {{workflow.parameters.port}}), Predict)
        server.serve_forever()
      volumeMounts: [{name: scratch, mountPath: /scratch}]
      readinessProbe:
        httpGet: {path: /healthz, port: "{{workflow.parameters.port}}"}
        periodSeconds: 1
  - name: score
    inputs:
      parameters: [{name: address}, {name: x}]
    script:
      command: [python]
      source: |
        import urllib.request
        url = "http://{{inputs.parameters.address}}:{{workflow.parameters.port}}/?x={{inputs.parameters.x}}"
        print(urllib.request.urlopen(url, timeout=10).read().decode())
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _pid(path: Path) -> int | None:
    """The daemon's pid on this machine (it writes the one its PID namespace gave it)."""
    home = path.parents[2]  # <home>/volumes/scratch/server.pid
    return pod_pid(int(path.read_text()), f"{home}/runs/", "/nodes/model-server")


def test_a_daemon_serves_later_tasks_and_is_gone_at_the_end(tmp_path: Path) -> None:
    pidfile = tmp_path / "home" / "volumes" / "scratch" / "server.pid"
    events: list[RunEvent] = []
    done = run(SERVING, {"port": free_port()}, home=tmp_path / "home",
               reporter=events.append, timeout=120)
    done.assert_succeeded()
    assert sorted(n.result or "" for n in done.nodes.values() if n.template == "score"
                  and n.type == "Pod") == ["16", "7"]
    server = done.node("model-server")
    assert (server.phase, server.message) == (NodePhase.SUCCEEDED, "")  # ended by its DAG
    # the scores started once the server was ready (daemoned), not before
    order = [(e.node.display_name, e.phase) for e in events if e.kind == "node" and e.node]
    assert order.index(("model-server", NodePhase.RUNNING)) < next(
        i for i, (name, phase) in enumerate(order) if name.startswith("score("))
    assert "daemoned" not in result_status(done.run_folder, "model-server")  # not anymore
    assert _pid(pidfile) is None


def result_status(run_folder: Path, display: str) -> dict:
    status = json.loads((run_folder / "status.json").read_text())
    return next(n for n in status["nodes"] if n["display_name"] == display)


# Steps: a daemon ready when a file appears in its emptyDir (an exec probe, in the pod's view),
# and one that exits by itself: Failed, as on Argo ("daemon pods should run indefinitely").
STEPS = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: steps-}
spec:
  entrypoint: main
  templates:
  - name: main
    steps:
    - - {name: cache, template: cache}
    - - name: use
        template: use
        arguments:
          parameters: [{name: at, value: "{{steps.cache.ip}}"}]
      - {name: quitter, template: quitter, continueOn: {failed: true}}
    - - {name: after, template: use, arguments: {parameters: [{name: at, value: done}]}}
  - name: cache
    daemon: true
    volumes: [{name: state, emptyDir: {}}]
    container:
      command: [sh, -c, "sleep 0.3; touch /var/cache-state/ready; exec sleep 300"]
      volumeMounts: [{name: state, mountPath: /var/cache-state}]
      readinessProbe:
        exec: {command: [test, -f, /var/cache-state/ready]}
        periodSeconds: 1
  - name: quitter
    daemon: true
    container: {command: ["true"]}
  - name: use
    inputs:
      parameters: [{name: at}]
    container: {command: [echo, "cache at {{inputs.parameters.at}}"]}
"""


def test_a_steps_daemon_with_an_exec_probe_and_one_that_quits(tmp_path: Path) -> None:
    done = run(STEPS, home=tmp_path, echo=False, timeout=120)
    assert done.phase == NodePhase.SUCCEEDED, done.message
    assert done.node("use").result == "cache at 127.0.0.1"
    assert done.node("cache").phase == NodePhase.SUCCEEDED
    quitter = done.node("quitter")
    assert (quitter.phase, quitter.message) == (
        NodePhase.FAILED, "daemon exited (exit code 0) before its steps or DAG ended")
    # the cache lived until its steps template ended, after the last group
    assert done.node("cache").finished >= done.node("after").finished


def _wait_running(home: Path, display: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in (home / "runs").glob("*/status.json"):
            try:
                nodes = json.loads(path.read_text())["nodes"]
            except ValueError:
                continue
            if any(n["display_name"] == display and n["phase"] == "Running" for n in nodes):
                return
        time.sleep(0.05)
    raise AssertionError(f"{display} never ran")


def _gone(pid: int | None, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while pid is not None and still_runs(pid, None):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_no_daemon_is_left_when_the_run_is_stopped_or_its_runner_killed(
        tmp_path: Path, home: Path) -> None:
    pidfile = home / "volumes" / "scratch" / "server.pid"
    manifest = tmp_path / "serve.yaml"
    manifest.write_text(SERVING.replace(
        "print(urllib.request.urlopen(url, timeout=10).read().decode())",
        "print(urllib.request.urlopen(url, timeout=10).read().decode())\n"
        "        import time; time.sleep(120)"))
    for how in (signal.SIGTERM, signal.SIGKILL):
        pidfile.unlink(missing_ok=True)
        runner = start_run(home, str(manifest), "-p", f"port={free_port()}")
        try:
            _wait_running(home, "model-server")
            pid = _pid(pidfile)
            assert pid is not None and still_runs(pid, None)
            os.kill(runner.pid, how)
            output = finish_run(runner, timeout=60)
        finally:
            if runner.poll() is None:
                stop_run(runner)
        assert runner.returncode in (128 + how, -how), output
        assert _gone(pid), f"the daemon outlived a runner ended by {how.name}"
        for path in (home / "runs").iterdir():
            path.rename(tmp_path / f"done-{path.name}")  # the next run finds only its own
