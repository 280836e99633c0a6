"""The fork server of local_cwd's CPU nodes (launch.forked_agents, processes.agent_zygote).

A real server (it imports torch once for the module) forks real torchrun agents: one that meets
no peer waits in its rendezvous, which is where these tests signal it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sublimate.components.base.ports import free_port
from sublimate.components.base.process_identity import start_ticks
from sublimate.components.data.datasets import build_builtin
from sublimate.components.launch import forked_agents
from sublimate.components.launch.apps import WORKER_AGENT, WORKER_MODULE
from sublimate.components.launch.forked_agents import AgentServer, AgentServers, agent_command
from sublimate.components.launch.netns_scheduler import NODE_INIT, RUN_IT_YOURSELF
from tests.components.launch.test_netns_scheduler import netns
from tests.conftest import REPO, wait_for

__all__ = ["netns"]

AGENT = f"python -m {WORKER_MODULE} {WORKER_AGENT}"


def _in_rendezvous(port: int) -> bool:
    """Whether the agent hosts its rendezvous's store (it listens on the endpoint's port)."""
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _waiting_agent(port: int) -> list[str]:
    """An agent of a two-node job whose other node never comes: it waits in its rendezvous."""
    return [sys.executable, "-m", WORKER_MODULE, WORKER_AGENT, "--nnodes", "2",
            "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "lonely",
            "--rdzv-conf", "join_timeout=600", "--", "--data-dir", "/nowhere", "--run-dir",
            "/nowhere"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    started = AgentServer(sys.executable, {**os.environ, "OMP_NUM_THREADS": "1"}, str(REPO))
    yield started
    started.close()


def test_the_replicas_bash_words_are_expanded_as_its_bash_would() -> None:
    script = (f"{AGENT} --rdzv-endpoint ${{TORCHX_RANK0_HOST:=localhost}}:29500 "
              f"--rdzv-conf ${{PET_RDZV_CONF:+$PET_RDZV_CONF,}}join_timeout=600 -- 'a b' \"$HOME\"")
    env = {"PATH": os.environ["PATH"], "HOME": "/home/me", "TORCHX_RANK0_HOST": "node0"}
    assert agent_command(["bash", "-c", script], env, None) == [
        "python", "-m", WORKER_MODULE, WORKER_AGENT, "--rdzv-endpoint", "node0:29500",
        "--rdzv-conf", "join_timeout=600", "--", "a b", "/home/me"]
    del env["TORCHX_RANK0_HOST"]
    assert agent_command(["/usr/bin/bash", "-c", script], env, None)[5] == "localhost:29500"


@pytest.mark.parametrize("args", [
    ["bash", "-c", f"python -m {WORKER_MODULE} --data-dir d"],  # a worker, not an agent
    ["bash", "-c", "python -m torch.distributed.run -m my.module"],  # a user's entry point
    ["bash", "-c", f"cd /tmp && {AGENT} --nnodes 1 "],  # more than one command
    ["sh", "-c", f"{AGENT} --nnodes 1 "],
    ["python", "-m", WORKER_MODULE, WORKER_AGENT, "--nnodes", "1"],
])
def test_anything_but_a_workers_agent_is_started_afresh(args: list[str]) -> None:
    assert agent_command(args, {"PATH": os.environ["PATH"]}, None) is None


@pytest.mark.parametrize("joint", ["; touch {ran}", " && touch {ran}", " || touch {ran}",
                                   " | tee {ran}", " > {ran}", "\ntouch {ran}", " & touch {ran}"])
def test_a_script_of_more_than_one_command_is_not_run_to_read_its_words(
        tmp_path: Path, joint: str) -> None:
    ran = tmp_path / "ran"
    script = f"true -m {WORKER_MODULE} {WORKER_AGENT} --nnodes 1 " + joint.format(ran=ran)
    assert agent_command(["bash", "-c", script], {"PATH": os.environ["PATH"]}, None) is None
    assert not ran.exists()


def test_switched_off_every_agent_is_started_afresh(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], forked_agents.ENABLE_ENV: "0"}
    assert AgentServers().server_for(["bash", "-c", f"{AGENT} --nnodes 1 "], env, None) is None


def test_an_agent_is_a_session_of_its_own_in_the_requests_directory(
        server: AgentServer, tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    port = free_port()
    with open(log, "wb") as output:
        agent = server.fork(_waiting_agent(port), dict(os.environ), str(tmp_path),
                            output.fileno(), output.fileno())
    try:
        assert agent.poll() is None
        # its own session from the moment its pid is known: TorchX may signal it at once
        assert os.getsid(agent.pid) == agent.pid == os.getpgid(agent.pid)
        # its parent is the server, not this process: TorchX handles it through the server
        assert f"PPid:\t{server.process.pid}" in Path(f"/proc/{agent.pid}/status").read_text()
        wait_for(lambda: _in_rendezvous(port), 60, "the agent's rendezvous")
        assert os.readlink(f"/proc/{agent.pid}/cwd") == str(tmp_path)
        with pytest.raises(subprocess.TimeoutExpired):
            agent.wait(timeout=0.2)
    finally:
        os.killpg(agent.pid, signal.SIGKILL)  # as TorchX's local scheduler kills a replica
    assert agent.wait(timeout=30) == -signal.SIGKILL
    assert agent.returncode == -signal.SIGKILL


def test_an_agents_exit_status_is_its_own(server: AgentServer, tmp_path: Path) -> None:
    """torchrun refusing its flags exits 2, as it would started afresh; SIGTERM to the group (a
    TorchX cancel) ends a waiting agent with torchrun's own handling of it."""
    with open(tmp_path / "refused.log", "wb") as output:
        refused = server.fork([sys.executable, "-m", WORKER_MODULE, WORKER_AGENT,
                               "--no-such-flag", "--"], dict(os.environ), str(tmp_path),
                              output.fileno(), output.fileno())
    assert refused.wait(timeout=60) == 2
    assert b"--no-such-flag" in (tmp_path / "refused.log").read_bytes()

    fresh = subprocess.run([sys.executable, "-m", WORKER_MODULE, WORKER_AGENT, "--no-such-flag",
                            "--"], capture_output=True, cwd=REPO, check=False)
    assert fresh.returncode == refused.returncode

    port = free_port()
    with open(tmp_path / "cancelled.log", "wb") as output:
        waiting = server.fork(_waiting_agent(port), dict(os.environ), str(tmp_path),
                              output.fileno(), output.fileno())
    wait_for(lambda: _in_rendezvous(port), 60, "the agent's rendezvous")
    os.killpg(waiting.pid, signal.SIGTERM)
    code = waiting.wait(timeout=60)
    assert code != 0 and waiting.poll() == code


def test_a_closed_server_ends_and_its_agents_still_read_as_running_then_ended(
        tmp_path: Path) -> None:
    """The server ends with the launcher's socket; an agent it forked is the launcher's to end
    (its cancel, or the job reaper), and with no server left to report it, an agent that is
    gone reads as killed."""
    server = AgentServer(sys.executable, dict(os.environ), str(tmp_path))
    with open(tmp_path / "agent.log", "wb") as output:
        agent = server.fork(_waiting_agent(free_port()), dict(os.environ), str(tmp_path),
                            output.fileno(), output.fileno())
    try:
        server.close()
        assert server.process.returncode == 0
        assert agent.poll() is None and Path(f"/proc/{agent.pid}").exists()
    finally:
        os.killpg(agent.pid, signal.SIGKILL)
    assert agent.wait(timeout=30) == -signal.SIGKILL


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _start_train_step(tmp_path: Path, scheduler: str) -> subprocess.Popen[bytes]:
    """The pipeline's train step, 2 nodes, 1 epoch, on ``scheduler``: its run in
    ``tmp_path / "run"``, its output in ``tmp_path / "train.log"``."""
    data = build_builtin("digits", tmp_path / "digits")
    with open(tmp_path / "train.log", "wb") as output:  # a pipe nobody reads could fill up
        return subprocess.Popen(
            [sys.executable, "-m", "sublimate.components.steps.train", "--data-dir", str(data),
             "--run-dir", str(tmp_path / "run"), "--scheduler", scheduler, "--nodes", "2",
             "--epochs", "1", "--checkpoint-every", "0"],
            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=output, stderr=subprocess.STDOUT)


def test_a_local_cwd_job_forks_its_nodes_from_one_server(tmp_path: Path) -> None:
    """The train step on local_cwd: both nodes' agents are children of one fork server (seen
    while it runs), and the job trains as it would (the same step count and its model)."""
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    launcher = _start_train_step(tmp_path, "local_cwd")
    agents: dict[int, set[int]] = {}  # server -> the agents seen under it
    while launcher.poll() is None:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and _parent(int(entry.name)) == launcher.pid:
                server = int(entry.name)
                with contextlib.suppress(OSError):
                    if forked_agents.SERVER_MODULE.encode() in (entry / "cmdline").read_bytes():
                        agents.setdefault(server, set()).update(
                            int(child.name) for child in Path("/proc").iterdir()
                            if child.name.isdigit() and _parent(int(child.name)) == server)
        time.sleep(0.05)
    output = log.read_text()
    assert launcher.returncode == 0, output
    assert len(agents) == 1 and len(next(iter(agents.values()))) == 2, (agents, output)
    summary = json.loads((run_dir / "train-summary.json").read_text())
    assert summary["steps"] == 22 and (run_dir / "model.pt").is_file()


def test_after_its_server_died_a_node_starts_afresh(tmp_path: Path) -> None:
    """A server killed (the OOM killer) is not asked again: the next node starts afresh, and the
    agents it forked read as killed once they are gone."""
    servers = AgentServers()
    args = ["bash", "-c", f"{sys.executable} -m {WORKER_MODULE} {WORKER_AGENT} --nnodes 1 "]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        found = servers.server_for(args, env, str(tmp_path))
        assert found is not None
        server, argv = found
        assert argv[1:4] == ["-m", WORKER_MODULE, WORKER_AGENT]
        port = free_port()
        with open(tmp_path / "agent.log", "wb") as output:
            agent = server.fork(_waiting_agent(port), env, str(tmp_path), output.fileno(),
                                output.fileno())
        server.process.kill()
        server.process.wait()
        assert servers.server_for(args, env, str(tmp_path)) is None
        os.killpg(agent.pid, signal.SIGKILL)
        assert agent.wait(timeout=30) == -signal.SIGKILL
    finally:
        servers.close()


# --- local_netns: an agent forked into its node's namespaces --------------------------------


def _namespaces(pid: int) -> tuple[str, str]:
    return os.readlink(f"/proc/{pid}/ns/net"), os.readlink(f"/proc/{pid}/ns/pid")


def _children(pid: int) -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and _parent(int(entry.name)) == pid]


@pytest.mark.usefixtures("netns")
def test_a_local_netns_job_forks_each_agent_into_its_nodes_namespaces(tmp_path: Path) -> None:
    """The train step on local_netns: every node's agent comes from the launcher's one fork
    server, and runs in its node's network and PID namespaces (not the host's) and CPU group;
    the job trains as it would."""
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    host = _namespaces(os.getpid())
    launcher = _start_train_step(tmp_path, "local_netns")
    agents: dict[int, tuple[tuple[str, str], str]] = {}  # agent -> its namespaces, cgroups
    servers: set[int] = set()
    while launcher.poll() is None:
        for server in _children(launcher.pid):
            with contextlib.suppress(OSError):
                if forked_agents.SERVER_MODULE.encode() not in \
                        Path(f"/proc/{server}/cmdline").read_bytes():
                    continue
                servers.add(server)
                for waiter in _children(server):  # the server's child that entered the node
                    for agent in _children(waiter):
                        agents.setdefault(agent, (_namespaces(agent),
                                                  Path(f"/proc/{agent}/cgroup").read_text()))
        time.sleep(0.05)
    output = log.read_text()
    assert launcher.returncode == 0, output
    assert len(servers) == 1 and len(agents) == 2, (servers, agents, output)
    nets = {namespaces[0] for namespaces, _ in agents.values()}
    pids = {namespaces[1] for namespaces, _ in agents.values()}
    assert len(nets) == len(pids) == 2 and host[0] not in nets and host[1] not in pids
    cluster = json.loads(next(run_dir.glob("logs/**/cluster.json")).read_text())
    # the training nodes' groups (a per-step job's Lighthouse has a node of its own, no agent)
    groups = [Path(node["cgroup"]).name for node in cluster["nodes"]
              if node.get("cgroup") and node.get("role", "worker") == "worker"]
    for group in groups:  # where the machine gives nodes CPU groups: the agents are in theirs
        assert sum(group in cgroups for _, cgroups in agents.values()) == 1, (group, agents)
    summary = json.loads((run_dir / "train-summary.json").read_text())
    assert summary["steps"] == 22 and (run_dir / "model.pt").is_file()


class _Init:
    """A node's PID 1 (NODE_INIT) in a PID and mount namespace of its own, in forked mode,
    past its go: the test holds the launcher's ends of its mounted and status pipes."""

    def __init__(self, command: list[str] | None = None) -> None:
        go_read, self.go = os.pipe()
        self.mounted, mounted_write = os.pipe()
        status_read, self.status = os.pipe()
        spec = {"binds": [], "forked": {"mounted": mounted_write, "status": status_read}}
        self.holder = subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", "--",  # ends with this test, however it ends
             "unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--",
             sys.executable, "-I", "-S", "-c", NODE_INIT, str(go_read), json.dumps(spec),
             *(command or ["the-command"])], pass_fds=(go_read, mounted_write, status_read),
            start_new_session=True)
        for fd in (go_read, mounted_write, status_read):
            os.close(fd)
        self.pid = wait_for(lambda: next(iter(_children(self.holder.pid)), None), 30,
                            "the node's init")
        os.write(self.go, b"1")
        # its byte is written once its signal handlers are in place (left for the server)
        assert select.select([self.mounted], [], [], 30)[0], "the init never mounted"

    def fork(self, server: AgentServer, argv: list[str], log: Path) -> int:
        """Have ``server`` fork ``argv`` into this node; the server's child that does it."""
        with open(log, "wb") as output:
            waiter = server.fork_into_node(argv, {**os.environ, "OMP_NUM_THREADS": "1"},
                                           str(REPO), (output.fileno(), output.fileno(),
                                                       self.mounted, self.status), self.pid,
                                           None)
        for fd in (self.mounted, self.status, self.go):
            os.close(fd)
        return waiter


@pytest.mark.usefixtures("netns")
def test_a_node_exits_with_its_forked_agents_status(server: AgentServer, tmp_path: Path) -> None:
    init = _Init()
    init.fork(server, [sys.executable, "-m", WORKER_MODULE, WORKER_AGENT, "--no-such-flag",
                       "--"], tmp_path / "agent.log")
    assert init.holder.wait(timeout=60) == 2  # torchrun's refusal, as the command's would be
    assert b"--no-such-flag" in (tmp_path / "agent.log").read_bytes()


@pytest.mark.usefixtures("netns")
def test_a_node_killed_before_its_agent_is_forked_in_says_nothing(
        server: AgentServer, tmp_path: Path) -> None:
    """A kill at a node's start (chaos, ``sublimate fault kill``) can land after its init
    mounted the volume and before the server's child entered the node: the namespaces it was to
    enter are gone (``/proc/<init>/root``; a fork into a PID namespace whose init died fails
    with ENOMEM). That is the kill, which the launcher reports: the node's log, which the
    console follows, shows no traceback (it showed FileNotFoundError or ENOMEM's)."""
    init = _Init()
    os.kill(init.pid, signal.SIGKILL)
    init.holder.wait(timeout=30)
    log = tmp_path / "agent.log"
    waiter = init.fork(server, _waiting_agent(free_port()), log)
    wait_for(lambda: start_ticks(waiter) is None, 30, "the server's child to end")
    assert log.read_bytes() == b""


@pytest.mark.usefixtures("netns")
def test_a_stop_that_comes_before_the_agent_reaches_it_once_it_runs(
        server: AgentServer, tmp_path: Path) -> None:
    """A TorchX cancel (SIGTERM) that reaches a node's init before its agent is forked finds
    no process to pass it to; the init passes it on once the agent runs, which then ends (it
    would otherwise wait in its rendezvous for ten minutes)."""
    init = _Init()
    os.kill(init.pid, signal.SIGTERM)
    time.sleep(0.5)  # handled meanwhile (were it handled later, it would reach the agent anyway)
    init.fork(server, _waiting_agent(free_port()), tmp_path / "agent.log")
    code = init.holder.wait(timeout=60)
    assert code != 0, (tmp_path / "agent.log").read_text()


@pytest.mark.usefixtures("netns")
def test_a_node_no_server_can_fork_for_runs_its_command_itself() -> None:
    """No fork server to fork a node's agent (it did not start, or died): the launcher tells
    the node's init so, and the init runs the replica's command as it would have."""
    init = _Init(["sh", "-c", "exit 7"])
    os.write(init.status, RUN_IT_YOURSELF)
    for fd in (init.mounted, init.status, init.go):
        os.close(fd)
    assert init.holder.wait(timeout=60) == 7


def test_a_closed_launchers_servers_start_no_server(tmp_path: Path) -> None:
    """A server asked for ahead (local_netns starts it in a thread while the cluster is made)
    after the launcher closed its servers would outlive them: none starts."""
    servers = AgentServers()
    servers.close()
    argv = [sys.executable, "-m", WORKER_MODULE, WORKER_AGENT, "--nnodes", "1"]
    assert servers.server(argv, dict(os.environ), str(tmp_path)) is None
