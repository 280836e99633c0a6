"""The Hera script for CI: render, lint and, when an Argo Server is configured, smoke-test.

    python -m sublimate.pipelines.ci_smoke [--output-dir argo] [-p name=value ...]

1. renders every manifest from the Hera definitions into ``--output-dir``;
2. lints them (Argo's schema, strict, plus references, cycles and parameters);
3. if ``ARGO_SERVER`` is set (with ``ARGO_TOKEN`` and ``ARGO_NAMESPACE`` as for the argo CLI):
   creates or updates the WorkflowTemplates and CronWorkflows, submits a short smoke run of the
   train pipeline (1 epoch unless overridden) and waits for it, failing if it fails.

Exit status: 0 when every stage that ran passed. See ``.github/workflows/argo-smoke.yml``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

SMOKE_PARAMETERS = {"epochs": "1", "nodes": "2"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ci_smoke", description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, default=Path("argo"))
    parser.add_argument("-p", "--parameter", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--poll-seconds", type=float, default=10.0)
    args = parser.parse_args(argv)

    from sublimate.pipelines import argo_server
    from sublimate.pipelines.cli import parse_parameter_flags
    from sublimate.pipelines.lint import lint_paths
    from sublimate.pipelines.render import argo_documents, render_all

    for path, changed in render_all(args.output_dir):
        print(f"rendered {path}{' (changed)' if changed else ''}")
    problems, documents = lint_paths([args.output_dir])
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    print(f"lint: {documents} Argo documents passed")
    if not os.environ.get("ARGO_SERVER"):
        print("no Argo Server configured (ARGO_SERVER): rendered and linted only")
        return 0
    conn = argo_server.connection(None, None, None)
    try:
        for done in argo_server.install(conn, argo_documents()):
            print(f"installed {done}")
        parameters = {**SMOKE_PARAMETERS, **parse_parameter_flags(args.parameter)}
        name = argo_server.submit(conn, "sublimate-train", parameters,
                                  labels={"sublimate.dev/smoke": "true"})
        print(f"submitted {name}", flush=True)
        phase = argo_server.wait(conn, name, lambda p: print(f"{name}: {p}", flush=True),
                                 poll_seconds=args.poll_seconds)
    except argo_server.ArgoServerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0 if phase == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
