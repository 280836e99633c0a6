"""The train step's launcher: submits the training job through TorchX and follows it to its end.

:func:`launch` takes the run folder's lock, then runs attempts (:func:`run_attempt`): each builds
the job's ``AppDef`` from the step's settings (:func:`build_app`, over the TorchX components of
:mod:`.apps`), submits it to a TorchX scheduler (``local_cwd`` or ``local_netns`` on one machine,
``kubernetes`` in a cluster pod), follows its logs (:mod:`.logs`) and its progress (the
watchdog), and ends in one of ``SUCCEEDED``, ``FAILED``, ``STALLED``, ``LOST`` or ``STOPPED``; a
stalled job or a lost node is relaunched from the last checkpoint (``max-restarts`` times).
Stopping the step cancels the job.

Only light imports here: everything before the job's submission is start-up time the user waits
through, and torch alone takes about a second to import (the workers need it, the launcher does
not).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shlex
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sublimate.components.base import run_files
from sublimate.components.base import settings as declared
from sublimate.components.base.contract import contract_env, is_script, locate_entrypoint
from sublimate.components.base.ports import free_port
from sublimate.components.base.runtime import shown_path
from sublimate.components.base.settings import PER_STEP, to_flags, worker_settings
from sublimate.components.base.termination import fail
from sublimate.components.launch import etcd_server, failures, lighthouse
from sublimate.components.launch import per_step as recovery
from sublimate.components.launch.apps import parameter_server, trainer
from sublimate.components.launch.chaos import Chaos
from sublimate.components.launch.gpu_plan import GpuPlan, GpuShortage, gpu_plan, place_gpus
from sublimate.components.launch.job_runner import (
    LOCAL_SCHEDULERS,
    JobRunner,
    claim_job,
    job_handle,
    job_name,
    make_runner,
)
from sublimate.components.launch.logs import follow_logs
from sublimate.components.launch.request import LaunchPlan, TrainRequest
from sublimate.components.launch.run_lock import RunLock, RunLockBusy, lock_owner
from sublimate.components.monitoring import metrics, watchdog

if TYPE_CHECKING:
    from torchx import specs
    from torchx.specs import AppStatus

# The step whose launcher this is: its settings (``settings(step=STEP)``) and the prefix of
# every line the launcher writes.
STEP = "train"
# How often the launcher asks the scheduler whether the job ended: a local process table is
# cheap to poll, a Kubernetes API server is not.
POLL_SECONDS = {"local_cwd": 0.05, "local_netns": 0.05, "kubernetes": 0.25}


SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def scheduler_config(request: TrainRequest, scheduler: str) -> dict[str, str]:
    if scheduler == "local_cwd":
        return {"log_dir": str(request.run_dir / run_files.LOGS)}
    if scheduler == "local_netns":
        from sublimate.components.base.runtime import SHARED_VOLUME_PATH

        # Each node sees the shared volume at its cluster path too, as a pod would.
        volume = {"volume": f"{request.runs_root.parent}:{SHARED_VOLUME_PATH}"} \
            if request.runs_root else {}
        return {"log_dir": str(request.run_dir / run_files.LOGS), **volume,
                **{option: value for option, value in (
                    ("link_rate", request.link_rate), ("link_delay", request.link_delay),
                    ("link_loss", request.link_loss)) if value}}
    namespace_file = SERVICE_ACCOUNT_DIR / "namespace"
    # The job runs next to the workflow, in the namespace of the pod that launches it.
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else "default"
    return {"queue": request.queue, "namespace": namespace,
            "job_name": job_name(request.workflow_name, request.run_dir)}


def training_flags(request: TrainRequest, plan: LaunchPlan) -> list[str]:
    """The settings the workers of ``request.algorithm`` read, as their command-line flags."""
    return to_flags(plan.resolved(request), worker_settings([request.algorithm]))


def job_settings(request: TrainRequest, plan: LaunchPlan) -> dict[str, object]:
    """The train step's settings, typed, by attribute: ``$SUBLIMATE_SETTINGS`` of the contract."""
    resolved = plan.resolved(request)
    return {setting.attribute: resolved[setting.attribute]
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


def build_app(request: TrainRequest, plan: LaunchPlan) -> specs.AppDef:
    """The training job's ``AppDef`` for one attempt (each gets its own local ports)."""
    local = plan.scheduler in LOCAL_SCHEDULERS
    env = {
        # The workers time their start-up from this launcher's start (train-summary.json).
        **({metrics.LAUNCH_TIME_ENV: f"{plan.launch_time:.3f}"} if plan.launch_time else {}),
        # In a pod the workers' metrics endpoints must be reachable by Prometheus; on one
        # machine they stay on loopback.
        **({} if local else {"SUBLIMATE_METRICS_ADDR": "0.0.0.0"}),
        # Every training process gets the contract (dataset, run folder, settings:
        # contract.py); the built-in workers read the same through their flags.
        **contract_env(request.data_dir, request.run_dir, job_settings(request, plan)),
        **failures.error_file_env(request.run_dir),  # why a worker failed
    }
    common: dict[str, Any] = {
        "image": request.image, "cpu": request.cpu_per_node, "gpu": request.gpus_per_node,
        "memMB": request.memory_mb_per_node, "python": sys.executable if local else "python",
        "mounts": None if local else list(request.mounts),
        "name": f"sublimate-{request.algorithm}", "env": env,
    }
    # Simulated nodes share one host, so each local job needs its own rendezvous port.
    port = free_port() if local else 29500
    paths = ["--data-dir", str(request.data_dir), "--run-dir", str(request.run_dir)]
    nodes = request.nodes
    layout: dict[str, Any] = {
        "nodes": int(nodes), "min_nodes": nodes.minimum, "procs_per_node": request.procs_per_node,
        "rdzv_port": port, "max_restarts": plan.max_restarts,
        "rendezvous_timeout": int(request.rendezvous_timeout),
        "rendezvous": declared.rendezvous_backend(plan.resolved(request))}
    if layout["rendezvous"] == declared.ETCD_V2:
        # The user's server, or the one the launcher starts for this attempt (run_attempt);
        # building the job before that (the GPU plan, a dry run) gets a placeholder port.
        layout["rdzv_endpoint"] = plan.etcd_endpoint or request.rendezvous_endpoint \
            or f"{etcd_server.NODE_ENDPOINT_HOST}:{etcd_server.DEFAULT_PORT}"
    if plan.per_step:
        # A step needs nodes=MIN:MAX's MIN groups alive; a plain count needs just one.
        layout["min_nodes"] = nodes.minimum if nodes.ranged else 1
        layout.update(recovery=PER_STEP, lighthouse_port=free_port() if local else 29510,
                      lighthouse_join_ms=lighthouse.join_timeout_ms(request.algorithm),
                      **({} if local else {"lighthouse_bind": "0.0.0.0"}))
    if request.entrypoint:
        target, pythonpath = locate_entrypoint(request.entrypoint, local)
        if pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [pythonpath, os.environ.get("PYTHONPATH")]))
        return trainer(
            *entrypoint_arguments(request.entrypoint_args, env), entrypoint=target,
            framework=request.framework, **layout, **common)
    if request.algorithm == "async":
        return parameter_server(
            *paths, *training_flags(request, plan),
            trainers=int(nodes) * request.procs_per_node, rpc_port=port, **common)
    return trainer("--algorithm", request.algorithm, *paths, *training_flags(request, plan),
                   **layout, **common)


def make_watchdog(request: TrainRequest, attempt: str | None) -> watchdog.Watchdog | None:
    """The launcher's progress watchdog for one attempt (None: off, or async, whose processes
    write no heartbeats); ``attempt`` None judges every heartbeat written from now on."""
    if request.algorithm == "async" or not request.stall_seconds:
        return None
    # An elastic job may go on with fewer nodes: only the ranks it always has are judged.
    world = request.nodes.minimum * request.procs_per_node
    return watchdog.Watchdog(request.run_dir, request.stall_seconds, world,
                             startup_seconds=request.startup_seconds, attempt=attempt,
                             nodes={rank: f"node{rank // request.procs_per_node}"
                                    for rank in range(world)})


def _watched(request: TrainRequest, dog: watchdog.Watchdog | None) -> bool:
    """Whether to judge progress now: own code that does not use sublimate's library writes no
    heartbeats, so its watchdog waits for the first one."""
    if dog is None:
        return False
    return not request.entrypoint or dog.heard_from_any()


def launch(request: TrainRequest, plan: LaunchPlan) -> int:
    """Submit the job and wait for it; relaunch it from the last checkpoint when the watchdog
    finds it stalled or a node is lost (``max-restarts`` times; torchrun's own restarts cover
    a crashed worker on a node that is still there)."""
    # The first attempt's job, built here so that a GPU shortage fails the step in one line
    # before anything is written or started; every attempt divides the GPUs the same way.
    first = build_app(request, plan)
    gpus = None
    if plan.scheduler in LOCAL_SCHEDULERS:  # simulated nodes share this host's GPUs
        try:
            gpus = gpu_plan(first, request.backend, request.host_gpus)
        except GpuShortage as error:
            return fail(STEP, str(error))
        if gpus.note:
            print(f"train: {gpus.note}", file=sys.stderr, flush=True)
    request.run_dir.mkdir(parents=True, exist_ok=True)
    if request.dryrun:  # writes nothing in the run folder: no lock to take
        return _launch(request, plan, first, gpus)
    lock = RunLock(request.run_dir, lock_owner(request.workflow_name, request.run_dir))
    try:
        takeover = lock.acquire()
    except RunLockBusy as error:
        return fail(STEP, str(error))
    try:
        if takeover:
            print(f"train: {takeover}", file=sys.stderr, flush=True)
        return _launch(request, plan, first, gpus)
    finally:
        lock.release()


def _launch(request: TrainRequest, plan: LaunchPlan, first: specs.AppDef,
            gpus: GpuPlan | None) -> int:
    started = time.perf_counter()
    run_dir = request.run_dir
    chaos = start_chaos(request, plan.scheduler)
    try:
        # What each relaunch cost (train-summary.json's relaunches): when the attempt before
        # it ended, when it started.
        relaunches: list[dict[str, float]] = []
        outcome = FAILED
        with make_runner(plan.scheduler, request.host_gpus) as runner:
            for attempt in range(plan.max_restarts + 1):
                if attempt:
                    relaunches[-1]["relaunched_at"] = time.time()
                outcome = run_attempt(runner, request, plan, attempt, chaos, gpus,
                                      first if attempt == 0 else None)
                if outcome not in (STALLED, LOST):
                    break
                if attempt < plan.max_restarts:
                    relaunches.append({"previous_ended_at": time.time()})
                    print(f"train: relaunching {failures.relaunch_note(run_dir)} (relaunch "
                          f"{attempt + 1} of {plan.max_restarts})", file=sys.stderr, flush=True)
            if outcome in (STALLED, LOST):
                # The last attempt's own line said which node was lost (or that training
                # stalled); the step's one line says it again, with the setting that decides it.
                left = (f"no relaunch is left ({plan.max_restarts} made)" if plan.max_restarts
                        else "max-restarts is 0")
                return fail(STEP, f"{_ENDED.get('why') or 'a node was lost'}; {left}: set "
                                  "-p max-restarts=N to relaunch from the last checkpoint"
                                  + ("" if outcome == STALLED else
                                     ", or -p recovery=per-step to go on without the node"),
                            code=1)
            if outcome != SUCCEEDED:
                return 143 if outcome == STOPPED else 1
        if relaunches and not request.dryrun:
            recovery.merge_into_summary(
                run_dir, failures.relaunches_section(run_dir, relaunches), "relaunches")
    finally:
        if chaos is not None:
            chaos.stop()
            print(f"train: chaos killed {len(chaos.kills)} node(s): "
                  f"{', '.join(f'node{kill.node}' for kill in chaos.kills) or 'none'}",
                  flush=True)
    if request.dryrun:
        return 0
    startup = _startup_line(run_dir)
    if startup:
        print(f"train: {startup}", flush=True)
    model = run_dir / run_files.MODEL
    where = f"model at {shown_path(model)}" if model.is_file() \
        else f"results in {shown_path(run_dir)} (no {run_files.MODEL})"
    print(f"train: finished in {time.perf_counter() - started:.1f}s; {where}", flush=True)
    # model-path is empty when the training wrote no model (own code may write only metrics).
    for output, value in ((request.model_path_output, model if model.is_file() else ""),
                          (request.run_dir_output, run_dir)):
        if output:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(str(value))
    return 0


# How one attempt ended; a stalled job or a lost node is relaunched from the last checkpoint.
SUCCEEDED, FAILED, STALLED, LOST, STOPPED = "succeeded", "failed", "stalled", "lost", "stopped"


def enough_nodes(request: TrainRequest, status: AppStatus | None) -> bool:
    """Whether an elastic job still has its minimum of nodes (running or finished well)."""
    from torchx.specs import AppState

    minimum = request.nodes.minimum
    if minimum >= int(request.nodes):
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


def run_attempt(runner: JobRunner, request: TrainRequest, plan: LaunchPlan, attempt: int,
                chaos: Chaos | None = None, gpus: GpuPlan | None = None,
                app: specs.AppDef | None = None) -> str:
    """Submit the training job once and follow it to its end: one of SUCCEEDED, FAILED,
    STALLED (the watchdog stopped it), LOST (a node died while the others waited for it, or,
    under per-step recovery, every node at once) or STOPPED (the step was stopped). Under
    per-step recovery on one machine a lost node is replaced alone (:class:`recovery.Replacer`)
    and the job goes on. A local ``etcd-v2`` job gets its etcd server for the attempt: started
    before its nodes, stopped (its data removed) however the attempt ends. ``gpus``: how a
    local job's nodes share this host's GPUs (None: on the CPU); ``app``: the job, when built
    already (the first attempt's), else built here."""
    server = rendezvous_server(request, plan)
    if server is None:
        return _run_attempt(runner, request, plan, attempt, chaos, gpus, app)
    try:
        server.start()
    except etcd_server.EtcdError as error:
        print(f"train: error: {error}", file=sys.stderr, flush=True)
        return FAILED
    try:
        endpoint = f"{etcd_server.NODE_ENDPOINT_HOST}:{server.port}"
        # the job's nodes meet on this attempt's server: its endpoint is in their command line
        return _run_attempt(runner, request, plan.for_attempt(endpoint), attempt, chaos, gpus)
    finally:
        server.stop()


def rendezvous_server(request: TrainRequest, plan: LaunchPlan) -> etcd_server.EtcdServer | None:
    """The etcd server a local ``etcd-v2`` job needs (None: another backend, the user's server,
    a cluster, or a dry run). On ``local_netns`` it listens where the nodes reach the host
    (:mod:`.etcd_server`)."""
    if request.dryrun or plan.scheduler not in LOCAL_SCHEDULERS or plan.per_step \
            or request.rendezvous_endpoint \
            or declared.rendezvous_backend(plan.resolved(request)) != declared.ETCD_V2:
        return None
    return etcd_server.EtcdServer(request.run_dir / run_files.ETCD,
                                  request.run_dir / run_files.LOGS / "etcd.log",
                                  listen="0.0.0.0" if plan.scheduler == "local_netns"
                                  else "127.0.0.1")


def _run_attempt(runner: JobRunner, request: TrainRequest, plan: LaunchPlan, attempt: int,
                 chaos: Chaos | None = None, gpus: GpuPlan | None = None,
                 app: specs.AppDef | None = None) -> str:
    from torchx.specs import AppState

    attempt_started = time.time()
    scheduler, run_dir = plan.scheduler, request.run_dir
    app = app if app is not None else build_app(request, plan)
    cfg: dict[str, object] = dict(scheduler_config(request, scheduler))
    if gpus is not None:
        place_gpus(app, cfg, gpus)
    if request.dryrun:
        print(runner.dryrun(app, scheduler, cfg=cfg))
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
    dog = make_watchdog(request, None if attached else attempt_id)
    # Caught from before the submission: a SIGTERM between the job's start and the wait below
    # must cancel the job too, not end this launcher and orphan the job's processes.
    stop = threading.Event()
    previous = _catch_stop_signals(stop)
    status: AppStatus | None = None
    stalled: watchdog.Stall | None = None
    lost: list[str] = []
    streams: list[threading.Thread] = []
    tolerated: list[str] = []  # nodes an elastic job lost and went on without
    replacer: recovery.Replacer | recovery.VolcanoWatch | None = None
    ended: str | None = None
    try:
        if not attached:
            handle = runner.run(app, scheduler, cfg=cfg)
            # TorchX's local scheduler, made by the runner on its first submission, installs
            # handlers that raise out of this loop: ours again, so a stop cancels the job.
            _catch_stop_signals(stop)
            what = f"entrypoint {request.entrypoint}" if request.entrypoint \
                else f"algorithm {request.algorithm}"
            how = f", recovery {PER_STEP}, up to {plan.max_restarts} replacements per node" \
                if plan.per_step else \
                f", up to {plan.max_restarts} relaunches" if plan.max_restarts else ""
            print(f"train: submitted {handle} ({request.nodes} nodes x {request.procs_per_node} "
                  f"procs, {what}{how})", flush=True)
        if plan.per_step and scheduler == "kubernetes":
            # The Lighthouse runs beside the job as a Deployment (per_step.volcano_per_step),
            # with no pod of TorchX's naming to follow.
            app = dataclasses.replace(app, roles=[role for role in app.roles
                                                  if role.name == recovery.WORKER_ROLE])
            replacer = recovery.VolcanoWatch(runner, handle, plan.max_restarts, run_dir=run_dir)
        elif plan.per_step and scheduler in LOCAL_SCHEDULERS:
            replacer = recovery.Replacer(runner, handle, plan.max_restarts, run_dir=run_dir,
                                         stop=stop)
        streams = follow_logs(runner, handle, app, scheduler)
        poll = POLL_SECONDS.get(scheduler, 0.25)
        next_check = time.monotonic() + watchdog.CHECK_EVERY_SECONDS
        while not stop.is_set():
            status = runner.status(handle)
            # A Volcano job ends by itself, and its watch says how; a local one never does
            # (its Lighthouse serves until the launcher stops it).
            if status is None or (status.is_terminal()
                                  and not isinstance(replacer, recovery.VolcanoWatch)):
                break
            if replacer is not None:
                if stop.is_set():  # a signal while the status was read: stop, replace nothing
                    break
                ended = replacer.check(status.state.name)
                if ended is not None:
                    break
                stop.wait(poll)
                continue
            lost = lost_replicas(status)
            if lost and enough_nodes(request, status):
                tolerated += [node for node in lost if node not in tolerated]
                lost = []  # elastic: the others go on without it
            if lost:
                break  # a node died while the others wait for it (rendezvous or a collective)
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + watchdog.CHECK_EVERY_SECONDS
                stalled = dog.check() if dog is not None and _watched(request, dog) else None
                if stalled is not None:
                    break
            stop.wait(poll)  # a SIGTERM ends the wait at once
    except KeyboardInterrupt:
        stop.set()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if stop.is_set():
        if handle:  # empty when stopped before the submission returned a handle
            runner.cancel(handle)
        print("train: stopped; cancelled the training job", file=sys.stderr)
        return STOPPED
    if replacer is not None and ended is not None:
        return _per_step_end(runner, handle, request, replacer, ended, streams, attempt_started,
                             chaos, attempt)
    if stalled is not None:
        runner.cancel(handle)
        if scheduler == "local_cwd":
            end_hung_workers(run_dir, attempt_id)
        return _ended(STALLED, f"training stalled: {stalled.message}")
    if lost:
        runner.cancel(handle)
        return _ended(LOST, f"lost {', '.join(lost)} while the job ran; stopped the others")
    for stream in streams:
        stream.join(timeout=5)
    lost = lost_replicas(status, ended=True)
    if status is not None and status.state == AppState.FAILED and lost \
            and enough_nodes(request, status):
        nodes = int(request.nodes)
        print(f"train: finished on {nodes - len(lost)} of {nodes} nodes "
              f"(elastic, lost {', '.join(lost)})", flush=True)
        return SUCCEEDED
    gone = _lost_first(run_dir, handle, scheduler, status, tolerated)
    if gone:
        return _ended(LOST, f"lost {', '.join(gone)} while the job ran; the other nodes failed "
                            "after it")
    if status is None or status.state != AppState.SUCCEEDED:
        state = status.state.name if status else "UNKNOWN"
        runner.cancel(handle)  # stop the replicas still running
        failed = [(role.role, replica.id) for role in (status.roles if status else [])
                  for replica in role.replicas if replica.state == AppState.FAILED]
        fail(STEP, failures.explain(run_dir, handle, scheduler, state, failed), code=1)
        return FAILED
    for note in failures.restarts(run_dir, handle, scheduler):
        print(f"train: {note}", file=sys.stderr, flush=True)
    return SUCCEEDED


# Why the last attempt ended (a node lost, training stalled): said again in the step's last
# line when no relaunch is left. One launcher per process: the train step's.
_ENDED: dict[str, str] = {}


def _ended(outcome: str, why: str) -> str:
    """Say why an attempt ended (``train: error: ...``), keep it for the step's last line."""
    print(f"train: error: {why}", file=sys.stderr, flush=True)
    _ENDED["why"] = why
    return outcome


def _lost_first(run_dir: Path, handle: str, scheduler: str, status: AppStatus | None,
                tolerated: list[str]) -> list[str]:
    """The nodes lost in a job that failed, when losing them is why it failed: the same outcome
    (LOST, relaunched) whether the launcher saw the loss before the survivors failed, or they
    failed within one poll of it. A loss is one an elastic job went on without (``tolerated``),
    or a failed node that reported nothing (killed whole: its peers' errors followed)."""
    from torchx.specs import AppState

    if status is None or status.state != AppState.FAILED:
        return []
    if tolerated:
        return tolerated
    failed = {replica.id: f"node{replica.id}" + (f" ({replica.hostname})" if replica.hostname
                                                   else "")
              for role in status.roles if role.role == "worker"
              for replica in role.replicas if replica.state == AppState.FAILED}
    if not failed or scheduler not in ("local_netns", "kubernetes"):
        return []  # local_cwd has no nodes to lose: its processes report
    return [failed[node] for node in failures.silent(run_dir, handle, failed)]


def _catch_stop_signals(stop: threading.Event) -> dict[int, Any]:
    """SIGTERM sets ``stop``, SIGINT raises KeyboardInterrupt (Python's own); returns the
    handlers they had."""
    return {signal.SIGTERM: signal.signal(signal.SIGTERM, lambda *_: stop.set()),
            signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler)}


def _per_step_end(runner: JobRunner, handle: str, request: TrainRequest,
                  replacer: recovery.Replacer | recovery.VolcanoWatch, ended: str,
                  streams: list[threading.Thread], attempt_started: float,
                  chaos: Chaos | None, attempt: int = 0) -> str:
    """End a per-step job the way its replicas ended: every node finished (the Lighthouse is
    stopped: it would serve forever), every node lost at once (relaunch from the checkpoint), or
    a node out of replacements."""
    # On one machine stopping the job (the Lighthouse, a replacement still starting) ends the
    # logs; on Kubernetes the pods' logs end with the pods, and the job's deletion would cut them.
    on_kubernetes = isinstance(replacer, recovery.VolcanoWatch)
    if not on_kubernetes:
        runner.cancel(handle)
    for stream in streams:
        stream.join(timeout=5)
    if on_kubernetes:
        runner.cancel(handle)
    if ended == "lost":  # every node at once: relaunched, if a relaunch is left
        return _ended(LOST, f"{replacer.message}; stopped the job")
    if ended != "succeeded":  # a node out of replacements: the step's one line says so
        fail(STEP, f"{replacer.message}; stopped the job", code=1)
        return FAILED
    section = recovery.summarize(request.run_dir, replacer.losses, attempt_started,
                                 chaos.kills if chaos is not None else [], replacer.stopped,
                                 unit="step" if request.algorithm == "sync" else "round",
                                 job_restarts=attempt)
    recovery.merge_into_summary(request.run_dir, section)
    for line in recovery.describe(section):
        print(f"train: {line}", flush=True)
    return SUCCEEDED


def start_chaos(request: TrainRequest, scheduler: str) -> Chaos | None:
    """The run's chaos (``chaos-mtbf``): kills drawn from ``chaos-seed``, on ``local_netns``."""
    if request.dryrun or not request.chaos_mtbf or scheduler != "local_netns":
        return None
    print(f"train: chaos: a node killed every {request.chaos_mtbf:g}s on average (seed "
          f"{request.chaos_seed}" + (f", at most {request.chaos_kills} kills"
                                     if request.chaos_kills else "") + ")", flush=True)
    since = time.time()

    def training() -> bool:  # a rank reported a step: kills land in training, not start-up
        return any(beat.step > 0 for beat in
                   watchdog.read_heartbeats(request.run_dir, since=since).values())

    return Chaos(request.run_dir / run_files.LOGS, mtbf=request.chaos_mtbf,
                 max_kills=request.chaos_kills, seed=request.chaos_seed, armed=training).start()


def _startup_line(run_dir: Path) -> str | None:
    """The workers' launch-to-first-step figures from the run's summary, as one log line."""
    try:
        summary = json.loads((run_dir / run_files.SUMMARY).read_text())
        total, phases = summary["launch_to_first_step_seconds"], summary["startup"]
    except (OSError, ValueError, KeyError):
        return None
    return metrics.format_startup(total, phases) if total is not None else None


