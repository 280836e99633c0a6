"""The keeper of a run's containers: removes them even when the runner is killed.

``sublimate run --containers`` creates a container per step (``images``) and removes it in a
``finally`` once the step has ended and its outputs are read. A runner killed outright
(SIGKILL, the OOM killer) runs no ``finally``: its keeper, a small process of its own started
with the run's first container, does it instead. The runner tells it, one line each on its
stdin, which containers exist (``watch NAME [PGID [LOG [SECRET...]]]``: the container, the
process group of the engine command running in it, which the keeper looks up itself if the
runner died before it could say, the step's log and the values to mask in it, hex-encoded)
and which it has removed itself (``forget NAME``). When its stdin ends without the runner
having closed it on purpose, the runner is gone: the keeper stops each container's command as
the runner's own stop would (SIGTERM to the step's processes, SIGKILL to the group after the
grace period: ``process.LocalProcess.stop``) and removes the container. This is the container
mode's counterpart of the ``PR_SET_PDEATHSIG`` that ties a process-mode step to the runner
(``local_process``).

The engine command writes the step's output to pipes whose reader is the runner. Once the
runner is gone, a write to them fails, and buildah's stdio relay dies of the SIGPIPE, killing
the step outright: a step that says anything on SIGTERM would never finish its cleanup. So
the keeper opens each engine command's output pipes as soon as it knows its group (through
``/proc/PGID/fd``: the same pipes, one more reader), reads nothing while the runner lives,
and once it has gone reads them into the step's log until the step has ended.

Run as a script (``python -I -S keeper.py CONFIG``, standard library only, no
package import: a few milliseconds) and imported by the runner for ``container_processes``,
so the keeper and the runner pick the same processes to signal.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import selectors
import signal
import stat
import subprocess
import sys
import threading
import time

GONE_POLL_S = 0.1
# After the step's group has gone, how long its output may still come (a background process
# outside the group holding the pipe) before the keeper stops reading.
DRAIN_AFTER_S = 1.0


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


class Kept:
    """One container the keeper knows: its engine command's group, once known, and the
    step's output pipes, held open from then on (see the module docstring)."""

    def __init__(self, words: list[str]) -> None:
        self.name = words[0]
        self.pgid: int | None = int(words[1]) if len(words) > 1 else None
        self.log = bytes.fromhex(words[2]).decode() if len(words) > 2 else ""
        self.masked = sorted((bytes.fromhex(w) for w in words[3:]), key=len, reverse=True)
        self.pipes: list[int] = []
        if self.pgid is not None:
            self.hold_pipes()

    def hold_pipes(self) -> None:
        """Open the engine command's stdout and stderr, if they are pipes, as a reader."""
        for fd in (1, 2):
            path = f"/proc/{self.pgid}/fd/{fd}"
            try:
                if stat.S_ISFIFO(os.stat(path).st_mode):
                    self.pipes.append(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
            except OSError:
                continue  # ended meanwhile, or not ours to open

    def close(self) -> None:
        for fd in self.pipes:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.pipes = []


def drain(kept: list[Kept], groups_gone: threading.Event) -> None:
    """Read every held pipe into its step's log, a line at a time with its secrets masked,
    until each has no writer left, or ``DRAIN_AFTER_S`` after ``groups_gone``."""
    selector = selectors.DefaultSelector()
    logs: dict[int, tuple[Kept, io.BufferedWriter]] = {}
    partial: dict[int, bytes] = {}
    for container in kept:
        if not container.pipes:
            continue
        try:
            log = open(container.log or os.devnull, "ab")  # noqa: SIM115 - closed below
        except OSError:
            log = open(os.devnull, "ab")  # noqa: SIM115
        for fd in container.pipes:
            selector.register(fd, selectors.EVENT_READ)
            logs[fd], partial[fd] = (container, log), b""
    noted: set[int] = set()  # the logs that say the keeper took over (on their first line)
    deadline: float | None = None
    while selector.get_map():
        if deadline is None and groups_gone.is_set():
            deadline = time.monotonic() + DRAIN_AFTER_S
        if deadline is not None and time.monotonic() >= deadline:
            break
        for key, _ in selector.select(GONE_POLL_S):
            fd = key.fd
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            container, log = logs[fd]
            text = partial[fd] + chunk
            if chunk:
                *lines, partial[fd] = text.split(b"\n")
                lines = [line + b"\n" for line in lines]
            else:  # no writer left: what is left is the last line
                lines, partial[fd] = ([text] if text else []), b""
                selector.unregister(fd)
            if lines and id(log) not in noted:
                noted.add(id(log))
                log.write(b"note: the runner is gone: its keeper stops the step, whose output "
                          b"follows\n")
            for line in lines:
                for secret in container.masked:
                    line = line.replace(secret, b"***")
                log.write(line)
            log.flush()
    selector.close()
    for _, log in set(logs.values()):
        log.close()


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
    kept: dict[str, Kept] = {}
    closed = False
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["watch"] and len(words) >= 2:
            if words[1] in kept:
                kept[words[1]].close()
            kept[words[1]] = Kept(words[1:])
        elif words[:1] == ["forget"] and len(words) == 2 and words[1] in kept:
            kept.pop(words[1]).close()
        elif words == ["close"]:
            closed = True
            break
    if closed and not kept:
        return 0
    # The runner is gone (or closed with containers it could not remove): finish its work.
    for container in kept.values():
        if container.pgid is None:
            container.pgid = engine_group(container.name)
            if container.pgid is not None:
                container.hold_pipes()
    groups_gone = threading.Event()
    reader = threading.Thread(target=drain, args=(list(kept.values()), groups_gone))
    reader.start()
    for container in kept.values():
        if container.pgid is not None:
            stop_group(container.pgid, engine_exes, grace_s)
    groups_gone.set()
    reader.join()
    for container in kept.values():
        container.close()
        subprocess.run([*remove, container.name], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
