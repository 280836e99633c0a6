"""A process named by its pid *and* its start time, which a recycled pid cannot impersonate.

A pid alone is reused once its process has ended; the start time (clock ticks since boot,
``/proc/<pid>/stat`` field 22) with it names exactly one process. Lock owners, staging folders,
the local runner's status and the netns cluster's records all keep both.
"""

from __future__ import annotations

import os
from pathlib import Path


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None when it does not run (a zombie
    no longer does)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            text = stat.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def still_runs(pid: int, ticks: int | None) -> bool:
    """Whether the process ``pid`` that started at ``ticks`` still runs. Without /proc, or
    without a recorded start time, only the pid can be checked."""
    if pid <= 0:
        return False
    if Path("/proc/self/stat").exists():
        now = start_ticks(pid)
        return now is not None and (ticks is None or now == ticks)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process holds the pid
    return True
