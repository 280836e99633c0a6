"""The keeper of a run's containers: removes them even when the runner is killed.

``sublimate run --containers`` creates a container per step (``images``) and removes it in a
``finally`` once the step has ended and its outputs are read. A runner killed outright
(SIGKILL, the OOM killer) runs no ``finally``: its keeper, a small process of its own started
with the run's first container, does it instead. The runner tells it, one line each on its
stdin, which containers exist (``watch NAME [PGID]``: the container, and the process group of
the engine command running in it, which the keeper looks up itself if the runner died before
it could say) and which it has removed itself (``forget NAME``). When its
stdin ends without the runner having closed it on purpose, the runner is gone: the keeper
stops each container's command as the runner's own stop would (SIGTERM to the step's
processes, SIGKILL to the group after the grace period: ``process.LocalProcess.stop``) and
removes the container. This is the container mode's counterpart of the ``PR_SET_PDEATHSIG``
that ties a process-mode step to the runner (``local_process``).

Run as a script (``python -I -S keeper.py CONFIG``, standard library only, no
package import: a few milliseconds) and imported by the runner for ``container_processes``,
so the keeper and the runner pick the same processes to signal.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

GONE_POLL_S = 0.1


def _process_groups() -> list[tuple[int, int]]:
    """Every process's id and process group, from ``/proc``."""
    found: list[tuple[int, int]] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                text = stat.read()
            # Fields after the command name (which may hold spaces and parentheses):
            # state, ppid, pgrp, ...
            found.append((int(entry), int(text[text.rindex(b")") + 2:].split()[2])))
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
    return found


def container_processes(pgid: int, engine_exes: tuple[str, ...]) -> list[int]:
    """The processes of the process group ``pgid`` that belong to the step, not to the engine
    that runs it: those whose executable does not start with one of ``engine_exes``. Empty
    ``engine_exes``: the whole group (an engine whose client passes signals on, such as
    ``docker run``'s signal proxy, is signalled itself)."""
    found: list[int] = []
    for pid, group in _process_groups():
        if group != pgid:
            continue
        try:
            exe = os.readlink(f"/proc/{pid}/exe") if engine_exes else ""
        except OSError:
            continue  # ended meanwhile, or a kernel thread
        if not any(exe.startswith(prefix) for prefix in engine_exes):
            found.append(pid)
    return found


def engine_group(name: str) -> int | None:
    """The process group of the engine command that runs the container ``name``: the group
    leader (started in a session of its own) whose arguments include the name. For a
    container the keeper knows by name only: the runner tells the group once the engine
    command has started, and a runner killed in between never does, though the command runs."""
    for pid, group in _process_groups():
        if group != pid:
            continue  # not a group leader
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                arguments = cmdline.read().split(b"\0")
        except OSError:
            continue
        if name.encode() in arguments:
            return pid
    return None


def stop_group(pgid: int, engine_exes: tuple[str, ...], grace_s: float) -> None:
    """SIGTERM the step's processes of ``pgid``, then SIGKILL the whole group once
    ``grace_s`` has passed with any process of it left."""
    for pid in container_processes(pgid, engine_exes) or [-pgid]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except OSError:
            return  # the group is gone
        time.sleep(GONE_POLL_S)
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)


def main(config_text: str) -> int:
    """Keep the containers the runner names on stdin (see the module docstring). ``config``:
    ``remove`` (the engine's argv that removes a container, its name appended),
    ``engine_exes`` and ``grace_s``."""
    config = json.loads(config_text)
    remove: list[str] = config["remove"]
    engine_exes = tuple(config["engine_exes"])
    grace_s = float(config["grace_s"])
    # A terminal's Ctrl-C or hang-up is for the runner; the keeper outlives it to clean up.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    kept: dict[str, int | None] = {}
    closed = False
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["watch"] and len(words) >= 2:
            kept[words[1]] = int(words[2]) if len(words) > 2 else None
        elif words[:1] == ["forget"] and len(words) == 2:
            kept.pop(words[1], None)
        elif words == ["close"]:
            closed = True
            break
    if closed and not kept:
        return 0
    # The runner is gone (or closed with containers it could not remove): finish its work.
    for name, pgid in kept.items():
        if pgid is None:
            pgid = engine_group(name)
        if pgid is not None:
            stop_group(pgid, engine_exes, grace_s)
        subprocess.run([*remove, name], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
