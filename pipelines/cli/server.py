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
    submit = commands.add_parser("submit", help="run a pipeline or your workflow on Argo Workflows",
                                 description="Submit a workflow through Argo Server: one of "
                                             "sublimate's pipelines from its installed "
                                             "WorkflowTemplate, or a file of your own (a "
                                             "Workflow or WorkflowTemplate manifest, or a Hera "
                                             "module defining one), linted first.")
    submit.add_argument("pipeline", nargs="?", default=DEFAULT_PIPELINE,
                        help="a pipeline's name, or a .yaml/.json manifest or .py Hera module")
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

    parameters = read_parameter_file(args.parameter_file) if args.parameter_file else {}
    parameters.update(parse_parameter_flags(args.parameter))
    if args.pipeline not in PIPELINES:
        path = Path(args.pipeline)
        if path.suffix not in _FILE_KINDS or not path.is_file():
            raise UsageError(f"'{args.pipeline}' is neither a pipeline (known: "
                             f"{', '.join(sorted(PIPELINES))}) nor a manifest (.yaml, .yml, "
                             ".json) or Hera module (.py) that exists")
        document = _checked_file(path, parameters)
        conn = _connection(args)
        if document["kind"] == "WorkflowTemplate":
            installed = argo_server.put_template(conn, document)
            print(f"WorkflowTemplate/{installed} installed in namespace {conn.namespace}")
            name = argo_server.submit(conn, installed, parameters)
        else:
            name = argo_server.create(conn, document)
    else:
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


_FILE_KINDS = (".yaml", ".yml", ".json", ".py")


def _checked_file(path: Path, parameters: dict[str, str]) -> dict:
    """The Workflow or WorkflowTemplate a file holds (a manifest, or a Hera module's object),
    linted as ``sublimate lint`` lints it and its parameters checked as ``sublimate run``
    checks them, before anything goes over the network; a Workflow's ``-p`` values are set
    in it (a WorkflowTemplate's go with the submission). ``UsageError`` saying what to fix."""
    from sublimate.pipelines.lint import lint_document
    from sublimate.pipelines.runner import ParameterError, resolve_parameters

    documents = _documents(path)
    kinds = [d for d in documents if d.get("kind") in ("Workflow", "WorkflowTemplate")]
    if len(kinds) != 1:
        found = ", ".join(f"{d.get('kind')}/{(d.get('metadata') or {}).get('name')}"
                          for d in documents) or "nothing"
        raise UsageError(f"{path}: needs exactly one Workflow or WorkflowTemplate to submit "
                         f"(found {found})")
    document = kinds[0]
    problems = [str(p) for p in lint_document(document, str(path)) if not p.warning]
    if problems:
        raise UsageError(f"{path} does not pass sublimate lint:\n  " + "\n  ".join(problems))
    try:
        resolved = resolve_parameters(document, parameters)
    except ParameterError as error:
        raise UsageError(f"{path}: {error}") from error
    if document["kind"] == "Workflow" and parameters:
        for given in (document["spec"].get("arguments") or {}).get("parameters") or []:
            if given.get("name") in parameters:
                given["value"] = resolved[given["name"]]
    return document


def _documents(path: Path) -> list[dict]:
    """The documents of a manifest file, or the Hera Workflows a module defines."""
    if path.suffix == ".py":
        import runpy

        try:
            defined = runpy.run_path(str(path), run_name="sublimate_submit")
        except Exception as error:  # the user's module: its own error, in one line
            raise UsageError(f"{path}: importing it failed: {type(error).__name__}: "
                             f"{error}") from None
        from hera.workflows import Workflow

        return [value.to_dict() for value in defined.values() if isinstance(value, Workflow)]
    import yaml

    try:
        return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    except (OSError, yaml.YAMLError) as error:
        raise UsageError(f"{path}: not readable YAML: {error}") from None


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
            elif node.get("type") == "Suspend" and node.get("phase") == "Running":
                # a step waiting for a person: its message says how to resume it
                print(f"  {node.get('displayName', ''):<16} {'Waiting':<10} "
                      f"{node.get('message', '')}")
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
