"""``sublimate report RUN [RUN...]``: print a run's report, regenerate its plots, compare runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_report_command(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``sublimate report RUN [RUN...]`` on the CLI's subparsers."""
    parser = subparsers.add_parser(
        "report", help="print a run's report and regenerate its plots; compare several runs",
        description="Print the summary of one or more runs and (re)generate report/ in each "
                    "run folder; with two or more runs also draw them side by side in one plot.")
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="the run folder `sublimate run` printed "
                             "($SUBLIMATE_HOME/runs/<workflow>), the results folder "
                             "($SUBLIMATE_HOME/volumes/sublimate-data/runs/<run-id>), or the "
                             "workflow name or run id alone")
    parser.add_argument("--output", "-o", type=Path, default=None,
                        help="where to write the comparison PNG (default: "
                             "$SUBLIMATE_HOME/reports/<run>-vs-<run>.png)")
    parser.add_argument("--json", action="store_true", help="print the report(s) as JSON")
    parser.add_argument("--no-plots", dest="plots", action="store_false",
                        help="write report.json only")
    parser.set_defaults(handler=command_report)
    return parser


def command_report(args: argparse.Namespace) -> int:
    # Imported here: registering the command must not load the report (every CLI start does).
    from sublimate.pipelines.run_lookup import (
        REPORT_DIR,
        ReportError,
        compare,
        format_summary,
        home,
        resolve_run,
        resolve_sweep,
        write_report,
    )

    sweeps = [resolve_sweep(reference) for reference in args.runs]
    if any(sweeps):
        return _report_sweeps(args.runs, sweeps, args.json)

    try:
        run_dirs = [resolve_run(reference) for reference in args.runs]
        reports = [write_report(run_dir, plots=args.plots) for run_dir in run_dirs]
    except ReportError as error:
        print(f"report: error: {error}", file=sys.stderr)
        return 2
    comparison = None
    if len(run_dirs) > 1 and args.plots:
        output = args.output or home() / "reports" / (
            "-vs-".join(run_dir.name for run_dir in run_dirs) + ".png")
        try:
            comparison = compare(run_dirs, output)
        except ImportError:
            print("report: matplotlib is not installed; no comparison plot", file=sys.stderr)
    if args.json:
        print(json.dumps(reports[0] if len(reports) == 1 else reports, indent=2))
        return 0
    for report in reports:
        print(format_summary(report))
        if report["plots"]:
            print(f"  plots: {Path(report['run_dir']) / REPORT_DIR}/"
                  f"{{{','.join(report['plots'].values())}}}")
    if len(reports) == 2:  # the differences, side by side
        from sublimate.components.monitoring.run_report import format_comparison

        print("compared:")
        print(format_comparison(reports))
    if comparison:
        print(f"comparison: {comparison}")
    return 0


def _report_sweeps(references: list[str], sweeps: list[Path | None], as_json: bool) -> int:
    """``sublimate report SWEEP``: the compare step's report, printed (its plots are in its
    folder already); a sweep is not compared with other runs."""
    from sublimate.components.steps.compare import format_console

    if len(references) > 1:
        print(f"report: error: {', '.join(references)}: give one sweep alone (its report "
              "compares its points already)", file=sys.stderr)
        return 2
    folder = sweeps[0]
    assert folder is not None
    document = json.loads((folder / "report.json").read_text())
    print(json.dumps(document, indent=2) if as_json else format_console(document, folder))
    return 0
