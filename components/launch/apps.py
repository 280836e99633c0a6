"""The TorchX components of training: typed functions returning an ``AppDef``, like
``torchx.components.dist.ddp``.

:func:`trainer` is collective training (sync, bmuf, easgd, or a user's own code): one role with one
replica per node, each running ``torchrun`` over :mod:`sublimate.components.processes.worker`
(or :mod:`~sublimate.components.processes.entrypoint`). :func:`parameter_server` is asynchronous
SGD: a ``ps`` role and a ``trainer`` role over :mod:`sublimate.components.processes.async_sgd`.
They know nothing of the train step: :func:`sublimate.components.launch.launcher.build_app` turns
the step's settings into their arguments. TorchX is imported inside them (the launcher's start is
the user's wait).
"""

from __future__ import annotations

import math
import shlex
from typing import TYPE_CHECKING

from sublimate.components.base import replica_groups
from sublimate.components.base.runtime import DEFAULT_IMAGE
from sublimate.components.base.settings import PER_STEP, RESTART
from sublimate.components.launch import etcd_server, lighthouse
from sublimate.components.monitoring import metrics

if TYPE_CHECKING:
    from torchx import specs

WORKER_MODULE = "sublimate.components.processes.worker"
# worker.py's first argument that makes it a torchrun agent (processes.forking_agent.AGENT)
WORKER_AGENT = "agent"
ASYNC_MODULE = "sublimate.components.processes.async_sgd"
# runs a user's code (entrypoint.MODULE)
ENTRYPOINT_MODULE = "sublimate.components.processes.entrypoint"
RANK0_HOST = "${TORCHX_RANK0_HOST:=localhost}"  # set by TorchX schedulers on multi-node jobs
# Where a local per-step node's Lighthouse listens: the node's own address on local_netns, else
# loopback (a pod binds every address of its own network instead: see build_app).
LOCAL_BIND = f"${{{replica_groups.NODE_ADDR_ENV}:-127.0.0.1}}"
# How often torchrun's agent checks its workers (torchrun's own default, made explicit: it is
# also how soon a finished or failed worker is noticed).
MONITOR_INTERVAL = 0.1


def _worker_env(gpu: int, env: dict[str, str] | None) -> dict[str, str]:
    return {
        "LOGLEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
        # Restarted gloo workers hang on torch 2.x unless each restart gets its own store
        # (pytorch issue 135712).
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        **({} if gpu else {"OMP_NUM_THREADS": "1"}),
        **(env or {}),
    }


def _metrics_port() -> int:
    return metrics.DEFAULT_PORT  # declared on the role so the pods expose the workers' endpoints


# torchrun's rendezvous options; a scheduler may already have set some in $PET_RDZV_CONF
# (local_netns: is_host), which an explicit --rdzv-conf would otherwise replace.
RDZV_CONF = "${PET_RDZV_CONF:+$PET_RDZV_CONF,}"


def _shell(command: list[str]) -> list[str]:
    # Shell expansions (the rendezvous host, the scheduler's rendezvous options, a local
    # Lighthouse's address) stay unquoted.
    return ["-c", " ".join(arg if RANK0_HOST in arg or arg.startswith(RDZV_CONF)
                           or arg == LOCAL_BIND or etcd_server.NODE_ENDPOINT_HOST in arg
                           else shlex.quote(arg) for arg in command)]


def _mounts(mounts: list[str] | None) -> list[specs.Mount]:
    from torchx import specs

    # parse_mounts takes the comma-separated tokens of TorchX's --mounts flag.
    return specs.parse_mounts([token for mount in mounts or [] for token in mount.split(",")])


def trainer(
    *worker_args: str,
    nodes: int = 2,
    procs_per_node: int = 1,
    image: str = DEFAULT_IMAGE,
    cpu: int = 1,
    gpu: int = 0,
    memMB: int = 2048,
    rdzv_port: int = 29500,
    max_restarts: int = 0,
    python: str = "python",
    mounts: list[str] | None = None,
    env: dict[str, str] | None = None,
    name: str = "sublimate-train",
    fork_workers: bool | None = None,
    entrypoint: str = "",
    framework: str = "pytorch",
    min_nodes: int | None = None,
    rendezvous_timeout: int = 300,
    rendezvous: str = "c10d",
    rdzv_endpoint: str = "",
    recovery: str = RESTART,
    lighthouse_port: int = 29510,
    lighthouse_bind: str = LOCAL_BIND,
    lighthouse_join_ms: int = lighthouse.JOIN_TIMEOUT_MS,
) -> specs.AppDef:
    """Collective training (sync, bmuf, easgd) on ``nodes`` x ``procs_per_node`` workers.

    Args:
        worker_args: arguments for the worker module (``--algorithm``, ``--data-dir``, ...)
        nodes: number of nodes (TorchX replicas); each runs one torchrun agent
        procs_per_node: worker processes per node (one per GPU on GPU nodes)
        image: container image (ignored by the ``local_cwd`` scheduler)
        cpu: CPUs requested per node
        gpu: GPUs requested per node
        memMB: memory requested per node, in MB
        rdzv_port: port of the c10d rendezvous store on the rank-0 node
        max_restarts: times torchrun restarts the workers after one fails
        python: the Python interpreter that runs torchrun
        mounts: TorchX mounts, e.g. ``type=volume,src=<claim>,dst=/mnt/sublimate``
        env: extra environment variables for every worker
        name: the job's name
        fork_workers: fork the workers from the torchrun agent, which has already imported
            torch, instead of starting a fresh interpreter for each (default: on CPU nodes,
            where it saves a second of start-up per worker; CUDA and fork do not mix)
        entrypoint: your own training code instead of the built-in worker: a module,
            ``module:function`` or script path; ``worker_args`` are then its arguments
        framework: ``tensorflow`` also gives your code ``TF_CONFIG``
        min_nodes: fewer nodes the job may go on with (elastic: ``--nnodes min:max``); the
            TorchX role starts ``nodes`` replicas and needs ``min_nodes``
        rendezvous_timeout: seconds the nodes may take to meet, at start and after a restart
        rendezvous: torchrun's rendezvous backend: ``c10d`` (dynamic: the nodes join a shared
            state on node 0's store; elastic jobs and in-place restarts need it) or
            ``static`` (a fixed number of nodes, each told its rank: one store connection and
            one barrier per node, no polling; see docs/scale.md) or ``etcd-v2`` (c10d's
            protocol with its state in an etcd server: give ``rdzv_endpoint``)
        rdzv_endpoint: ``HOST:PORT`` of the rendezvous (default: node 0's store, on
            ``rdzv_port``); etcd-v2's server
        recovery: ``restart`` (a lost node stops the job, which restarts from its last
            checkpoint) or ``per-step`` (torchft: every node is a replica group with its own
            single-node torchrun; a ``lighthouse`` role forms the quorum of the groups alive
            before each step, and ``min_nodes`` is how many a step needs)
        lighthouse_port: the Lighthouse's port (per-step)
        lighthouse_bind: the address the Lighthouse binds (per-step; a shell expansion on the
            local schedulers)
        lighthouse_join_ms: how long a quorum waits for live nodes that have not asked for it
            yet (per-step; long for the rounds of bmuf, easgd and diloco)

    Under per-step recovery ``max_restarts`` is how many times each node may be replaced (by
    the launcher on one machine, by Volcano on Kubernetes); torchrun itself never restarts.
    """
    from torchx import specs

    if recovery == PER_STEP:
        return _per_step_trainer(
            worker_args, nodes=nodes, procs_per_node=procs_per_node, image=image, cpu=cpu,
            gpu=gpu, memMB=memMB, python=python, mounts=mounts, env=env, name=name,
            fork_workers=fork_workers, min_nodes=nodes if min_nodes is None else min_nodes,
            lighthouse_port=lighthouse_port, lighthouse_bind=lighthouse_bind,
            lighthouse_join_ms=lighthouse_join_ms, replacements=max_restarts)

    if nodes < 1 or procs_per_node < 1:
        raise ValueError("nodes and procs_per_node must be at least 1")
    min_nodes = nodes if min_nodes is None else min_nodes
    if not 1 <= min_nodes <= nodes:
        raise ValueError(f"min_nodes must be between 1 and nodes ({nodes})")
    if rendezvous == "static" and min_nodes < nodes:
        raise ValueError("a static rendezvous needs a fixed number of nodes")
    if rendezvous == "etcd-v2" and not rdzv_endpoint:
        raise ValueError("an etcd-v2 rendezvous needs rdzv_endpoint (the etcd server)")
    # An elastic job notices a lost node within a few seconds (a keep-alive, three misses) and
    # closes a rendezvous that has its minimum soon after, not torch's 30 s. The keep-alive
    # grows with the nodes (1 s per 8): every keep-alive is a compare-and-set on the one state
    # all agents share, N per interval, and a late heartbeat (nodes still importing torch on
    # busy cores) gets an agent dropped and the rendezvous started over (docs/scale.md).
    keep_alive = max(1, math.ceil(nodes / 8))
    rdzv_conf = f"join_timeout={int(rendezvous_timeout)}" + (
        f",last_call_timeout=2,keep_alive_interval={keep_alive},keep_alive_max_attempt=3"
        if min_nodes < nodes else "")
    if rendezvous == "static":  # torchrun's static rendezvous reads its own timeout key
        rdzv_conf = f"timeout={int(rendezvous_timeout)}"
    torchrun_flags = [
        "--nnodes", f"{min_nodes}:{nodes}" if min_nodes < nodes else str(nodes),
        "--nproc-per-node", str(procs_per_node),
        "--rdzv-backend", rendezvous,
        "--rdzv-endpoint", rdzv_endpoint or f"{RANK0_HOST}:{rdzv_port}",
        "--rdzv-conf", RDZV_CONF + rdzv_conf,
        "--rdzv-id", specs.macros.app_id,
        # static: the node's rank is its replica's index (on Kubernetes, Volcano's task index)
        *(["--node-rank", specs.macros.replica_id] if rendezvous == "static" else []),
        "--max-restarts", str(max_restarts),
        "--monitor-interval", str(MONITOR_INTERVAL),
    ]
    if entrypoint:  # a fresh interpreter per worker: the user's code imports what it needs
        command = [python, "-m", "torch.distributed.run", *torchrun_flags,
                   "-m", ENTRYPOINT_MODULE, "--framework", framework, "--", entrypoint,
                   *worker_args]
    else:
        command = _worker_command(python, torchrun_flags, worker_args, gpu, fork_workers)
    return specs.AppDef(name=name, roles=[specs.Role(
        name="worker", image=image, entrypoint="bash", args=_shell(command),
        num_replicas=nodes, min_replicas=min_nodes if min_nodes < nodes else None,
        resource=specs.Resource(cpu=cpu, gpu=gpu, memMB=memMB),
        env=_worker_env(gpu, env), port_map={"c10d": rdzv_port, "metrics": _metrics_port()},
        mounts=_mounts(mounts),
    )])


def _worker_command(python: str, torchrun_flags: list[str], worker_args: tuple[str, ...],
                    gpu: int, fork_workers: bool | None) -> list[str]:
    """torchrun over the built-in worker: forked from an agent that has imported torch already
    (CPU nodes, by default: a second of start-up saved per worker), or started afresh."""
    if fork_workers if fork_workers is not None else not gpu:
        # The worker module runs torchrun itself (worker.agent) and forks each worker.
        return [python, "-m", WORKER_MODULE, WORKER_AGENT, *torchrun_flags, "--", *worker_args]
    return [python, "-m", "torch.distributed.run", *torchrun_flags, "-m", WORKER_MODULE,
            *worker_args]


def _per_step_trainer(worker_args: tuple[str, ...], *, nodes: int, procs_per_node: int,
                      image: str, cpu: int, gpu: int, memMB: int, python: str,
                      mounts: list[str] | None, env: dict[str, str] | None, name: str,
                      fork_workers: bool | None, min_nodes: int, lighthouse_port: int,
                      lighthouse_bind: str, lighthouse_join_ms: int,
                      replacements: int) -> specs.AppDef:
    """:func:`trainer` with ``recovery=per-step``: a ``worker`` role whose every replica is a
    replica group (a torchrun of one node, with its own store: no node hosts anything the others
    need), and a ``lighthouse`` role after it (so that the workers keep replica ids, and node
    indices, 0..nodes-1). A node's death ends its torchrun (no in-place restarts): the launcher,
    or Volcano on Kubernetes, replaces the whole node, which heals from a live peer."""
    from torchx import specs

    if not 1 <= min_nodes <= nodes:
        raise ValueError(f"min_nodes must be between 1 and nodes ({nodes})")
    torchrun_flags = [
        "--nnodes", "1", "--nproc-per-node", str(procs_per_node),
        # The node's own store, on a port the agent picks (worker._static_port): torchrun's
        # static rendezvous, since one node has no one to wait for (c10d's dynamic one takes
        # about a second even alone: a replacement's start is time the job trains without it).
        "--rdzv-backend", "static", "--rdzv-endpoint", "localhost:0", "--node-rank", "0",
        "--rdzv-id", f"{specs.macros.app_id}-{specs.macros.replica_id}",
        "--max-restarts", "0",
        "--monitor-interval", str(MONITOR_INTERVAL),
    ]
    command = _worker_command(python, torchrun_flags, worker_args, gpu, fork_workers)
    worker_env = {**_worker_env(gpu, env), **replica_groups.replica_group_env(
        nodes, min_nodes, lighthouse_port, specs.macros.replica_id),
        # torchft's Rust side logs every quorum and commit at INFO (lines per step): warnings
        # and errors only (its logger reads this once, when torchft is first imported)
        "RUST_LOG": lighthouse.RUST_LOG}
    return specs.AppDef(name=name, roles=[
        specs.Role(
            name="worker", image=image, entrypoint="bash", args=_shell(command),
            num_replicas=nodes, min_replicas=min_nodes if min_nodes < nodes else None,
            resource=specs.Resource(cpu=cpu, gpu=gpu, memMB=memMB), env=worker_env,
            port_map={"metrics": _metrics_port()}, mounts=_mounts(mounts),
            metadata={lighthouse.RECOVERY_METADATA: PER_STEP,
                      lighthouse.MIN_GROUPS_METADATA: min_nodes,
                      lighthouse.REPLACEMENTS_METADATA: replacements}),
        specs.Role(
            name=replica_groups.LIGHTHOUSE_ROLE, image=image, entrypoint="bash",
            args=_shell(lighthouse.command(python, lighthouse_port, min_nodes,
                                           lighthouse_bind, lighthouse_join_ms)),
            num_replicas=1, resource=specs.Resource(**lighthouse.RESOURCES),
            env={"PYTHONUNBUFFERED": "1", "RUST_LOG": lighthouse.RUST_LOG},
            port_map={"lighthouse": lighthouse_port}),
    ])


def parameter_server(
    *training_args: str,
    trainers: int = 2,
    image: str = DEFAULT_IMAGE,
    cpu: int = 1,
    gpu: int = 0,
    memMB: int = 2048,
    rpc_port: int = 29500,
    python: str = "python",
    mounts: list[str] | None = None,
    env: dict[str, str] | None = None,
    name: str = "sublimate-async",
) -> specs.AppDef:
    """Asynchronous SGD: a ``ps`` role (one replica) and a ``trainer`` role (``trainers``).

    Args:
        training_args: arguments for both roles (``--data-dir``, ``--epochs``, ...)
        trainers: number of trainer processes, one TorchX replica each
        image: container image (ignored by the ``local_cwd`` scheduler)
        cpu: CPUs requested per replica
        gpu: GPUs requested per trainer
        memMB: memory requested per replica, in MB
        rpc_port: port of the parameter server's RPC endpoint
        python: the Python interpreter
        mounts: TorchX mounts shared by both roles
        env: extra environment variables
        name: the job's name
    """
    from torchx import specs

    if trainers < 1:
        raise ValueError("trainers must be at least 1")
    common = ["--num-trainers", str(trainers), "--rpc-endpoint", f"{RANK0_HOST}:{rpc_port}",
              *training_args]
    resource = specs.Resource(cpu=cpu, gpu=0, memMB=memMB)
    # The ps role comes first, so its replica 0 is the rank-0 host every trainer dials.
    return specs.AppDef(name=name, roles=[
        specs.Role(name="ps", image=image, entrypoint="bash",
                   args=_shell([python, "-m", ASYNC_MODULE, "ps", *common]), num_replicas=1,
                   resource=resource, env=_worker_env(0, env), port_map={"rpc": rpc_port},
                   mounts=_mounts(mounts)),
        specs.Role(name="trainer", image=image, entrypoint="bash",
                   args=_shell([python, "-m", ASYNC_MODULE, "trainer", "--trainer-id",
                                specs.macros.replica_id, *common]),
                   num_replicas=trainers, resource=specs.Resource(cpu=cpu, gpu=gpu, memMB=memMB),
                   env=_worker_env(gpu, env), mounts=_mounts(mounts)),
    ])


