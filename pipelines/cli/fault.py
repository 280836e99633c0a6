"""``sublimate fault ...``: kill, cut off or slow down a node of a running ``local_netns`` job.

Shaped like ``argo``'s verbs on a workflow: ``sublimate fault kill RUN --node 1``,
``fault cut RUN --node 1 --for 20s``, ``fault slow RUN --node 2 --cpu 0.25 [--for 30s]``,
``fault restore RUN --node 2``, ``fault list RUN``. RUN is the run folder (its ``logs/`` is the
job's TorchX log_dir), a job's log folder or its ``cluster.json``, or a run id / workflow name
as ``sublimate report`` takes it. The work is :mod:`sublimate.components.launch.faults`; see
docs/local-cluster.md. Needs root, like the ``local_netns`` scheduler itself.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .common import UsageError

if TYPE_CHECKING:
    from sublimate.components.launch.netns_cluster import Cluster

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)?")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """``20s``, ``1.5m``, ``500ms``, or plain seconds (argparse type: a bad value is a usage
    error naming the flag)."""
    match = _DURATION.fullmatch(text.strip())
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a duration: expected e.g. 20s, 500ms, 2m")
    return float(match.group(1)) * _SECONDS[match.group(2) or "s"]


def cores(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a CPU share: expected cores, e.g. 0.25 (a quarter of one core)")
    return value


def add_fault_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register ``fault kill|cut|slow|restore|list`` on the main CLI's subparsers."""
    fault = subparsers.add_parser(
        "fault", help="kill, cut off or slow down a node of a running local_netns job",
        description="Inject faults into a job running on the local_netns TorchX scheduler "
                    "(one network namespace per node). Needs root.")
    commands = fault.add_subparsers(dest="fault_command", required=True, metavar="FAULT")

    def command(name: str, summary: str, handler: object,
                node: bool = True) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=summary, description=summary)
        parser.add_argument("run", metavar="RUN",
                            help="the run folder (whose logs/ is the job's log_dir), a job's log "
                                 "folder or cluster.json, or a run id / workflow name")
        parser.add_argument("--app", default=None,
                            help="the TorchX app id, when RUN holds several running jobs")
        if node:
            parser.add_argument("--node", type=int, required=True,
                                help="the node's index (`sublimate fault list RUN` shows them)")
        parser.set_defaults(handler=handler)
        return parser

    kill = command("kill", "kill every process of a node at once (SIGKILL its PID-namespace "
                           "init); with --every or --mtbf, again and again", command_kill,
                   node=False)
    kill.add_argument("--node", type=int, default=None,
                      help="the node's index (`sublimate fault list RUN` shows them); with "
                           "--every or --mtbf, default: a training node drawn at random each "
                           "time")
    repeat = kill.add_mutually_exclusive_group()
    repeat.add_argument("--every", type=duration, default=None,
                        help="kill again after each such interval, e.g. 20s (the command "
                             "waits; each kill waits for its node to be back)")
    repeat.add_argument("--mtbf", type=duration, default=None,
                        help="kill at exponentially distributed intervals of this mean, e.g. "
                             "30s: failures at a fleet's rate")
    kill.add_argument("--count", type=int, default=0,
                      help="with --every/--mtbf: stop after this many kills (0: until the job "
                           "ends or Ctrl-C)")
    kill.add_argument("--seed", type=int, default=0,
                      help="with --mtbf or a random node: the schedule's seed")
    cut = command("cut", "take a node's link down, and bring it back up after --for",
                  command_cut)
    cut.add_argument("--for", dest="seconds", type=duration, required=True,
                     help="how long the link stays down, e.g. 20s (the command waits)")
    slow = command("slow", "cap a node's CPU (and/or delay its link, where netem exists)",
                   command_slow)
    slow.add_argument("--cpu", type=cores, default=None,
                      help="CPU quota in cores for all the node's processes, e.g. 0.25")
    slow.add_argument("--delay", default=None,
                      help="extra delay on the node's outgoing traffic, e.g. 50ms (needs netem)")
    slow.add_argument("--for", dest="seconds", type=duration, default=None,
                      help="undo after this long (the command waits); default: until "
                           "`fault restore` or the job's end")
    command("restore", "undo slow and cut on a node", command_restore)
    listing = command("list", "the job's nodes: address, state, active faults", command_list,
                      node=False)
    listing.add_argument("--json", action="store_true", help="print JSON")


def _cluster(args: argparse.Namespace, running: bool = True) -> Cluster:
    """The job RUN names: a path first, else a run id or workflow name (``sublimate report``'s
    lookup, whose result folder holds the train step's logs/)."""
    from sublimate.components.launch import netns_cluster
    from sublimate.pipelines.run_lookup import ReportError, resolve_run, results_of_runner_folder

    reference = Path(args.run).expanduser()
    try:
        if (reference / "status.json").is_file():  # the run folder `sublimate run` printed
            reference = results_of_runner_folder(reference, require_results=False)
        elif not reference.exists() and "/" not in args.run:
            try:
                reference = resolve_run(args.run)
            except ReportError as error:
                raise UsageError(str(error)) from error
        if running:
            return netns_cluster.load_running(reference, args.app)
        return netns_cluster.Cluster.load(netns_cluster.find_cluster(reference, args.app))
    except netns_cluster.FaultError as error:
        raise UsageError(str(error)) from error


def _node(cluster: Cluster, index: int) -> str:
    node = cluster.nodes[index] if 0 <= index < len(cluster.nodes) else None
    return f"node {index} ({node.addr})" if node else f"node {index}"


def _act(action: object, *args: object, **kwargs: object) -> None:
    from sublimate.components.launch.netns_cluster import FaultError

    try:
        action(*args, **kwargs)  # type: ignore[operator]
    except FaultError as error:
        raise UsageError(str(error)) from error


def command_kill(args: argparse.Namespace) -> int:
    from sublimate.components.launch import faults

    cluster = _cluster(args)
    if args.every is None and args.mtbf is None:
        if args.node is None:
            raise UsageError("fault kill: give --node N (or --every/--mtbf to kill repeatedly)")
        _act(faults.kill_node, cluster, args.node)
        print(f"fault: killed {_node(cluster, args.node)} of {cluster.app_id}")
        return 0
    return _kill_repeatedly(args, cluster)


def _kill_repeatedly(args: argparse.Namespace, cluster: Cluster) -> int:
    """``fault kill --every/--mtbf``: chaos from this terminal until the job ends, ``--count``
    kills or Ctrl-C."""
    from sublimate.components.launch import netns_cluster
    from sublimate.components.launch.chaos import Chaos

    if args.count < 0:
        raise UsageError(f"fault kill: --count {args.count}: give 0 (no limit) or more kills")
    if args.node is not None:
        _act(cluster.node, args.node)  # one that the job has
    how = f"every {args.every:g}s" if args.every else f"every {args.mtbf:g}s on average"
    which = _node(cluster, args.node) if args.node is not None else "a random training node"
    print(f"fault: killing {which} of {cluster.app_id} {how}"
          + (f", {args.count} times" if args.count else " until the job ends") + " (Ctrl-C "
          "stops)", flush=True)

    def killed(kill: object) -> None:
        print(f"fault: killed {_node(cluster, kill.node)} "  # type: ignore[attr-defined]
              f"({time.strftime('%H:%M:%S', time.localtime(kill.time))})",  # type: ignore[attr-defined]
              flush=True)

    chaos = Chaos(cluster.path, every=args.every, mtbf=args.mtbf, node=args.node,
                  max_kills=args.count, seed=args.seed, on_kill=killed).start()
    try:
        while not chaos.wait(timeout=0.5):
            if netns_cluster.Cluster.load(cluster.path).state != netns_cluster.RUNNING:
                break  # the job ended: nothing left to kill
    except KeyboardInterrupt:
        pass
    finally:
        chaos.stop()
    print(f"fault: {len(chaos.kills)} kill(s)")
    return 0


def _countdown(what: str) -> object:
    interactive = sys.stdout.isatty()

    def progress(left: float) -> None:
        if interactive:
            print(f"\r{what}: {left:4.0f} s left ", end="", flush=True)
    return progress


def command_cut(args: argparse.Namespace) -> int:
    from sublimate.components.launch import faults

    cluster = _cluster(args)
    where = _node(cluster, args.node)
    print(f"fault: {where} of {cluster.app_id}: link down for {args.seconds:g} s", flush=True)
    _act(faults.cut_link, cluster, args.node, args.seconds,
         progress=_countdown(f"fault: {where} cut"))
    print(f"\rfault: {where}: link up again" + " " * 20)
    return 0


def command_slow(args: argparse.Namespace) -> int:
    from sublimate.components.launch import faults, netns_cluster

    if args.cpu is None and args.delay is None:
        raise UsageError("fault slow: give --cpu CORES (e.g. 0.25) and/or --delay TIME (e.g. 50ms)")
    cluster = _cluster(args)
    where = _node(cluster, args.node)
    _act(faults.slow_node, cluster, args.node, cpu=args.cpu, delay=args.delay)
    what = " and ".join(filter(None, [f"{args.cpu:g} cores" if args.cpu is not None else "",
                                      f"+{args.delay} delay" if args.delay else ""]))
    if args.seconds is None:
        print(f"fault: {where} of {cluster.app_id} slowed to {what} "
              f"(undo: sublimate fault restore {args.run} --node {args.node})")
        return 0
    print(f"fault: {where} of {cluster.app_id} slowed to {what} for {args.seconds:g} s",
          flush=True)
    try:
        time.sleep(args.seconds)
    finally:
        # the job may have ended meanwhile: its end already removed the slowdown
        if netns_cluster.Cluster.load(cluster.path).state == netns_cluster.RUNNING:
            _act(faults.restore_node, cluster, args.node)
    print(f"fault: {where}: restored")
    return 0


def command_restore(args: argparse.Namespace) -> int:
    from sublimate.components.launch import faults

    cluster = _cluster(args)
    _act(faults.restore_node, cluster, args.node)
    print(f"fault: {_node(cluster, args.node)} of {cluster.app_id}: restored")
    return 0


def command_list(args: argparse.Namespace) -> int:
    from dataclasses import asdict  # only this command needs it

    from sublimate.components.launch import faults

    cluster = _cluster(args, running=False)
    nodes = faults.list_nodes(cluster)
    services = {node.index for node in cluster.services()}
    if args.json:
        print(json.dumps({"app_id": cluster.app_id, "state": cluster.state,
                          "subnet": cluster.subnet, "host_addr": cluster.host_addr,
                          "nodes": [asdict(node) | {"training": node.index not in services}
                                    for node in nodes]}, indent=2))
        return 0
    training = len(nodes) - len(services)
    print(f"{cluster.app_id}: {cluster.state}, subnet {cluster.subnet}, "
          f"host {cluster.host_addr}; {training} training node{'s' * (training != 1)}"
          + "".join(f" and its {node.role}" for node in nodes if node.index in services))
    print(f"{'NODE':<5} {'ROLE/REPLICA':<20} {'ADDRESS':<16} {'STATE':<8} FAULTS")
    for node in nodes:
        active = ", ".join(f"{k}={v}" for k, v in node.faults.items()) or "-"
        print(f"{node.index:<5} {f'{node.role}/{node.replica}':<20} {node.addr:<16} "
              f"{node.state:<8} {active}"
              + ("   (serves the job; not a training node)" if node.index in services else ""))
    return 0
