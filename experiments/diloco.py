"""Study 4: DiLoCo and the traffic-to-accuracy frontier.

Four nodes on ``local_netns`` behind links of 1 Gbit/s, 100 Mbit/s and 10 Mbit/s, mnist1d: sync,
BMUF, EASGD (a round every 8 steps), DiLoCo at H = 8, 32 and 128 and Streaming DiLoCo (H = 32,
2 fragments), at equal epochs; then sync, BMUF and DiLoCo (H = 8, 32, 128) at three times the
epochs on 1 Gbit/s (does the gap to sync close?), and DiLoCo H = 128 at those epochs on the
slowest link. Each part is one sweep through the product
(``sublimate run sweep``); the parts' reports go to ``<output>/<part>/``, and the study's own
figures (accuracy against bytes sent and against training time, the frontier) and
``frontier.json`` (every point, the equal-budget table and the goal's verdict) to ``<output>/``.
Needs root (network namespaces).

``--smoke``: the parts paradigms, streaming and longer-slowest (every label, the longer parts'
filter) with each grid axis cut to its first value, on 2 nodes behind 100mbit links (both of
the goal's checks), global batch 32, 1 epoch (3 for longer-slowest): seconds, figures that mean
nothing.

Usage: python experiments/diloco.py [--rates 1gbit,100mbit,10mbit] [--epochs 6]
       [--parts paradigms,diloco,streaming,longer,longer-diloco,longer-slowest] [--model mlp]
       [--reuse]
       [--output DIR]
       python experiments/diloco.py --smoke
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.sweep_study import (
    arguments,
    mbytes,
    ok_points,
    parse,
    pyplot,
    run_parts,
    save,
    seconds_text,
    table,
)

RATES = ("1gbit", "100mbit", "10mbit")
# The goal of issue 23: at the slowest link a paradigm within half a point of sync's final
# accuracy, sending 100x fewer bytes per worker in a fifth of the time; at 100 Mbit/s the
# workers computing at least 90% of their time.
WITHIN, FEWER_BYTES, LESS_TIME, COMPUTING = 0.005, 100.0, 5.0, 0.90


def parts(args: Any, rates: list[str]) -> dict[str, tuple[dict[str, list], dict[str, Any]]]:
    """Each part's sweep: its grid and its fixed parameters."""
    common = {"dataset": args.dataset, "scheduler": "local_netns", "nodes": args.nodes,
              "epochs": args.epochs, "global-batch-size": args.global_batch_size,
              "model": args.model, "checkpoint-every": 0, "eval-every-epoch": True}
    return {
        "paradigms": ({"algorithm": ["sync", "bmuf", "easgd"], "link-rate": rates}, common),
        "diloco": ({"sync-period": [8, 32, 128], "link-rate": rates},
                   {**common, "algorithm": "diloco"}),
        "streaming": ({"link-rate": rates},
                      {**common, "algorithm": "diloco", "sync-period": 32, "fragments": 2}),
        "longer": ({"algorithm": ["sync", "bmuf", "diloco"]},
                   {**common, "link-rate": rates[0], "epochs": args.epochs * 3}),
        "longer-diloco": ({"sync-period": [32, 128]},
                          {**common, "algorithm": "diloco", "link-rate": rates[0],
                           "epochs": args.epochs * 3}),
        # the goal's candidate at the slowest link (sync's accuracy does not depend on the
        # link: it is the same all-reduced gradient; its time there is its bytes / the rate)
        "longer-slowest": ({"link-rate": rates[-1:]},
                           {**common, "algorithm": "diloco", "sync-period": 128,
                            "epochs": args.epochs * 3}),
    }


def label(params: dict[str, Any]) -> str:
    algorithm = params["algorithm"]
    if algorithm != "diloco":
        return algorithm
    period = params.get("sync-period", 8)  # the setting's default
    if int(params.get("fragments", 1)) > 1:
        return f"streaming H={period} F={params['fragments']}"
    return f"diloco H={period}"


def collect(part: str, report: dict[str, Any], fixed: dict[str, Any]) -> list[dict[str, Any]]:
    """The part's points with their full parameters and the figures the study reads."""
    points = []
    for point in ok_points(report):
        params = {**fixed, **point["params"]}
        points.append({
            "part": part, "id": point["id"], "label": label(params),
            "rate": params["link-rate"], "epochs": int(params["epochs"]),
            "accuracy": point["metric"], "train_seconds": point["train_seconds"],
            "sent_wire_bytes": point.get("sent_wire_bytes_per_worker"),
            "sent_namespace_bytes": point.get("net_sent_bytes_per_worker"),
            "compute_share": point.get("compute_share"),
            "communication_share": point.get("communication_share"),
            "curve": point["accuracy_curve"]})
    return points


def accuracy_within(curve: list[list[float]], budget: float) -> float | None:
    """The test accuracy of the last epoch that ended within ``budget`` training seconds."""
    reached = [accuracy for seconds, _step, accuracy in curve if seconds <= budget + 1e-9]
    return reached[-1] if reached else None


def verdict(points: list[dict[str, Any]], rates: list[str]) -> dict[str, Any]:
    """The goal, checked against the equal-epoch points."""
    equal = [p for p in points if not p["part"].startswith("longer")]
    result: dict[str, Any] = {}
    slowest = rates[-1]
    sync = next((p for p in equal if p["label"] == "sync" and p["rate"] == slowest), None)
    if sync is not None:
        rows = []
        for point in equal:
            if point["rate"] != slowest or point is sync or not point["sent_wire_bytes"]:
                continue
            rows.append({
                "label": point["label"], "accuracy_gap": round(sync["accuracy"]
                                                               - point["accuracy"], 4),
                "fewer_bytes": round(sync["sent_wire_bytes"] / point["sent_wire_bytes"], 1),
                "less_time": round(sync["train_seconds"] / point["train_seconds"], 2),
            })
        for row in rows:
            row["meets"] = row["accuracy_gap"] <= WITHIN and row["fewer_bytes"] >= FEWER_BYTES \
                and row["less_time"] >= LESS_TIME
        result[slowest] = rows
    if "100mbit" in rates:
        result["100mbit_compute_share"] = {
            p["label"]: p["compute_share"] for p in equal if p["rate"] == "100mbit"}
    return result


def draw(points: list[dict[str, Any]], rates: list[str], output: Path) -> None:
    """The frontier: final accuracy against bytes sent per worker and against training time,
    one marker per point (colour: paradigm; shape: link rate); and accuracy against time."""
    plt = pyplot()
    equal = [p for p in points if not p["part"].startswith("longer")]
    labels = list(dict.fromkeys(p["label"] for p in equal))
    colours = {name: f"C{index}" for index, name in enumerate(labels)}
    shapes = dict(zip(rates, ("o", "s", "^", "D"), strict=False))
    figure, (by_bytes, by_time) = plt.subplots(1, 2, figsize=(13, 5))
    for point in equal:
        style = dict(color=colours[point["label"]], marker=shapes.get(point["rate"], "o"),
                     s=50, label=f"{point['label']} {point['rate']}")
        if point["sent_wire_bytes"]:
            by_bytes.scatter(point["sent_wire_bytes"], point["accuracy"], **style)
        by_time.scatter(point["train_seconds"], point["accuracy"], **style)
    by_bytes.set(xscale="log", xlabel="bytes sent per worker (counted, on the wire)",
                 ylabel="final test accuracy", title="accuracy against traffic")
    by_time.set(xscale="log", xlabel="training seconds", ylabel="final test accuracy",
                title="accuracy against wall time")
    for axes in (by_bytes, by_time):
        axes.grid(alpha=0.3)
    by_time.legend(fontsize=7, ncol=2)
    save(figure, output, "frontier.png")
    figure, panels = plt.subplots(1, len(rates), figsize=(5 * len(rates), 4.2), squeeze=False)
    for axes, rate in zip(panels[0], rates, strict=True):
        for point in (p for p in equal if p["rate"] == rate):
            curve = point["curve"]
            axes.plot([c[0] for c in curve], [c[2] for c in curve], marker=".",
                      color=colours[point["label"]], label=point["label"])
        axes.set(xscale="log", xlabel="training seconds", ylabel="test accuracy",
                 title=f"{rate} links")
        axes.grid(alpha=0.3)
    panels[0][0].legend(fontsize=7)
    save(figure, output, "accuracy-over-time.png")


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], "diloco", epochs=6)
    parser.add_argument("--rates", default=",".join(RATES), help="link rates (tc syntax)")
    parser.add_argument("--parts", default="paradigms,diloco,streaming,longer,longer-diloco,"
                        "longer-slowest")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--global-batch-size", type=int, default=128)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--reuse", action="store_true",
                        help="read the parts already in --output instead of running them again "
                             "(only the missing parts run)")
    args = parse(parser, rates="100mbit", parts="paradigms,streaming,longer-slowest", nodes=2,
                 global_batch_size=32)
    rates = args.rates.split(",")
    output = args.output
    points = run_parts("diloco", parts(args, rates), args, collect)
    if not points:
        return
    equal = [p for p in points if not p["part"].startswith("longer")]
    budget = {rate: min(p["train_seconds"] for p in equal if p["rate"] == rate)
              for rate in rates if any(p["rate"] == rate for p in equal)}
    for point in points:
        point["accuracy_within_budget"] = accuracy_within(point["curve"],
                                                          budget.get(point["rate"], 0.0))
    rows = [(p["label"], p["rate"], p["epochs"], f"{p['accuracy']:.4f}",
             f"{p['train_seconds']:.1f}", mbytes(p["sent_wire_bytes"]),
             mbytes(p["sent_namespace_bytes"]),
             f"{p['compute_share']:.0%}" if p["compute_share"] is not None else "n/a",
             "n/a" if p["accuracy_within_budget"] is None
             else f"{p['accuracy_within_budget']:.4f}") for p in points]
    print(table(rows, ["point", "link", "epochs", "final accuracy", "training s",
                       "sent per worker (counted)", "sent per worker (namespace)",
                       "compute share", "accuracy within the budget"]))
    print("budget (the fastest point's training seconds, per link): "
          + ", ".join(f"{rate} {seconds_text(seconds)} s" for rate, seconds in budget.items()))
    goal = verdict(points, rates)
    print(json.dumps(goal, indent=1))
    output.mkdir(parents=True, exist_ok=True)
    (output / "frontier.json").write_text(json.dumps(
        {"points": points, "budget_seconds": budget, "goal": goal}, indent=1) + "\n")
    draw(points, rates, output)


if __name__ == "__main__":
    main()
