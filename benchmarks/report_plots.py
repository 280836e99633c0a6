"""The run report's plots: the overview drawn once with each panel cut out of its pixels
(``run_report.write_plots``, today's path) against drawing each panel as a figure of its own
beside the overview (the path before it: ``draw_panel`` x 4, then ``plot``), in one run.

Each repetition starts a fresh interpreter per path, as the evaluate step is one, on the same
run folder (a 2-rank, 20-epoch run as the train step leaves it), interleaved. It prints, per
path, the median and spread (min-max) of the CPU seconds of the whole process (imports
included: what the evaluate step pays) and of the plotting alone, and their ratios. Ratios are
printed, never asserted.

``--smoke`` (tests/test_benchmarks.py): one repetition of each path: seconds, figures that mean
nothing.

Usage: python benchmarks/report_plots.py [--repeat 15]
       python benchmarks/report_plots.py --smoke
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

EPOCHS = 20
SMOKE_LINE = "smoke mode: sizes too small for the figures to mean anything"

# Each child prints the CPU seconds its plotting took (after matplotlib's import).
CHILD = """
import json, sys, time
from pathlib import Path
from sublimate.components.monitoring import run_report as rr
rr._pyplot()
report = rr.build_report(Path(sys.argv[1]))
folder = Path(sys.argv[2])
folder.mkdir(parents=True, exist_ok=True)
started = time.process_time()
if sys.argv[3] == "cut":
    rr.write_plots(report, folder)
else:
    plt = rr._pyplot()
    for name in rr.PLOTS:
        figure = rr.draw_panel(name, [report])
        figure.savefig(folder / f"{name}.png", dpi=100)
        plt.close(figure)
    rr.plot([report], folder / "overview.png")
print(json.dumps(time.process_time() - started))
"""


def fake_run(run_dir: Path) -> Path:
    """A run folder as the train and evaluate steps leave it: two ranks, EPOCHS epochs."""
    (run_dir / "metrics").mkdir(parents=True)
    (run_dir / "train-summary.json").write_text(json.dumps({
        "algorithm": "sync", "world_size": 2, "epochs": EPOCHS, "steps": 22 * EPOCHS,
        "global_batch_size": 64, "train_seconds": 1.5, "samples_per_second": 3000.0,
        "final_learning_rate": 0.1, "backend": "gloo", "accuracy_curve": []}))
    (run_dir / "metrics.json").write_text(json.dumps(
        {"split": "test", "examples": 359, "loss": 0.2, "accuracy": 0.95}))
    for rank in (0, 1):
        records = [{"epoch": e, "step": 22 * e, "loss": 2.0 / e, "learning_rate": 0.1,
                    "samples_per_second": 1000.0 * e, "data_seconds": 0.01,
                    "compute_seconds": 0.06, "comm_seconds": 0.03,
                    **({"test_accuracy": 1 - 0.5 / e} if rank == 0 else {})}
                   for e in range(1, EPOCHS + 1)]
        (run_dir / "metrics" / f"rank-{rank}.jsonl").write_text(
            "\n".join(json.dumps(r) for r in records) + "\n")
    return run_dir


def one(path: str, run_dir: Path, output: Path) -> tuple[float, float]:
    """(CPU seconds of the whole child process, CPU seconds of its plotting)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-c", CHILD, str(run_dir), str(output), path],
                          capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    process = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return process, float(done.stdout.strip().splitlines()[-1])


def describe(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--smoke", action="store_true",
                        help="every code path at tiny sizes, in seconds (tests)")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(repeat=1)
        args = parser.parse_args()
        print(SMOKE_LINE, flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = fake_run(Path(scratch) / "run")
        results: dict[str, tuple[list[float], list[float]]] = {"panels": ([], []),
                                                                "cut": ([], [])}
        for index in range(args.repeat):
            for path in ("panels", "cut") if index % 2 == 0 else ("cut", "panels"):
                process, plotting = one(path, run_dir, Path(scratch) / f"{path}-{index}")
                results[path][0].append(process)
                results[path][1].append(plotting)
            print(f"repetition {index + 1}/{args.repeat}", file=sys.stderr, flush=True)
    for path, label in (("panels", "before: each panel drawn on its own"),
                        ("cut", "now: panels cut from the overview")):
        process, plotting = results[path]
        print(f"{label:40s} process CPU {describe(process)}, plotting CPU {describe(plotting)}")
    for kind, index in (("process", 0), ("plotting", 1)):
        ratio = statistics.median(results["cut"][index]) / \
            statistics.median(results["panels"][index])
        print(f"ratio now/before ({kind} CPU, medians): {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
