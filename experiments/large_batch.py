"""Study 2: where a larger global batch starts to cost accuracy, with and without warmup.

The same training (mnist1d, 2 nodes, the same number of epochs) at global batches from 32 to
8,192 with the learning rate scaled linearly from 0.1 at batch 64 (``lr-scaling linear``), once
without warmup and once with 5 epochs of gradual warmup (Goyal et al., 2017). Prints the final
test accuracy per batch and draws it against the batch, with the paper's ~10^3 marked.
About 8 minutes on 2 cores.

Usage: python experiments/large_batch.py [--batches 32,128,...,8192] [--epochs 10] [--home DIR]
       python experiments/large_batch.py --smoke   # batch 64, with and without 1 epoch of warmup
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.sweep_study import arguments, ok_points, parse, pyplot, run_study, save, table

BATCHES = "32,128,512,1024,2048,4096,8192"
PAPER_KNEE = 1000  # the global batch past which the paper saw accuracy drop


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], "large-batch", epochs=10)
    parser.add_argument("--batches", default=BATCHES, help="global batch sizes")
    parser.add_argument("--warmup-epochs", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=2)
    args = parse(parser, batches="64", warmup_epochs=1)
    batches = [int(b) for b in args.batches.split(",")]
    grid = {"global-batch-size": batches, "warmup-epochs": [0, args.warmup_epochs]}
    fixed = {"dataset": args.dataset, "nodes": args.nodes, "epochs": args.epochs,
             "learning-rate": 0.1, "reference-batch-size": 64, "lr-scaling": "linear",
             "checkpoint-every": 0, "eval-every-epoch": True}
    report = run_study("large-batch", grid, fixed, args)
    if not report:
        return
    accuracy: dict[int, dict[int, float]] = {}
    for point in ok_points(report):
        params = point["params"]
        accuracy.setdefault(params["warmup-epochs"], {})[params["global-batch-size"]] = \
            point["metric"]
    failed = [p for p in report["points"] if p["status"] != "ok"]
    rows = [(batch, f"{0.1 * batch / 64:g}",
             *(f"{accuracy.get(w, {}).get(batch, float('nan')):.4f}"
               for w in (0, args.warmup_epochs))) for batch in batches]
    print(table(rows, ["global batch", "scaled lr", "accuracy, no warmup",
                       f"accuracy, {args.warmup_epochs}-epoch warmup"]))
    for point in failed:
        print(f"failed: {point['id']} {point['params']}: {point['problem']}")
    draw(accuracy, batches, args)


def draw(accuracy: dict[int, dict[int, float]], batches: list[int], args) -> None:
    plt = pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for warmup, label in ((0, "no warmup"), (args.warmup_epochs,
                                              f"{args.warmup_epochs}-epoch warmup")):
        xs = [b for b in batches if b in accuracy.get(warmup, {})]
        axes.plot(xs, [accuracy[warmup][b] for b in xs], marker="o", label=label)
    axes.axvline(PAPER_KNEE, color="grey", linestyle=":", label="paper's knee (~10^3)")
    axes.set_xscale("log", base=2)
    axes.set(xlabel="global batch size (linear lr scaling from 0.1 at 64)",
             ylabel="final test accuracy",
             title=f"mnist1d, {args.nodes} nodes, {args.epochs} epochs")
    axes.grid(alpha=0.3)
    axes.legend()
    save(figure, args.output, "accuracy-by-batch.png")


if __name__ == "__main__":
    main()
