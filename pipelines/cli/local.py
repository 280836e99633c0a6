"""Commands that work on this machine: ``run`` (and ``run --dry-run``), ``render``, ``lint``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import (
    DEFAULT_PIPELINE,
    EXIT_FAILED,
    UsageError,
    check_settings,
    check_tracking_server,
    parse_parameter_flags,
    read_parameter_file,
)

if TYPE_CHECKING:
    from sublimate.pipelines.runner.pods.k8s_objects import ObjectLibrary


def _positive(text: str) -> int:
    """A whole number above 0 (``--max-nodes``)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number above 0")
    return value


def add_local_commands(commands: Any) -> None:
    """Register ``run``, ``render`` and ``lint``."""
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
    run.add_argument("--env", action="append", default=[], metavar="NAME[=VALUE]",
                     help="pass a variable of this shell (NAME), or NAME=VALUE, to every step "
                          "(repeatable); nothing else of this shell's environment reaches a "
                          "step, and its value is masked as a secret in every output")
    run.add_argument("-o", "--output", choices=["table", "json"], default="table",
                     help="final status format (json: for scripts and CI)")
    run.add_argument("--home", type=Path, default=None,
                     help="folder for run folders and local volumes "
                          "(default: $SUBLIMATE_HOME or ~/.sublimate)")
    run.add_argument("--parallelism", type=int, help="most nodes running at once")
    run.add_argument("--max-nodes", type=_positive, default=None, metavar="N",
                     help="most nodes the run may make (default 10,000): a loop that would "
                          "pass it is refused, a run that reaches it stops")
    run.add_argument("--semaphore", action="append", default=[], metavar="CONFIGMAP/KEY=N",
                     help="limit of a synchronization semaphore (default: a ConfigMap of that "
                          "name in the manifest's folder or an --objects folder); repeatable")
    run.add_argument("--objects", action="append", default=[], type=Path, metavar="DIR",
                     help="a folder of Secret and ConfigMap manifests the steps read (env, "
                          "envFrom, volumes) and semaphores' ConfigMaps (repeatable; the "
                          "manifest's own folder and --templates folders are always searched)")
    run.add_argument("--quiet", "-q", action="store_true",
                     help="show node phases only, not the steps' logs")
    run.add_argument("--templates", action="append", default=[], type=Path, metavar="DIR",
                     help="a folder of WorkflowTemplates and ClusterWorkflowTemplates the "
                          "manifest refers to (repeatable; the manifest's own folder is always "
                          "searched)")
    run.add_argument("--mounts", choices=["auto", "overlay", "namespace", "rewrite"],
                     default="auto",
                     help="how steps see files: overlay gives each step a private view of the "
                          "whole tree (its writes its own, as a container's root filesystem; "
                          "its volumes, inputs and script at the manifest's paths; Linux, "
                          "root), namespace mounts the run's folders at the manifest's paths "
                          "in a private mount namespace, sharing this machine's files (root or "
                          "user namespaces), rewrite rewrites the paths where written; auto: "
                          "the first of these that works here")
    run.add_argument("--containers", action="store_true",
                     help="run each step in its template's image, as Argo would, through the "
                          "first container engine that works here (docker, podman, buildah); "
                          "every image must be present locally: nothing is pulled (the "
                          "runtime image of sublimate's pipelines: build it first with "
                          "images/build.sh)")
    run.add_argument("--container-engine", choices=["docker", "podman", "buildah"],
                     help="the engine for --containers (implies it)")
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


def load_workflow(target: str, template_dirs: list[Path] | None = None,
                  images: bool = False) -> dict[str, Any]:
    """A pipeline name renders its Hera definition; anything else is read as a manifest file,
    with the templates it refers to from its folder and ``template_dirs``. What the manifest
    holds that one local run does not apply (a CronWorkflow's schedule) is said once, on
    stderr; ``images``: the steps run in their images (``--containers``), which applies the
    containers' ``image`` and ``securityContext``."""
    from sublimate.pipelines.render import PIPELINES

    if target in PIPELINES:
        from sublimate.pipelines.render import runnable_dict

        return runnable_dict(target)
    path = Path(target)
    if not path.exists():
        raise UsageError(f"'{target}' is neither a pipeline ({', '.join(sorted(PIPELINES))}) "
                         "nor an existing manifest file")
    from sublimate.pipelines.runner import ManifestError, load_manifest

    notes: list[str] = []
    try:
        workflow = load_manifest(path, template_dirs=template_dirs or (), notes=notes,
                                 applied=("image", "securityContext", "runAsUser", "runAsGroup",
                                          "runAsNonRoot") if images else ())
    except (ManifestError, OSError) as error:
        raise UsageError(f"{target}: {error}") from error
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return workflow


def semaphore_limits(args: argparse.Namespace) -> dict[str, int]:
    """``--semaphore`` limits (the runner falls back on the ConfigMap manifests it finds)."""
    limits: dict[str, int] = {}
    semaphores = getattr(args, "semaphore", None) or []
    if not semaphores:
        return limits  # nothing to parse: the module stays unloaded
    from sublimate.pipelines.runner.templates.synchronization import parse_semaphore_option

    for text in semaphores:
        try:
            name, limit = parse_semaphore_option(text)
        except ValueError as error:
            raise UsageError(str(error)) from error
        limits[name] = limit
    return limits


def kube_objects(workflow: dict[str, Any], args: argparse.Namespace) -> ObjectLibrary | None:
    """The Secrets and ConfigMaps the steps and semaphores may read: beside the manifest, in
    ``--templates`` and ``--objects`` folders (read only when a pod or semaphore names one).
    None for a workflow that mentions neither kind and no ``--objects``: ``k8s_objects`` then
    stays unloaded (a plain run imports only what it uses: tests/pipelines/cli/
    test_run_imports.py)."""
    text = json.dumps(workflow.get("spec") or {})
    if not args.objects and '"secret' not in text and '"configMap' not in text:
        return None
    from sublimate.pipelines.runner.pods.k8s_objects import manifest_objects

    target = Path(args.target)
    return manifest_objects(target if target.is_file() else None,
                            [*args.templates, *args.objects])


def command_run(args: argparse.Namespace) -> int:
    from sublimate.pipelines.lint.semantics import semantic_problems
    from sublimate.pipelines.runner import (
        ManifestError,
        ParameterError,
        RunInterrupted,
        RunOptions,
        settle_interrupted_runs,
    )
    from sublimate.pipelines.runner.engine import run_workflow
    from sublimate.pipelines.runner.records.display import console_reporter

    parameters = read_parameter_file(args.parameter_file) if args.parameter_file else {}
    parameters.update(parse_parameter_flags(args.parameter))
    passed_env = parse_env_flags(args.env)
    containers = args.container_engine or ("auto" if args.containers else None)
    if containers is not None and args.mounts != "auto":
        raise UsageError("--mounts does not apply with --containers: each step's folders are "
                         "bound at the manifest's paths in its own image")
    workflow = load_workflow(args.target, args.templates, images=containers is not None)
    if problems := semantic_problems(workflow, source=args.target):
        raise UsageError("the manifest is invalid:\n  " + "\n  ".join(map(str, problems)))
    check_settings(workflow, parameters)
    if args.mounts in ("overlay", "namespace"):  # before a run folder exists
        from sublimate.pipelines.runner.pods.mount_modes import NamespaceError, resolve

        try:
            resolve(args.mounts, True, args.home, args.home)
        except NamespaceError as error:
            raise UsageError(str(error)) from error
    if args.dry_run:
        if containers is not None:
            print("note: --dry-run shows the steps as local processes; --containers runs the "
                  "same commands in their images", file=sys.stderr)
        return dry_run(workflow, parameters, args, passed_env)
    check_tracking_server(workflow, parameters)  # a dry run asks no server
    for folder in args.objects:
        if not folder.is_dir():
            raise UsageError(f"--objects {folder}: not a folder")
    options = RunOptions(
        home=args.home,
        parallelism=args.parallelism,
        max_nodes=max_nodes(args),
        semaphores=semaphore_limits(args),
        objects=kube_objects(workflow, args),
        # progress goes to stderr, so `-o json` keeps stdout machine-readable
        reporter=console_reporter(sys.stderr, follow_logs=not args.quiet),
        follow_logs=not args.quiet,
        mounts=args.mounts,
        containers=containers,
        env=passed_env,
    )
    # A run whose runner was killed still says Running in its status.json: say what happened
    # to it (and record it there) before this one starts.
    for interrupted in settle_interrupted_runs(args.home):
        print(f"note: run {interrupted.name} was interrupted: {interrupted.message}; "
              f"marked Failed ({interrupted.run_dir})", file=sys.stderr)
    started = time.perf_counter()
    try:
        result = run_workflow(workflow, parameters, options)
    except (ManifestError, ParameterError) as error:
        raise UsageError(str(error)) from error
    except RunInterrupted as stop:
        # The terminal may be gone (SIGHUP): the run folder has the status either way.
        with contextlib.suppress(OSError):
            show_result(stop.result, args.output, time.perf_counter() - started)
            how = "terminated" if stop.terminated else "stopped"
            print(f"{how} by {_signal_name(stop.signal)}", file=sys.stderr)
        return 128 + stop.signal  # the shell's convention for a command ended by a signal
    show_result(result, args.output, time.perf_counter() - started)
    return 0 if result.phase == "Succeeded" else EXIT_FAILED


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env_flags(flags: list[str]) -> dict[str, str]:
    """``--env NAME`` (its value from this shell, as ``docker run -e NAME`` takes it) or
    ``--env NAME=VALUE``: what the user passes to every pod; a bad one is a ``UsageError``."""
    passed: dict[str, str] = {}
    for flag in flags:
        name, separator, value = flag.partition("=")
        if not _ENV_NAME.fullmatch(name):
            # a shell's rule: a name the shell could not export is a typo (or a value);
            # the message names the name only, as what follows `=` may be a secret
            raise UsageError(f"--env {name!r}: not a variable name (letters, digits and _, "
                             "not starting with a digit)")
        if not separator:
            if name not in os.environ:
                raise UsageError(f"--env {name}: not set in this shell (export it, or give "
                                 f"--env {name}=VALUE)")
            value = os.environ[name]
        passed[name] = value
    return passed


def show_result(result: Any, output: str, seconds: float) -> None:
    """The final status (a table, or JSON on stdout) and, for a failed run, why."""
    from sublimate.pipelines.runner import format_table

    if output == "json":
        print(json.dumps(result.to_json(), indent=2, sort_keys=True))
    else:
        # a failed run's message is its last line (report_failures), not said twice at its end
        print(format_table(result, with_message=result.phase == "Succeeded"))
        print(format_results(result, seconds))
    if result.phase != "Succeeded":
        report_failures(result)


def _signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def max_nodes(args: argparse.Namespace) -> int:
    """``--max-nodes``, else the runner's default cap."""
    from sublimate.pipelines.runner.records.run_types import DEFAULT_MAX_NODES

    return int(args.max_nodes or DEFAULT_MAX_NODES)


def dry_run(workflow: dict[str, Any], parameters: dict[str, str],
            args: argparse.Namespace, passed_env: dict[str, str] | None = None) -> int:
    """``run --dry-run``: what would start first and what decides the rest; runs nothing and
    creates no run folder. ``passed_env`` (``--env``) is shown by name only."""
    from sublimate.pipelines.runner import ManifestError, ParameterError
    from sublimate.pipelines.runner.preview import format_preview, preview_workflow

    try:
        preview = preview_workflow(workflow, parameters, args.home, kube_objects(workflow, args),
                                   max_nodes=max_nodes(args),
                                   passed_env=list(passed_env or {}))
    except (ManifestError, ParameterError) as error:
        raise UsageError(str(error)) from error
    print(format_preview(preview))
    return 0


def format_results(result: Any, seconds: float) -> str:
    """Where everything is: the workflow's outputs (Argo's ``status.outputs``, as in ``-o json``),
    the run folder, and the folders it links to, never shortened."""
    from sublimate.components.base import run_files

    lines = []
    if outputs := (result.outputs.get("parameters") or {}):
        lines.append("outputs: " + ", ".join(f"{k}={v}" for k, v in outputs.items()))
    lines.append(f"run folder: {result.run_dir} ({seconds:.1f}s)")
    for link in result.links.values():
        target = Path(link).resolve()
        held = sorted(entry.name + ("/" if entry.is_dir() else "")
                      for entry in target.iterdir()) if target.is_dir() else []
        # A run's results: what a user came for first, then how much else is there.
        key = [f"{name}/" if f"{name}/" in held else name for name in (
            run_files.MODEL, run_files.EVALUATION, run_files.REPORT, run_files.SUMMARY)
            if name in held or f"{name}/" in held]
        shown = key or held[:6]
        more = len(held) - len(shown)
        listing = ", ".join(shown) + (f" and {more} more" if more > 0 else "")
        lines.append(f"  {link.relative_to(result.run_dir)} -> {target}"
                     + (f"  ({listing})" if listing else ""))
        if run_files.holds_results(target):
            lines.append(f"report: sublimate report {result.run_dir}")
    return "\n".join(lines)


# A node message that says only how the step ended, not why (no termination message).
_BARE_ENDING = re.compile(r"(Error|Failed)( \(exit code -?\d+\))?")


def report_failures(result: Any, lines: int = 8) -> None:
    """Say why the run failed: the message, and for each failed step whose own one-line
    message is not already that message, its message and the end of its log."""
    print(f"error: {result.message or result.phase}", file=sys.stderr)
    for node in result.nodes:
        said = bool(node.message) and not _BARE_ENDING.fullmatch(node.message) \
            and node.message in (result.message or "")
        if node.phase in ("Failed", "Error") and node.log and not node.children and not said:
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
    errors = [problem for problem in problems if not problem.warning]
    if errors:
        print(f"{len(errors)} problem(s) in {documents} document(s)", file=sys.stderr)
        return EXIT_FAILED
    if documents == 0:
        print("error: no Workflow, WorkflowTemplate or CronWorkflow documents found",
              file=sys.stderr)
        return EXIT_FAILED
    warnings = len(problems) - len(errors)
    print(f"{documents} document(s) passed lint"
          + (f", with {warnings} warning(s)" if warnings else ""))
    return 0


class _RunHelp(argparse.Action):
    """``run --help``: the flags, then every parameter of the default pipeline with its default.

    The list is built only when asked for: it imports the Hera definition, which `run` itself
    must not pay for."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        from sublimate.pipelines.sublimate_train import pipeline_parameters
        from sublimate.pipelines.typed_parameters import describe_parameters

        parser.print_help()
        print(f"\nparameters of the '{DEFAULT_PIPELINE}' pipeline (-p NAME=VALUE):")
        print(describe_parameters(pipeline_parameters()))
        parser.exit()
