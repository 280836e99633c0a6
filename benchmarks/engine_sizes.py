"""The engines at scale, offline: how big the objects a cluster would store get, and what the
local runner costs per node of a large fan-out.

    python benchmarks/engine_sizes.py [--nodes 2,512,1024,4096] [--torchx-up-to 4096]
                                      [--sweep-nodes 1000]

1. **The train step's Volcano Job** at N nodes x 8 GPUs, as the launcher submits it (one task
   of N pods, launch/volcano_job.py) and in TorchX 0.7's own form (one task per replica,
   rendered by TorchX itself up to ``--torchx-up-to`` nodes; above that its per-task size is
   extrapolated from the largest rendering, and marked so): compact JSON bytes, as the API
   server stores them, against etcd's default 1.5 MiB request limit.
2. **The rendered WorkflowTemplates** (``argo/``): their size against Argo's 1 MB. They do not
   grow with nodes: the train step is one pod (the launcher) whatever the job's size.
3. **The local runner** running a Workflow of ``--sweep-nodes`` trivial steps (``true``, a DAG
   loop of ``withSequence``, ``parallelism`` 16): wall time per node (the steps do nearly
   nothing, so it is the runner's overhead), the steps' own time, the runner's peak memory (the
   largest resident set of its process tree, from ``getrusage``) and its ``status.json`` per
   node.

``--smoke`` (tests/test_benchmarks.py): 2 and 4 nodes, TorchX rendering 2 (4 extrapolated), a
fan-out of 4 steps: seconds, figures that mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # for the test's manifest

from tests.pipelines.runner.test_fan_out import fan_out_manifest  # noqa: E402

ETCD_REQUEST_LIMIT = 1_572_864
SMOKE = {"nodes": "2,4", "torchx_up_to": 2, "sweep_nodes": 4}  # --smoke's sizes
SMOKE_LINE = "smoke mode: sizes too small for the figures to mean anything"


def volcano_sizes(node_counts: list[int], torchx_up_to: int) -> None:
    from kubernetes.client import ApiClient
    from torchx.schedulers.kubernetes_scheduler import KubernetesScheduler

    from sublimate.components.launch import volcano_job
    from sublimate.components.launch.job_runner import make_runner
    from sublimate.components.launch.launcher import build_app
    from sublimate.components.launch.request import plan_launch
    from sublimate.components.steps.train import parse_args

    def app(nodes: int) -> object:
        args = parse_args(["--data-dir", "/d", "--run-dir", "/runs/r", "--workflow-name", "w",
                           "--scheduler", "kubernetes", "--gpus-per-node", "8",
                           "--procs-per-node", "8", "--nodes", "512",
                           "--global-batch-size", "4096"])
        built = build_app(args, plan_launch(args, scheduler="kubernetes"))
        built.roles[0].num_replicas = nodes  # the launcher caps nodes at 512
        return built

    cfg = {"queue": "default", "job_name": "sublimate-run-0123abcd"}
    print("| nodes (x 8 GPUs) | sublimate: tasks | JSON | TorchX 0.7: tasks | JSON | per task "
          "| TorchX render time | over etcd's 1.5 MiB |")
    print("|---|---|---|---|---|---|---|---|")
    per_task = None
    for nodes in node_counts:
        ours = make_runner("kubernetes").dryrun(app(nodes), "kubernetes",  # type: ignore
                                                cfg=cfg).request.resource
        ours_bytes = volcano_job.job_bytes(ours)
        if nodes <= torchx_up_to:
            started = time.perf_counter()
            theirs = KubernetesScheduler("bench")._submit_dryrun(app(nodes), cfg).request.resource
            rendered = f"{time.perf_counter() - started:.1f} s"
            theirs_bytes = len(json.dumps(ApiClient().sanitize_for_serialization(theirs),
                                          separators=(",", ":")))
            if nodes > 1:
                per_task = theirs_bytes / nodes
            theirs_text = f"{theirs_bytes:,} B"
        else:
            theirs_bytes = int(per_task * nodes) if per_task else 0
            theirs_text, rendered = f"~{theirs_bytes:,} B (extrapolated)", "-"
        print(f"| {nodes:,} | {len(ours['spec']['tasks'])} | {ours_bytes:,} B | {nodes:,} "
              f"| {theirs_text} | {per_task or 0:,.0f} B | {rendered} "
              f"| {'TorchX form' if theirs_bytes > ETCD_REQUEST_LIMIT else 'no'}"
              f"{', ours too' if ours_bytes > ETCD_REQUEST_LIMIT else ''} |")


def workflow_sizes() -> None:
    import yaml

    print("\n| WorkflowTemplate | JSON | of Argo's 1 MB |\n|---|---|---|")
    for path in sorted((REPO / "argo").glob("sublimate-*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            size = len(json.dumps(doc, separators=(",", ":")))
            print(f"| {path.name} | {size:,} B | {size / 1e6:.1%} |")




def local_runner(count: int) -> None:
    with tempfile.TemporaryDirectory(prefix="fan-out-") as folder:
        manifest = Path(folder) / "fan-out.yaml"
        manifest.write_text(fan_out_manifest(count))
        env = {**os.environ, "SUBLIMATE_HOME": str(Path(folder) / "home")}
        load = os.getloadavg()[0]
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "sublimate.pipelines", "run",
                               str(manifest)], env=env, capture_output=True, text=True,
                              check=False)
        wall = time.perf_counter() - started
        if done.returncode:
            raise SystemExit(done.stdout[-2000:] + done.stderr[-2000:])
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        [status] = (Path(folder) / "home" / "runs").glob("*/status.json")
        nodes = json.loads(status.read_text()).get("nodes", {})
        pods = [node for node in (nodes.values() if isinstance(nodes, dict) else nodes)
                if node.get("type") == "Pod"]
        steps = sum(_seconds(node) for node in pods)
        size = status.stat().st_size
        print(f"\nlocal runner, {count:,} trivial steps (parallelism 16), load {load:.1f} -> "
              f"{os.getloadavg()[0]:.1f}:\n"
              f"  wall {wall:.1f} s, {wall / count * 1000:.1f} ms per node (the steps run `true`: "
              f"the time is the runner's; their own, summed: {steps:.0f} s at the status' "
              "whole-second resolution)\n"
              f"  runner peak RSS {peak_mib:.0f} MiB; status.json {size:,} B "
              f"({size / max(len(pods), 1):,.0f} B per pod node, {len(pods)} pod nodes)")


def _seconds(node: dict) -> float:
    from datetime import datetime

    started, finished = node.get("startedAt"), node.get("finishedAt")
    if not started or not finished:
        return 0.0
    return (datetime.fromisoformat(finished.replace("Z", "+00:00"))
            - datetime.fromisoformat(started.replace("Z", "+00:00"))).total_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="2,512,1024,4096")
    parser.add_argument("--torchx-up-to", type=int, default=4096)
    parser.add_argument("--sweep-nodes", type=int, default=1000)
    parser.add_argument("--smoke", action="store_true",
                        help="every code path at tiny sizes, in seconds (tests)")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(**SMOKE)
        args = parser.parse_args()
        print(SMOKE_LINE, flush=True)
    volcano_sizes([int(n) for n in args.nodes.split(",")], args.torchx_up_to)
    workflow_sizes()
    if args.sweep_nodes:
        local_runner(args.sweep_nodes)


if __name__ == "__main__":
    main()
