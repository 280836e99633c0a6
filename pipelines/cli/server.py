"""Commands that talk to an Argo Server, as the ``argo`` CLI does: ``submit``,
``cron trigger``, ``install``, ``get``, ``list``, ``logs``. Settings as for ``argo``:
``ARGO_SERVER``, ``ARGO_TOKEN``, ``ARGO_NAMESPACE``, ``ARGO_SECURE``, or the flags."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .common import (
    DEFAULT_PIPELINE,
    EXIT_FAILED,
    UsageError,
    check_settings,
    parse_parameter_flags,
    read_parameter_file,
)


def add_server_commands(commands: Any) -> None:
    """Register ``submit``, ``cron trigger``, ``install``, ``get``, ``list`` and ``logs``."""
    submit = commands.add_parser("submit", help="run a pipeline on Argo Workflows",
                                 description="Submit a workflow from an installed "
                                             "WorkflowTemplate through Argo Server.")
    submit.add_argument("pipeline", nargs="?", default=DEFAULT_PIPELINE)
    submit.add_argument("-p", "--parameter", action="append", default=[], metavar="NAME=VALUE")
    submit.add_argument("--parameter-file", "-f", type=Path)
    submit.add_argument("--wait", "-w", action="store_true", help="wait for the workflow to end")
    submit.add_argument("--poll-seconds", type=float, default=5.0, help=argparse.SUPPRESS)
    _add_server_flags(submit)
    submit.set_defaults(handler=command_submit)

    cron = commands.add_parser("cron", help="CronWorkflows on Argo Server")
    cron_commands = cron.add_subparsers(dest="cron_command", required=True, metavar="COMMAND")
    trigger = cron_commands.add_parser(
        "trigger", help="run a CronWorkflow now",
        description="Start a workflow from an installed CronWorkflow now, as "
                    "`argo submit --from cronwf/NAME` does.")
    trigger.add_argument("name", help="the CronWorkflow's name (e.g. sublimate-train-nightly)")
    _add_server_flags(trigger)
    trigger.set_defaults(handler=command_cron_trigger)

    install = commands.add_parser("install", help="create or update the WorkflowTemplates and "
                                                  "CronWorkflows on Argo Server")
    _add_server_flags(install)
    install.set_defaults(handler=command_install)

    get = commands.add_parser("get", help="show a workflow on Argo Server")
    get.add_argument("name")
    get.add_argument("-o", "--output", choices=["table", "json"], default="table")
    _add_server_flags(get)
    get.set_defaults(handler=command_get)

    listing = commands.add_parser("list", help="list sublimate workflows on Argo Server")
    _add_server_flags(listing)
    listing.set_defaults(handler=command_list)

    logs = commands.add_parser("logs", help="print a workflow's logs from Argo Server")
    logs.add_argument("name")
    logs.add_argument("--follow", "-f", action="store_true",
                      help="keep following while the workflow runs")
    # How long a followed stream may be quiet before the workflow's phase is checked, and how
    # often it is checked while the server has nothing to stream (tests make them short).
    logs.add_argument("--quiet-seconds", type=float, help=argparse.SUPPRESS)
    logs.add_argument("--poll-seconds", type=float, help=argparse.SUPPRESS)
    _add_server_flags(logs)
    logs.set_defaults(handler=command_logs)


def _add_server_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--argo-server", help="Argo Server host:port or URL ($ARGO_SERVER)")
    parser.add_argument("--token", help="bearer token ($ARGO_TOKEN)")
    parser.add_argument("-n", "--namespace", help="namespace ($ARGO_NAMESPACE, default "
                                                  "sublimate)")
    parser.add_argument("-k", "--insecure", action="store_true",
                        help="skip TLS verification ($ARGO_INSECURE_SKIP_VERIFY)")


def _connection(args: argparse.Namespace) -> Any:
    from sublimate.pipelines.argo_server import connection

    return connection(args.argo_server, args.token, args.namespace, args.insecure)


def command_submit(args: argparse.Namespace) -> int:
    from sublimate.pipelines import argo_server
    from sublimate.pipelines.render import PIPELINES, render_dict

    if args.pipeline not in PIPELINES:
        raise UsageError(f"unknown pipeline '{args.pipeline}' (known: "
                         f"{', '.join(sorted(PIPELINES))})")
    parameters = read_parameter_file(args.parameter_file) if args.parameter_file else {}
    parameters.update(parse_parameter_flags(args.parameter))
    template = render_dict(args.pipeline)
    # the same checks as a local run, before anything goes over the network
    check_settings(template, parameters)
    conn = _connection(args)
    name = argo_server.submit(conn, template["metadata"]["name"], parameters)
    print(f"submitted {name} in namespace {conn.namespace}: "
          f"{conn.url}/workflows/{conn.namespace}/{name}")
    if not args.wait:
        return 0
    phase = argo_server.wait(conn, name, lambda phase: print(f"{name}: {phase}", flush=True),
                             poll_seconds=args.poll_seconds)
    return 0 if phase == "Succeeded" else EXIT_FAILED


def command_cron_trigger(args: argparse.Namespace) -> int:
    from sublimate.pipelines import argo_server

    conn = _connection(args)
    name = argo_server.trigger_cron(conn, args.name)
    print(f"submitted {name} in namespace {conn.namespace}: "
          f"{conn.url}/workflows/{conn.namespace}/{name}")
    return 0


def command_install(args: argparse.Namespace) -> int:
    from sublimate.pipelines import argo_server
    from sublimate.pipelines.render import argo_documents

    for done in argo_server.install(_connection(args), argo_documents()):
        print(f"{done}: created or updated")
    return 0


def command_get(args: argparse.Namespace) -> int:
    from sublimate.pipelines import argo_server

    workflow = argo_server.get(_connection(args), args.name)
    status = workflow.get("status", {})
    if args.output == "json":
        print(json.dumps(workflow, indent=2, sort_keys=True))
    else:
        print(f"{args.name}: {status.get('phase', 'Pending')} {status.get('message', '')}")
        for node in sorted((status.get("nodes") or {}).values(),
                           key=lambda n: n.get("startedAt") or ""):
            if node.get("type") == "Pod":
                outputs = ", ".join(f"{p['name']}={p.get('value', '')}" for p in
                                    (node.get("outputs") or {}).get("parameters") or [])
                print(f"  {node.get('displayName', ''):<16} {node.get('phase', ''):<10} "
                      f"{outputs}")
    return 0 if status.get("phase") in (None, "Running", "Pending", "Succeeded") else EXIT_FAILED


def command_list(args: argparse.Namespace) -> int:
    from sublimate.pipelines import argo_server

    for workflow in argo_server.list_runs(_connection(args)):
        labels = workflow["metadata"].get("labels", {})
        status = workflow.get("status", {})
        print(f"{workflow['metadata']['name']:<32} {status.get('phase', 'Pending'):<10} "
              f"{labels.get('sublimate.dev/algorithm', ''):<6} {status.get('startedAt', '')}")
    return 0


def command_logs(args: argparse.Namespace) -> int:
    from sublimate.pipelines import argo_server

    timing = {option: value for option, value in (("quiet_seconds", args.quiet_seconds),
                                                  ("poll_seconds", args.poll_seconds))
              if value is not None}
    for line in argo_server.logs(_connection(args), args.name, follow=args.follow, **timing):
        print(line, flush=True)
    return 0
