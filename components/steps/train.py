"""The ``train`` step: launch multi-node data-parallel training through TorchX.

:func:`trainer` is a TorchX component (a typed function returning an ``AppDef``, like
``torchx.components.dist.ddp``): one role with one replica per node, each running ``torchrun`` over
:mod:`sublimate.components.processes.worker`. :func:`main` is what the workflow step runs: it
validates the parameters, submits the app to a TorchX scheduler (``local_cwd`` on one machine,
``kubernetes`` in a cluster pod), streams the workers' logs into the step's log, and fails the step
with the failing worker's error when any worker fails. Stopping the step cancels the job.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from sublimate.components.base import run_files
from sublimate.components.base import settings as declared
from sublimate.components.base.contract import contract_env, is_script, locate_entrypoint
from sublimate.components.base.runtime import DEFAULT_IMAGE
from sublimate.components.base.settings import (
    SettingError,
    add_arguments,
    check,
    to_flags,
    worker_settings,
)
from sublimate.components.base.termination import OneLineParser, fail
from sublimate.components.data.datasets import data_problem
from sublimate.components.launch.cluster_job import claim_job, job_handle, job_name, make_runner
from sublimate.components.launch.gpu_plan import GpuShortage, gpu_plan, place_gpus
from sublimate.components.launch.run_lock import RunLock, RunLockBusy, lock_owner

# Only light imports here: everything before the job's submission is start-up time the user
# waits through, and torch alone takes about a second to import (the workers need it, the
# launcher does not).
from sublimate.components.monitoring import metrics, watchdog

if TYPE_CHECKING:
    from torchx import specs

STEP = "train"
WORKER_MODULE = "sublimate.components.processes.worker"
WORKER_AGENT = "agent"  # worker.py's first argument that makes it a torchrun agent (worker.AGENT)
ASYNC_MODULE = "sublimate.components.processes.async_sgd"
# runs a user's code (entrypoint.MODULE)
ENTRYPOINT_MODULE = "sublimate.components.processes.entrypoint"
RANK0_HOST = "${TORCHX_RANK0_HOST:=localhost}"  # set by TorchX schedulers on multi-node jobs
# How often torchrun's agent checks its workers (torchrun's own default, made explicit: it is
# also how soon a finished or failed worker is noticed).
MONITOR_INTERVAL = 0.1
# How often the launcher asks the scheduler whether the job ended: a local process table is
# cheap to poll, a Kubernetes API server is not.
POLL_SECONDS = {"local_cwd": 0.05, "local_netns": 0.05, "kubernetes": 0.25}
# Schedulers that run the nodes on this machine (the launcher's Python, its folders).
LOCAL_SCHEDULERS = ("local_cwd", "local_netns")


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
    # Shell expansions (the rendezvous host, the scheduler's rendezvous options) stay unquoted.
    return ["-c", " ".join(arg if RANK0_HOST in arg or arg.startswith(RDZV_CONF)
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
    """
    from torchx import specs

    if nodes < 1 or procs_per_node < 1:
        raise ValueError("nodes and procs_per_node must be at least 1")
    min_nodes = nodes if min_nodes is None else min_nodes
    if not 1 <= min_nodes <= nodes:
        raise ValueError(f"min_nodes must be between 1 and nodes ({nodes})")
    # An elastic job notices a lost node within a few seconds (keep-alive every second, three
    # misses) and closes a rendezvous that has its minimum soon after, not torch's 30 s.
    rdzv_conf = f"join_timeout={int(rendezvous_timeout)}" + (
        ",last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3"
        if min_nodes < nodes else "")
    torchrun_flags = [
        "--nnodes", f"{min_nodes}:{nodes}" if min_nodes < nodes else str(nodes),
        "--nproc-per-node", str(procs_per_node),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{RANK0_HOST}:{rdzv_port}",
        "--rdzv-conf", RDZV_CONF + rdzv_conf,
        "--rdzv-id", specs.macros.app_id,
        "--max-restarts", str(max_restarts),
        "--monitor-interval", str(MONITOR_INTERVAL),
    ]
    if entrypoint:  # a fresh interpreter per worker: the user's code imports what it needs
        command = [python, "-m", "torch.distributed.run", *torchrun_flags,
                   "-m", ENTRYPOINT_MODULE, "--framework", framework, "--", entrypoint,
                   *worker_args]
    elif fork_workers if fork_workers is not None else not gpu:
        # The worker module runs torchrun itself (worker.agent) and forks each worker.
        command = [python, "-m", WORKER_MODULE, WORKER_AGENT, *torchrun_flags, "--",
                   *worker_args]
    else:
        command = [python, "-m", "torch.distributed.run", *torchrun_flags,
                   "-m", WORKER_MODULE, *worker_args]
    return specs.AppDef(name=name, roles=[specs.Role(
        name="worker", image=image, entrypoint="bash", args=_shell(command),
        num_replicas=nodes, min_replicas=min_nodes if min_nodes < nodes else None,
        resource=specs.Resource(cpu=cpu, gpu=gpu, memMB=memMB),
        env=_worker_env(gpu, env), port_map={"c10d": rdzv_port, "metrics": _metrics_port()},
        mounts=_mounts(mounts),
    )])


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


RUN_ID = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def scheduler_config(args: argparse.Namespace, scheduler: str) -> dict[str, str]:
    if scheduler == "local_cwd":
        return {"log_dir": str(args.run_dir / run_files.LOGS)}
    if scheduler == "local_netns":
        from sublimate.components.base.runtime import SHARED_VOLUME_PATH

        # Each node sees the shared volume at its cluster path too, as a pod would.
        volume = {"volume": f"{args.runs_root.parent}:{SHARED_VOLUME_PATH}"} \
            if args.runs_root else {}
        return {"log_dir": str(args.run_dir / run_files.LOGS), **volume,
                **{option: value for option, value in (
                    ("link_rate", args.link_rate), ("link_delay", args.link_delay),
                    ("link_loss", args.link_loss)) if value}}
    namespace_file = SERVICE_ACCOUNT_DIR / "namespace"
    # The job runs next to the workflow, in the namespace of the pod that launches it.
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else "default"
    return {"queue": args.queue, "namespace": namespace,
            "job_name": job_name(args.workflow_name, args.run_dir)}




def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = OneLineParser(prog=STEP, description=__doc__.splitlines()[0])
    # Every setting of the step, typed and bounded by its one declaration; the ones the workers
    # read are passed on to them (training_flags).
    add_arguments(parser, declared.settings(step=STEP))
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path,
                        help="folder for checkpoints, logs and the model (or use --runs-root)")
    parser.add_argument("--runs-root", type=Path, help="folder holding one folder per run")
    parser.add_argument("--workflow-name", default="", help="the Argo workflow's name")
    parser.add_argument("--run-dir-output", type=Path,
                        help="file to write the run folder's path to (an Argo output)")
    parser.add_argument("--mount", action="append", default=[],
                        help="TorchX mount for the workers (kubernetes only)")
    parser.add_argument("--model-path-output", type=Path,
                        help="file to write the trained model's path to (an Argo output)")
    parser.add_argument("--dryrun", action="store_true",
                        help="print the scheduler request instead of submitting it")
    parser.add_argument("--host-gpus", type=int, metavar="N",
                        help="GPUs of this host that simulated nodes (local schedulers) share "
                             "(default: as many as nvidia-smi lists)")
    args = parser.parse_args(argv)
    if args.host_gpus is not None and args.host_gpus < 0:
        parser.error(f"--host-gpus {args.host_gpus}: give 0 or more GPUs")
    if args.run_dir is None:
        run_id = args.run_id or args.workflow_name
        if args.runs_root is None or not run_id:
            parser.error("give --run-dir, or --runs-root with --run-id or --workflow-name")
        if not RUN_ID.fullmatch(run_id):
            parser.error(f"run-id '{run_id}' must be lowercase letters, digits and '-' "
                         "(it names a folder on the shared volume)")
        args.run_dir = args.runs_root / run_id
    try:  # the rules `sublimate run` and `submit` checked before any step, in the same words
        check(vars(args))
    except SettingError as error:
        parser.error(str(error))
    return args


def choose_scheduler(requested: str) -> str:
    if requested != "auto":
        return requested
    in_cluster = "KUBERNETES_SERVICE_HOST" in os.environ and "SUBLIMATE_LOCAL_RUN" not in os.environ
    return "kubernetes" if in_cluster else "local_cwd"


def training_flags(args: argparse.Namespace) -> list[str]:
    """The settings the workers of ``args.algorithm`` read, as their command-line flags."""
    return to_flags(vars(args), worker_settings([args.algorithm]))


def job_settings(args: argparse.Namespace) -> dict[str, object]:
    """The train step's settings, typed, by attribute: ``$SUBLIMATE_SETTINGS`` of the contract."""
    return {setting.attribute: getattr(args, setting.attribute)
            for setting in declared.settings(step=STEP)}


def entrypoint_arguments(text: str, env: dict[str, str]) -> list[str]:
    """``entrypoint-args`` split like a shell line, with the contract's variables expanded
    (``--data $SUBLIMATE_DATA_DIR``), so that a script that knows nothing of sublimate can be
    told where things are; other ``$`` text is left as it is."""
    names = "|".join(re.escape(name) for name in env if name.startswith("SUBLIMATE_"))
    pattern = re.compile(rf"\$(?:\{{({names})\}}|({names})\b)")
    return [pattern.sub(lambda match: env[match.group(1) or match.group(2)], arg)
            for arg in shlex.split(text)]


def entrypoint_problem(entrypoint: str, local: bool) -> str | None:
    """Why the workers could not start ``entrypoint``, in one line (None: they can, as far as
    the launcher can tell; in a cluster the launcher's image is the workers')."""
    import importlib.util

    target, pythonpath = locate_entrypoint(entrypoint, local)
    if is_script(target):
        return None if Path(target).is_file() else \
            f"entrypoint '{entrypoint}': no such script ({target})"
    module = target.partition(":")[0]
    if pythonpath and pythonpath not in sys.path:
        sys.path.insert(0, pythonpath)
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError) as error:  # a parent package is missing
        return f"entrypoint '{entrypoint}': {error}"
    return None if found else f"entrypoint '{entrypoint}': no module named '{module}'"


def build_app(args: argparse.Namespace, scheduler: str) -> specs.AppDef:
    local = scheduler in LOCAL_SCHEDULERS
    common = {
        "image": args.image, "cpu": args.cpu_per_node, "gpu": args.gpus_per_node,
        "memMB": args.memory_mb_per_node, "python": sys.executable if local else "python",
        "mounts": None if local else args.mount, "name": f"sublimate-{args.algorithm}",
        "env": {
            # The workers time their start-up from this launcher's start (train-summary.json).
            **({metrics.LAUNCH_TIME_ENV: f"{args.launch_time:.3f}"}
               if getattr(args, "launch_time", None) else {}),
            # In a pod the workers' metrics endpoints must be reachable by Prometheus; on one
            # machine they stay on loopback.
            **({} if local else {"SUBLIMATE_METRICS_ADDR": "0.0.0.0"}),
        },
    }
    # Simulated nodes share one host, so each local job needs its own rendezvous port.
    port = _free_port() if local else 29500
    # Every training process gets the contract (dataset, run folder, settings: contract.py);
    # the built-in workers read the same through their flags.
    common["env"].update(contract_env(args.data_dir, args.run_dir, job_settings(args)))
    paths = ["--data-dir", str(args.data_dir), "--run-dir", str(args.run_dir)]
    layout = {"nodes": int(args.nodes), "min_nodes": getattr(args.nodes, "minimum", args.nodes),
              "procs_per_node": args.procs_per_node, "rdzv_port": port,
              "max_restarts": args.max_restarts,
              "rendezvous_timeout": int(args.rendezvous_timeout)}
    if args.entrypoint:
        target, pythonpath = locate_entrypoint(args.entrypoint, local)
        if pythonpath:
            common["env"]["PYTHONPATH"] = os.pathsep.join(
                filter(None, [pythonpath, os.environ.get("PYTHONPATH")]))
        return trainer(
            *entrypoint_arguments(args.entrypoint_args, common["env"]), entrypoint=target,
            framework=args.framework, **layout, **common)
    if args.algorithm == "async":
        return parameter_server(
            *paths, *training_flags(args),
            trainers=int(args.nodes) * args.procs_per_node, rpc_port=port, **common)
    return trainer("--algorithm", args.algorithm, *paths, *training_flags(args), **layout,
                   **common)


_OUTPUT_LOCK = threading.Lock()


def whole_lines(chunks: Iterable[str]) -> Iterator[str]:
    """Lines of ``chunks``, joining the pieces of a line that arrived in two reads.

    TorchX's local log iterator reads fixed-size chunks from a file that is still being
    written, so one printed line can come back as two pieces.
    """
    pending = ""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split("\n")
        yield from complete
    if pending:
        yield pending


def log_streams(scheduler: str) -> tuple[object, ...]:
    """Which of a replica's log streams to follow."""
    from torchx.schedulers.api import Stream

    # The local scheduler's combined.log is copied from stdout/stderr by a background thread
    # that can lag the process by 0.1 s, so a job that just ended may miss its last lines
    # there; the per-stream files are written by the process itself and are complete.
    return (Stream.STDOUT, Stream.STDERR) if scheduler in LOCAL_SCHEDULERS else (None,)


def _stream_logs(runner: object, handle: str, role: str, replica: int, scheduler: str,
                 stream: object, prefix: str) -> None:
    try:
        chunks = runner.log_lines(  # type: ignore[attr-defined]
            handle, role, k=replica, should_tail=True, streams=stream)
        # Kubernetes yields whole lines without their newline; the local scheduler, file chunks.
        lines = whole_lines(chunks) if scheduler in LOCAL_SCHEDULERS else chunks
        for line in lines:
            # One write per line under a lock, so lines from different nodes never interleave.
            with _OUTPUT_LOCK:
                sys.stdout.write(f"[{prefix}] {line.rstrip()}\n")
                sys.stdout.flush()
    except Exception as error:  # the log stream must never take the step down with it
        print(f"[{prefix}] (log stream ended: {error})", flush=True)


def follow_logs(runner: object, handle: str, app: specs.AppDef,
                scheduler: str) -> list[threading.Thread]:
    """Copies every replica's log into this process's stdout, each line prefixed by its node.

    Returns the started threads; they end once the job has ended and its logs are read.
    """
    threads = [
        threading.Thread(target=_stream_logs, daemon=True, args=(
            runner, handle, role.name, replica, scheduler, stream,
            f"node{replica}" if role.name == "worker" else f"{role.name}{replica}"))
        for role in app.roles for replica in range(role.num_replicas)
        for stream in log_streams(scheduler)]
    for thread in threads:
        thread.start()
    return threads


def make_watchdog(args: argparse.Namespace, attempt: str | None) -> watchdog.Watchdog | None:
    """The launcher's progress watchdog for one attempt (None: off, or async, whose processes
    write no heartbeats); ``attempt`` None judges every heartbeat written from now on."""
    if args.algorithm == "async" or not args.stall_seconds:
        return None
    # An elastic job may go on with fewer nodes: only the ranks it always has are judged.
    world = getattr(args.nodes, "minimum", args.nodes) * args.procs_per_node
    return watchdog.Watchdog(args.run_dir, args.stall_seconds, world,
                             startup_seconds=args.startup_seconds, attempt=attempt,
                             nodes={rank: f"node{rank // args.procs_per_node}"
                                    for rank in range(world)})


def _watched(args: argparse.Namespace, dog: watchdog.Watchdog | None) -> bool:
    """Whether to judge progress now: own code that does not use sublimate's library writes no
    heartbeats, so its watchdog waits for the first one."""
    if dog is None:
        return False
    return not args.entrypoint or any(watchdog.progress_dir(args.run_dir).glob("rank-*.json"))




def launch(args: argparse.Namespace) -> int:
    """Submit the job and wait for it; relaunch it from the last checkpoint when the watchdog
    finds it stalled or a node is lost (``max-restarts`` times; torchrun's own restarts cover
    a crashed worker on a node that is still there)."""
    scheduler = choose_scheduler(args.scheduler)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    if args.dryrun:  # writes nothing in the run folder: no lock to take
        return _launch(args, scheduler)
    lock = RunLock(args.run_dir, lock_owner(args.workflow_name, args.run_dir))
    try:
        takeover = lock.acquire()
    except RunLockBusy as error:
        return fail(STEP, str(error))
    try:
        if takeover:
            print(f"train: {takeover}", file=sys.stderr, flush=True)
        return _launch(args, scheduler)
    finally:
        lock.release()


def _launch(args: argparse.Namespace, scheduler: str) -> int:
    started = time.perf_counter()
    with make_runner(scheduler, args.host_gpus) as runner:  # type: ignore[attr-defined]
        for attempt in range(args.max_restarts + 1):
            outcome = run_attempt(runner, args, scheduler, attempt)
            if outcome not in (STALLED, LOST):
                break
            if attempt < args.max_restarts:
                print(f"train: relaunching from the last checkpoint (relaunch {attempt + 1} of "
                      f"{args.max_restarts})", file=sys.stderr, flush=True)
        if outcome != SUCCEEDED:
            return 143 if outcome == STOPPED else 1
    if args.dryrun:
        return 0
    startup = _startup_line(args.run_dir)
    if startup:
        print(f"train: {startup}", flush=True)
    where = f"results in {args.run_dir}" if args.entrypoint and not (
        args.run_dir / run_files.MODEL).is_file() else f"model at {args.run_dir / run_files.MODEL}"
    print(f"train: finished in {time.perf_counter() - started:.1f}s; {where}", flush=True)
    for output, value in ((args.model_path_output, args.run_dir / run_files.MODEL),
                          (args.run_dir_output, args.run_dir)):
        if output:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(str(value))
    return 0


# How one attempt ended; a stalled job or a lost node is relaunched from the last checkpoint.
SUCCEEDED, FAILED, STALLED, LOST, STOPPED = "succeeded", "failed", "stalled", "lost", "stopped"


def enough_nodes(args: argparse.Namespace, status: object) -> bool:
    """Whether an elastic job still has its minimum of nodes (running or finished well)."""
    from torchx.specs import AppState

    minimum = getattr(args.nodes, "minimum", args.nodes)
    if minimum >= int(args.nodes):
        return False
    replicas = [replica for role in getattr(status, "roles", None) or []
                if role.role == "worker" for replica in role.replicas]
    return sum(replica.state in (AppState.RUNNING, AppState.SUCCEEDED)
               for replica in replicas) >= minimum


def lost_replicas(status: object, ended: bool = False) -> list[str]:
    """Nodes that failed (while others still run, unless ``ended``), as ``node<i>
    (<address>)``, from schedulers that report replicas one by one (local_netns, kubernetes)."""
    from torchx.specs import AppState

    roles = getattr(status, "roles", None) or []
    replicas = [replica for role in roles for replica in role.replicas]
    if not ended and not any(replica.state == AppState.RUNNING for replica in replicas):
        return []  # the job as a whole ended: its own state says how
    return [f"node{replica.id}" + (f" ({replica.hostname})" if replica.hostname else "")
            for role in roles for replica in role.replicas
            if replica.state == AppState.FAILED and role.role == "worker"]


def end_hung_workers(run_dir: Path, attempt: str) -> None:
    """End this attempt's workers for good after a stall was cancelled.

    A frozen worker (stopped, or stuck where signals wait) outlives the SIGTERM of a cancel,
    and a peer waiting for it in a collective lives on until the collective timeout; on
    ``local_cwd`` their process ids are in their heartbeats (``local_netns`` nodes are their own
    PID namespaces, ended with them; a pod ends with its pod).
    """
    for beat in watchdog.read_heartbeats(run_dir, attempt).values():
        if beat.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(beat.pid, signal.SIGKILL)


def run_attempt(runner: object, args: argparse.Namespace, scheduler: str, attempt: int) -> str:
    """Submit the training job once and follow it to its end: one of SUCCEEDED, FAILED,
    STALLED (the watchdog stopped it), LOST (a node died while the others waited for it) or
    STOPPED (the step was stopped)."""
    from torchx.specs import AppState

    attempt_started = time.time()
    app = build_app(args, scheduler)
    cfg: dict[str, object] = dict(scheduler_config(args, scheduler))
    if scheduler in LOCAL_SCHEDULERS:
        place_gpus(app, cfg, gpu_plan(args, app))  # main() refused a shortage, said a fallback
    if args.dryrun:
        print(runner.dryrun(app, scheduler, cfg=cfg))  # type: ignore[attr-defined]
        return SUCCEEDED
    attempt_id = f"{os.getpid()}-{attempt}-{time.time():.3f}"
    for role in app.roles:  # the end of the launcher's own share of the start-up
        role.env[metrics.SUBMIT_TIME_ENV] = f"{time.time():.3f}"
        role.env[watchdog.ATTEMPT_ENV] = attempt_id
        if attempt:  # a relaunch's start-up begins with it, not with the stalled attempt
            role.env[metrics.LAUNCH_TIME_ENV] = f"{attempt_started:.3f}"
    # On a cluster the job has this step's name: an earlier attempt's job may be there.
    handle = job_handle(runner, scheduler, cfg) if scheduler == "kubernetes" else ""
    try:
        attached = bool(handle) and claim_job(runner, handle, fresh=attempt > 0)
    except RuntimeError as error:  # the job under this step's name would not go
        print(f"train: error: {error}", file=sys.stderr, flush=True)
        return FAILED
    # The job followed was started with another attempt id: judge the heartbeats written from
    # now on, whatever attempt wrote them.
    dog = make_watchdog(args, None if attached else attempt_id)
    # Caught from before the submission: a SIGTERM between the job's start and the wait below
    # must cancel the job too, not end this launcher and orphan the job's processes.
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    status, stalled, lost, streams = None, None, [], []
    try:
        if not attached:
            handle = runner.run(app, scheduler, cfg=cfg)  # type: ignore[attr-defined]
            what = f"entrypoint {args.entrypoint}" if args.entrypoint \
                else f"algorithm {args.algorithm}"
            print(f"train: submitted {handle} ({args.nodes} nodes x {args.procs_per_node} "
                  f"procs, {what})", flush=True)
        streams = follow_logs(runner, handle, app, scheduler)
        poll = POLL_SECONDS.get(scheduler, 0.25)
        next_check = time.monotonic() + watchdog.CHECK_EVERY_SECONDS
        while not stop.is_set():
            status = runner.status(handle)  # type: ignore[attr-defined]
            if status is None or status.is_terminal():
                break
            lost = lost_replicas(status)
            if lost and enough_nodes(args, status):
                lost = []  # elastic: the others go on without it
            if lost:
                break  # a node died while the others wait for it (rendezvous or a collective)
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + watchdog.CHECK_EVERY_SECONDS
                stalled = dog.check() if _watched(args, dog) else None  # type: ignore[union-attr]
                if stalled is not None:
                    break
            stop.wait(poll)  # a SIGTERM ends the wait at once
    except KeyboardInterrupt:
        stop.set()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if stop.is_set():
        if handle:  # empty when stopped before the submission returned a handle
            runner.cancel(handle)  # type: ignore[attr-defined]
        print("train: stopped; cancelled the training job", file=sys.stderr)
        return STOPPED
    if stalled is not None:
        runner.cancel(handle)  # type: ignore[attr-defined]
        if scheduler == "local_cwd":
            end_hung_workers(args.run_dir, attempt_id)
        print(f"train: error: training stalled: {stalled.message}", file=sys.stderr, flush=True)
        return STALLED
    if lost:
        runner.cancel(handle)  # type: ignore[attr-defined]
        print(f"train: error: lost {', '.join(lost)} while the job ran; stopped the others",
              file=sys.stderr, flush=True)
        return LOST
    for stream in streams:
        stream.join(timeout=5)
    lost = lost_replicas(status, ended=True)
    if status is not None and status.state == AppState.FAILED and lost \
            and enough_nodes(args, status):
        print(f"train: finished on {int(args.nodes) - len(lost)} of {int(args.nodes)} nodes "
              f"(elastic, lost {', '.join(lost)})", flush=True)
        return SUCCEEDED
    if status is None or status.state != AppState.SUCCEEDED:
        state = status.state.name if status else "UNKNOWN"
        runner.cancel(handle)  # type: ignore[attr-defined]  # stop the replicas still running
        print(f"train: error: training job {handle} ended {state}", file=sys.stderr)
        for role in status.roles if status else []:
            for replica in role.replicas:
                if replica.state != AppState.SUCCEEDED:
                    print(f"train: {role.role} replica {replica.id} ended "
                          f"{replica.state.name}", file=sys.stderr)
        return FAILED
    return SUCCEEDED


def _startup_line(run_dir: Path) -> str | None:
    """The workers' launch-to-first-step figures from the run's summary, as one log line."""
    try:
        summary = json.loads((run_dir / run_files.SUMMARY).read_text())
        total, phases = summary["launch_to_first_step_seconds"], summary["startup"]
    except (OSError, ValueError, KeyError):
        return None
    return metrics.format_startup(total, phases) if total is not None else None


def template_inputs() -> dict[str, str | None]:
    """The train step's workflow inputs and their defaults, each passed to the launcher as the
    flag of the same name: where the data and the run live (no default), then every setting a
    pipeline sets, from its one declaration. A setting's input defaults to its declared default,
    so a pipeline that sets only some of them still passes Argo's argument check."""
    return {"data-dir": None, "workflow-name": None,
            **{setting.name: setting.default_text() for setting in declared.settings(step=STEP)
               if setting.in_pipeline}}


TEMPLATE_INPUTS = tuple(template_inputs())


def template(name: str = "train", **step_options: object):
    """The ``train`` step: launches the TorchX job and waits for it.

    Outputs ``run-dir`` (the run's folder on the shared volume) and ``model-path``.
    """
    from hera.workflows import Parameter

    from sublimate.components.base.runtime import (
        DEFAULT_CLAIM,
        RUNS_PATH,
        SHARED_VOLUME_PATH,
        python_step,
    )

    claim = step_options.get("claim_name", DEFAULT_CLAIM)
    inputs = template_inputs()
    step = python_step(
        name, "sublimate.components.steps.train",
        inputs={parameter: f"--{parameter}" for parameter in inputs},
        outputs={"run-dir": "--run-dir-output", "model-path": "--model-path-output"},
        extra_args=["--runs-root", RUNS_PATH,
                    "--mount", f"type=volume,src={claim},dst={SHARED_VOLUME_PATH}"],
        **step_options,  # type: ignore[arg-type]
    )
    # Inputs added after the first release default to the launcher's own default, so that a
    # pipeline written against the earlier inputs still passes Argo's argument check.
    step.inputs = [p if inputs[p.name] is None else Parameter(name=p.name, default=inputs[p.name])
                   for p in step.inputs]
    return step


def main(argv: list[str] | None = None) -> int:
    # The launcher's process start (interpreter included): where the step's start-up begins.
    launch_time = metrics.process_start_time()
    args = parse_args(argv)
    args.launch_time = launch_time
    # Refused here, in one line, before any worker starts: otherwise every worker fails with
    # its own traceback and torchrun's failure report around it.
    problem = data_problem(args.data_dir, args.global_batch_size,
                           args.eval_every_epoch and not args.entrypoint)
    if problem is not None:
        return fail(STEP, problem)
    if args.entrypoint:
        problem = entrypoint_problem(args.entrypoint,
                                     choose_scheduler(args.scheduler) != "kubernetes")
        if problem is not None:
            return fail(STEP, problem)
    elif args.model != "mlp":  # the built-in needs no check (nor the torch import resolve costs)
        from sublimate.components.model.models import resolve

        try:
            resolve(args.model)  # a typo in the entry point fails here, not in every worker
        except ValueError as error:
            return fail(STEP, str(error))  # it names the model: "model 'x:y': ..."
    scheduler = choose_scheduler(args.scheduler)
    if scheduler in LOCAL_SCHEDULERS:  # simulated nodes share this host's GPUs
        try:
            plan = gpu_plan(args, build_app(args, scheduler))
        except GpuShortage as error:
            return fail(STEP, str(error))
        if plan.note:
            print(f"train: {plan.note}", file=sys.stderr, flush=True)
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
