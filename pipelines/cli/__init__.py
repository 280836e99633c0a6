"""The ``sublimate`` command line, shaped like the ``argo`` CLI.

One module per group of commands: :mod:`.local` (run, render, lint), :mod:`.control` (resume,
stop: a local run from another terminal), :mod:`.server` (submit, install, get, list, logs
against an Argo Server), :mod:`.serve` (server: this machine as an Argo Server), :mod:`.data`
(data push/ls), :mod:`.report` (report); :mod:`.common` is what they share. Each command
imports only what it needs: ``sublimate run FILE.yaml`` must start in tens of milliseconds, so
Hera, torch and jsonschema are loaded only by the commands that use them.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from .common import (
    DEFAULT_PIPELINE,
    EXIT_FAILED,
    EXIT_USAGE,
    UsageError,
    default_home,
    parse_parameter_flags,
    read_parameter_file,
)

__all__ = [
    "DEFAULT_PIPELINE",
    "EXIT_FAILED",
    "EXIT_USAGE",
    "UsageError",
    "build_parser",
    "default_home",
    "main",
    "parse_parameter_flags",
    "read_parameter_file",
]


def build_parser() -> argparse.ArgumentParser:
    from .control import add_control_commands
    from .data import add_data_commands
    from .fault import add_fault_commands
    from .local import add_local_commands
    from .models import add_models_commands
    from .report import add_report_command
    from .rerun import add_rerun_commands
    from .serve import add_serve_command
    from .server import add_server_commands

    parser = argparse.ArgumentParser(
        prog="sublimate",
        description="Distributed training pipelines on Argo Workflows, runnable on one machine.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_local_commands(commands)
    add_control_commands(commands)
    add_rerun_commands(commands)
    add_server_commands(commands)
    add_serve_command(commands)
    add_data_commands(commands)
    add_report_command(commands)
    add_fault_commands(commands)
    add_models_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`sublimate run --help | head`): nothing more to say to it.
        # Python's own advice: point stdout at /dev/null so the interpreter's final flush is
        # quiet too, and exit as a command killed by SIGPIPE would.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "home", "unset") is None:
        args.home = default_home()
    try:
        return args.handler(args)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as error:
        # A full disk, whatever the command wrote: which disk and what, in one line.
        from sublimate.components.base.disk_full import explain

        line = explain(error)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as error:
        # The Argo Server client is imported only by the commands that talk to a server: an
        # error of its kind can only come from there (a local run never loads it).
        argo_server = sys.modules.get("sublimate.pipelines.argo_server")
        if argo_server is None or not isinstance(error, argo_server.ArgoServerError):
            raise
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 130
