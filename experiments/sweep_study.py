"""Run one study as one sweep through the product, and keep its report in ``docs/results/``.

Every study in this folder is a grid handed to the ``sublimate-sweep`` pipeline exactly as a
user would (``sublimate run sweep -p grid=... -p NAME=VALUE``): the dataset is staged once, each
point trains and evaluates with the same templates as ``sublimate-train``, and the compare step
writes the report. This module only starts that command, waits, and copies the sweep's report
(``report.md``, ``report.json``, ``points.csv``, the plots) into ``docs/results/<study>/``, with
a ``study.json`` that says how it was run: the exact command, the machine, the load beside it.

Points run one at a time (``--parallelism 1``): they share two cores, so two at once would halve
each other's throughput and blur every time-based figure.

``--smoke`` (every study; tests/test_benchmarks.py runs each so): the study's grid at its tiniest
(digits, 1 epoch, each axis cut to what still reaches every table and plot), its report in a
temporary folder removed afterwards, never ``docs/results/``: seconds, figures that mean nothing.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
REPORT_FILES = ("report.md", "report.json", "points.csv")
SMOKE_LINE = "smoke mode: sizes too small for the figures to mean anything"


def arguments(description: str, study: str, epochs: int) -> argparse.ArgumentParser:
    """The options every study shares; each study adds its own grid's."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--home", type=Path, default=None,
                        help="SUBLIMATE_HOME for the sweep's runs and volume (default: a "
                             "temporary folder, removed afterwards)")
    parser.add_argument("--output", type=Path, default=RESULTS / study,
                        help="where the report and plots go (default: docs/results/%(default)s)")
    parser.add_argument("--dataset", default="mnist1d", help="the sweep's dataset parameter")
    parser.add_argument("--epochs", type=int, default=epochs,
                        help="epochs of every point (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the sweep command and exit")
    parser.add_argument("--smoke", action="store_true",
                        help="every code path at tiny sizes, in seconds (tests)")
    return parser


def parse(parser: argparse.ArgumentParser, **smoke: Any) -> argparse.Namespace:
    """The study's options; with ``--smoke``, ``smoke`` (the study's own tiniest sizes, by
    option name), digits and 1 epoch are the defaults (options given still win), and
    ``--output`` is a temporary folder, removed when the study ends (never under docs/)."""
    args = parser.parse_args()
    if not args.smoke:
        return args
    parser.set_defaults(dataset="digits", epochs=1, output=None, **smoke)
    args = parser.parse_args()
    print(SMOKE_LINE, flush=True)
    if args.output is None:
        args.output = Path(tempfile.mkdtemp(prefix="sublimate-smoke-"))
        atexit.register(shutil.rmtree, args.output, ignore_errors=True)
    elif args.output.resolve().is_relative_to(REPO / "docs"):
        parser.error("--smoke writes its figures into a temporary folder, never under docs/")
    return args


def sweep_command(grid: Mapping[str, Sequence[Any]], fixed: Mapping[str, Any],
                  home: Path) -> list[str]:
    """``sublimate run sweep`` for ``grid`` with ``fixed`` parameters, points one at a time."""
    command = [sys.executable, "-m", "sublimate.pipelines", "run", "sweep",
               "-p", f"grid={json.dumps(grid, separators=(',', ':'))}"]
    for name, value in fixed.items():
        command += ["-p", f"{name}={_text(value)}"]
    return [*command, "--parallelism", "1", "--quiet", "-o", "json", "--home", str(home)]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def run_study(study: str, grid: Mapping[str, Sequence[Any]], fixed: Mapping[str, Any],
              args: argparse.Namespace) -> dict[str, Any]:
    """Run the sweep, copy its report into ``args.output``; returns the sweep's report.json."""
    temporary = args.home is None
    if args.dry_run:  # the command as a user types it (no --home), and no folder made
        print(shlex.join(["sublimate", *sweep_command(grid, fixed, Path("."))[3:-2]]))
        return {}
    home = Path(tempfile.mkdtemp(prefix=f"sublimate-{study}-")) if temporary else args.home
    command = sweep_command(grid, fixed, home)
    shown = shlex.join(["sublimate", *command[3:-2]])  # as a user types it, without --home
    points = 1
    for values in grid.values():
        points *= len(values)
    print(f"{study}: {points} points, one at a time; {shown}", file=sys.stderr, flush=True)
    load_before = os.getloadavg()
    started = time.monotonic()
    try:
        # The runner's progress goes to stderr (shown as it comes); stdout is the JSON status.
        finished = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
        seconds = time.monotonic() - started
        if finished.returncode != 0 or not finished.stdout.strip():
            raise SystemExit(f"{study}: the sweep failed (exit {finished.returncode}); "
                             f"its runs are in {home}")
        status = json.loads(finished.stdout)
        report_md = Path(status["links"]["report"]).resolve()
        sweep_dir = report_md.parent
        output = args.output
        if output.exists():
            shutil.rmtree(output)
        output.mkdir(parents=True)
        for path in sweep_dir.iterdir():
            if path.name in REPORT_FILES or path.suffix == ".png":
                shutil.copy2(path, output / path.name)
        report = json.loads((output / "report.json").read_text())
        study_record = {
            "study": study, "command": shown, "grid": grid, "fixed": dict(fixed),
            "points": points, "failed": sum(p["status"] != "ok" for p in report["points"]),
            "sweep_seconds": round(seconds, 1), "workflow": status.get("name"),
            "best": report.get("best"),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "python": platform.python_version(), "torch": _torch_version()},
            # Everything shares two cores. The load averages include the sweep's own processes
            # (every node, the async server's threads): compared with the sweep's node count
            # they say whether anything else ran beside it.
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        }
        (output / "study.json").write_text(json.dumps(study_record, indent=2) + "\n")
        print(f"{study}: {points} points in {seconds:.0f}s; report in {output}",
              file=sys.stderr)
        return report
    finally:
        if temporary:
            shutil.rmtree(home, ignore_errors=True)


def run_parts(study: str, parts: Mapping[str, tuple[dict[str, list[Any]], dict[str, Any]]],
              args: argparse.Namespace,
              collect: Callable[[str, dict[str, Any], dict[str, Any]], list[dict[str, Any]]],
              ) -> list[dict[str, Any]]:
    """A study of several sweeps: each part (its grid and fixed parameters) named in
    ``args.parts`` runs as its own sweep, its report in ``<output>/<part>/`` (``args.reuse``:
    a part whose report is there already is read, not run again; ``args.smoke``: each axis at
    its first value). Returns the points ``collect(part, report, fixed)`` reads from each."""
    output, points = args.output, []
    try:
        for part, (grid, fixed) in parts.items():
            if part not in args.parts.split(","):
                continue
            if args.smoke:  # each axis at its first value: one point per part
                grid = {name: values[:1] for name, values in grid.items()}
            args.output = output / part
            kept = args.output / "report.json"
            report = json.loads(kept.read_text()) if args.reuse and kept.exists() \
                else run_study(f"{study}-{part}", grid, fixed, args)
            if report:
                points += collect(part, report, fixed)
    finally:
        args.output = output
    return points


def _torch_version() -> str:
    from importlib.metadata import version

    return version("torch")


def ok_points(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [point for point in report["points"] if point["status"] == "ok"]


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(figure: Any, output: Path, name: str) -> Path:
    path = output / name
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot().close(figure)
    return path


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A Markdown table (printed by each study and pasted into docs/results.md)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def mbytes(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1e6:.1f} MB"


def seconds_text(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.1f}"
