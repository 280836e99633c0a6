"""``sublimate retry RUN`` and ``sublimate resubmit RUN``: a finished local run again, as
``argo retry`` and ``argo resubmit`` do it on a cluster (``pipelines/runner/reruns.py``).

``retry`` runs the failed nodes again, and what comes after them, in the run's own folder and
under its name; the nodes that succeeded keep their outputs and are not run. ``resubmit`` starts
a new run of the same manifest (``--memoized``: keeping what succeeded). Both run in the
foreground, as ``sublimate run`` does, and take its flags for what a run folder does not record
(``--objects``, ``--env``, ``--semaphore``, ``--mounts``, ``--containers``).

With ``--argo-server`` they ask an Argo Server instead (a cluster's, or ``sublimate server``),
as ``argo retry`` and ``argo resubmit`` do; ``--wait`` waits for the workflow's end.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from .common import EXIT_FAILED, UsageError, parse_parameter_flags


def add_rerun_commands(commands: Any) -> None:
    """Register ``retry`` and ``resubmit``."""
    retry = commands.add_parser(
        "retry", help="run a failed local run's failed steps again (argo retry)",
        description="Run the failed nodes of a finished local run again, with what comes "
                    "after them, in the same run folder; the nodes that succeeded keep their "
                    "outputs and do not run.")
    retry.add_argument("--restart-successful", action="store_true",
                       help="run the succeeded nodes --node-field-selector matches again too")
    retry.add_argument("--node-field-selector", default="", metavar="SELECTOR",
                       help="with --restart-successful: the nodes to run again, e.g. "
                            "displayName=evaluate, templateName=train (comma: and)")
    resubmit = commands.add_parser(
        "resubmit", help="run a local run's manifest again, as a new run (argo resubmit)",
        description="Start a new run of the manifest a local run ran; with --memoized, the "
                    "nodes that succeeded there are kept, as a retry keeps them.")
    resubmit.add_argument("--memoized", action="store_true",
                          help="keep what succeeded in the earlier run (it must have failed)")
    for parser, handler in ((retry, command_retry), (resubmit, command_resubmit)):
        parser.add_argument("run", metavar="RUN",
                            help="the run's name (a folder of $SUBLIMATE_HOME/runs/) or folder")
        parser.add_argument("-p", "--parameter", action="append", default=[],
                            metavar="NAME=VALUE",
                            help="override a workflow parameter (repeatable)")
        _add_run_flags(parser)
        remote = parser.add_argument_group("on an Argo Server instead (as argo retry/resubmit)")
        remote.add_argument("--argo-server", help="Argo Server host:port or URL: the workflow "
                                                  "RUN there, not a local run")
        remote.add_argument("--token", help="bearer token ($ARGO_TOKEN)")
        remote.add_argument("-n", "--namespace", help="namespace ($ARGO_NAMESPACE, default "
                                                      "sublimate)")
        remote.add_argument("-k", "--insecure", action="store_true",
                            help="skip TLS verification ($ARGO_INSECURE_SKIP_VERIFY)")
        remote.add_argument("-w", "--wait", action="store_true",
                            help="wait for the workflow to end")
        parser.set_defaults(handler=handler)


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    """What ``sublimate run`` was given that the run folder does not keep."""
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table",
                        help="final status format")
    parser.add_argument("--home", type=Path, default=None,
                        help="where runs are (default: $SUBLIMATE_HOME or ~/.sublimate)")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="show node phases only, not the steps' logs")
    parser.add_argument("--env", action="append", default=[], metavar="NAME[=VALUE]",
                        help="as for sublimate run: a variable passed to every step, masked")
    parser.add_argument("--objects", action="append", default=[], type=Path, metavar="DIR",
                        help="a folder of the Secret and ConfigMap manifests the steps read")
    parser.add_argument("--semaphore", action="append", default=[], metavar="CONFIGMAP/KEY=N",
                        help="limit of a synchronization semaphore (repeatable)")
    parser.add_argument("--parallelism", type=int, help="most nodes running at once")
    parser.add_argument("--mounts", choices=["auto", "overlay", "namespace", "rewrite"],
                        default="auto", help="how steps see files (as for sublimate run)")
    parser.add_argument("--containers", action="store_true",
                        help="run each step in its template's image (as for sublimate run)")


def run_folder(reference: str, home: Path) -> Path:
    """A run's folder from its name or its folder; ``UsageError`` if there is none."""
    from sublimate.pipelines.runner.records.run_folder import STATUS_FILE

    path = Path(reference).expanduser()
    if (path / STATUS_FILE).is_file() or (path / "workflow.yaml").is_file():
        return path.resolve()
    named = home / "runs" / reference
    if "/" not in reference and "\0" not in reference and (named / "workflow.yaml").is_file():
        return named
    raise UsageError(f"run {reference!r}: no such run (looked for the folder {path} and "
                     f"{named})")


def _options(args: argparse.Namespace) -> Any:
    from sublimate.pipelines.runner import RunOptions
    from sublimate.pipelines.runner.records.display import console_reporter

    from .local import max_nodes, parse_env_flags, semaphore_limits

    for folder in args.objects:
        if not folder.is_dir():
            raise UsageError(f"--objects {folder}: not a folder")
    objects = None
    if args.objects:
        from sublimate.pipelines.runner.pods.k8s_objects import manifest_objects

        objects = manifest_objects(None, list(args.objects))
    args.max_nodes = None
    return RunOptions(
        home=args.home, parallelism=args.parallelism, max_nodes=max_nodes(args),
        semaphores=semaphore_limits(args), objects=objects,
        reporter=console_reporter(sys.stderr, follow_logs=not args.quiet),
        follow_logs=not args.quiet, mounts=args.mounts,
        containers="auto" if args.containers else None, env=parse_env_flags(args.env))


def command_retry(args: argparse.Namespace) -> int:
    from sublimate.pipelines.runner.reruns import retry

    if args.argo_server:
        from sublimate.pipelines import argo_server

        return _on_server(args, lambda conn, parameters: argo_server.retry(
            conn, args.run, args.restart_successful, args.node_field_selector, parameters),
            "retried")
    folder = run_folder(args.run, args.home)
    return _rerun(args, lambda options, parameters: retry(
        folder, options, args.restart_successful, args.node_field_selector, parameters),
        f"retrying run {folder.name}")


def command_resubmit(args: argparse.Namespace) -> int:
    from sublimate.pipelines.runner.reruns import resubmit

    if args.argo_server:
        from sublimate.pipelines import argo_server

        return _on_server(args, lambda conn, parameters: argo_server.resubmit(
            conn, args.run, args.memoized, parameters), "resubmitted as")  # + its new name
    folder = run_folder(args.run, args.home)
    return _rerun(args, lambda options, parameters: resubmit(
        folder, options, args.memoized, parameters), f"resubmitting run {folder.name}")


def _on_server(args: argparse.Namespace, act: Any, done: str) -> int:
    """The retry or resubmit asked of Argo Server; with ``--wait``, its end awaited."""
    from sublimate.pipelines import argo_server

    conn = argo_server.connection(args.argo_server, args.token, args.namespace, args.insecure)
    name = act(conn, parse_parameter_flags(args.parameter))
    said = done if name == args.run else f"{done} {name}"
    print(f"{args.run}: {said} ({conn.url}/workflows/{conn.namespace}/{name})")
    if not args.wait:
        return 0
    phase = argo_server.wait(conn, name, lambda change: print(f"{name}: {change}"),
                             poll_seconds=1.0)
    return 0 if phase == "Succeeded" else EXIT_FAILED


def _rerun(args: argparse.Namespace, make: Any, doing: str) -> int:
    from sublimate.pipelines.runner import ManifestError, ParameterError, RunInterrupted
    from sublimate.pipelines.runner.templates.rerun import RerunError

    from .local import _signal_name, show_result

    parameters = parse_parameter_flags(args.parameter)
    try:
        rerun = make(_options(args), parameters)
    except (RerunError, ManifestError, ParameterError) as error:
        raise UsageError(str(error)) from error
    print(doing if rerun.run.name in doing else f"{doing} as {rerun.run.name}", file=sys.stderr)
    if rerun.kept:
        print(f"kept from the earlier run (not run again): {', '.join(rerun.kept)}",
              file=sys.stderr)
    if rerun.again:
        print(f"run again: {', '.join(rerun.again)}", file=sys.stderr)
    started = time.perf_counter()
    try:
        result = rerun.run.run()
    except RunInterrupted as stop:
        with contextlib.suppress(OSError):
            show_result(stop.result, args.output, time.perf_counter() - started)
            how = "terminated" if stop.terminated else "stopped"
            print(f"{how} by {_signal_name(stop.signal)}", file=sys.stderr)
        return 128 + stop.signal
    finally:
        rerun.close()
    show_result(result, args.output, time.perf_counter() - started)
    return 0 if result.phase == "Succeeded" else EXIT_FAILED
