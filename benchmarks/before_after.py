"""Every paradigm's throughput through the train step, this checkout against another, in one run.

``--before`` is the Python of an environment where an earlier checkout is installed (e.g. a copy
of the venv with ``pip install --no-deps -e <worktree>``). Runs alternate between the two, so
drift on a shared machine hits both alike; it prints per paradigm the median samples/s (training
loop only) and the train step's wall time (start-up included) of each, the after/before ratios,
and the spread over the repeats.

``--smoke`` (tests/test_benchmarks.py): this checkout against itself (``--before`` defaults to
this Python), sync only (every paradigm takes the same path here, and benchmarks/paradigms.py's
smoke runs each), 1 epoch, one repeat: seconds, figures that mean nothing.

Usage: python benchmarks/before_after.py --before /tmp/old-venv/bin/python [--repeat 3]
       [--epochs 30] [--paradigms sync,async,bmuf,easgd,diloco]
       python benchmarks/before_after.py --smoke
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from paradigms import SMOKE_LINE, component

from sublimate.components.base.settings import PARADIGM_NAMES
from sublimate.components.data.datasets import build_builtin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="Python of the earlier checkout (required)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--paradigms", default=",".join(PARADIGM_NAMES))
    parser.add_argument("--smoke", action="store_true",
                        help="every code path at tiny sizes, in seconds (tests)")
    args = parser.parse_args()
    if args.smoke:
        parser.set_defaults(before=sys.executable, repeat=1, epochs=1, paradigms="sync")
        args = parser.parse_args()
        print(SMOKE_LINE, flush=True)
    if not args.before:
        parser.error("the following arguments are required: --before")
    pythons = {"before": args.before, "after": sys.executable}
    paradigms = args.paradigms.split(",")
    speed = {(p, side): [] for p in paradigms for side in pythons}
    wall = {(p, side): [] for p in paradigms for side in pythons}
    with tempfile.TemporaryDirectory() as folder:
        data_dir = build_builtin("digits", Path(folder) / "digits")
        for attempt in range(args.repeat):
            for paradigm in paradigms:
                for side, python in pythons.items():
                    summary = component(paradigm, data_dir,
                                        Path(folder) / f"{paradigm}-{side}-{attempt}", args,
                                        python=python)
                    speed[paradigm, side].append(summary["samples_per_second"])
                    wall[paradigm, side].append(summary["step_wall_seconds"])
    print(f"digits, MLP {args.hidden}, 2 nodes, batch {args.batch}, {args.epochs} epochs, "
          f"median of {args.repeat} (min-max)")
    print(f"{'paradigm':<9}{'samples/s before':>22}{'after':>22}{'ratio':>7}"
          f"{'step wall before':>22}{'after':>22}{'ratio':>7}")
    for paradigm in paradigms:
        cells = []
        for table in (speed, wall):
            before, after = table[paradigm, "before"], table[paradigm, "after"]
            cells += [f"{statistics.median(before):>9.1f} ({min(before):.1f}-{max(before):.1f})",
                      f"{statistics.median(after):>9.1f} ({min(after):.1f}-{max(after):.1f})",
                      f"{statistics.median(after) / statistics.median(before):.3f}"]
        print(f"{paradigm:<9}{cells[0]:>22}{cells[1]:>22}{cells[2]:>7}"
              f"{cells[3]:>22}{cells[4]:>22}{cells[5]:>7}")


if __name__ == "__main__":
    main()
