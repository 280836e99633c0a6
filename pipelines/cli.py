"""The ``sublimate`` command line, shaped like the ``argo`` CLI.

Each subcommand imports only what it needs: ``sublimate run FILE.yaml`` must start in tens of
milliseconds, so Hera, torch and jsonschema are loaded only by the commands that use them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from sublimate.pipelines.argo_server import ArgoServerError

DEFAULT_PIPELINE = "train"
EXIT_FAILED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def default_home() -> Path:
    return Path(os.environ.get("SUBLIMATE_HOME") or Path.home() / ".sublimate")


def parse_parameter_flags(flags: list[str]) -> dict[str, str]:
    parameters: dict[str, str] = {}
    for flag in flags:
        name, separator, value = flag.partition("=")
        if not separator or not name.strip():
            raise UsageError(f"-p '{flag}': expected name=value")
        parameters[name.strip()] = value
    return parameters


def read_parameter_file(path: Path) -> dict[str, str]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise UsageError(f"--parameter-file {path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise UsageError(f"--parameter-file {path}: not valid YAML/JSON: {error}") from error
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"--parameter-file {path}: expected a mapping of name: value")
    parameters = {}
    for name, value in data.items():
        if isinstance(value, dict | list):
            raise UsageError(f"--parameter-file {path}: parameter '{name}' must be a scalar")
        parameters[str(name)] = str(value).lower() if isinstance(value, bool) else str(value)
    return parameters


def load_workflow(target: str) -> dict[str, Any]:
    """A pipeline name renders its Hera definition; anything else is read as a manifest file."""
    from sublimate.pipelines.render import PIPELINES

    if target in PIPELINES:
        from sublimate.pipelines.render import render_dict

        return render_dict(target)
    path = Path(target)
    if not path.exists():
        raise UsageError(f"'{target}' is neither a pipeline ({', '.join(sorted(PIPELINES))}) "
                         "nor an existing manifest file")
    from sublimate.pipelines.runner import ManifestError, load_manifest

    try:
        return load_manifest(path)
    except (ManifestError, OSError) as error:
        raise UsageError(f"{target}: {error}") from error


def check_settings(workflow: dict[str, Any], parameters: dict[str, str]) -> None:
    """For a sublimate pipeline: its parameters as the runner resolves them, then its
    cross-setting rules, so a bad combination is refused in one line before any step runs or a
    run folder exists. Other manifests are checked by the runner itself."""
    from sublimate.components.settings import SettingError
    from sublimate.pipelines.render import parameter_check
    from sublimate.pipelines.runner import ParameterError, resolve_parameters

    check = parameter_check(workflow)
    if check is None:
        return
    try:
        check(resolve_parameters(workflow, parameters))
    except (ParameterError, SettingError) as error:
        raise UsageError(str(error)) from error


def command_run(args: argparse.Namespace) -> int:
    from sublimate.pipelines.lint import semantic_problems
    from sublimate.pipelines.runner import (
        ManifestError,
        ParameterError,
        RunOptions,
        console_reporter,
        format_table,
        run_workflow,
    )

    parameters = read_parameter_file(args.parameter_file) if args.parameter_file else {}
    parameters.update(parse_parameter_flags(args.parameter))
    workflow = load_workflow(args.target)
    if problems := semantic_problems(workflow, source=args.target):
        raise UsageError("the manifest is invalid:\n  " + "\n  ".join(map(str, problems)))
    check_settings(workflow, parameters)
    if args.dry_run:
        return dry_run(workflow, parameters, args.home)
    options = RunOptions(
        home=args.home,
        parallelism=args.parallelism,
        # progress goes to stderr, so `-o json` keeps stdout machine-readable
        reporter=console_reporter(sys.stderr, follow_logs=not args.quiet),
        follow_logs=not args.quiet,
    )
    started = time.perf_counter()
    try:
        result = run_workflow(workflow, parameters, options)
    except (ManifestError, ParameterError) as error:
        raise UsageError(str(error)) from error
    if args.output == "json":
        print(json.dumps(result.to_json(), indent=2, sort_keys=True))
    else:
        print(format_table(result))
        print(format_results(result, time.perf_counter() - started))
    if result.phase != "Succeeded":
        report_failures(result)
    return 0 if result.phase == "Succeeded" else EXIT_FAILED


def dry_run(workflow: dict[str, Any], parameters: dict[str, str], home: Path) -> int:
    """``run --dry-run``: what would start first and what decides the rest; runs nothing and
    creates no run folder."""
    from sublimate.pipelines.runner import ManifestError, ParameterError
    from sublimate.pipelines.runner.preview import format_preview, preview_workflow

    try:
        preview = preview_workflow(workflow, parameters, home)
    except (ManifestError, ParameterError) as error:
        raise UsageError(str(error)) from error
    print(format_preview(preview))
    return 0


def format_results(result: Any, seconds: float) -> str:
    """Where everything is: the workflow's outputs (Argo's ``status.outputs``, as in ``-o json``),
    the run folder, and the folders it links to, never shortened."""
    from sublimate.components.run_files import holds_results

    lines = []
    if outputs := (result.outputs.get("parameters") or {}):
        lines.append("outputs: " + ", ".join(f"{k}={v}" for k, v in outputs.items()))
    lines.append(f"run folder: {result.run_dir} ({seconds:.1f}s)")
    for link in result.links.values():
        target = Path(link).resolve()
        held = sorted(entry.name + ("/" if entry.is_dir() else "")
                      for entry in target.iterdir()) if target.is_dir() else []
        shown = ", ".join(held[:6]) + (", ..." if len(held) > 6 else "")
        lines.append(f"  {link.relative_to(result.run_dir)} -> {target}"
                     + (f"  ({shown})" if shown else ""))
        if holds_results(target):
            lines.append(f"report: sublimate report {result.run_dir}")
    return "\n".join(lines)


def report_failures(result: Any, lines: int = 8) -> None:
    """Say why the run failed: the message and the end of each failed step's log."""
    print(f"error: {result.message or result.phase}", file=sys.stderr)
    for node in result.nodes:
        if node.phase in ("Failed", "Error") and node.log and not node.children:
            log = Path(node.log)
            tail = log.read_text(errors="replace").splitlines()[-lines:] if log.is_file() else []
            print(f"--- {node.display_name}: {node.message} (log: {log})", file=sys.stderr)
            for line in tail:
                print(f"    {line}", file=sys.stderr)


def command_render(args: argparse.Namespace) -> int:
    from sublimate.pipelines.render import render_all

    if args.check and not args.output_dir.is_dir():
        raise UsageError(f"render --check: there is no {args.output_dir}/ folder here to check; "
                         "run it in a sublimate checkout or pass --output-dir")
    results = render_all(args.output_dir, check=args.check)
    for path, changed in results:
        state = ("differs from the Hera source" if args.check else "written") if changed \
            else "up to date"
        print(f"{path}: {state}")
    if args.check and any(changed for _, changed in results):
        print("error: rendered manifests are stale; run `sublimate render`", file=sys.stderr)
        return EXIT_FAILED
    return 0


def command_lint(args: argparse.Namespace) -> int:
    from sublimate.pipelines.lint import lint_files

    problems, documents, skipped = lint_files(args.paths or ["argo"], strict=args.strict)
    for problem in problems:
        print(problem)
    for source in skipped:
        print(f"{source}: skipped (no Workflow, WorkflowTemplate or CronWorkflow in it)",
              file=sys.stderr)
    if problems:
        print(f"{len(problems)} problem(s) in {documents} Argo document(s)", file=sys.stderr)
        return EXIT_FAILED
    if documents == 0:
        print("error: no Workflow, WorkflowTemplate or CronWorkflow documents found",
              file=sys.stderr)
        return EXIT_FAILED
    print(f"{documents} Argo document(s) passed lint")
    return 0


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

    for line in argo_server.logs(_connection(args), args.name, follow=args.follow):
        print(line, flush=True)
    return 0


class _RunHelp(argparse.Action):
    """``run --help``: the flags, then every parameter of the default pipeline with its default.

    The list is built only when asked for: it imports the Hera definition, which `run` itself
    must not pay for."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        from sublimate.pipelines.parameters import describe_parameters
        from sublimate.pipelines.train import pipeline_parameters

        parser.print_help()
        print(f"\nparameters of the '{DEFAULT_PIPELINE}' pipeline (-p NAME=VALUE):")
        print(describe_parameters(pipeline_parameters()))
        parser.exit()


def _add_server_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--argo-server", help="Argo Server host:port or URL ($ARGO_SERVER)")
    parser.add_argument("--token", help="bearer token ($ARGO_TOKEN)")
    parser.add_argument("-n", "--namespace", help="namespace ($ARGO_NAMESPACE, default "
                                                  "sublimate)")
    parser.add_argument("-k", "--insecure", action="store_true",
                        help="skip TLS verification ($ARGO_INSECURE_SKIP_VERIFY)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sublimate",
        description="Distributed training pipelines on Argo Workflows, runnable on one machine.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run", help="run a pipeline or a rendered manifest locally (no Kubernetes needed)",
        description="Execute a pipeline's rendered Argo manifest on this machine.",
        add_help=False)
    run.add_argument("-h", "--help", action=_RunHelp, nargs=0,
                     help="show this help and the default pipeline's parameters, then exit")
    run.add_argument("target", nargs="?", default=DEFAULT_PIPELINE,
                     help=f"pipeline name or manifest file (default: {DEFAULT_PIPELINE})")
    run.add_argument("-p", "--parameter", action="append", default=[], metavar="NAME=VALUE",
                     help="set a workflow parameter (repeatable)")
    run.add_argument("--parameter-file", "-f", type=Path,
                     help="YAML or JSON file of parameter values (-p wins)")
    run.add_argument("-o", "--output", choices=["table", "json"], default="table",
                     help="final status format (json: for scripts and CI)")
    run.add_argument("--home", type=Path, default=None,
                     help="folder for run folders and local volumes "
                          "(default: $SUBLIMATE_HOME or ~/.sublimate)")
    run.add_argument("--parallelism", type=int, help="most nodes running at once")
    run.add_argument("--quiet", "-q", action="store_true",
                     help="show node phases only, not the steps' logs")
    run.add_argument("--dry-run", action="store_true",
                     help="print what would start first (commands, env, mounts, deadlines) and "
                          "what decides the rest; start nothing, create no run folder")
    run.set_defaults(handler=command_run)

    render = commands.add_parser("render", help="write the pipelines' Argo manifests")
    render.add_argument("--output-dir", type=Path, default=Path("argo"))
    render.add_argument("--check", action="store_true",
                        help="write nothing; fail if the files differ from the Hera source")
    render.set_defaults(handler=command_render)

    lint = commands.add_parser("lint", help="validate Argo manifests offline")
    lint.add_argument("paths", nargs="*", help="files or folders (default: argo/)")
    lint.add_argument("--no-strict", dest="strict", action="store_false",
                      help="allow fields Argo's schema does not define")
    lint.set_defaults(handler=command_lint)

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
    logs.add_argument("--follow", "-f", action="store_true")
    _add_server_flags(logs)
    logs.set_defaults(handler=command_logs)

    from sublimate.pipelines.data_cli import add_data_commands
    from sublimate.pipelines.report import add_report_command

    add_data_commands(commands)
    add_report_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "home", "unset") is None:
        args.home = default_home()
    try:
        return args.handler(args)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except ArgoServerError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
