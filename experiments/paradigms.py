"""Study 1: synchronous SGD against asynchronous SGD, BMUF and EASGD on a cluster on one machine.

Four nodes, each in its own network namespace (``local_netns``) behind a link of a fixed rate
(``tc tbf``, both ways), trained on mnist1d (50,000 examples) with the same model, global batch
and epochs; two link rates. Prints accuracy, time to target, samples/s and bytes sent per worker
per point, and draws test accuracy against epochs and against training time.
Needs root (network namespaces). About 10 minutes on 2 cores.

Usage: python experiments/paradigms.py [--rates 1gbit,100mbit] [--epochs 6] [--home DIR]
       [--algorithms sync,async,bmuf,easgd,diloco] [--seeds 1,2,3] [--output DIR]
       python experiments/paradigms.py --smoke   # sync and async, 2 nodes, 1gbit, 1 epoch
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.sweep_study import (
    arguments,
    mbytes,
    ok_points,
    parse,
    pyplot,
    run_study,
    save,
    seconds_text,
    table,
)
from sublimate.components.base.settings import PARADIGM_NAMES

ALGORITHMS = list(PARADIGM_NAMES)
STYLES = {"sync": "tab:blue", "async": "tab:red", "bmuf": "tab:green", "easgd": "tab:purple",
          "diloco": "tab:orange"}


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], "paradigms", epochs=6)
    parser.add_argument("--rates", default="1gbit,100mbit", help="link rates (tc syntax)")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--seeds", default="",
                        help="a seed axis (e.g. 1,2,3) for the spread; default: the seed 0 only")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--global-batch-size", type=int, default=128)
    # smoke: a collective paradigm and the parameter server (the others take sync's path here;
    # benchmarks/paradigms.py's smoke runs each through the train step)
    args = parse(parser, rates="1gbit", nodes=2, algorithms="sync,async")
    rates = args.rates.split(",")
    grid: dict[str, list] = {"algorithm": args.algorithms.split(","), "link-rate": rates}
    if args.seeds:
        grid["seed"] = [int(seed) for seed in args.seeds.split(",")]
    fixed = {"dataset": args.dataset, "scheduler": "local_netns", "nodes": args.nodes,
             "epochs": args.epochs, "global-batch-size": args.global_batch_size,
             "checkpoint-every": 0, "eval-every-epoch": True}
    report = run_study("paradigms", grid, fixed, args)
    if not report:
        return
    points = ok_points(report)
    rows = [(p["id"], p["params"]["algorithm"], p["params"]["link-rate"],
             p["params"].get("seed", 0), f"{p['metric']:.4f}",
             seconds_text(p["time_to_target_seconds"]), f"{p['train_seconds']:.1f}",
             f"{p['samples_per_second']:.0f}", f"{p['communication_share']:.0%}",
             mbytes(p["net_sent_bytes_per_worker"])) for p in points]
    print(table(rows, ["id", "algorithm", "link", "seed", "accuracy", "time to target (s)",
                       "train s", "samples/s", "comm share", "sent per worker"]))
    draw_curves(points, rates, args.output)


def draw_curves(points: list[dict], rates: list[str], output: Path) -> None:
    """Test accuracy against epochs and against training seconds, a line per point: colour
    the paradigm, solid the first link rate, dashed the second."""
    plt = pyplot()
    figure, (by_epoch, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    for point in points:
        curve = point["accuracy_curve"]  # [training seconds, step, accuracy] per epoch
        if not curve:
            continue
        algorithm, rate = point["params"]["algorithm"], point["params"]["link-rate"]
        style = dict(color=STYLES.get(algorithm), marker=".",
                     linestyle="-" if rate == rates[0] else "--", label=f"{algorithm} {rate}")
        by_epoch.plot(range(1, len(curve) + 1), [c[2] for c in curve], **style)
        by_time.plot([c[0] for c in curve], [c[2] for c in curve], **style)
    by_epoch.set(xlabel="epoch", ylabel="test accuracy", title="accuracy against epochs")
    by_time.set(xlabel="training seconds", ylabel="test accuracy",
                title="accuracy against training time")
    by_time.set_xscale("log")
    for axes in (by_epoch, by_time):
        axes.grid(alpha=0.3)
    by_time.legend(fontsize=8)
    save(figure, output, "accuracy-curves.png")


if __name__ == "__main__":
    main()
