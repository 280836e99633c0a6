"""A free port for a server that a job starts later: one no outgoing connection can take first.

The launcher chooses a local job's ports (the rendezvous store, the Lighthouse, etcd) before
the process that binds them has started: seconds later, once it has imported torch. A port
from ``bind(port 0)`` comes from the kernel's ephemeral range, the range every outgoing
connection on the machine takes its source port from and every other ``bind(0)`` is answered
from, so in those seconds another test or job could take it, and the server then failed with
EADDRINUSE. A port below that range is handed out only to a process that names it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Below the ephemeral range, above the well-known and most registered servers' ports.
LOWEST = 15000
TRIES = 64


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections and ``bind(0)`` (Linux default)."""
    try:
        low, high = (int(value) for value in EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A port that ``host`` can bind now, outside the ephemeral range where there is room."""
    low, _ = ephemeral_range()
    candidates = range(LOWEST, low) if low - LOWEST >= TRIES else range(0)
    for port in random.sample(candidates, min(TRIES, len(candidates))):
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:  # in use (or listening): another one
                continue
            return port
    with socket.socket() as probe:  # no room below the range: the kernel's choice
        probe.bind((host, 0))
        return probe.getsockname()[1]
