"""Pods of several containers: containerSet, initContainers and sidecars, run locally as Argo
runs them (runner/pods/container_set.py cites the Argo sources). Each manifest is ours; each
test asserts the phases, messages and outputs Argo gives."""

from __future__ import annotations

import socket
import textwrap
import time
from pathlib import Path

import pytest

from sublimate.components.base.ports import free_port
from sublimate.pipelines.runner import run
from sublimate.pipelines.runner.errors import ManifestError


def _run(tmp_path: Path, text: str, **parameters: object):
    return run(textwrap.dedent(text), parameters or None, home=tmp_path / "home", echo=False,
               timeout=60)


CHAIN = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: chain}
spec:
  entrypoint: build
  templates:
  - name: build
    volumes:
    - {name: work, emptyDir: {}}
    containerSet:
      volumeMounts:
      - {name: work, mountPath: /work}
      containers:
      - name: fetch
        command: [sh, -c, "echo one > /work/log"]
      - name: compile
        dependencies: [fetch]
        command: [sh, -c, "echo two >> /work/log"]
      - name: main
        dependencies: [compile]
        command: [sh, -c, "echo three >> /work/log; cat /work/log | tr '\\\\n' ' '"]
    outputs:
      parameters:
      - name: log
        valueFrom: {path: /work/log}
"""


def test_a_dependency_chain_shares_its_volume_and_main_gives_the_result(tmp_path: Path) -> None:
    result = _run(tmp_path, CHAIN)
    assert result.phase == "Succeeded", result.message
    pod = result.node("chain")
    assert pod.result == "one two three "
    assert pod.outputs["log"] == "one\ntwo\nthree"
    assert pod.exit_code == 0
    # one Container node per container, children of the pod's node, each with its own log
    for name in ("fetch", "compile", "main"):
        assert result.node(f"chain.{name}").phase == "Succeeded"
    assert result.started_order.index("fetch") < result.started_order.index("compile") \
        < result.started_order.index("main")
    logs = {p.name for p in Path(result.run_folder).rglob("*.log")}
    assert {"fetch.log", "compile.log", "main.log"} <= logs


FAILING = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: failing}
spec:
  entrypoint: set
  templates:
  - name: set
    containerSet:
      containers:
      - name: slow
        command: [sh, -c, "sleep 30"]
      - name: broken
        command: [sh, -c, "echo disk full > $SUBLIMATE_TERMINATION_LOG; exit 3"]
      - name: main
        dependencies: [broken]
        command: [sh, -c, "echo never"]
"""


def test_a_failing_container_fails_the_pod_and_ends_the_others(tmp_path: Path) -> None:
    started = time.monotonic()
    result = _run(tmp_path, FAILING)
    assert time.monotonic() - started < 20  # slow was terminated, not waited for
    assert result.phase == "Failed"
    pod = result.node("failing")
    assert pod.phase == "Failed"
    assert pod.message == "broken: Error (exit code 3): disk full"
    # main never ran: the emissary exits with its dependency's code
    assert result.node("failing.main").phase == "Failed"
    assert result.node("failing.main").exit_code == 3
    assert pod.exit_code == 3
    assert result.node("failing.broken").message == "broken: Error (exit code 3): disk full"
    assert result.node("failing.slow").message == "slow: Error (exit code 143)"


RETRIED = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: retried}
spec:
  entrypoint: set
  arguments:
    parameters: [{name: marker}, {name: retries}]
  templates:
  - name: set
    containerSet:
      retryStrategy: {retries: "{{workflow.parameters.retries}}"}
      containers:
      - name: main
        command: [sh, -c]
        args: ["echo try; if [ -e {{workflow.parameters.marker}} ]; then exit 0; fi;
                touch {{workflow.parameters.marker}}; exit 1"]
"""


@pytest.mark.parametrize(("retries", "phase"), [(1, "Failed"), (2, "Succeeded")])
def test_retry_strategy_counts_attempts_in_all(tmp_path: Path, retries: int, phase: str) -> None:
    # Argo's emissary_test.go: retries 1 fails a command that succeeds on its second try.
    result = _run(tmp_path, RETRIED, marker=tmp_path / "marker", retries=retries)
    assert result.phase == phase
    assert result.node("retried").log_text().count("try") == retries  # the log is appended


INIT = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: init}
spec:
  entrypoint: work
  arguments:
    parameters: [{name: second, value: "exit 0"}]
  templates:
  - name: work
    volumes:
    - {name: shared, emptyDir: {}}
    initContainers:
    - name: first
      command: [sh, -c, "echo first >> /shared/order"]
      volumeMounts: [{name: shared, mountPath: /shared}]
    - name: second
      command: [sh, -c, "echo second >> /shared/order; {{workflow.parameters.second}}"]
      mirrorVolumeMounts: true
    container:
      command: [sh, -c, "echo main >> /shared/order; cat /shared/order"]
      volumeMounts: [{name: shared, mountPath: /shared}]
"""


def test_init_containers_run_in_order_before_main(tmp_path: Path) -> None:
    result = _run(tmp_path, INIT)
    assert result.phase == "Succeeded", result.message
    assert result.node("init").result == "first\nsecond\nmain"


def test_a_failing_init_container_fails_the_node_without_running_main(tmp_path: Path) -> None:
    result = _run(tmp_path, INIT, second="exit 4")
    node = result.node("init")
    assert node.phase == "Failed"
    assert node.message == "second: Error (exit code 4)"
    assert node.result in (None, "")
    order = Path(result.run_folder).rglob("order")
    assert [p.read_text() for p in order] == ["first\nsecond\n"]


SIDECAR = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: sidecar}
spec:
  entrypoint: query
  arguments:
    parameters: [{name: port}, {name: pidfile}]
  templates:
  - name: query
    sidecars:
    - name: server
      command: [sh, -c]
      args: ["echo $$ > {{workflow.parameters.pidfile}};
              exec python -m http.server {{workflow.parameters.port}} --bind 127.0.0.1
              --directory /srv"]
      volumeMounts: [{name: site, mountPath: /srv}]
    volumes:
    - {name: site, emptyDir: {}}
    container:
      command: [python, -c]
      args:
      - |
        import pathlib, time, urllib.request
        pathlib.Path("/srv/hello.txt").write_text("hello from the sidecar")
        for _ in range(100):
            try:
                url = "http://127.0.0.1:{{workflow.parameters.port}}/hello.txt"
                print(urllib.request.urlopen(url, timeout=1).read().decode())
                break
            except OSError:
                time.sleep(0.1)
      volumeMounts: [{name: site, mountPath: /srv}]
"""


def _serving(port: int) -> bool:
    """Whether anything still accepts connections on the port (the sidecar's pid is its
    PID namespace's, not this machine's: what is observable here is its socket)."""
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_a_sidecar_serves_main_and_is_stopped_after_it(tmp_path: Path) -> None:
    started = time.monotonic()
    port = free_port()
    # on the volume the two containers share: a container's other files are its own
    result = _run(tmp_path, SIDECAR, port=port, pidfile="/srv/server.pid")
    assert result.phase == "Succeeded", result.message  # its SIGTERM exit does not count
    assert result.node("sidecar").result == "hello from the sidecar"
    assert time.monotonic() - started < 20  # stopped by SIGTERM, not after the grace period
    assert next(Path(result.run_folder).glob("nodes/*/volumes/site/server.pid")).read_text()
    assert not _serving(port)
    logs = {p.name for p in Path(result.run_folder).rglob("*.log")}
    assert {"main.log", "server.log"} <= logs


def test_a_sidecar_failing_on_its_own_fails_the_node(tmp_path: Path) -> None:
    # inferFailedReason: a sidecar's exit code other than 137/143 fails the pod.
    text = SIDECAR.replace('exec python -m http.server', 'exit 5; exec python -m http.server')
    text = text.replace("range(100)", "range(2)")  # nothing will answer: do not wait long
    result = _run(tmp_path, text, port=free_port(), pidfile=tmp_path / "server.pid")
    node = result.node("sidecar")
    assert node.phase == "Failed"
    assert node.message == "server: Error (exit code 5)"


@pytest.mark.parametrize(("edit", "problem"), [
    ("dependencies: [compile]", "dependencies: [nothing]"),
    ("name: main", "name: last"),
    ("retryStrategy", None),
])
def test_bad_container_sets_are_refused(edit: str, problem: str | None) -> None:
    if problem is None:
        text = CHAIN.replace("      volumeMounts:\n      - {name: work, mountPath: /work}",
                             "      retryStrategy: {retries: 0}\n      volumeMounts:\n"
                             "      - {name: work, mountPath: /work}")
        expected = "containerSet.retryStrategy.retries: 0 would never run"
    else:
        text = CHAIN.replace(edit, problem)
        expected = ("'nothing' is not a container of the set" if "nothing" in problem
                    else 'must have a container named "main" for input or output')
    with pytest.raises(ManifestError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        run(textwrap.dedent(text), echo=False)
