"""The web page's workflow graph (``pipelines/server/web/graph.js``) on a large workflow: how
long a 1,000-node workflow takes to draw, and to show a change, against issue 42's target of a
second.

A `sublimate server` (a subprocess, as the tests start it) serves a home holding one synthetic
run, written as the runner writes one (``runs/<name>/status.json`` and ``workflow.yaml``) with
the server's record of it (``server/workflows/<name>.json``, as for one submitted to it): a
DAG of ``--tasks`` pods in layers of 50, each depending on two of the layer before, half of
them done and the rest running, its runner this process (so the server does not settle it as
interrupted). Headless chromium (selenium, as tests/pipelines/server/web/ drives it) opens
``/workflows/NS/NAME``:

- first paint: from the navigation's start until every node is drawn (``window.__graphDrawn``,
  set by graph.js at its first draw; the page's ``performance.now()``), the page's scripts,
  its API request and the server's conversion included; and of it, the graph's own work
  (model, layout, SVG);
- live update: ``status.json`` rewritten (a rename, as the runner's writer does) with some
  running tasks done and others started, until the page's DOM shows it (a MutationObserver
  on a changed node's ``data-phase``, wall clock on both sides): the server's watch poll
  (0.3 s), its conversion, the event and the graph's update; and of it, the graph's update.

Each is repeated ``--repeat`` times; printed: median, spread (min-max) and the ratio of the
median to the 1 s target.

Usage: python benchmarks/web_graph.py [--tasks 1000] [--repeat 7]
  --smoke: (tests/test_benchmarks.py) 60 tasks, one of each: seconds, figures that mean nothing
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

SMOKE = {"tasks": 60, "repeat": 1}
SMOKE_LINE = "smoke mode: sizes too small for the figures to mean anything"
NAME = "big-graph"
NAMESPACE = "bench"
WIDTH = 50  # tasks per layer
TARGET_S = 1.0

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.pipelines.server.argo_api: the server as the tests start it


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _manifest(tasks: int) -> dict:
    dag = []
    for i in range(tasks):
        task: dict = {"name": f"t{i}", "template": "work"}
        if i >= WIDTH:
            layer_start = (i // WIDTH - 1) * WIDTH
            task["dependencies"] = sorted({f"t{layer_start + i % WIDTH}",
                                           f"t{layer_start + (i + 1) % WIDTH}"})
        dag.append(task)
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "spec": {"entrypoint": "main", "templates": [
                {"name": "main", "dag": {"tasks": dag}},
                {"name": "work", "container": {"image": "alpine:3.20", "command": ["true"]}}]}}


def _status(tasks: int, done: int, run_dir: Path) -> dict:
    """The run with tasks [0, done) Succeeded and the rest Running."""
    from sublimate.components.base.process_identity import start_ticks
    from sublimate.pipelines.runner.records.run_folder import host_name, node_id

    start = datetime.now(UTC) - timedelta(minutes=5)
    task_ids = [node_id(NAME, f"{NAME}.t{i}") for i in range(tasks)]
    nodes = [{"id": NAME, "name": NAME, "display_name": NAME, "template": "main", "type": "DAG",
              "phase": "Running", "started_at": _stamp(start), "finished_at": None,
              "duration_s": None, "outputs": {"parameters": {}, "artifacts": {}, "result": None,
                                              "exitCode": None},
              "message": "", "log": None, "parent": None, "children": task_ids}]
    for i, task_id in enumerate(task_ids):
        finished = i < done
        nodes.append({
            "id": task_id, "name": f"{NAME}.t{i}", "display_name": f"t{i}", "template": "work",
            "type": "Pod", "phase": "Succeeded" if finished else "Running",
            "started_at": _stamp(start + timedelta(seconds=i // WIDTH)),
            "finished_at": _stamp(start + timedelta(seconds=i // WIDTH + 1)) if finished else None,
            "duration_s": 1.0 if finished else None,
            "outputs": {"parameters": {}, "artifacts": {}, "result": "" if finished else None,
                        "exitCode": "0" if finished else None},
            "message": "", "log": str(run_dir / "nodes" / f"t{i}" / "main.log"),
            "parent": NAME, "children": []})
    pid = os.getpid()
    return {"name": NAME, "phase": "Running", "message": "", "started_at": _stamp(start),
            "finished_at": None, "duration_s": None, "run_dir": str(run_dir), "parameters": {},
            "outputs": {}, "links": {}, "nodes": nodes,
            "runner": {"pid": pid, "start_ticks": start_ticks(pid), "host": host_name()}}


def _write(path: Path, status: dict) -> float:
    """Replace ``status.json`` as the runner does (a rename); the wall clock, in ms, before."""
    spare = path.with_name(".status.json.tmp")
    spare.write_text(json.dumps(status))
    written = time.time() * 1000
    os.replace(spare, path)
    return written


def _browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1400,900",
                     "--disable-extensions", "--no-first-run"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")
                                            or "/usr/bin/chromedriver"), options=options)


def _wait(driver: Any, script: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script(script)
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(script)
        time.sleep(0.01)


_WATCH = """
const [id, phase] = arguments;
window.__seen = null;
const g = document.querySelector(`g.node[data-node-id="${id}"]`);
const observer = new MutationObserver(() => {
  if (g.dataset.phase === phase) {
    window.__seen = Date.now();
    observer.disconnect();
  }
});
observer.observe(g, {attributes: true, attributeFilter: ["data-phase"]});
window.__drawsBefore = (window.__graphDraws || []).length;
"""


def _line(name: str, values: list[float], target: float | None = TARGET_S * 1000) -> str:
    median = statistics.median(values)
    ratio = f"   ratio to 1 s {median / target:.3f}" if target else ""
    return f"{name:<34} median {median:8.1f} ms  ({min(values):.1f}-{max(values):.1f}){ratio}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--smoke", action="store_true",
                        help="every code path at tiny sizes, in seconds (tests)")
    options = parser.parse_args()
    if options.smoke:
        parser.set_defaults(**SMOKE)
        options = parser.parse_args()
        print(SMOKE_LINE, flush=True)
    from sublimate.pipelines.runner.records.run_folder import node_id
    from tests.pipelines.server.argo_api import Server

    tasks = options.tasks
    with tempfile.TemporaryDirectory() as folder:
        home = Path(folder) / "home"
        run_dir = home / "runs" / NAME
        run_dir.mkdir(parents=True)
        import yaml

        manifest = _manifest(tasks)
        (run_dir / "workflow.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
        # the server's record, as for a workflow submitted to it (the page's usual case)
        records = home / "server" / "workflows"
        records.mkdir(parents=True)
        (records / f"{NAME}.json").write_text(json.dumps({
            "name": NAME, "namespace": NAMESPACE, "uid": "00000000-0000-4000-8000-000000000042",
            "creationTimestamp": _stamp(datetime.now(UTC)).split(".")[0] + "Z",
            "labels": {}, "annotations": {}, "spec": manifest["spec"]}))
        status_path = run_dir / "status.json"
        done = tasks // 2
        status = _status(tasks, done, run_dir)
        _write(status_path, status)
        server = Server(home)
        driver = _browser()
        try:
            nodes = tasks + 1
            url = f"{server.url}/workflows/{NAMESPACE}/{NAME}"
            paints, paint_draws = [], []
            for _ in range(options.repeat):
                driver.get(url)
                _wait(driver, f"return window.__graphDrawn !== undefined && "
                              f"document.querySelectorAll('g.node').length >= {nodes}")
                paint, draw = driver.execute_script(
                    "return [window.__graphDrawn, window.__graphDraws[0].ms]")
                paints.append(paint)
                paint_draws.append(draw)
            updates, update_draws = [], []
            step = max(1, min(WIDTH, tasks // 20))
            for _ in range(options.repeat):
                if done + step > tasks:
                    done = tasks // 2
                    _write(status_path, _status(tasks, done, run_dir))
                    time.sleep(1)
                last = node_id(NAME, f"{NAME}.t{done + step - 1}")
                driver.execute_script(_WATCH, last, "Succeeded")
                done += step
                written = _write(status_path, _status(tasks, done, run_dir))
                seen = _wait(driver, "return window.__seen", timeout=30)
                updates.append(seen - written)
                update_draws.append(driver.execute_script(
                    "const d = window.__graphDraws; return d[d.length - 1].ms"))
                time.sleep(0.4)
            count = driver.execute_script("return document.querySelectorAll('g.node').length")
            assert count == nodes, count
        finally:
            driver.quit()
            server.stop()
    print(f"graph of {nodes} nodes ({tasks} DAG tasks in layers of {WIDTH}), headless "
          f"chromium, {options.repeat} of each; {step} tasks change per update")
    print(_line("first paint (navigation -> drawn)", paints))
    print(_line("  of which the graph's draw", paint_draws, None))
    print(_line("live update (written -> DOM)", updates))
    print(_line("  of which the graph's update", update_draws, None))


if __name__ == "__main__":
    main()
