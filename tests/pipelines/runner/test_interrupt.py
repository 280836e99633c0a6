"""The local runner under interruption: stop (a first Ctrl-C, SIGTERM or SIGHUP) runs the exit
handler, a second signal terminates at once, a runner killed outright takes its steps (and the
train step's TorchX job) with it, and the next run says what became of the killed one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from sublimate.components.base.process_identity import start_ticks
from tests.conftest import (
    REPO,
    first_checkpoint,
    pod_pid,
    run_cli,
    start_run,
    stop_run,
    wait_for,
)

STOP_THEN_EXIT_HANDLER = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: stop}
spec:
  entrypoint: main
  onExit: bye
  templates:
  - name: main
    script: {command: [sh], source: "echo $$ > pid; sleep 60"}
  - name: bye
    script: {command: [sh], source: "echo {{workflow.status}}"}
"""

# The main step ignores SIGTERM (it ends by SIGKILL after the grace period); the exit handler
# would then run for 5 minutes: only a second signal ends the run soon.
TERMINATE = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: stop}
spec:
  entrypoint: main
  onExit: bye
  templates:
  - name: main
    script: {command: [sh], source: "trap '' TERM; echo $$ > pid; sleep 60"}
  - name: bye
    script: {command: [sh], source: "echo $$ > pid; sleep 300"}
"""

# A step that says when it gets SIGTERM: what a runner killed outright must still send it.
TERM_AWARE = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: orphan}
spec:
  entrypoint: main
  templates:
  - name: main
    script:
      command: [python]
      source: |
        import os, signal, sys, time
        def stop(*_):
            open("got-sigterm", "w").write("yes")
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        open("pid", "w").write(str(os.getpid()))
        time.sleep(120)
"""

TRIVIAL = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {generateName: next-}
spec:
  entrypoint: main
  templates:
  - name: main
    script: {command: [sh], source: "echo ok"}
"""


def _cli(home: Path, manifest: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sublimate.pipelines", "run", str(manifest), "--quiet"], cwd=REPO,
        env={**os.environ, "SUBLIMATE_HOME": str(home)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _in_working_dir(run_dir: Path, node_prefix: str, name: str) -> list[Path]:
    """A file a step wrote in its working directory: ``/`` in its view (so in its layer,
    ``fs/``), its node folder where it shares this machine's files."""
    return [*run_dir.glob(f"nodes/{node_prefix}*/fs/{name}"),
            *run_dir.glob(f"nodes/{node_prefix}*/{name}")]


def _pid_in(run_dir: Path, node_prefix: str) -> int | None:
    """The step's pid on this machine, once it has written the pid it sees (its PID
    namespace's, in a contained pod): ``pod_pid`` finds it by its node folder."""
    seen = None
    for path in _in_working_dir(run_dir, node_prefix, "pid"):
        with contextlib.suppress(ValueError, OSError):
            seen = int(path.read_text())
    if seen is None:
        return None
    for folder in run_dir.glob(f"nodes/{node_prefix}*"):
        if (found := pod_pid(seen, f"SUBLIMATE_TERMINATION_LOG={folder}/")) is not None:
            return found
    return None


def _runs(pid: int) -> bool:
    return start_ticks(pid) is not None  # a zombie no longer runs


def _written_manifest(tmp_path: Path, text: str, name: str = "wf.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


class Leftovers:
    """Processes a test saw started, each by its pid and start time: pids are reused within
    seconds on a busy machine (pid_max can be 32768), and a pid that names another process by
    the test's end must not be killed."""

    def __init__(self) -> None:
        self.seen: dict[int, int | None] = {}

    def append(self, pid: int) -> None:
        self.seen.setdefault(pid, start_ticks(pid))

    def extend(self, pids: Iterable[int]) -> None:
        for pid in pids:
            self.append(pid)

    def kill(self) -> None:
        for pid, ticks in self.seen.items():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if ticks is not None and start_ticks(pid) == ticks:
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def leftovers() -> Iterator[Leftovers]:
    """Processes a test saw started; those still running at the end are killed (a failed test
    must not leave processes behind)."""
    seen = Leftovers()
    yield seen
    seen.kill()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_stops_the_steps_and_runs_the_exit_handler(
        tmp_path: Path, sig: int, leftovers: Leftovers) -> None:
    home = tmp_path / "home"
    runner = _cli(home, _written_manifest(tmp_path, STOP_THEN_EXIT_HANDLER))
    leftovers.append(runner.pid)
    try:
        step = wait_for(lambda: _pid_in(home / "runs" / "stop", "stop-"), 60, "the step")
        leftovers.append(step)
        runner.send_signal(sig)
        out, err = runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            stop_run(runner)  # type: ignore[arg-type]
    assert runner.returncode == 128 + sig, err
    assert f"stopped by {signal.Signals(sig).name}" in err
    status = json.loads((home / "runs" / "stop" / "status.json").read_text())
    assert (status["phase"], status["message"]) == ("Failed", "stopped")
    nodes = {node["display_name"]: node for node in status["nodes"]}
    assert (nodes["stop"]["phase"], nodes["stop"]["message"]) == ("Failed", "stopped")
    # Argo's stop: the exit handler runs, and sees the workflow Failed.
    assert nodes["onExit"]["phase"] == "Succeeded"
    assert nodes["onExit"]["outputs"]["result"] == "Failed"
    assert not _runs(step)
    assert "onExit" in out  # the final table is printed for a stopped run too


def test_a_second_signal_terminates_at_once(tmp_path: Path, leftovers: Leftovers) -> None:
    home = tmp_path / "home"
    runner = _cli(home, _written_manifest(tmp_path, TERMINATE))
    leftovers.append(runner.pid)
    try:
        step = wait_for(lambda: _pid_in(home / "runs" / "stop", "stop-"), 60, "the step")
        leftovers.append(step)
        runner.send_signal(signal.SIGINT)
        # The step ignores SIGTERM: it ends by SIGKILL after the grace, then the exit handler
        # starts, and runs for 5 minutes unless the run is terminated.
        handler = wait_for(lambda: _pid_in(home / "runs" / "stop", "onExit"), 60,
                            "the exit handler")
        leftovers.append(handler)
        assert not _runs(step)
        runner.send_signal(signal.SIGINT)
        _, err = runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            stop_run(runner)  # type: ignore[arg-type]
    assert runner.returncode == 128 + signal.SIGINT, err
    assert "terminated by SIGINT" in err
    status = json.loads((home / "runs" / "stop" / "status.json").read_text())
    assert (status["phase"], status["message"]) == ("Failed", "terminated")
    onexit = next(node for node in status["nodes"] if node["display_name"] == "onExit")
    assert onexit["phase"] == "Failed"
    wait_for(lambda: not _runs(handler), 10, "the exit handler to be killed")


def test_a_killed_runner_takes_its_steps_along_and_the_next_run_says_so(
        tmp_path: Path, leftovers: Leftovers) -> None:
    home = tmp_path / "home"
    runner = _cli(home, _written_manifest(tmp_path, TERM_AWARE))
    leftovers.append(runner.pid)
    run_dir = home / "runs" / "orphan"
    try:
        step = wait_for(lambda: _pid_in(run_dir, "orphan-"), 60, "the step")
        leftovers.append(step)
        before = json.loads((run_dir / "status.json").read_text())
        assert before["phase"] == "Running" and before["runner"]["pid"] == runner.pid
        runner.kill()
        runner.communicate(timeout=30)
        # PR_SET_PDEATHSIG: the step gets the SIGTERM that a stop would have sent it.
        wait_for(lambda: not _runs(step), 30, "the step to end with its runner")
        assert _in_working_dir(run_dir, "orphan", "got-sigterm")[0].read_text() == "yes"
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    still = json.loads((run_dir / "status.json").read_text())
    assert still["phase"] == "Running"  # nobody could say otherwise yet
    following = run_cli("run", str(_written_manifest(tmp_path, TRIVIAL, "next.yaml")),
                        "--quiet", home=home, timeout=120)
    assert following.returncode == 0, following.stderr
    message = f"the runner was killed (pid {runner.pid} no longer runs)"
    assert f"note: run orphan was interrupted: {message}" in following.stderr
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["phase"], status["message"]) == ("Failed", message)
    assert status["finished_at"] and all(node["phase"] == "Failed" for node in status["nodes"])
    again = run_cli("run", str(tmp_path / "next.yaml"), "--quiet", home=home, timeout=120)
    assert "was interrupted" not in again.stderr  # said once: the status now says Failed


def _processes_of(home: Path) -> set[int]:
    """Every process whose environment or command line names ``home``: the runner, its steps,
    the train step's TorchX replicas (they inherit the environment)."""
    mark = str(home).encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            named = mark in (entry / "environ").read_bytes() or \
                mark in (entry / "cmdline").read_bytes()
            if named and _runs(int(entry.name)):
                found.add(int(entry.name))
    return found


def _command_line(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    return "?"


def _agents_started(home: Path) -> set[int]:
    """The run's processes, once its torchrun agents are among them (else none): agents started
    afresh (``worker agent``), or forked by the launcher's fork server (launch.forked_agents):
    a process whose parent is that server, whose command line, forked, is the server's, and
    which leads a session of its own. One scan answers both, so the processes a test goes on
    with are those among which it saw the agents."""
    server = "processes.agent_zygote"
    processes = _processes_of(home)
    started = any("processes.worker agent" in _command_line(pid) or
                  (server in _command_line(pid) and server in _command_line(_stat(pid, 1))
                   and _stat(pid, 3) == pid)
                  for pid in processes)
    return processes if started else set()


def _stat(pid: int, field: int) -> int:
    """A numeric field of /proc/PID/stat after the command name: 1 the parent, 3 the session."""
    with contextlib.suppress(OSError, ValueError):
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[field])
    return 0


def _launcher_of(home: Path) -> int:
    """The train step's launcher. A child it is forking (the bash that expands a replica's
    command, forked_agents.agent_command) shows the launcher's command line until it execs: the
    launcher is the one whose parent is not one of them (two were found once, under load)."""
    named = [pid for pid in _processes_of(home)
             if "-m sublimate.components.steps.train " in _command_line(pid)]
    (launcher,) = [pid for pid in named if _stat(pid, 1) not in named]
    return launcher


@pytest.mark.parametrize(("moment", "victim", "sig"), [
    ("rendezvous", "runner", signal.SIGKILL), ("rendezvous", "runner", signal.SIGINT),
    # as the OOM killer, or the runner's SIGKILL after its grace period, would end it
    ("rendezvous", "launcher", signal.SIGKILL),
    ("training", "runner", signal.SIGKILL), ("training", "runner", signal.SIGINT)])
def test_an_interrupted_run_leaves_no_training_process(
        home: Path, leftovers: Leftovers, moment: str, victim: str, sig: int) -> None:
    """Whatever moment the signal comes, while the torchrun agents meet (rendezvous) or while
    they train, every process of the training job ends with the run (or with its launcher)."""
    # Enough epochs that training would go on for many minutes after its runner is gone.
    runner = start_run(home, "-p", "checkpoint-every=20", "-p", "epochs=2000")
    leftovers.append(runner.pid)
    try:
        if moment == "rendezvous":
            started = wait_for(lambda: _agents_started(home), 120, "the torchrun agents to start")
        else:
            first_checkpoint(home, runner)
            started = _processes_of(home)
        leftovers.extend(started)
        assert runner.pid in started and len(started) >= 4  # runner, launcher, 2 replicas...
        if victim == "runner":
            runner.send_signal(sig)
            # A SIGKILL: the launcher gets SIGTERM (PR_SET_PDEATHSIG) and cancels its TorchX
            # job; a SIGINT: the runner stops its steps. Either way, whatever the launcher
            # manages before its own end, its job reaper ends what is left of the job.
        else:
            os.kill(_launcher_of(home), sig)  # nothing of the launcher runs after this
        runner.communicate(timeout=60)
        # 128 + N for a stop by signal N, 1 for a workflow whose train step failed
        expected = {signal.SIGKILL: -sig, signal.SIGINT: 128 + sig}[sig] \
            if victim == "runner" else 1
        assert runner.returncode == expected
        try:
            wait_for(lambda: not _processes_of(home), 30, "the run's processes to end")
        except AssertionError as error:  # say which processes stayed, for whoever reads CI
            remaining = {pid: _command_line(pid) for pid in _processes_of(home)}
            raise AssertionError(f"{error}; still running: {remaining}") from None
    finally:
        if runner.poll() is None:
            stop_run(runner)
        leftovers.extend(_processes_of(home))


def _fan_out(home: Path, count: int, spec_parallelism: str, template_parallelism: str) -> str:
    """``count`` steps that sleep a minute, each a ``sh`` named after ``home`` (so that
    ``_processes_of`` finds it whatever its environment)."""
    return f"""
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {{name: big}}
spec:
  entrypoint: main
  {spec_parallelism}
  templates:
  - name: main
    {template_parallelism}
    dag:
      tasks:
      - {{name: fan, template: sleep, withSequence: {{count: "{count}"}}}}
  - name: sleep
    container: {{image: busybox, command: [sh, -c, "sleep 60; true", "{home}"]}}
"""


def _threads(pid: int) -> int:
    with contextlib.suppress(OSError, StopIteration):
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        return int(next(line for line in status if line.startswith("Threads:")).split()[1])
    return 0


@pytest.mark.parametrize(("sig", "spec_parallelism", "template_parallelism"), [
    (signal.SIGTERM, "", "parallelism: 16"),
    (signal.SIGTERM, "parallelism: 16", ""),
    (signal.SIGINT, "", ""),
], ids=["template-parallelism", "workflow-parallelism", "no-parallelism"])
def test_a_stop_signal_ends_a_fan_out_of_thousands_within_ten_seconds(
        tmp_path: Path, sig: int, spec_parallelism: str, template_parallelism: str,
        leftovers: Leftovers) -> None:
    # Issue 40: 10,000 items took 48 s to stop (the status writer's snapshots of every node
    # starved the threads that end them), 1,000,000 ignored SIGTERM for ten minutes.
    home, count = tmp_path / "home", 6000
    manifest = _written_manifest(tmp_path, _fan_out(home, count, spec_parallelism,
                                                    template_parallelism))
    console = tmp_path / "console.txt"  # a line per node: more than a pipe holds unread
    with console.open("w") as out:
        runner = subprocess.Popen(
            [sys.executable, "-m", "sublimate.pipelines", "run", str(manifest), "--quiet"],
            cwd=REPO, env={**os.environ, "SUBLIMATE_HOME": str(home)},
            stdout=subprocess.DEVNULL, stderr=out)
    leftovers.append(runner.pid)
    try:
        # As a user would, once the first steps run: the runner is still starting the other
        # items (one thread each), and its status holds thousands of nodes.
        wait_for(lambda: len(list((home / "runs" / "big").glob("nodes/fan*"))) >= 16, 120,
                 "16 steps to start")
        assert _threads(runner.pid) > 16
        leftovers.extend(_processes_of(home))
        signalled = time.monotonic()
        runner.send_signal(sig)
        runner.wait(timeout=120)  # a bound on a failure's wait only
        took = time.monotonic() - signalled
    finally:
        if runner.poll() is None:
            stop_run(runner)  # type: ignore[arg-type]
    err = console.read_text()
    assert runner.returncode == 128 + sig, err[-2000:]
    assert took < 10, f"{took:.1f} s from {signal.Signals(sig).name} to the runner's end"
    status_file = home / "runs" / "big" / "status.json"
    status = json.loads(status_file.read_text())
    assert (status["phase"], status["message"]) == ("Failed", "stopped")
    # every item has its node (run, or "not started: stopped"), and no more than that
    assert count < len(status["nodes"]) <= count + 3
    assert status_file.stat().st_size < 1024 * len(status["nodes"])
    assert not _processes_of(home)  # every step ended with it
