"""The Lighthouse of a per-step job: torchft's quorum server, as a role of its own.

With ``recovery=per-step`` (:mod:`sublimate.components.training.fault_tolerance`) every training
node is a replica group, and before each step the groups ask the Lighthouse which of them are
alive; it answers all of them with one quorum. It runs as the ``lighthouse`` role of the training
job, never on a training node: losing any node, node 0 included, leaves it standing. On
``local_cwd`` it is one more local process of the launcher's job, on ``local_netns`` a node of its
own on the bridge, on Kubernetes a Volcano task (its pods reach it as ``$VC_LIGHTHOUSE_0_HOSTS``,
Volcano's env plugin's name for the task's host).

``python -m sublimate.components.launch.lighthouse --port P --min-groups M --bind ADDR`` execs
torchft's ``torchft_lighthouse`` (a Rust binary in the torchft wheel) with the timings below. No
torch here, nor in the binary.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

MODULE = "sublimate.components.launch.lighthouse"
BINARY = "torchft_lighthouse"
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
# torchft's Rust side logs every quorum at INFO (a line per step); warnings and errors stay.
RUST_LOG = "warn"
# How often a pending quorum is re-examined (torchft's default: 100 ms, a tenth of a step lost at
# every join on a small model).
QUORUM_TICK_MS = 10


def command(python: str, port: int, min_groups: int, bind: str) -> list[str]:
    """The role's command line (``bind`` may be a shell expansion)."""
    return [python, "-m", MODULE, "--port", str(port), "--min-groups", str(min_groups),
            "--bind", bind]


def binary() -> str:
    """The ``torchft_lighthouse`` executable: on PATH (an image's venv), or beside this
    interpreter (a local venv that is not on PATH)."""
    found = shutil.which(BINARY) or str(Path(sys.executable).with_name(BINARY))
    if not os.access(found, os.X_OK):
        raise FileNotFoundError(f"{BINARY} not found on PATH nor beside {sys.executable}: "
                                "recovery per-step needs torchft (pip install torchft)")
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lighthouse", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--min-groups", type=int, required=True,
                        help="replica groups a quorum needs (nodes=MIN:MAX's MIN)")
    parser.add_argument("--bind", required=True, help="the address to listen on")
    args = parser.parse_args(argv)
    try:
        executable = binary()
    except FileNotFoundError as error:
        sys.exit(f"lighthouse: error: {error}")
    print(f"lighthouse: quorums of at least {args.min_groups} group(s) on "
          f"{args.bind}:{args.port}", flush=True)
    os.environ.setdefault("RUST_LOG", RUST_LOG)
    os.execv(executable, [
        executable, "--bind", f"{args.bind}:{args.port}", "--min_replicas", str(args.min_groups),
        "--heartbeat_timeout_ms", str(HEARTBEAT_TIMEOUT_MS),
        "--join_timeout_ms", str(JOIN_TIMEOUT_MS), "--quorum_tick_ms", str(QUORUM_TICK_MS)])


if __name__ == "__main__":
    main()
