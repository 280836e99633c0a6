"""Study 4b: the traffic-to-accuracy frontier, round two, on a model whose step computes.

Section 4's setup with the 1-D CNN of section 3b (``signal_cnn``: about 45x the MLP's
arithmetic per example) on mnist1d, global batch 256, learning rate 0.1 unscaled (section 3b's,
which reaches 0.95 in a few epochs), 6 epochs, ``local_netns`` nodes behind links of 1 Gbit/s,
100 Mbit/s and 10 Mbit/s, two seeds: sync at every rate on 4 and 8 nodes (DDP:
``recovery=restart``); DiLoCo at H = 32, 128 and 512 with each outer codec (float32, int8,
top-k) at 10 Mbit/s; Streaming DiLoCo with its round's all-gather overlapped with inner steps
(2 fragments, ``fragment-delay``, ``fragment-update-alpha`` 0.5: int8 at H = 128, top-k at
H = 32 and 128); and the candidates at 100 Mbit/s for the compute share. Each part is one
sweep through the product; the parts' reports go to ``<output>/<part>/``, the study's figures
and ``frontier.json`` (every point, the equal-budget figures, the goal's check per seed) to
``<output>/``. Needs root (network namespaces).

``--smoke``: every part with each grid axis cut to its first value, on 2 nodes behind 100mbit
links, digits' MLP, global batch 32, 1 epoch: seconds, figures that mean nothing.

Usage: python experiments/frontier.py [--parts sync,diloco-4,diloco-8,streaming,overlap,compute]
       [--seeds 0,1] [--epochs 6] [--reuse] [--output DIR]
       python experiments/frontier.py --smoke
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.diloco import RATES, accuracy_within
from experiments.sweep_study import (
    arguments,
    mbytes,
    ok_points,
    parse,
    pyplot,
    run_parts,
    save,
    table,
)

CNN = "sublimate.components.examples.example_models:signal_cnn"
# Issue 44's goal: at the slowest link, a paradigm within half a point of sync's final
# accuracy sending 500x fewer bytes per worker in a tenth of the time; at 100 Mbit/s and at
# 10 Mbit/s its workers computing at least 90% of their time.
WITHIN, FEWER_BYTES, LESS_TIME, COMPUTING = 0.005, 500.0, 10.0, 0.90
STREAMING = {"algorithm": "diloco", "sync-period": 128, "fragments": 2, "fragment-delay": 4,
             "fragment-update-alpha": 0.5, "outer-codec": "int8"}
# the codec that sends the fewest bytes, its rounds' time hidden behind 8 inner steps
OVERLAP = {"algorithm": "diloco", "fragments": 2, "fragment-delay": 8,
           "fragment-update-alpha": 0.5, "outer-codec": "topk"}


def parts(args: Any) -> dict[str, tuple[dict[str, list], dict[str, Any]]]:
    """Each part's sweep: its grid and its fixed parameters."""
    seeds = [int(seed) for seed in args.seeds.split(",")]
    slowest, middle = args.rates[-1], args.rates[min(1, len(args.rates) - 1)]
    common = {"dataset": args.dataset, "scheduler": "local_netns", "epochs": args.epochs,
              "global-batch-size": args.global_batch_size, "model": args.model,
              "learning-rate": 0.1, "lr-scaling": "none", "checkpoint-every": 0,
              "eval-every-epoch": True}
    nodes = [int(count) for count in args.nodes.split(",")]
    streaming, overlap = dict(STREAMING), dict(OVERLAP)
    periods = ([32, 128, 512], [128, 512], [32, 128])
    if args.smoke:  # a short H: digits' epoch is 45 steps
        streaming.update({"sync-period": 8, "fragment-delay": 1})
        overlap.update({"fragment-delay": 1})
        periods = ([8], [8], [8])
    return {
        # sync at its fastest: DDP on plain gloo (recovery auto would commit through torchft)
        "sync": ({"nodes": nodes, "link-rate": args.rates, "seed": seeds},
                 {**common, "algorithm": "sync", "recovery": "restart"}),
        "diloco-4": ({"sync-period": periods[0], "outer-codec": ["none", "int8", "topk"],
                      "seed": seeds},
                     {**common, "algorithm": "diloco", "nodes": nodes[0],
                      "link-rate": slowest}),
        "diloco-8": ({"sync-period": periods[1], "outer-codec": ["int8", "topk"],
                      "seed": seeds},
                     {**common, "algorithm": "diloco", "nodes": nodes[-1],
                      "link-rate": slowest}),
        "streaming": ({"nodes": nodes, "link-rate": [middle, slowest], "seed": seeds},
                      {**common, **streaming}),
        "overlap": ({"sync-period": periods[2], "nodes": nodes,
                     "link-rate": [middle, slowest], "seed": seeds},
                    {**common, **overlap}),
        "compute": ({"nodes": nodes, "sync-period": [128, 512], "seed": seeds},
                    {**common, "algorithm": "diloco", "outer-codec": "int8",
                     "link-rate": middle}),
    }


def label(params: dict[str, Any]) -> str:
    if params["algorithm"] != "diloco":
        return params["algorithm"]
    period, codec = params.get("sync-period", 8), params.get("outer-codec", "none")
    codec = "" if codec == "none" else f" {codec}"
    if int(params.get("fragment-delay", 0)):
        return (f"streaming H={period} F={params['fragments']} delay "
                f"{params['fragment-delay']}{codec}")
    return f"diloco H={period}{codec}"


def collect(part: str, report: dict[str, Any], fixed: dict[str, Any]) -> list[dict[str, Any]]:
    """The part's points with the figures the study reads."""
    points = []
    for point in ok_points(report):
        params = {**fixed, **point["params"]}
        points.append({
            "part": part, "id": point["id"], "label": label(params),
            "nodes": int(params["nodes"]), "seed": int(params.get("seed", 0)),
            "rate": params["link-rate"], "accuracy": point["metric"],
            "train_seconds": point["train_seconds"],
            "sent_wire_bytes": point.get("sent_wire_bytes_per_worker"),
            "sent_namespace_bytes": point.get("net_sent_bytes_per_worker"),
            "compute_share": point.get("compute_share"),
            "curve": point["accuracy_curve"]})
    return points


def verdict(points: list[dict[str, Any]], slowest: str) -> list[dict[str, Any]]:
    """The goal for every DiLoCo point at the slowest link, against sync's run of the same
    nodes and seed there; a point's compute share at 100 Mbit/s is its own configuration's run
    there where the study has one."""
    rows = []
    for point in points:
        if point["label"] == "sync" or point["rate"] != slowest:
            continue
        sync = next((p for p in points if p["label"] == "sync" and p["rate"] == slowest
                     and p["nodes"] == point["nodes"] and p["seed"] == point["seed"]), None)
        if sync is None or not point["sent_wire_bytes"]:
            continue
        middle = next((p for p in points if p["label"] == point["label"]
                       and p["nodes"] == point["nodes"] and p["seed"] == point["seed"]
                       and p["rate"] == "100mbit"), None)
        row = {"label": point["label"], "nodes": point["nodes"], "seed": point["seed"],
               "accuracy": point["accuracy"], "sync_accuracy": sync["accuracy"],
               "accuracy_gap": round(sync["accuracy"] - point["accuracy"], 4),
               "fewer_bytes": round(sync["sent_wire_bytes"] / point["sent_wire_bytes"], 1),
               "less_time": round(sync["train_seconds"] / point["train_seconds"], 2),
               "compute_share_10mbit": point["compute_share"],
               "compute_share_100mbit": middle["compute_share"] if middle else None}
        row["meets_10mbit"] = (row["accuracy_gap"] <= WITHIN
                               and row["fewer_bytes"] >= FEWER_BYTES
                               and row["less_time"] >= LESS_TIME)
        row["meets_compute"] = all(share is not None and share >= COMPUTING for share in (
            row["compute_share_10mbit"], row["compute_share_100mbit"]))
        rows.append(row)
    return rows


def spread(values: list[float], digits: int = 4) -> str:
    """A figure over the seeds: the mean and its range."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return (f"{statistics.fmean(values):.{digits}f} "
            f"({min(values):.{digits}f}-{max(values):.{digits}f})")


def summarise(points: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """One row per configuration (label, nodes, link), its figures over the seeds."""
    keys = list(dict.fromkeys((p["label"], p["nodes"], p["rate"]) for p in points))
    rows = []
    for key in keys:
        runs = [p for p in points if (p["label"], p["nodes"], p["rate"]) == key]
        shares = [p["compute_share"] for p in runs if p["compute_share"] is not None]
        within = [p["accuracy_within_budget"] or 0.0 for p in runs]
        rows.append((*key, len(runs), spread([p["accuracy"] for p in runs]),
                     mbytes(statistics.fmean(p["sent_wire_bytes"] or 0 for p in runs)),
                     spread([p["train_seconds"] for p in runs], 1),
                     f"{statistics.fmean(shares):.0%}" if shares else "n/a", spread(within)))
    return rows


def draw(points: list[dict[str, Any]], output: Path) -> None:
    """Final accuracy against bytes sent per worker and against training time (colour: the
    configuration; shape: the link), 4 and 8 nodes side by side."""
    plt = pyplot()
    labels = list(dict.fromkeys(p["label"] for p in points))
    colours = {name: plt.get_cmap("tab20")(index % 20) for index, name in enumerate(labels)}
    shapes = dict(zip(RATES, ("o", "s", "^"), strict=True))
    node_counts = sorted({p["nodes"] for p in points})
    figure, panels = plt.subplots(len(node_counts), 2, figsize=(13, 5 * len(node_counts)),
                                  squeeze=False)
    for row, nodes in zip(panels, node_counts, strict=True):
        by_bytes, by_time = row
        for point in (p for p in points if p["nodes"] == nodes):
            style = dict(color=colours[point["label"]], marker=shapes.get(point["rate"], "o"),
                         s=40, label=f"{point['label']} {point['rate']}")
            if point["sent_wire_bytes"]:
                by_bytes.scatter(point["sent_wire_bytes"], point["accuracy"], **style)
            by_time.scatter(point["train_seconds"], point["accuracy"], **style)
        by_bytes.set(xscale="log", xlabel="bytes sent per worker (counted, on the wire)",
                     ylabel="final test accuracy", title=f"{nodes} nodes: against traffic")
        by_time.set(xscale="log", xlabel="training seconds", ylabel="final test accuracy",
                    title=f"{nodes} nodes: against wall time")
        for axes in row:
            axes.grid(alpha=0.3)
        handles, names = by_time.get_legend_handles_labels()
        unique = dict(zip(names, handles, strict=True))
        by_time.legend(unique.values(), unique.keys(), fontsize=6, ncol=2)
    save(figure, output, "frontier.png")


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], "frontier", epochs=6)
    parser.add_argument("--rates", default=",".join(RATES), help="link rates (tc syntax)")
    parser.add_argument("--parts", default="sync,diloco-4,diloco-8,streaming,overlap,compute")
    parser.add_argument("--nodes", default="4,8", help="the node counts (the first is the "
                        "DiLoCo grid's, the last the smaller grid's)")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--global-batch-size", type=int, default=256)
    parser.add_argument("--model", default=CNN)
    parser.add_argument("--reuse", action="store_true",
                        help="read the parts already in --output instead of running them again")
    args = parse(parser, rates="100mbit", nodes="2", seeds="0", global_batch_size=32,
                 model="mlp")
    args.rates = args.rates.split(",")
    output = args.output
    points = run_parts("frontier", parts(args), args, collect)
    if not points:
        return
    budget = {(rate, nodes): min(p["train_seconds"] for p in points
                                 if p["rate"] == rate and p["nodes"] == nodes)
              for rate, nodes in {(p["rate"], p["nodes"]) for p in points}}
    for point in points:
        point["accuracy_within_budget"] = accuracy_within(
            point["curve"], budget[(point["rate"], point["nodes"])])
    print(table(summarise(points), ["point", "nodes", "link", "seeds", "final accuracy",
                                    "sent per worker", "training s", "compute share",
                                    "accuracy within the budget"]))
    print("budget (the fastest point's training seconds, per link and node count; 0: no "
          "epoch ended within it): " + ", ".join(
              f"{rate} x {nodes} {seconds:.1f} s"
              for (rate, nodes), seconds in sorted(budget.items())))
    goal = verdict(points, args.rates[-1])
    print(table([(r["label"], r["nodes"], r["seed"], f"{r['accuracy_gap']:+.4f}",
                  f"{r['fewer_bytes']}x", f"{r['less_time']}x",
                  "n/a" if r["compute_share_100mbit"] is None
                  else f"{r['compute_share_100mbit']:.0%}",
                  "n/a" if r["compute_share_10mbit"] is None
                  else f"{r['compute_share_10mbit']:.0%}",
                  "yes" if r["meets_10mbit"] else "no",
                  "yes" if r["meets_compute"] else "no") for r in goal],
                ["point", "nodes", "seed", "below sync", "fewer bytes", "less time",
                 "computing at 100mbit", "at 10mbit", "meets 10mbit", "meets 90%"]))
    output.mkdir(parents=True, exist_ok=True)
    (output / "frontier.json").write_text(json.dumps(
        {"points": points, "budget_seconds": {f"{rate} {nodes}": seconds
                                              for (rate, nodes), seconds in budget.items()},
         "goal": goal}, indent=1) + "\n")
    draw(points, output)


if __name__ == "__main__":
    main()
