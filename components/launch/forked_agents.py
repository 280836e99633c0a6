"""Local CPU nodes, forked from one server that has imported torch once.

Every node of a local job is a torchrun agent, ``python -m <worker> agent ...`` (the worker
module forks its workers, see :func:`apps.trainer`). Started afresh, each one imports torch,
torchrun and its workers' modules: about two CPU-seconds per node at every start, restart and
per-step replacement, on cores the nodes share. :class:`AgentServer` starts
:mod:`sublimate.components.processes.agent_zygote` once per launcher (per interpreter), which
imports all of that once and forks each agent on request; :class:`ForkedAgent` is the agent as
TorchX's local scheduler sees a replica (its ``PopenProtocol``: pid, poll, wait, kill).

What stays as it was: the agent's arguments (the replica's ``bash -c`` command, expanded by
bash with the replica's environment), environment, working directory and log files; a session
of its own (TorchX signals a replica with ``killpg(pid)``); its exit status (the server reports
every exit). ``local_netns`` has the agent forked into its node's namespaces instead
(:meth:`AgentServer.fork_into_node`; the node's init stands for it as the replica's process).
What differs: ``/proc/<pid>/cmdline`` and ``environ`` show the server's, whose
environment is the first node's (the job's mark, which :mod:`.job_reaper` reads, included), and
the server's own output (import warnings) goes to the launcher's standard error.
``SUBLIMATE_FORK_AGENTS=0`` starts every agent afresh instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from typing import Any

from sublimate.components.base.process_identity import start_ticks, still_runs
from sublimate.components.launch.apps import WORKER_AGENT, WORKER_MODULE

SERVER_MODULE = "sublimate.components.processes.agent_zygote"
ENABLE_ENV = "SUBLIMATE_FORK_AGENTS"
MESSAGE_BYTES = 1 << 20
# How long the server may take to import torch and the rest before the launcher starts the
# agents afresh instead (a second or two when idle; far more on a machine that is swapping).
READY_SECONDS = 300.0
CLOSE_SECONDS = 5.0
SHELL_OPERATORS = "();<>|&"


def enabled(env: dict[str, str]) -> bool:
    return env.get(ENABLE_ENV, "1") != "0"


def agent_command(args: list[str], env: dict[str, str], cwd: str | None) -> list[str] | None:
    """The agent's command line if ``args`` (a replica's, ``bash -c SCRIPT``) runs a torchrun
    agent of the worker module, with bash's expansions done as the replica's bash would."""
    if len(args) != 3 or os.path.basename(args[0]) != "bash" or args[1] != "-c" or \
            f" -m {WORKER_MODULE} {WORKER_AGENT} " not in args[2] or \
            not _one_simple_command(args[2]):
        return None
    # bash expands the script's words (${TORCHX_RANK0_HOST:=localhost}, ...) in `set --` as it
    # would for the command; printf hands them back NUL-separated.
    shown = subprocess.run(["bash", "-c", f'set -- {args[2]}\nprintf "%s\\0" "$@"'], env=env,
                           cwd=cwd, capture_output=True, check=False)
    argv = shown.stdout.split(b"\0")[:-1]
    if shown.returncode != 0 or argv[1:4] != [b"-m", WORKER_MODULE.encode(),
                                              WORKER_AGENT.encode()]:
        return None
    return [os.fsdecode(word) for word in argv]


def _one_simple_command(script: str) -> bool:
    """Whether ``script`` is one command and its words, with no operator (``&&``, ``;``, a
    pipe, a redirection, a newline): reading its words through ``set --`` must not run any
    part of it."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return "\n" not in script and not any(set(token) <= set(SHELL_OPERATORS)
                                               for token in lexer)
    except ValueError:  # an unclosed quote: bash would refuse it too
        return False


class AgentServer:
    """One running :mod:`agent_zygote` and the agents it forked (see the module's docstring)."""

    def __init__(self, python: str, env: dict[str, str], cwd: str | None) -> None:
        self._control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._lock = threading.RLock()
        self._statuses: dict[int, int] = {}
        self._closed = False
        try:
            self.process = subprocess.Popen(
                [python, "-m", SERVER_MODULE, str(theirs.fileno())], env=env, cwd=cwd,
                stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),), start_new_session=True)
        finally:
            theirs.close()
        try:
            ready = self._next_answer(READY_SECONDS)
        except BaseException:  # e.g. the launcher stopped meanwhile: no server left behind
            self.close()
            raise
        if ready is None or "ready" not in ready:
            self.close()
            raise OSError(f"the agents' fork server ({python} -m {SERVER_MODULE}) did not start"
                          f"{': ' + ready['error'] if ready and 'error' in ready else ''}")

    def fork(self, argv: list[str], env: dict[str, str], cwd: str | None,
             stdout: int, stderr: int) -> ForkedAgent:
        """An agent running ``argv`` (``python -m <worker> agent ...``) as a process would."""
        request = {"argv": argv[3:], "env": env, "cwd": cwd or os.getcwd()}
        with self._lock:
            socket.send_fds(self._control, [json.dumps(request).encode()], [stdout, stderr])
            answer = self._next_answer(READY_SECONDS)
        if answer is None or "pid" not in answer:
            raise OSError(f"the agents' fork server could not start {argv[3:5]}: "
                          f"{(answer or {}).get('error', 'it ended')}")
        return ForkedAgent(self, answer["pid"], argv)

    def fork_into_node(self, argv: list[str], env: dict[str, str], cwd: str | None,
                       fds: tuple[int, int, int, int], init: int, cgroup: str | None) -> int:
        """Have a ``local_netns`` node's agent forked into that node once its init (``init``)
        has mounted its volume (see :mod:`agent_zygote`); ``fds``: its stdout, stderr, and the
        node's mounted (read end) and status (write end) pipes. Returns the pid of the server's
        child that waits to do it (the agent's status reaches the init, not the launcher)."""
        request = {"argv": argv[3:], "env": env, "cwd": cwd or os.getcwd(),
                   "node": {"init": init, "cgroup": cgroup}}
        with self._lock:
            socket.send_fds(self._control, [json.dumps(request).encode()], list(fds))
            answer = self._next_answer(READY_SECONDS)
        if answer is None or "pid" not in answer:
            raise OSError(f"the agents' fork server could not start {argv[3:5]} in a node: "
                          f"{(answer or {}).get('error', 'it ended')}")
        return int(answer["pid"])

    def _next_answer(self, timeout: float) -> dict[str, Any] | None:
        """The next message that is not an exit report (those are kept), or None at the
        server's end or after ``timeout``."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            message = self._receive(left)
            if message is None:
                return None
            if "exited" not in message:
                return message
        return None

    def _receive(self, timeout: float) -> dict[str, Any] | None:
        ready, _, _ = select.select([self._control], [], [], timeout)
        if not ready:
            return {}  # nothing yet: not an answer, and not the end
        try:
            data = self._control.recv(MESSAGE_BYTES)
        except OSError:
            data = b""
        if not data:
            self._closed = True
            return None
        message = json.loads(data)
        if "exited" in message:
            self._statuses[message["exited"]] = message["status"]
        return message

    def status(self, pid: int, timeout: float = 0.0) -> int | None:
        """``pid``'s wait status once it has ended (None while it runs, or until ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while pid not in self._statuses and not self._closed:
                if self._receive(max(deadline - time.monotonic(), 0.0)) == {} and \
                        time.monotonic() >= deadline:
                    break
            return self._statuses.get(pid)

    @property
    def ended(self) -> bool:
        """Whether the server is gone (it reports no more exits, and forks nothing more)."""
        return self._closed or self.process.poll() is not None

    def close(self) -> None:
        """End the server (the agents it forked are left to their own ends)."""
        with contextlib.suppress(OSError):
            self._control.shutdown(socket.SHUT_RDWR)
        self._control.close()
        self._closed = True
        try:
            self.process.wait(timeout=CLOSE_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ForkedAgent:
    """A forked agent as TorchX's local scheduler handles a replica (``PopenProtocol``)."""

    def __init__(self, server: AgentServer, pid: int, args: list[str]) -> None:
        self.server = server
        self.pid = pid
        self._ticks = start_ticks(pid)  # a recycled pid is not this agent
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self._ended(0.0)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self._ended(0.05)) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def _ended(self, timeout: float) -> int | None:
        if self.returncode is None:
            status = self.server.status(self.pid, timeout)
            if status is not None:  # as Popen: the exit code, or minus the signal's number
                self.returncode = os.waitstatus_to_exitcode(status)
            elif self.server.ended and not still_runs(self.pid, self._ticks):
                # no server left to tell how it ended: killed, as the server's end implies
                self.returncode = -signal.SIGKILL
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class AgentServers:
    """A launcher's fork servers, one per interpreter its nodes name (usually one)."""

    def __init__(self) -> None:
        self._servers: dict[str, AgentServer | None] = {}
        self._lock = threading.Lock()  # a server may be started ahead, from another thread
        self._closed = False  # closed: a server started ahead now would outlive its launcher

    @staticmethod
    def agent_argv(args: list[str], env: dict[str, str], cwd: str | None) -> list[str] | None:
        """The agent's command line if ``args`` (a replica's) runs a forkable agent and forking
        is on; None for the caller to start it afresh."""
        if not enabled(env):
            return None
        argv = agent_command(args, env, cwd)
        return argv if argv and shutil.which(argv[0], path=env.get("PATH")) else None

    def server(self, argv: list[str], env: dict[str, str], cwd: str | None,
               ) -> AgentServer | None:
        """The server for the interpreter of ``argv`` (an :meth:`agent_argv`), started if need
        be; None when it could not start or has died since."""
        python = shutil.which(argv[0], path=env.get("PATH"))
        if python is None:
            return None
        with self._lock:
            if self._closed:
                return None
            if python not in self._servers:
                try:
                    self._servers[python] = AgentServer(python, env, cwd)
                except OSError:
                    self._servers[python] = None  # started afresh, where its failure shows
            server = self._servers[python]
            if server is not None and server.ended:  # killed (the OOM killer): not again
                server.close()
                self._servers[python] = server = None
            return server

    def server_for(self, args: list[str], env: dict[str, str], cwd: str | None,
                   ) -> tuple[AgentServer, list[str]] | None:
        """The server to fork the agent that ``args`` (a replica's) runs, started if need be,
        and the agent's command line; None when ``args`` is not a forkable agent (or its
        server could not start), for the caller to start it afresh."""
        argv = self.agent_argv(args, env, cwd)
        if not argv:
            return None
        server = self.server(argv, env, cwd)
        return None if server is None else (server, argv)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for server in self._servers.values():
                if server is not None:
                    server.close()
            self._servers.clear()
