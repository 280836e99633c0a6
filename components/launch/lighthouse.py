"""The Lighthouse of a per-step job: torchft's quorum server, as a role of its own.

With ``recovery=per-step`` (:mod:`sublimate.components.training.fault_tolerance`) every training
node is a replica group, and before each step the groups ask the Lighthouse which of them are
alive; it answers all of them with one quorum. It runs as the ``lighthouse`` role of the training
job, never on a training node: losing any node, node 0 included, leaves it standing. On
``local_cwd`` it is one more local process of the launcher's job, on ``local_netns`` a node of its
own on the bridge, on Kubernetes a Deployment behind a Service beside the Volcano job
(:func:`~sublimate.components.launch.per_step.volcano_per_step`; the nodes reach it as
``$VC_LIGHTHOUSE_0_HOSTS``, which the rendered job sets to the Service's name).

``python -m sublimate.components.launch.lighthouse --port P --min-groups M --bind ADDR`` runs
torchft's Rust lighthouse (``lighthouse_main`` of the extension module ``torchft._torchft``) with
the timings below. No torch here: torchft's own ``torchft_lighthouse`` script imports the
extension through the ``torchft`` package, whose ``__init__`` loads torch (1.2 CPU-s, longer
than every node's start from the fork server) for a server that never uses it; this loads the
extension module alone. The Rust side reads the process's own argument vector (the second word
on is its options), so the module execs this file as a script with torchft's options.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

MODULE = "sublimate.components.launch.lighthouse"
# The worker role of a per-step job is marked (TorchX role metadata) with its recovery, the groups
# a step needs and the replacements each node may have, for a scheduler to act on (Kubernetes:
# the Volcano job's policies, launch.per_step.volcano_per_step).
RECOVERY_METADATA = "sublimate.dev/recovery"
MIN_GROUPS_METADATA = "sublimate.dev/min-groups"
REPLACEMENTS_METADATA = "sublimate.dev/replacements"
# A lighthouse holds a few KB of state per group: it needs little of a node.
RESOURCES = {"cpu": 1, "gpu": 0, "memMB": 512}
# A group is dead once it has missed its heartbeats (every 100 ms, torchft's default) for a
# second: the survivors' next quorum then forms without it. torchft's default (5 s) would stall
# every survivor for 5 s per failure; much lower would take a busy node (a long evaluation holds
# the GIL, but not the Rust heartbeat thread) for a lost one.
HEARTBEAT_TIMEOUT_MS = 1000
# How long a quorum waits for groups that heartbeat but have not asked yet (a replacement that is
# still loading): torchft's 60 s default would hold every survivor that long whenever a node joins.
JOIN_TIMEOUT_MS = 500
# The same for the rounds of bmuf, easgd and diloco, every sync-period steps: nodes that share
# machines or differ in speed reach a round seconds apart, and a live node left out of a round
# throws away its sync-period steps (it heals from a peer at the next one). A round waits for
# every node that heartbeats, up to torchft's own default; a dead one stops heartbeating and
# is not waited for past the heartbeat timeout.
ROUND_JOIN_TIMEOUT_MS = 60_000


def join_timeout_ms(algorithm: str) -> int:
    """How long a quorum of ``algorithm`` waits for live groups that have not asked yet."""
    return JOIN_TIMEOUT_MS if algorithm == "sync" else ROUND_JOIN_TIMEOUT_MS
# torchft's Rust side logs every quorum at INFO (a line per step); warnings and errors stay.
RUST_LOG = "warn"
# How often a pending quorum is re-examined (torchft's default: 100 ms, a tenth of a step lost at
# every join on a small model).
QUORUM_TICK_MS = 10


def command(python: str, port: int, min_groups: int, bind: str,
            join_ms: int = JOIN_TIMEOUT_MS) -> list[str]:
    """The role's command line (``bind`` may be a shell expansion; ``join_ms``: how long a
    quorum waits for live groups that have not asked yet, :func:`join_timeout_ms`)."""
    return [python, "-m", MODULE, "--port", str(port), "--min-groups", str(min_groups),
            "--bind", bind, "--join-timeout-ms", str(join_ms)]


def extension() -> Path:
    """The file of torchft's extension module (``torchft/_torchft.*.so``), found without importing
    the torchft package."""
    spec = importlib.util.find_spec("torchft")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            if (library := Path(folder) / f"_torchft{suffix}").is_file():
                return library
    raise FileNotFoundError("torchft's lighthouse is not installed: recovery per-step needs "
                            "torchft (pip install torchft)")


def serve(library: Path) -> None:
    """Run the Rust lighthouse in this process until it ends; it reads its options from the
    process's arguments (after the script's path)."""
    spec = importlib.util.spec_from_file_location("torchft._torchft", library)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.lighthouse_main()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lighthouse", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--min-groups", type=int, required=True,
                        help="replica groups a quorum needs (nodes=MIN:MAX's MIN)")
    parser.add_argument("--bind", required=True, help="the address to listen on")
    parser.add_argument("--join-timeout-ms", type=int, default=JOIN_TIMEOUT_MS,
                        help="how long a quorum waits for live groups that have not asked")
    args = parser.parse_args(argv)
    try:
        extension()
    except FileNotFoundError as error:
        sys.exit(f"lighthouse: error: {error}")
    print(f"lighthouse: quorums of at least {args.min_groups} group(s) on "
          f"{args.bind}:{args.port}", flush=True)
    os.environ.setdefault("RUST_LOG", RUST_LOG)
    os.execv(sys.executable, [
        sys.executable, __file__, "--bind", f"{args.bind}:{args.port}",
        "--min_replicas", str(args.min_groups),
        "--heartbeat_timeout_ms", str(HEARTBEAT_TIMEOUT_MS),
        "--join_timeout_ms", str(args.join_timeout_ms), "--quorum_tick_ms",
        str(QUORUM_TICK_MS)])


if __name__ == "__main__":
    if __spec__ is None:  # run as a file: the lighthouse itself (see the module's docstring)
        serve(extension())
    else:
        main()
