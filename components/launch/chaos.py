"""Chaos on demand: kill training nodes of a running ``local_netns`` job on a schedule.

A recovery mode is best judged by watching it recover, again and again. :class:`Chaos` kills a
node (every process of it at once, :func:`faults.kill_node`) after each interval of a schedule:

* ``mtbf``: exponentially distributed intervals of that mean (failures that come at random, at a
  rate: a fleet's mean time between failures), each on a node drawn at random;
* ``every``: a fixed interval, on a given node or one drawn at random.

The schedule (intervals and nodes) is drawn from ``seed`` alone, so two runs with the same seed
are hit the same way: that is how the benchmark puts ``recovery=restart`` and ``recovery=per-step``
through the same failures. A drawn node that is down at its moment (being replaced, or the whole
job relaunching) is killed as soon as it is back, so the n-th kill always hits the n-th drawn
node. The launcher runs one for ``-p chaos-mtbf=``; ``sublimate fault kill RUN --every/--mtbf``
runs one from another terminal. Standard library only (and :mod:`.faults`).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sublimate.components.launch import faults, netns_cluster

# How often a waiting kill looks again for its node (down, or its job between attempts).
POLL_SECONDS = 0.1


@dataclass(frozen=True)
class Kill:
    """One kill: the node's index and when its processes were signalled (epoch seconds)."""

    node: int
    time: float


class Chaos:
    """Kills nodes of the ``local_netns`` job found in ``run`` (a run folder, its ``logs/``, or a
    ``cluster.json``; the running job is looked up before every kill, so a relaunched job is
    followed), from a background thread, until :meth:`stop` or ``max_kills`` kills.
    ``armed``: the schedule starts once it returns True (the launcher's: once the job trains,
    so that kills land in training rather than in start-up)."""

    def __init__(self, run: Path, *, mtbf: float | None = None, every: float | None = None,
                 node: int | None = None, max_kills: int = 0, seed: int = 0,
                 role: str = "worker", armed: Callable[[], bool] | None = None,
                 on_kill: Callable[[Kill], None] | None = None) -> None:
        if (mtbf is None) == (every is None) or (mtbf or every or 0) <= 0:
            raise ValueError("give one of mtbf and every, a number of seconds above 0")
        self.run, self.mtbf, self.every, self.node = Path(run), mtbf, every, node
        self.max_kills, self.role, self.on_kill = max_kills, role, on_kill
        self.armed = armed  # the first interval starts once it says so (None: at once)
        self._random = random.Random(seed)
        self.kills: list[Kill] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="chaos", daemon=True)

    def schedule(self, nodes: list[int]) -> tuple[float, int]:
        """The next (interval in seconds, node) of the seeded schedule among ``nodes``."""
        # __init__ took exactly one of mtbf and every
        interval = self._random.expovariate(1 / self.mtbf) if self.mtbf else float(self.every or 0)
        return interval, self.node if self.node is not None else self._random.choice(nodes)

    def start(self) -> Chaos:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the schedule is done (``max_kills`` reached); False on timeout."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _serve(self) -> None:
        while self.armed is not None and not self.armed():
            if self._stop.wait(POLL_SECONDS):
                return
        nodes: list[int] | None = None
        while not self._stop.is_set() and not (self.max_kills and
                                               len(self.kills) >= self.max_kills):
            while nodes is None and not self._stop.is_set():
                nodes = self._training_nodes()
                if nodes is None:
                    self._stop.wait(POLL_SECONDS)
            if nodes is None:
                return
            interval, node = self.schedule(nodes)
            if self._stop.wait(interval):
                return
            while not self._stop.is_set():  # the node may be down: kill it once it is back
                if self._kill(node):
                    break
                self._stop.wait(POLL_SECONDS)

    def _training_nodes(self) -> list[int] | None:
        """The indices of the running job's nodes of ``role`` (None: no job running)."""
        try:
            cluster = netns_cluster.load_running(self.run)
        except netns_cluster.FaultError:
            return None
        return [node.index for node in cluster.nodes if node.role == self.role] or None

    def _kill(self, index: int) -> bool:
        try:
            cluster = netns_cluster.load_running(self.run)
            faults.kill_node(cluster, index)
        except netns_cluster.FaultError:  # between attempts, or the node is down: try again later
            return False
        kill = Kill(index, time.time())
        self.kills.append(kill)
        if self.on_kill is not None:
            self.on_kill(kill)
        return True
