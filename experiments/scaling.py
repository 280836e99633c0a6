"""Study 3: samples/s and time to accuracy against the number of nodes.

On this 2-core machine, nodes are network namespaces behind links of one rate, and the CPU does
not grow with them, so the honest question is the communication-bound one: how throughput and
time to a target accuracy change with the node count when the links are slow, for synchronous
SGD (an all-reduce every step) and BMUF (one every ``sync-period`` steps). The fixed global batch
is split over the nodes. The same script runs on a GPU machine: ``--scheduler local_cwd
--gpus-per-node 1 --link-rate none --nodes 1,2,4,8``.

With ``--link-rate none`` and a large batch the same script shows the compute-bound side, where
two cores can hold two nodes (docs/results.md: ``--output docs/results/scaling-compute``).

Usage: python experiments/scaling.py [--nodes 1,2,4] [--link-rate 100mbit] [--target 0.8]
       [--global-batch-size 128] [--model M] [--learning-rate LR] [--lr-scaling linear|none]
       python experiments/scaling.py --smoke   # 2 nodes, sync, 1 epoch (root, as the default)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.sweep_study import (
    arguments,
    ok_points,
    parse,
    pyplot,
    run_study,
    save,
    seconds_text,
    table,
)


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], "scaling", epochs=4)
    parser.add_argument("--nodes", default="1,2,4", help="node counts")
    parser.add_argument("--algorithms", default="sync,bmuf")
    parser.add_argument("--link-rate", default="100mbit", help="tc rate, or none")
    parser.add_argument("--scheduler", default="local_netns")
    parser.add_argument("--gpus-per-node", type=int, default=0)
    parser.add_argument("--global-batch-size", type=int, default=128)
    parser.add_argument("--model", default=None,
                        help="the model parameter (default: the built-in mlp)")
    parser.add_argument("--learning-rate", type=float, default=None)
    parser.add_argument("--lr-scaling", choices=["linear", "none"], default=None)
    parser.add_argument("--target", type=float, default=0.8,
                        help="test accuracy for time to target")
    args = parse(parser, nodes="2", algorithms="sync", target=0.3)
    nodes = [int(n) for n in args.nodes.split(",")]
    grid = {"nodes": nodes, "algorithm": args.algorithms.split(",")}
    fixed = {"dataset": args.dataset, "scheduler": args.scheduler, "epochs": args.epochs,
             "global-batch-size": args.global_batch_size, "checkpoint-every": 0,
             "eval-every-epoch": True, "target": args.target,
             "gpus-per-node": args.gpus_per_node}
    if args.link_rate != "none":
        fixed["link-rate"] = args.link_rate
    for name in ("model", "learning-rate", "lr-scaling"):
        if getattr(args, name.replace("-", "_")) is not None:
            fixed[name] = getattr(args, name.replace("-", "_"))
    report = run_study("scaling", grid, fixed, args)
    if not report:
        return
    points = ok_points(report)
    rows = [(p["params"]["nodes"], p["params"]["algorithm"], f"{p['samples_per_second']:.0f}",
             f"{p['communication_share']:.0%}", seconds_text(p["time_to_target_seconds"]),
             f"{p['metric']:.4f}") for p in points]
    target = report["target"]  # --target, or the compare step's default rule's value
    print(table(rows, ["nodes", "algorithm", "samples/s", "comm share",
                       f"time to {target:.3g} (s)", "final accuracy"]))
    draw(points, nodes, target, args)


def draw(points: list[dict], nodes: list[int], target: float, args) -> None:
    plt = pyplot()
    figure, (speed, time_to) = plt.subplots(1, 2, figsize=(11, 4.2))
    for algorithm in args.algorithms.split(","):
        mine = sorted((p for p in points if p["params"]["algorithm"] == algorithm),
                      key=lambda p: p["params"]["nodes"])
        xs = [p["params"]["nodes"] for p in mine]
        speed.plot(xs, [p["samples_per_second"] for p in mine], marker="o", label=algorithm)
        reached = [p for p in mine if p["time_to_target_seconds"] is not None]
        time_to.plot([p["params"]["nodes"] for p in reached],
                     [p["time_to_target_seconds"] for p in reached], marker="o", label=algorithm)
    link = "unlimited links" if args.link_rate == "none" else f"{args.link_rate} links"
    speed.set(xlabel="nodes", ylabel="samples/s", title=f"throughput ({link})")
    time_to.set(xlabel="nodes", ylabel="training seconds",
                title=f"time to test accuracy {target:.3g}")
    for axes in (speed, time_to):
        axes.set_xticks(nodes)
        axes.grid(alpha=0.3)
        axes.legend()
    save(figure, args.output, "scaling.png")


if __name__ == "__main__":
    main()
