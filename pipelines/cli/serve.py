"""``sublimate server``: Argo Server's REST API on this machine, workflows run by the local
runner (``sublimate.pipelines.server``). Flags as ``argo server``'s where they mean the same:
``--port`` (2746), ``--auth-mode client``'s bearer token."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from .common import UsageError

TOKEN_VARIABLE = "SUBLIMATE_AUTH_TOKEN"


def add_serve_command(commands: Any) -> None:
    """Register ``server``."""
    server = commands.add_parser(
        "server", help="serve Argo Server's API on this machine, workflows run locally",
        description="Serve the Argo Server REST API (workflows: create, lint, submit, get, "
                    "list, delete; WorkflowTemplates; version) on this machine; each workflow "
                    "runs as `sublimate run` runs it, its state in SUBLIMATE_HOME. Hera's "
                    "WorkflowsService and `sublimate submit/get/list` talk to it as to a "
                    "cluster's Argo Server.")
    server.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1; any other needs a token)")
    server.add_argument("--port", type=int, default=None,
                        help="port to listen on (default 2746, Argo Server's; 0: any free one)")
    server.add_argument("--auth-token", default=None,
                        help="require 'Authorization: Bearer TOKEN' on every request "
                             f"(${TOKEN_VARIABLE}; a flag shows in `ps`, the variable does not)")
    server.add_argument("-n", "--namespace", default="sublimate",
                        help="namespace of the runs `sublimate run` made, whose manifests name "
                             "none (default sublimate)")
    server.add_argument("--home", type=Path, default=None,
                        help="where runs live (default $SUBLIMATE_HOME or ~/.sublimate)")
    server.add_argument("--access-log", action="store_true", help="print one line per request")
    server.add_argument("--allow-privileged", action="store_true",
                        help="run workflows whose pods ask for privileged, added capabilities, "
                             "privilege escalation or sublimate.dev/local-privileged (e.g. "
                             "-p scheduler=local_netns); refused by default, as a cluster's "
                             "baseline Pod Security refuses them")
    server.set_defaults(handler=command_server)


def is_loopback(host: str) -> bool:
    import ipaddress  # only this command pays for it

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def command_server(args: argparse.Namespace) -> int:
    import signal
    import threading

    from sublimate.pipelines.server import DEFAULT_PORT, make_server

    token = args.auth_token or os.environ.get(TOKEN_VARIABLE) or None
    if not is_loopback(args.host) and token is None:
        raise UsageError(f"--host {args.host or '(all addresses)'}: not a loopback address; "
                         f"other machines could run anything on this one, so give a token "
                         f"(--auth-token or ${TOKEN_VARIABLE}) that clients send as "
                         f"'Authorization: Bearer TOKEN'")
    port = DEFAULT_PORT if args.port is None else args.port
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port}: must be between 0 and 65535")
    log = (lambda line: print(line, file=sys.stderr, flush=True)) if args.access_log else None
    try:
        server = make_server(args.home, args.host, port, token, args.namespace, log,
                             allow_privileged=args.allow_privileged)
    except OSError as error:
        raise UsageError(f"--host {args.host} --port {port}: cannot listen there: "
                         f"{error.strerror or error}") from error
    host, bound = server.server_address[:2]
    print(f"sublimate server: Argo Server API on http://{host}:{bound} "
          f"(runs in {args.home}{', token required' if token else ''})", flush=True)

    def stop(signum: int, _frame: object) -> None:
        # serve_forever runs in this (the main) thread: shutdown() waits for it, so from
        # another thread
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        # What was running ends Failed, saying why, rather than being killed unrecorded.
        from sublimate.pipelines.server.execution import SERVER_STOPPED

        cron_scheduler = getattr(server, "cron_scheduler", None)
        if cron_scheduler is not None:
            cron_scheduler.stop()  # no schedule fires while the server ends its runs
        server.launcher.stop_all(SERVER_STOPPED, wait_s=10)
        server.server_close()
    print("sublimate server: stopped", flush=True)
    return 0
