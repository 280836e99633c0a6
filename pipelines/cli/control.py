"""``sublimate resume RUN`` and ``sublimate stop RUN``: act on a local run from another terminal,
as ``argo resume``, ``argo node set`` and ``argo stop`` act on a workflow.

RUN is a run's name (its folder under ``$SUBLIMATE_HOME/runs/``) or its folder. The run must be
running, on this machine. ``resume`` resumes its waiting suspend nodes, setting the supplied
output parameters given with ``-p`` (checked against their enums); ``stop`` with
``--node-field-selector`` fails the matching suspend nodes, and without one stops the whole run
as Ctrl-C would (the runner gets SIGTERM: its steps are stopped, its exit handler runs). The
rules are Argo's: ``pipelines/runner/records/control.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from .common import EXIT_FAILED, UsageError, parse_parameter_flags


def add_control_commands(commands: Any) -> None:
    """Register ``resume`` and ``stop``."""
    resume = commands.add_parser(
        "resume", help="resume a local run's suspend nodes (argo resume, argo node set)",
        description="Resume the suspend nodes a local run waits on, from any terminal: those "
                    "matching --node-field-selector, or all of them.")
    resume.add_argument("-p", "--output-parameter", dest="outputs", action="append",
                        default=[], metavar="NAME=VALUE",
                        help="a supplied output parameter of the suspend node (valueFrom."
                             "supplied; checked against its enum); repeatable")
    stop = commands.add_parser(
        "stop", help="stop a local run (argo stop), or only some suspend nodes",
        description="Stop a local run as Ctrl-C would (its steps get SIGTERM, its exit handler "
                    "runs); with --node-field-selector, fail only the matching suspend nodes.")
    for parser, handler in ((resume, command_resume), (stop, command_stop)):
        parser.add_argument("run", metavar="RUN",
                            help="the run's name (a folder of $SUBLIMATE_HOME/runs/) or folder")
        parser.add_argument("--node-field-selector", default="", metavar="SELECTOR",
                            help="only the suspend nodes matching it, e.g. "
                                 "displayName=approve, templateName=gate, "
                                 "inputs.parameters.env.value=prod (comma: and)")
        parser.add_argument("-m", "--message", default="",
                            help="the nodes' message (default: who resumed or stopped them)")
        parser.add_argument("--home", type=Path, default=None,
                            help="where runs are (default: $SUBLIMATE_HOME or ~/.sublimate)")
        parser.set_defaults(handler=handler)


def running_run(reference: str, home: Path) -> tuple[Path, dict]:
    """A run's folder and status, from its name or folder; ``UsageError`` unless it runs."""
    from sublimate.pipelines.runner.records.run_folder import STATUS_FILE, runner_gone

    path = Path(reference).expanduser()
    folder = path if (path / STATUS_FILE).is_file() else home / "runs" / reference
    try:
        status = json.loads((folder / STATUS_FILE).read_text())
    except (OSError, ValueError):
        raise UsageError(f"run {reference!r}: no such run (looked for the folder {path} and "
                         f"{home / 'runs' / reference})") from None
    if status.get("phase") != "Running":
        raise UsageError(f"run {folder.name} is not running: it ended {status.get('phase')}")
    if gone := runner_gone(status):
        raise UsageError(f"run {folder.name} is not running: {gone}")
    return folder, status


def command_resume(args: argparse.Namespace) -> int:
    folder, _ = running_run(args.run, args.home)
    outputs = {name: _unquote(value)
               for name, value in parse_parameter_flags(args.outputs).items()}
    return _ask(folder, {"action": "resume", "selector": args.node_field_selector,
                         "outputs": outputs, "message": args.message}, "resumed")


def command_stop(args: argparse.Namespace) -> int:
    folder, status = running_run(args.run, args.home)
    if args.node_field_selector:
        return _ask(folder, {"action": "stop", "selector": args.node_field_selector,
                             "message": args.message}, "stopped")
    import signal

    from sublimate.pipelines.runner.records.run_folder import host_name

    runner = status.get("runner") or {}
    if runner.get("host") != host_name() or not isinstance(runner.get("pid"), int):
        raise UsageError(f"run {folder.name} runs on {runner.get('host')}: stop it there")
    os.kill(runner["pid"], signal.SIGTERM)
    print(f"run {folder.name}: stopping (SIGTERM to its runner, pid {runner['pid']})")
    return 0


def _ask(folder: Path, request: dict, done: str) -> int:
    import getpass

    from sublimate.pipelines.runner.records.control import ControlError, send

    try:
        reply = send(folder, {**request, "user": getpass.getuser()})
    except ControlError as error:
        raise UsageError(str(error)) from error
    if not reply.get("ok"):
        print(f"error: {reply.get('error')}", file=sys.stderr)
        return EXIT_FAILED
    print(f"run {folder.name}: {done} {', '.join(reply.get('nodes') or [])}")
    return 0


def _unquote(value: str) -> str:
    """A value as ``argo node set`` reads it: Go's ``strconv.Unquote`` when that succeeds."""
    if len(value) >= 2 and value[0] == value[-1] == "`":
        return value[1:-1]
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            return str(json.loads(value))
        except ValueError:
            return value
    return value
