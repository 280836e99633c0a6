"""The job reaper: every process of a local job ends with its launcher, however the launcher
ends (``components/launch/job_reaper.py``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from sublimate.components.base.process_identity import start_ticks
from sublimate.components.launch.job_reaper import MARK_ENV, JobReaper, marked_processes
from tests.conftest import wait_for

# A launcher in miniature: it starts the reaper, then three "nodes" in sessions of their own
# (as TorchX's local_cwd does), marked: one that forks a worker, one that ignores SIGTERM and
# SIGINT, one that is a shell running a command. It writes the mark and the reaper's pid,
# then waits to be killed.
LAUNCHER = textwrap.dedent("""
    import os, subprocess, sys, time
    from sublimate.components.launch.job_reaper import MARK_ENV, JobReaper
    folder = sys.argv[1]
    reaper = JobReaper()
    reaper.start()
    env = {**os.environ, MARK_ENV: reaper.mark}
    nodes = [
        "import os, time\\nif os.fork() == 0:\\n    time.sleep(600)\\ntime.sleep(600)",
        "import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\\ntime.sleep(600)",
    ]
    started = [subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
               for code in nodes]
    started.append(subprocess.Popen(["sh", "-c", "sleep 600 & wait"], env=env,
                                    start_new_session=True))
    with open(os.path.join(folder, ".ready"), "w") as ready:
        ready.write(f"{reaper.mark} {reaper.process.pid}")
    os.rename(os.path.join(folder, ".ready"), os.path.join(folder, "ready"))
    time.sleep(600)
""")


def _mark_of(pid: int) -> str:
    """The job mark in ``pid``'s environment (the test's own reading of it), "" for none."""
    with contextlib.suppress(OSError):
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if item.startswith(f"{MARK_ENV}=".encode()):
                return item.split(b"=", 1)[1].decode()
    return ""


def _marked(mark: str) -> dict[int, int | None]:
    """The running processes that carry ``mark``, by pid and start time."""
    return {int(entry.name): start_ticks(int(entry.name)) for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and _mark_of(int(entry.name)) == mark
            and start_ticks(int(entry.name))}


def _running(processes: dict[int, int | None]) -> list[int]:
    # by start time too: pids come back within seconds on a busy machine
    return [pid for pid, ticks in processes.items() if start_ticks(pid) == ticks]


def test_a_launcher_killed_outright_leaves_none_of_its_job(tmp_path: Path) -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)])
    mark = ""
    try:
        wait_for(lambda: (tmp_path / "ready").exists(), 60, "the launcher's job to start")
        mark, reaper = (tmp_path / "ready").read_text().split()
        job = wait_for(lambda: len(found := _marked(mark)) >= 5 and found, 30,
                       "the nodes and the worker")  # 3 nodes, a forked worker, a sleep
        reaper_process = {int(reaper): start_ticks(int(reaper))}
        launcher.kill()
        launcher.wait()
        wait_for(lambda: not _running(job), 15, "every process of the job to end")
        wait_for(lambda: not _running(reaper_process), 15, "the reaper to exit")
    finally:
        launcher.kill()
        launcher.wait()
        for pid in _marked(mark) if mark else {}:  # a failed test's cleanup, by mark
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_closing_ends_what_is_left_and_spares_other_marks() -> None:
    reaper, other = JobReaper(), JobReaper()
    other.mark = reaper.mark + "0"  # a mark that extends this one is another job's
    reaper.start()
    left = [subprocess.Popen(["sleep", "600"], env={**os.environ, MARK_ENV: mark},
                             start_new_session=True) for mark in (reaper.mark, other.mark)]
    try:
        wait_for(lambda: marked_processes(reaper.mark) == [left[0].pid], 10, "the mark")
        reaper.close()  # returns once the reaper has done its work
        assert left[0].poll() == -signal.SIGKILL
        assert left[1].poll() is None
        assert reaper.process is not None and reaper.process.returncode == 0
        reaper.close()  # a second close does nothing
    finally:
        for process in left:
            process.kill()
            process.wait()
