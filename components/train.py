"""The ``train`` step: launch multi-node data-parallel training through TorchX.

:func:`trainer` is a TorchX component (a typed function returning an ``AppDef``, like
``torchx.components.dist.ddp``): one role with one replica per node, each running ``torchrun``
over :mod:`sublimate.components.worker`. :func:`main` is what the workflow step runs: it validates
the parameters, submits the app to a TorchX scheduler (``local_cwd`` on one machine, ``kubernetes``
in a cluster pod), streams the workers' logs into the step's log, and fails the step with the
failing worker's error when any worker fails. Stopping the step cancels the job.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sublimate.components.paradigm import PARADIGMS
from sublimate.components.runtime import DEFAULT_IMAGE

if TYPE_CHECKING:
    from torchx import specs

WORKER_MODULE = "sublimate.components.worker"
RANK0_HOST = "${TORCHX_RANK0_HOST:=localhost}"  # set by TorchX schedulers on multi-node jobs


def trainer(
    *worker_args: str,
    nodes: int = 2,
    procs_per_node: int = 1,
    image: str = DEFAULT_IMAGE,
    cpu: int = 1,
    gpu: int = 0,
    memMB: int = 2048,  # noqa: N803 (TorchX's own spelling, so the CLI flag matches dist.ddp)
    rdzv_port: int = 29500,
    max_restarts: int = 0,
    python: str = "python",
    mounts: list[str] | None = None,
    env: dict[str, str] | None = None,
    name: str = "sublimate-train",
) -> specs.AppDef:
    """Data-parallel training on ``nodes`` x ``procs_per_node`` workers with torchrun.

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
    """
    from torchx import specs

    if nodes < 1 or procs_per_node < 1:
        raise ValueError("nodes and procs_per_node must be at least 1")
    worker_env = {
        "LOGLEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
        # Restarted gloo workers hang on torch 2.x unless each restart gets its own store
        # (pytorch issue 135712).
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        **({} if gpu else {"OMP_NUM_THREADS": "1"}),
        **(env or {}),
    }
    command = [
        python, "-m", "torch.distributed.run",
        "--nnodes", str(nodes),
        "--nproc-per-node", str(procs_per_node),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{RANK0_HOST}:{rdzv_port}",
        "--rdzv-id", specs.macros.app_id,
        "--max-restarts", str(max_restarts),
        "-m", WORKER_MODULE, *worker_args,
    ]
    # The rendezvous host is a shell expansion, so only that argument stays unquoted.
    script = " ".join(arg if arg.startswith(RANK0_HOST) else shlex.quote(arg) for arg in command)
    return specs.AppDef(
        name=name,
        roles=[
            specs.Role(
                name="worker",
                image=image,
                entrypoint="bash",
                args=["-c", script],
                num_replicas=nodes,
                resource=specs.Resource(cpu=cpu, gpu=gpu, memMB=memMB),
                env=worker_env,
                port_map={"c10d": rdzv_port},
                # parse_mounts takes the comma-separated tokens of TorchX's --mounts flag.
                mounts=specs.parse_mounts([token for mount in mounts or [] for token in
                                           mount.split(",")]),
            )
        ],
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="train", description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", choices=sorted(PARADIGMS), default="sync")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--nodes", type=_positive, default=2)
    parser.add_argument("--procs-per-node", type=_positive, default=1)
    parser.add_argument("--epochs", type=_positive, default=20)
    parser.add_argument("--global-batch-size", type=_positive, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--max-restarts", type=int, default=0)
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    parser.add_argument("--scheduler", choices=["auto", "local_cwd", "kubernetes"],
                        default="auto")
    parser.add_argument("--image", default=DEFAULT_IMAGE)
    parser.add_argument("--cpu-per-node", type=_positive, default=1)
    parser.add_argument("--gpus-per-node", type=int, default=0)
    parser.add_argument("--memory-mb-per-node", type=_positive, default=2048)
    parser.add_argument("--queue", default="default", help="Volcano queue (kubernetes only)")
    parser.add_argument("--mount", action="append", default=[],
                        help="TorchX mount for the workers (kubernetes only)")
    parser.add_argument("--model-path-output", type=Path,
                        help="file to write the trained model's path to (an Argo output)")
    parser.add_argument("--dryrun", action="store_true",
                        help="print the scheduler request instead of submitting it")
    args = parser.parse_args(argv)
    if args.global_batch_size % (args.nodes * args.procs_per_node):
        parser.error(f"global-batch-size {args.global_batch_size} is not divisible by "
                     f"nodes x procs-per-node = {args.nodes * args.procs_per_node}")
    return args


def choose_scheduler(requested: str) -> str:
    if requested != "auto":
        return requested
    in_cluster = "KUBERNETES_SERVICE_HOST" in os.environ and "SUBLIMATE_LOCAL_RUN" not in os.environ
    return "kubernetes" if in_cluster else "local_cwd"


def build_app(args: argparse.Namespace, scheduler: str) -> specs.AppDef:
    worker_args = [
        "--algorithm", args.algorithm, "--data-dir", str(args.data_dir),
        "--run-dir", str(args.run_dir), "--epochs", str(args.epochs),
        "--global-batch-size", str(args.global_batch_size),
        "--learning-rate", str(args.learning_rate), "--momentum", str(args.momentum),
        "--weight-decay", str(args.weight_decay), "--seed", str(args.seed),
        "--checkpoint-every", str(args.checkpoint_every), "--backend", args.backend,
    ]
    local = scheduler == "local_cwd"
    return trainer(
        *worker_args,
        nodes=args.nodes, procs_per_node=args.procs_per_node, image=args.image,
        cpu=args.cpu_per_node, gpu=args.gpus_per_node, memMB=args.memory_mb_per_node,
        # Simulated nodes share one host, so each local job needs its own rendezvous port.
        rdzv_port=_free_port() if local else 29500,
        max_restarts=args.max_restarts,
        python=sys.executable if local else "python",
        mounts=None if local else args.mount,
        name=f"sublimate-{args.algorithm}",
    )


_OUTPUT_LOCK = threading.Lock()


def _stream_logs(runner: object, handle: str, node: int) -> None:
    try:
        for line in runner.log_lines(handle, "worker", k=node, should_tail=True):  # type: ignore[attr-defined]
            # One write per line under a lock, so lines from different nodes never interleave.
            with _OUTPUT_LOCK:
                sys.stdout.write(f"[node{node}] {line.rstrip()}\n")
                sys.stdout.flush()
    except Exception as error:  # the log stream must never take the step down with it
        print(f"[node{node}] (log stream ended: {error})", flush=True)


def launch(args: argparse.Namespace) -> int:
    from torchx.runner import get_runner
    from torchx.specs import AppState

    scheduler = choose_scheduler(args.scheduler)
    app = build_app(args, scheduler)
    cfg: dict[str, str] = {"log_dir": str(args.run_dir / "logs")} if scheduler == "local_cwd" \
        else {"queue": args.queue}
    args.run_dir.mkdir(parents=True, exist_ok=True)
    with get_runner() as runner:
        if args.dryrun:
            print(runner.dryrun(app, scheduler, cfg=cfg))
            return 0
        started = time.perf_counter()
        handle = runner.run(app, scheduler, cfg=cfg)
        print(f"train: submitted {handle} ({args.nodes} nodes x {args.procs_per_node} procs, "
              f"algorithm {args.algorithm})", flush=True)
        stop = threading.Event()
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
        streams = [threading.Thread(target=_stream_logs, args=(runner, handle, node), daemon=True)
                   for node in range(args.nodes)]
        for stream in streams:
            stream.start()
        try:
            while True:
                status = runner.status(handle)
                if status is None or status.is_terminal() or stop.is_set():
                    break
                time.sleep(0.25)
        except KeyboardInterrupt:
            stop.set()
        finally:
            signal.signal(signal.SIGTERM, previous)
            if stop.is_set():
                runner.cancel(handle)
                print("train: stopped; cancelled the training job", file=sys.stderr)
                return 143
        for stream in streams:
            stream.join(timeout=5)
        if status is None or status.state != AppState.SUCCEEDED:
            state = status.state.name if status else "UNKNOWN"
            print(f"train: error: training job {handle} ended {state}", file=sys.stderr)
            for role in status.roles if status else []:
                for replica in role.replicas:
                    if replica.state != AppState.SUCCEEDED:
                        print(f"train: node{replica.id} ended {replica.state.name}",
                              file=sys.stderr)
            return 1
    print(f"train: finished in {time.perf_counter() - started:.1f}s; model at "
          f"{args.run_dir / 'model.pt'}", flush=True)
    if args.model_path_output:
        args.model_path_output.parent.mkdir(parents=True, exist_ok=True)
        args.model_path_output.write_text(str(args.run_dir / "model.pt"))
    return 0


# Workflow inputs of the train step, each passed to the launcher as the flag of the same name.
TEMPLATE_INPUTS = (
    "algorithm", "data-dir", "run-dir", "nodes", "procs-per-node", "epochs", "global-batch-size",
    "learning-rate", "momentum", "weight-decay", "seed", "checkpoint-every", "max-restarts",
    "backend", "scheduler", "cpu-per-node", "gpus-per-node", "memory-mb-per-node", "queue",
)


def template(name: str = "train", **step_options: object):
    """The ``train`` step: launches the TorchX job and waits for it; output ``model-path``."""
    from sublimate.components.runtime import DEFAULT_CLAIM, SHARED_VOLUME_PATH, python_step

    claim = step_options.get("claim_name", DEFAULT_CLAIM)
    return python_step(
        name, "sublimate.components.train",
        inputs={parameter: f"--{parameter}" for parameter in TEMPLATE_INPUTS},
        outputs={"model-path": "--model-path-output"},
        extra_args=["--mount", f"type=volume,src={claim},dst={SHARED_VOLUME_PATH}"],
        **step_options,  # type: ignore[arg-type]
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from sublimate.components.datasets import DatasetError, read_metadata

    try:
        read_metadata(args.data_dir)
    except DatasetError as error:
        print(f"train: error: --data-dir: {error}", file=sys.stderr)
        return 2
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
