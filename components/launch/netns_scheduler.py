"""``local_netns``: a TorchX scheduler that runs every node of a job in its own network.

TorchX's ``local_cwd`` runs all replicas as processes of one host: they share one network, so
a multi-node job never crosses a link, and there is no node to cut off or slow down. This
scheduler is ``local_cwd`` (same logs, ``SUCCESS`` file, describe, logs, cancel) with one
difference: each replica (node) runs in its own network, mount and PID namespaces, with its own
address on a bridge, behind a link that can be shaped, and can be faulted on demand
(:mod:`sublimate.components.launch.faults`). See ``docs/local-cluster.md``.

How a job is laid out::

    host namespace            bridge namespace                node namespaces
    sbl-<y> 10.213.y.254  ==  host --+
                                     br0 --- n0  ==  eth0 10.213.y.1   (node 0: rendezvous host)
                                         --- n1  ==  eth0 10.213.y.2   ...

No namespace is named (``ip netns add`` would leave bind mounts behind): each is *held* by a
process, and goes when it goes. The bridge's by ``unshare --net sleep infinity``; a node's by
``unshare --net --mount --pid --fork --kill-child --mount-proc``, whose child is PID 1 of the
node (a tiny init, :data:`NODE_INIT`, that runs the replica's command and exits with its status;
when PID 1 dies the kernel kills every other process of the node). The holders are started with
PR_SET_PDEATHSIG=SIGKILL from one long-lived thread (the signal fires when the *thread* that
forked them exits), so a launcher killed with SIGKILL takes them down; veth pairs vanish with
their namespaces. What the kernel does not clean by itself (the nodes' cgroups) is removed by a
supervisor process that outlives the launcher (:func:`netns_cluster.supervise`).
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import ipaddress
import json
import os
import pprint
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from torchx.schedulers.api import AppDryRunInfo, DescribeAppResponse
from torchx.schedulers.local_scheduler import (
    LocalOpts,
    PopenRequest,
    ReplicaParam,
    _LocalAppDef,
    _LocalReplica,
)
from torchx.specs.api import AppDef, AppState, ReplicaStatus, RoleStatus, runopts

from sublimate.components.base.process_identity import start_ticks
from sublimate.components.base.replica_groups import volcano_hosts_env
from sublimate.components.launch import cpu_cgroups, faults, netns_cluster
from sublimate.components.launch.forked_agents import AgentServers
from sublimate.components.launch.local_cwd_scheduler import (
    HostGpuLocalScheduler,
    structured_error_msg,
)
from sublimate.components.launch.netns_cluster import CLUSTER_FILE, Cluster, Node

NAME = "local_netns"
# Nodes' subnets are 10.213.<y>.0/24, one per running job; nodes are .1, .2, ..., the host .254.
SUBNET_PREFIX = "10.213"
HOST_OCTET = 254
NODE_IFNAME = "eth0"  # every node's end of its link has this name, in its own namespace
MAX_NODES = 253
# What the launcher writes on a forked node's status pipe when no fork server can fork its
# agent: its init then runs the command itself (NODE_INIT).
RUN_IT_YOURSELF = b"run"
# Serializes the choice of a free subnet between launchers (an empty file on tmpfs).
LOCK_FILE = Path("/run/lock/sublimate-netns.lock")
TOOLS = {"ip": "iproute2", "tc": "iproute2", "unshare": "util-linux", "nsenter": "util-linux",
         "setpriv": "util-linux", "mount": "mount"}
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}  # what a node's init forwards
# How long to wait for a new namespace's holder to be in place.
START_SECONDS = 10.0

# PID 1 of a node, run as `python -I -S -c NODE_INIT <go fd> <spec json> <command...>`: only the
# standard library, so it starts in ~20 ms. It waits for the launcher's go (the node's link is
# configured and the node is in its cgroup), bind-mounts the volume, then runs the replica's
# command as its child and exits with the command's status (128+N when killed by signal N).
# As PID 1 it gets only the signals it handles: SIGTERM/SIGINT/SIGHUP are forwarded to every
# process of the node, so TorchX's cancel (SIGTERM to the process group) stops the node cleanly.
# A node whose command is the worker's torchrun agent (spec "forked") runs nothing itself: the
# agents' fork server forks the agent into the node's namespaces once this init has written a
# byte to the "mounted" pipe (forked_agents, agent_zygote), and the agent's exit status comes
# back on the "status" pipe; a stop signal that finds no agent yet is passed on once it runs.
# Where no fork server can (it did not start, or died), the launcher writes "run" on that pipe
# instead, and the init runs the command itself as above.
NODE_INIT = r"""
import json, os, select, signal, subprocess, sys
go, spec, command = int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3:]
STOP = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
def leave(signum, frame):
    os._exit(128 + signum)
for s in STOP:
    signal.signal(s, leave)
signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP)  # blocked by the launcher until the handlers
if os.read(go, 1) != b"1":
    os._exit(125)  # the launcher failed to set the node up, or died: nothing to run
os.close(go)
for source, target in spec["binds"]:
    os.makedirs(target, exist_ok=True)
    subprocess.run(["mount", "--bind", source, target], check=True)
unsent = []  # a stop signal that found no other process of the node (forked mode)
def forward(signum, frame):
    try:
        os.kill(-1, signum)  # from PID 1: every other process of the node's PID namespace
    except ProcessLookupError:
        unsent.append(signum)
def reap():
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return
forked = spec.get("forked")
if forked:
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP)
    for s in STOP:
        signal.signal(s, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP)
    try:
        os.write(forked["mounted"], b"m")
    except OSError:
        pass  # no server waits for it: the status pipe ends empty below
    os.close(forked["mounted"])
    told = b""
    while True:  # as PID 1 it also reaps every orphan of the node
        ready = select.select([forked["status"]], [], [], 0.2)[0]
        reap()
        while unsent:
            try:
                os.kill(-1, unsent[0])
                unsent.pop(0)
            except ProcessLookupError:
                break
        if ready:
            chunk = os.read(forked["status"], 16)
            if not chunk:
                break
            told += chunk
    if told != b"run":
        sys.exit(int(told) if told.isdigit() else 128 + signal.SIGKILL)
    if unsent:  # stopped before anything ran
        os._exit(128 + unsent[0])
# A stop signal from here until the child exists would find no one to forward to: hold them
# (blocked, pending) across the fork. The child restores the defaults before unblocking, so a
# pending stop ends it as it would end the command.
signal.pthread_sigmask(signal.SIG_BLOCK, STOP)
for s in STOP:
    signal.signal(s, forward)
child = os.fork()
if child == 0:
    for s in (*STOP, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(s, signal.SIG_DFL)  # Python ignores SIGPIPE; the command must not
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP)
    try:
        os.execvp(command[0], command)
    except OSError as error:
        print(f"local_netns: cannot run {command[0]}: {error}", file=sys.stderr, flush=True)
        os._exit(127)
signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP)
while True:  # as PID 1 it also reaps every orphan of the node
    pid, status = os.wait()
    if pid == child:
        break
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


class NetnsError(RuntimeError):
    """The job cannot be submitted here: one line saying why and what to do."""


# ---------------------------------------------------------------------------------------------
# Prerequisites


def effective_capabilities() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def check_privileges(uid: int | None = None, capabilities: int | None = None) -> None:
    """Refuse to submit without CAP_NET_ADMIN (links, addresses, tc) and CAP_SYS_ADMIN (the
    nodes' mount and PID namespaces); ``uid`` and ``capabilities`` default to this process's."""
    uid = os.geteuid() if uid is None else uid
    capabilities = effective_capabilities() if capabilities is None else capabilities
    missing = [name for name, bit in (("CAP_NET_ADMIN", CAP_NET_ADMIN),
                                      ("CAP_SYS_ADMIN", CAP_SYS_ADMIN))
               if not capabilities >> bit & 1]
    if missing:
        raise NetnsError(
            f"{NAME} needs root or CAP_NET_ADMIN: running as uid {uid} without "
            f"{' and '.join(missing)}; it creates network namespaces, veth links and tc "
            "qdiscs (CAP_NET_ADMIN) and each node's mount and PID namespaces (CAP_SYS_ADMIN). "
            "Run the launcher as root, or use -s local_cwd")


def check_prerequisites(link: LinkConfig) -> None:
    """Everything a submission needs, checked before anything is created: one clear error."""
    check_privileges()
    missing = sorted({f"{tool} ({package})" for tool, package in TOOLS.items()
                      if shutil.which(tool) is None})
    if missing:
        raise NetnsError(f"{NAME} needs these commands on PATH: {', '.join(missing)}")
    asked = [(option, value) for option, value in (("link_delay", link.delay),
                                                   ("link_loss", link.loss)) if value]
    if asked and not faults.kernel_has_netem():
        raise NetnsError(faults.netem_missing(*asked[0]))


# ---------------------------------------------------------------------------------------------
# Run options and the request


@dataclass
class LinkConfig:
    rate: str | None = None
    delay: str | None = None
    loss: str | None = None


@dataclass
class NetnsRequest(PopenRequest):
    """``local_cwd``'s request plus the links' shaping and the volume to bind in every node."""

    link: LinkConfig = field(default_factory=LinkConfig)
    binds: list[tuple[str, str]] = field(default_factory=list)


def parse_volume(volume: str | None) -> list[tuple[str, str]]:
    if not volume:
        return []
    source, separator, target = volume.partition(":")
    if not separator or not source or not os.path.isabs(target):
        raise ValueError(f"volume '{volume}': expected HOST_PATH:CLUSTER_PATH, e.g. "
                         "/srv/data:/mnt/sublimate (CLUSTER_PATH absolute)")
    if not os.path.isdir(source):
        raise ValueError(f"volume '{volume}': {source} is not a folder on this host")
    return [(os.path.abspath(source), target)]


def node_env(index: int, addr: str, rank0: str, host_addr: str,
             env: dict[str, str]) -> dict[str, str]:
    """The variables a node gets on top of its role's: its address, node 0's, and torchrun's
    flags for a rendezvous across namespaces (``--local-addr``, ``is_host``: the hostname
    resolves to 127.0.0.1 in every node, so torchrun must be told which address is whose)."""
    # The role's own rendezvous options stay; an is_host there is this scheduler's to decide
    # (and a request addressed twice, dry run then submission, must not get two).
    rdzv_conf = [option for option in env.get("PET_RDZV_CONF", "").split(",")
                 if option and not option.startswith("is_host=")]
    return {
        "TORCHX_RANK0_HOST": rank0,
        "PET_LOCAL_ADDR": addr,
        "PET_RDZV_CONF": ",".join([*rdzv_conf, f"is_host={1 if index == 0 else 0}"]),
        "SUBLIMATE_NODE_ADDR": addr,
        "SUBLIMATE_METRICS_ADDR": addr,  # reachable from the host, unlike 127.0.0.1
        "SUBLIMATE_HOST_ADDR": host_addr,  # the launcher's host, seen from the nodes
        # gloo (and TensorPipe, NCCL) pick the address the hostname resolves to, 127.0.0.1 in
        # every node, and peers in other namespaces cannot reach it: name the node's link.
        **{name: env.get(name, NODE_IFNAME)
           for name in ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")},
    }


def _nodes(request: PopenRequest) -> list[tuple[str, int, ReplicaParam, str]]:
    """(role, replica, params, log dir) of every node, in node order: roles, then replicas."""
    return [(role, replica, params, request.role_log_dirs[role][replica])
            for role, replicas in request.role_params.items()
            for replica, params in enumerate(replicas)]


def node_mac(addr: str) -> str:
    """A node link's MAC address, from its IPv4 address (locally administered, unicast)."""
    return "02:42:" + ":".join(f"{octet:02x}" for octet in ipaddress.IPv4Address(addr).packed)


def _address(subnet: ipaddress.IPv4Network, octet: int) -> str:
    return str(subnet.network_address + octet)


def assign_addresses(request: PopenRequest, subnet: ipaddress.IPv4Network) -> None:
    nodes = _nodes(request)
    if len(nodes) > MAX_NODES:
        raise NetnsError(f"{NAME}: {len(nodes)} nodes; at most {MAX_NODES} fit on one bridge")
    rank0 = _address(subnet, 1)
    # Where every replica runs, as Volcano's env plugin tells each pod (VC_<TASK>_HOSTS).
    hosts = {volcano_hosts_env(role, replica): _address(subnet, index + 1)
             for index, (role, replica, _, _) in enumerate(nodes)}
    for index, (_, _, params, _) in enumerate(nodes):
        params.env.update(node_env(index, _address(subnet, index + 1), rank0,
                                   _address(subnet, HOST_OCTET), params.env))
        params.env.update(hosts)


# ---------------------------------------------------------------------------------------------
# Subnets


def _host_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Every IPv4 network the host's namespace has an address or a route in."""
    networks = []
    for argv in (["ip", "-4", "-j", "addr"], ["ip", "-4", "-j", "route", "show", "table", "all"]):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        for entry in json.loads(done.stdout or "[]"):
            for info in entry.get("addr_info", []):
                networks.append(ipaddress.ip_interface(
                    f"{info['local']}/{info['prefixlen']}").network)
            dst = entry.get("dst")
            if dst and dst != "default":
                with contextlib.suppress(ValueError):
                    networks.append(ipaddress.ip_network(dst, strict=False))
    return networks


def _links() -> set[str]:
    done = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=False)
    return {entry["ifname"] for entry in json.loads(done.stdout or "[]")}


def host_veth_name(subnet: ipaddress.IPv4Network) -> str:
    return f"sbl-{subnet.network_address.packed[2]}"


def free_subnet() -> ipaddress.IPv4Network:
    """A 10.213.y.0/24 that no address or route of the host touches: the host's veth of a
    running job holds its subnet's address, so two jobs never share one. Starting from a random
    y spreads jobs out, so a subnet just freed is rarely reused at once."""
    taken = _host_networks()
    links = _links()
    start = random.randrange(256)
    for step in range(256):
        subnet = ipaddress.IPv4Network(f"{SUBNET_PREFIX}.{(start + step) % 256}.0/24")
        if host_veth_name(subnet) not in links and not any(subnet.overlaps(n) for n in taken):
            return subnet
    raise NetnsError(f"{NAME}: every subnet {SUBNET_PREFIX}.0.0/16 is in use")


# ---------------------------------------------------------------------------------------------
# Processes

_T = TypeVar("_T")


class _Spawner:
    """Starts processes from one daemon thread that lives as long as the launcher.

    PR_SET_PDEATHSIG fires when the *thread* that forked a process exits, not the process: a
    holder forked from a short-lived thread (a web handler, a thread pool) would be killed with
    it. Forking from this thread ties the holders to the launcher process itself.
    """

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = \
            queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def call(self, function: Callable[[], _T]) -> _T:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="local_netns-spawner",
                                                daemon=True)
                self._thread.start()
        future: Future[_T] = Future()
        self._requests.put((future, function))
        return future.result()

    def _serve(self) -> None:
        # The processes forked here start with the stop signals blocked (the mask survives
        # fork and exec, and `unshare` gives its child the mask it got). A PID-namespace init
        # drops the signals it has no handler for, so a SIGTERM arriving while a node's init
        # is still starting would be lost (and a cancel would wait 10 s for TorchX's SIGKILL);
        # blocked, it waits until the init has its handlers and unblocks it.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        while True:
            future, function = self._requests.get()
            try:
                future.set_result(function())
            except BaseException as error:  # handed back to the caller
                future.set_exception(error)


_SPAWNER = _Spawner()


def _pdeathsig(argv: list[str]) -> list[str]:
    # setpriv sets PR_SET_PDEATHSIG and execs; the setting survives exec (no preexec_fn, which
    # is unsafe in a threaded launcher).
    return ["setpriv", "--pdeathsig", "KILL", "--", *argv]


def _netns(pid: int | str) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def _wait_for_namespace(pid: int, what: str) -> int:
    """Wait until ``pid`` is in a network namespace of its own, and return its start time.

    Never configure a holder before this: ``nsenter -t`` on a process that has not unshared yet
    would change the *host's* network.
    """
    own = _netns("self")
    end = time.monotonic() + START_SECONDS
    while time.monotonic() < end:
        start = start_ticks(pid)
        if start is None:
            raise NetnsError(f"{NAME}: the {what} exited while starting")
        with contextlib.suppress(OSError):
            if _netns(pid) != own:
                return start
        time.sleep(0.005)
    raise NetnsError(f"{NAME}: the {what} did not start within {START_SECONDS:g} s")


def _child_of(parent: int, what: str) -> int:
    """The pid of ``parent``'s child (the node's PID 1), found through /proc (no procfs
    ``children`` file on every kernel)."""
    end = time.monotonic() + START_SECONDS
    while time.monotonic() < end:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(entry.path, "stat").read_text()
                if int(stat[stat.rindex(")") + 2:].split()[1]) == parent:
                    return int(entry.name)
        if start_ticks(parent) is None:
            raise NetnsError(f"{NAME}: the {what} exited while starting")
        time.sleep(0.005)
    raise NetnsError(f"{NAME}: the {what} did not start within {START_SECONDS:g} s")


def _own_cpu_cgroup() -> Path | None:
    """The group the nodes' cpu groups go in, on cgroup v1 or v2 (:mod:`.cpu_cgroups`), or
    None without a cpu controller this launcher can use."""
    return cpu_cgroups.node_parent()


# ---------------------------------------------------------------------------------------------
# The scheduler


@dataclass
class _NodeFork:
    """A node's agent to be forked into it (``AgentServer.fork_into_node``), with the
    launcher's ends of its pipes until the request is sent."""

    index: int
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    fds: tuple[int, int, int, int]  # stdout, stderr (the replica's), mounted read, status write

    def close(self) -> None:
        for fd in self.fds[2:]:
            with contextlib.suppress(OSError):
                os.close(fd)


class _NetnsApp(_LocalAppDef):
    """A ``local_cwd`` app whose end also tears its cluster down (once, however it ends)."""

    def __init__(self, id: str, log_dir: str) -> None:
        super().__init__(id, log_dir)
        self.cluster_path = Path(log_dir) / CLUSTER_FILE
        self.supervisor: subprocess.Popen[bytes] | None = None
        self.go: list[int] = []  # write ends of the nodes' go pipes, until they are released
        self.node_forks: list[_NodeFork] = []  # agents to fork into nodes, before the go
        self.addresses: dict[tuple[str, int], str] = {}
        self.torn_down = False

    def get_structured_error_msg(self) -> str:
        return structured_error_msg(self)

    def fork_agents(self, servers: AgentServers, cluster: Cluster) -> None:
        """Ask the fork server for each new node's agent, to be forked into the node once its
        init has mounted the volume (after the go), in the node's CPU group. Where no server
        can (it did not start, or died), the node's init runs the command itself."""
        while self.node_forks:
            fork = self.node_forks.pop(0)
            try:
                server = servers.server(fork.argv, fork.env, fork.cwd)
                try:
                    if server is not None:
                        server.fork_into_node(fork.argv, fork.env, fork.cwd, fork.fds,
                                              cluster.nodes[fork.index].init_pid,
                                              cluster.nodes[fork.index].cgroup)
                except OSError:
                    server = None
                if server is None:
                    os.write(fork.fds[3], RUN_IT_YOURSELF)
            finally:
                fork.close()

    def release(self, go: bool) -> None:
        """Tell every waiting node to start (``go``) or to exit without running anything."""
        while self.node_forks:  # never asked for: their nodes' inits exit with the pipes
            self.node_forks.pop().close()
        while self.go:
            fd = self.go.pop()
            with contextlib.suppress(OSError):
                if go:
                    os.write(fd, b"1")
            os.close(fd)

    def kill(self) -> None:
        self.release(go=False)
        super().kill()  # SIGTERM each node's process group, SIGKILL after 10 s
        if self.torn_down:
            return
        self.torn_down = True
        try:
            netns_cluster.teardown(self.cluster_path)
        finally:
            if self.supervisor is not None:
                # EOF on its stdin: it finds the cluster ended and exits.
                self.supervisor.stdin.close()  # type: ignore[union-attr]
                try:
                    self.supervisor.wait(timeout=netns_cluster.REAP_SECONDS + 5)
                except subprocess.TimeoutExpired:
                    self.supervisor.kill()
                    self.supervisor.wait()


class NetnsScheduler(HostGpuLocalScheduler):
    """``local_cwd`` with one network (and mount and PID) namespace per node.

    **Config Options**: those of ``local_cwd`` and ``link_rate``, ``link_delay``, ``link_loss``,
    ``volume`` (see :meth:`_run_opts`).
    """

    # A node's agent is forked into its namespaces from _start_node, not through _popen.
    FORKS_AGENTS = False

    def __init__(self, session_name: str, cache_size: int = 100,
                 extra_paths: list[str] | None = None, gpu_count: int | None = None) -> None:
        super().__init__(session_name, cache_size=cache_size, extra_paths=extra_paths,
                         gpu_count=gpu_count)
        self.backend = NAME

    def _run_opts(self) -> runopts:
        opts = super()._run_opts()
        opts.add("link_rate", type_=str, default=None,
                 help="rate of each node's link, both directions, in tc's syntax (100mbit, "
                      "1gbit); a tbf qdisc")
        opts.add("link_delay", type_=str, default=None,
                 help="delay each node's link adds in each direction (2ms); needs netem")
        opts.add("link_loss", type_=str, default=None,
                 help="packet loss of each node's link in each direction (1%%); needs netem")
        opts.add("volume", type_=str, default=None,
                 help="HOST_PATH:CLUSTER_PATH bind-mounted in every node, e.g. "
                      "/srv/sublimate:/mnt/sublimate")
        return opts

    # -- submission ---------------------------------------------------------------------------

    def _to_popen_request(self, app: AppDef, cfg: LocalOpts) -> NetnsRequest:
        options: dict[str, Any] = dict(cfg)
        link = LinkConfig(options.get("link_rate"), options.get("link_delay"),
                          options.get("link_loss"))
        try:
            faults.check_link_options(link.rate, link.delay, link.loss)
            binds = parse_volume(options.get("volume"))
        except ValueError as error:
            raise NetnsError(f"{NAME}: {error}") from error
        base = super()._to_popen_request(app, cfg)
        request = NetnsRequest(**vars(base), link=link, binds=binds)
        # Addresses for the dry run's eyes; the submission picks a free subnet and reassigns.
        assign_addresses(request, ipaddress.IPv4Network(f"{SUBNET_PREFIX}.0.0/24"))
        return request

    def _submit_dryrun(self, app: AppDef, cfg: LocalOpts) -> AppDryRunInfo[NetnsRequest]:
        request = self._to_popen_request(app, cfg)
        return AppDryRunInfo(request, lambda r: pprint.pformat(asdict(r), indent=2, width=80))

    def schedule(self, dryrun_info: AppDryRunInfo[NetnsRequest]) -> str:
        request = dryrun_info.request
        check_prerequisites(request.link)
        if len(self._apps) == self._cache_size and not self._evict_lru():
            raise IndexError(f"App cache size ({self._cache_size}) exceeded. "
                             "Increase the cache size")
        os.makedirs(request.log_dir)
        app = _NetnsApp(request.app_id, request.log_dir)
        try:
            self._start_cluster(app, request)
        except BaseException:
            app.kill()  # whatever was started goes, and the error stands
            raise
        self._apps[request.app_id] = app
        self._requests[request.app_id] = request
        return request.app_id

    def _start_cluster(self, app: _NetnsApp, request: NetnsRequest) -> None:
        self._start_agent_server(request)
        cluster = Cluster(path=app.cluster_path, app_id=request.app_id, started=time.time(),
                          link=asdict(request.link),
                          volume=",".join(":".join(b) for b in request.binds) or None)
        cluster.save()
        # First the supervisor, so that a launcher killed from here on is cleaned up after.
        # It must outlive the launcher: no PDEATHSIG, its own session.
        app.supervisor = subprocess.Popen(
            [sys.executable, "-m", "sublimate.components.launch.netns_cluster", "supervise",
             str(app.cluster_path)], stdin=subprocess.PIPE, start_new_session=True)
        cluster.supervisor_pid = app.supervisor.pid
        bridge = _SPAWNER.call(lambda: subprocess.Popen(
            _pdeathsig(["unshare", "--net", "--", "sleep", "infinity"]),
            stdin=subprocess.DEVNULL, start_new_session=True))
        cluster.bridge_pid = bridge.pid
        cluster.bridge_start = start_ticks(bridge.pid) or 0
        cluster.save()
        _wait_for_namespace(bridge.pid, "bridge's namespace holder")
        faults.in_netns(bridge.pid, "ip link set lo up\nip link add br0 type bridge\n"
                                    "ip link set br0 up\n", "creating the bridge")
        LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
        with open(LOCK_FILE, "a") as lock:
            # One launcher at a time between choosing a subnet and holding it (the address on
            # the host's veth is what the next launcher sees as taken).
            fcntl.flock(lock, fcntl.LOCK_EX)
            subnet = free_subnet()
            cluster.subnet, cluster.host_veth = str(subnet), host_veth_name(subnet)
            cluster.host_addr = _address(subnet, HOST_OCTET)
            cluster.save()
            faults.run(["ip", "link", "add", cluster.host_veth, "type", "veth", "peer", "name",
                        "host", "netns", str(bridge.pid)], "creating the host's link")
            faults.run(["ip", "addr", "add", f"{cluster.host_addr}/24", "dev",
                        cluster.host_veth], "addressing the host's link")
            faults.run(["ip", "link", "set", cluster.host_veth, "up"], "the host's link")
        assign_addresses(request, subnet)
        bridge_script = "ip link set host master br0 up\n"
        cgroups = _own_cpu_cgroup()
        for index, (role, replica, params, log_dir) in enumerate(_nodes(request)):
            os.makedirs(log_dir)
            node = self._start_node(app, index, role, replica, params, request.binds)
            cluster.nodes.append(node)
            cluster.save()
            bridge_script += self._wire_node(cluster, node, request.link)
            if cgroups is not None:
                # The node's PID 1 goes in before it starts anything: all its descendants
                # inherit the group, so a CPU quota on it covers the whole node.
                group = cgroups / f"sublimate-{request.app_id}-n{index}"
                group.mkdir()
                node.cgroup = str(group)
                cluster.save()
                (group / "cgroup.procs").write_text(str(node.init_pid))
        faults.in_netns(bridge.pid, bridge_script, "connecting the nodes to the bridge")
        app.fork_agents(self.agent_servers, cluster)
        cluster.state = netns_cluster.RUNNING
        cluster.save()
        app.release(go=True)

    def _start_agent_server(self, request: NetnsRequest) -> None:
        """Start the fork server for the nodes' agents now, in the background, so that its
        imports go on while the cluster is made (its nodes' agents need it only after)."""
        for _, _, params, _ in _nodes(request):  # the first node that runs an agent
            env = self._get_replica_env(params)
            argv = self.agent_servers.agent_argv(params.args, env, params.cwd)
            if argv is not None:
                threading.Thread(target=self.agent_servers.server,
                                 args=(argv, env, params.cwd),
                                 name="local_netns-agent-server", daemon=True).start()
                return

    @staticmethod
    def _wire_node(cluster: Cluster, node: Node, link: LinkConfig) -> str:
        """Give a started node its link (address, shaping) into the bridge's namespace; returns
        the bridge side's script (attach to br0, shape), which the caller runs."""
        # The node's MAC follows from its address, so a node started again in place keeps it:
        # its peers' ARP caches stay right (a new MAC would leave them sending to the old one
        # until their entries expired, tens of seconds in which the replacement is unreachable).
        faults.run(["ip", "link", "add", node.veth, "address", node_mac(node.addr), "netns",
                    str(node.init_pid), "type", "veth", "peer", "name", node.bridge_veth,
                    "netns", str(cluster.bridge_pid)], f"creating node {node.index}'s link")
        faults.in_netns(node.init_pid, (
            f"ip link set lo up\nip addr add {node.addr}/24 dev {node.veth}\n"
            f"ip link set {node.veth} up\n"
            + faults.qdisc_script(node.veth, link.rate, link.delay, link.loss)),
            f"configuring node {node.index}")
        return (f"ip link set {node.bridge_veth} master br0 up\n"
                + faults.qdisc_script(node.bridge_veth, link.rate, link.delay, link.loss))

    def restart_replica(self, app_id: str, role: str, replica: int,
                        env: dict[str, str]) -> None:
        """Start a lost node again in place: a new node with the same index, address, link
        shaping and CPU group (and any CPU cap ``fault slow`` left on it), its command run afresh
        with ``env`` on top; its logs go on in the same files. A node still alive is killed
        first (a replica is restarted only once the launcher found it failed)."""
        app = self._apps[app_id]
        if not isinstance(app, _NetnsApp):
            raise NetnsError(f"{NAME}: no running cluster for {app_id}")
        request = self._requests[app_id]
        params = copy.deepcopy(request.role_params[role][replica])
        params.env.update(env)
        with netns_cluster.updating(app.cluster_path) as cluster:
            index, old = next((n.index, n) for n in cluster.nodes
                              if n.role == role and n.replica == replica)
            netns_cluster.signal_process(old.init_pid, old.init_start)
            app.role_replicas[role][replica].terminate()  # closes its log handles
            self._appending = True
            try:
                node = self._start_node(app, index, role, replica, params, request.binds)
            finally:
                self._appending = False
            node.cgroup, node.faults = old.cgroup, old.faults
            # The old bridge-side veth goes with the old namespace, which the kernel removes a
            # little after its last process: a new name never collides with it.
            started = self._restarts.setdefault(app_id, {})
            started[index] = started.get(index, 0) + 1
            node.bridge_veth = f"n{index}r{started[index]}"
            cluster.nodes[index] = node
            bridge_script = self._wire_node(cluster, node, request.link)
            if node.cgroup:
                Path(node.cgroup, "cgroup.procs").write_text(str(node.init_pid))
        faults.in_netns(cluster.bridge_pid, bridge_script, f"connecting node {index} again")
        app.fork_agents(self.agent_servers, cluster)
        app.release(go=True)

    def _start_node(self, app: _NetnsApp, index: int, role: str, replica: int,
                    params: ReplicaParam, binds: list[tuple[str, str]]) -> Node:
        """Start a node's namespaces, its init waiting for the go (see :data:`NODE_INIT`), and
        make it the replica's process (a replica started again replaces its predecessor)."""
        stdout, stderr, combined = self._get_replica_output_handles(params)
        env = self._get_replica_env(params)
        go_read, go_write = os.pipe()
        app.go.append(go_write)
        spec: dict[str, Any] = {"binds": binds}
        init_fds = [go_read]
        agent_argv = self.agent_servers.agent_argv(params.args, env, params.cwd)
        if agent_argv is not None:  # the agent is forked into the node once it is up
            mounted_read, mounted_write = os.pipe()
            status_read, status_write = os.pipe()
            spec["forked"] = {"mounted": mounted_write, "status": status_read}
            init_fds += [mounted_write, status_read]
            app.node_forks.append(_NodeFork(
                index, agent_argv, env, params.cwd,
                (stdout.fileno() if stdout else 1, stderr.fileno() if stderr else 2,
                 mounted_read, status_write)))
        argv = _pdeathsig([
            "unshare", "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
            "--", sys.executable, "-I", "-S", "-c", NODE_INIT, str(go_read),
            json.dumps(spec), *params.args])
        try:
            proc = _SPAWNER.call(lambda: subprocess.Popen(
                argv, env=env, stdout=stdout, stderr=stderr, start_new_session=True,
                cwd=params.cwd, pass_fds=tuple(init_fds)))
        finally:
            for fd in init_fds:
                os.close(fd)
        local = _LocalReplica(role, replica, proc, stdout=stdout, stderr=stderr,
                              combined=combined,
                              error_file=env.get("TORCHELASTIC_ERROR_FILE", "<N/A>"))
        replicas = app.role_replicas.setdefault(role, [])
        if replica < len(replicas):
            replicas[replica] = local
        else:
            app.add_replica(role, local)
        init = _child_of(proc.pid, f"node {index}'s namespace holder")
        init_start = _wait_for_namespace(init, f"node {index}'s init")
        addr = params.env["SUBLIMATE_NODE_ADDR"]
        app.addresses[(role, replica)] = addr
        return Node(index=index, role=role, replica=replica, addr=addr, holder_pid=proc.pid,
                    holder_start=start_ticks(proc.pid) or 0, init_pid=init,
                    init_start=init_start, bridge_veth=f"n{index}")

    # -- state --------------------------------------------------------------------------------

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        """``local_cwd``'s answer plus each replica's own state and address (``hostname``), so
        a killed node shows as a FAILED replica while the others still run."""
        response = super().describe(app_id)
        app = self._apps.get(app_id)
        if response is None or not isinstance(app, _NetnsApp):
            return response
        for role, replicas in app.role_replicas.items():
            statuses = []
            for r in replicas:
                state = (AppState.RUNNING if r.is_alive() else
                         AppState.FAILED if r.failed() else AppState.SUCCEEDED)
                if response.state == AppState.CANCELLED and r.proc.returncode != 0:
                    state = AppState.CANCELLED
                statuses.append(ReplicaStatus(r.replica_id, state, role,
                                              app.addresses.get((role, r.replica_id), "")))
            response.roles_statuses.append(RoleStatus(role, statuses))
        return response


def create_scheduler(session_name: str, cache_size: int = 100,
                     extra_paths: list[str] | None = None, gpu_count: int | None = None,
                     **kwargs: Any) -> NetnsScheduler:
    """The TorchX entry point (``torchx.schedulers`` group, name ``local_netns``).

    ``kwargs`` swallows what TorchX passes to every scheduler (e.g. from TORCHX_* variables).
    """
    return NetnsScheduler(session_name, cache_size=cache_size, extra_paths=extra_paths,
                          gpu_count=gpu_count)
