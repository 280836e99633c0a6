"""The fork server that ``local_cwd`` and ``local_netns`` start every CPU node's torchrun agent
from.

A node of a local job is a torchrun agent (``worker agent ...``, see :func:`worker.agent`), and
each agent started afresh imports torch, torchrun and what its workers need (DDP's
``torch._dynamo``, TensorBoard, Prometheus): about two CPU-seconds per node, at every start,
restart and replacement, on a machine whose cores the nodes share. This process imports all of
that once per launcher and forks each agent from it: a node then starts in milliseconds, and a
per-step replacement trains again after its rendezvous, not after its imports.

The launcher's side (:mod:`sublimate.components.launch.forked_agents`) talks to it over one
``SOCK_SEQPACKET`` socket, one JSON message per packet::

    launcher -> server   {"argv": [...], "env": {...}, "cwd": "..."}  + stdout, stderr fds
    server -> launcher   {"pid": N}  or  {"error": "..."}            (the answer to a request)
    server -> launcher   {"exited": N, "status": S}                  (a wait status, any time)

A ``local_netns`` node's agent is forked into the node's namespaces instead: the request names
the node's PID 1 (``"node": {"init": PID, "cgroup": PATH}``) and passes two more descriptors,
the node's *mounted* pipe (its init writes a byte once the node's volume is mounted) and its
*status* pipe. The server's child waits for that byte, joins the node's CPU group and its
network, mount and PID namespaces, and forks the agent there (it is the node's process as the
command its init would have run); the agent's exit status goes down the status pipe, and the
init exits with it (see ``netns_scheduler.NODE_INIT``).

Each agent is the leader of a session of its own (as TorchX's ``start_new_session``), so the
launcher signals it and its workers with ``killpg(pid)`` as it would a process it started; its
environment, working directory, output and arguments are the request's. The server only ever
imports and forks: it never computes, so no OpenMP thread pool is copied into a fork, and it is
single-threaded when it forks. It exits when the launcher closes the socket (the launcher's end,
however it ends); the agents it forked go on to the launcher's own cleanup (the job reaper).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from typing import Any, NoReturn

from sublimate.components.base.process_identity import start_ticks
from sublimate.components.base.termination import exit_now
from sublimate.components.monitoring.metrics import process_start_time
from sublimate.components.processes import forking_agent, worker

MESSAGE_BYTES = 1 << 20  # a request's environment and arguments fit many times over
ANSWER_FDS = 4  # stdout and stderr; a netns node's mounted and status pipes as well
# setns(2)'s namespace types (<sched.h>); os.setns is Python 3.12's
CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x20000000, 0x40000000
NODE_NAMESPACES = (("net", CLONE_NEWNET), ("mnt", CLONE_NEWNS), ("pid", CLONE_NEWPID))


def preload() -> None:
    """Import what an agent and its workers import, in this (the only) thread."""
    for name in (*forking_agent.AGENT_IMPORTS, "torch.distributed.run",
                 *worker.preload_modules()):
        with contextlib.suppress(Exception):  # as the agent's own preload: met again there
            importlib.import_module(name)


def serve(control: socket.socket, started: float, ready: float) -> None:
    """Fork an agent for every request until the launcher closes ``control``; report every
    agent's exit as it happens. ``started`` and ``ready``: when this server started and when it
    had imported all (the first agent's start-up report shows them as its own; the agents
    forked later took no time to either)."""
    first = [("scheduler", started), ("agent_imports", ready)]
    wakeup_read, wakeup_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD wakes select
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher, not a Ctrl-C, ends the server
    with selectors.DefaultSelector() as selector:
        selector.register(control, selectors.EVENT_READ)
        selector.register(wakeup_read, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj is control:
                    try:
                        message, fds, _, _ = socket.recv_fds(control, MESSAGE_BYTES,
                                                             ANSWER_FDS)
                    except ConnectionError:
                        message = b""
                    if not message:  # the launcher's end
                        return
                    request = json.loads(message)
                    now = time.time()
                    request["env"][forking_agent.FORKED_MARKS_ENV] = json.dumps(
                        first or [("scheduler", now), ("agent_imports", now)])
                    first = []
                    _answer(control, request, fds, (control.fileno(), selector.fileno(),
                                                    wakeup_read, wakeup_write))
                else:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wakeup_read, 4096)
            _report_exits(control)


def _answer(control: socket.socket, request: dict[str, Any], fds: list[int],
            own: tuple[int, ...]) -> None:
    # The answer waits for the agent's own session: the launcher may signal its process group
    # (killpg(pid)) as soon as it has the pid, and before setsid() there is no such group.
    in_session, session_started = os.pipe()
    try:
        pid = os.fork()
    except OSError as error:
        control.send(json.dumps({"error": f"fork: {error}"}).encode())
        pid = -1
    if pid == 0:
        os.close(in_session)
        if "node" in request:
            _become_node(request, fds, (*own, session_started))
        _become_agent(request, fds, (*own, session_started))
    os.close(session_started)
    for fd in fds:
        os.close(fd)
    if pid > 0:
        os.read(in_session, 1)  # a byte, or the end of a child that died before setsid()
        control.send(json.dumps({"pid": pid}).encode())
    os.close(in_session)


def _report_exits(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        with contextlib.suppress(OSError):  # the launcher is gone: nobody to tell
            control.send(json.dumps({"exited": pid, "status": status}).encode())


def _become_node(request: dict[str, Any], fds: list[int], own: tuple[int, ...]) -> NoReturn:
    """In the fork: once the node's init has mounted its volume, enter the node (its CPU group
    and namespaces) and fork the agent there; hand the agent's exit status to the init."""
    code = 1
    try:
        _leave_server(own)  # the server answers at once: this child waits below
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        stdout, stderr, mounted, status = fds
        os.dup2(stderr, 2)  # what fails here shows in the node's log, not the launcher's
        if os.read(mounted, 1) != b"m":  # the node never started (or its launcher failed it)
            os._exit(125)
        os.close(mounted)
        node = request["node"]
        try:
            if node.get("cgroup"):  # where the node's init is: a CPU cap on the node covers it
                with open(os.path.join(node["cgroup"], "cgroup.procs"), "w") as procs:
                    procs.write(str(os.getpid()))
            _enter_namespaces(node["init"])
            agent = os.fork()  # the first process this one makes in the node's PID namespace
        except OSError:
            if start_ticks(node["init"]) is None:
                # The node was killed while its agent was forked in (a kill at its start):
                # its group, its /proc/<init>/root went with it, and a fork into a PID
                # namespace whose init is dead fails with ENOMEM. That is the kill, which the
                # launcher reports; a traceback here would look like a crash of its own.
                os._exit(128 + signal.SIGKILL)
            raise
        if agent == 0:
            os.close(status)
            _become_agent(request, [stdout, stderr], ())
        for fd in (stdout, stderr):
            os.close(fd)
        _, wait_status = os.waitpid(agent, 0)
        code = os.waitstatus_to_exitcode(wait_status)
        with contextlib.suppress(OSError):  # an init already gone has no use for it
            os.write(status, str(code if code >= 0 else 128 - code).encode())
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _leave_server(own: tuple[int, ...]) -> None:
    """In the server's fork: a session of its own, then (``own``: the server's descriptors, the
    last one the pipe its answer waits on) tell the server so and drop what was the server's.
    A process forked in turn from such a fork passes no ``own``."""
    os.setsid()
    if own:
        *servers, session_started = own
        os.write(session_started, b"s")
        signal.set_wakeup_fd(-1)
        for fd in (*servers, session_started):
            os.close(fd)


def _enter_namespaces(init: int) -> None:
    """Join the network and mount namespaces of process ``init`` and its root (a pod's view
    is a chroot, which joining a mount namespace leaves for that namespace's root), and make
    its PID namespace the one this process's children start in (entered by the next fork)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    root = os.open(f"/proc/{init}/root", os.O_RDONLY | os.O_DIRECTORY)
    opened = [(os.open(f"/proc/{init}/ns/{name}", os.O_RDONLY), kind)
              for name, kind in NODE_NAMESPACES]
    for fd, kind in opened:
        if libc.setns(fd, kind) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns into process {init}'s namespaces: "
                                 f"{os.strerror(error)}")
        os.close(fd)
    os.fchdir(root)
    os.chroot(".")
    os.close(root)


def _become_agent(request: dict[str, Any], fds: list[int], own: tuple[int, ...]) -> NoReturn:
    """In the fork: a torchrun agent as ``python -m worker agent ...`` would be, then exit."""
    code = 1
    try:
        _leave_server(own)
        for signum in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        stdout, stderr = fds
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        for fd in {stdout, stderr} - {1, 2}:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        code = _run_agent(request["argv"])
    except SystemExit as end:
        code = end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
        if not isinstance(end.code, int | None):
            print(end.code, file=sys.stderr)
    except BaseException:  # as the interpreter would: the traceback, then status 1
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _run_agent(argv: list[str]) -> int:
    # What the command's own interpreter would have: its arguments, and the thread count its
    # environment asks for (torch read OMP_NUM_THREADS when this server imported it).
    sys.argv = [worker.__file__, *argv]
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    if argv[:1] != [forking_agent.AGENT]:
        raise SystemExit(f"agent_zygote: not an agent's arguments: {argv[:3]}")
    worker.agent(argv[1:])  # ends the process itself
    return 0


def main(argv: list[str] | None = None) -> NoReturn:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        raise SystemExit("usage: python -m sublimate.components.processes.agent_zygote FD")
    control = socket.socket(fileno=int(args[0]))
    started = process_start_time()
    preload()
    control.send(json.dumps({"ready": os.getpid()}).encode())
    serve(control, started, time.time())
    exit_now(0)  # no interpreter teardown of torch


if __name__ == "__main__":
    main()
