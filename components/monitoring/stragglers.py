"""Straggler detection: which rank holds the job back in an epoch, and where its time goes.

Every rank measures where its step time went (``data``: gathering the batch, ``compute``:
forward, backward, optimizer, ``comm``: collectives or RPC), and the epoch's one collective
brings every rank's figures to every rank. :func:`find_stragglers` turns them into a
:class:`Finding`: each rank's time per step against the median of all ranks, the ranks flagged
as stragglers, and for each the phase its extra time goes to.

**The rule, and why it is not "the rank with the longest steps".** In synchronous training
(sync SGD, and BMUF/EASGD at their averaging steps) no rank can finish a step before the slowest
one: every rank's *wall* time per step is about the same. The straggler's extra time shows up on
the *fast* ranks, as communication: they sit in the all-reduce waiting for it. So a rank is
judged by its **own work per step**, the time it spends on data and compute, which excludes
waiting for peers:

    work(r)  = (data_s(r) + compute_s(r)) / steps(r)             synchronous
    work(r)  = (data_s(r) + compute_s(r) + comm_s(r)) / steps(r)  asynchronous (async SGD)

Asynchronous trainers do not wait for each other, so their communication (the push/pull round
trip to the parameter server) is their own, and a slow link is a reason to be slow.

A rank is a straggler when both hold:

* ``work(r) >= THRESHOLD x median(work)`` (1.5: half again the typical rank's work), and
* ``work(r) - median(work) >= MIN_EXCESS_SECONDS`` per step (2 ms): on a small CPU model a step's
  work is well under a millisecond, and scheduler noise alone makes one rank 1.5x another; two
  milliseconds per step are more than that noise on local runs and nothing on real models.

The median, not the mean, is the reference, so one straggler does not drag the yardstick
towards itself (with two ranks the median is their mean: a rank must then be noticeably slower
than the pair's average). Its **cause** is the phase with the largest excess over that phase's
median across ranks (``data`` or ``compute``; ``comm`` too for async trainers).

What this cannot see: in synchronous training a slow network link slows every rank's all-reduce
alike, so it raises the job's ``comm`` share (the live line's split) without singling out a
rank. A rank that hangs produces no epoch at all: that is the progress watchdog's
(:mod:`sublimate.components.monitoring.watchdog`) job.

This module is pure Python (no torch) so the launcher, the report and tests can use it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

THRESHOLD = 1.5  # own work per step, as a multiple of the median rank's
MIN_EXCESS_SECONDS = 0.002  # and at least this much more per step than the median rank
PHASES = ("data", "compute", "comm")


@dataclass(frozen=True, slots=True)
class RankTiming:
    """One rank's figures for one epoch: its step count, wall seconds and phase seconds."""

    rank: int
    node: str
    steps: int
    seconds: float  # wall time of the epoch's steps (about equal across synchronous ranks)
    data_seconds: float
    compute_seconds: float
    comm_seconds: float

    def per_step(self, phase: str) -> float:
        """Seconds per step spent in ``phase`` (``data``, ``compute`` or ``comm``)."""
        return getattr(self, f"{phase}_seconds") / self.steps


@dataclass(frozen=True, slots=True)
class Straggler:
    """A flagged rank: how much slower than the median it is, and where its extra time goes."""

    rank: int
    node: str
    ratio: float  # own work per step / the median rank's
    work_seconds_per_step: float
    excess_seconds_per_step: float  # own work per step minus the median rank's
    cause: str  # the phase with the largest excess over its median: data, compute (or comm)
    # that phase per step / the median of that phase; None when the median rank spends no
    # measurable time in it (a ratio to zero says nothing; the excess still does)
    cause_ratio: float | None
    phases_per_step: dict[str, float]  # this rank's seconds per step, by phase

    def describe(self) -> str:
        """``rank 3 (node1) compute 2.5x median (+1.50 ms/step)``."""
        how = f"{self.cause_ratio:.1f}x median" if self.cause_ratio is not None \
            else f"{self.ratio:.1f}x median work"
        return (f"rank {self.rank} ({self.node}) {self.cause} {how} "
                f"(+{_milliseconds(self.excess_seconds_per_step)}/step)")

    def to_dict(self) -> dict[str, Any]:
        """The JSON record (rank 0's epoch log, the report)."""
        return {"rank": self.rank, "node": self.node, "ratio": round(self.ratio, 3),
                "work_seconds_per_step": round(self.work_seconds_per_step, 6),
                "excess_seconds_per_step": round(self.excess_seconds_per_step, 6),
                "cause": self.cause,
                "cause_ratio": None if self.cause_ratio is None else round(self.cause_ratio, 3),
                "phases_per_step": {phase: round(seconds, 6)
                                    for phase, seconds in self.phases_per_step.items()}}


@dataclass(frozen=True, slots=True)
class Finding:
    """One epoch's verdict: every rank's ratio to the median, and the stragglers among them."""

    median_work_seconds_per_step: float
    ratios: dict[int, float]  # rank -> own work per step / median (1.0: typical)
    stragglers: tuple[Straggler, ...] = field(default=())
    synchronous: bool = True

    def ratio_of(self, rank: int) -> float:
        """``rank``'s ratio to the median; 1.0 for a rank that took no step (nothing to judge)."""
        return self.ratios.get(rank, 1.0)

    def is_straggler(self, rank: int) -> bool:
        return any(straggler.rank == rank for straggler in self.stragglers)

    def line(self) -> str | None:
        """The live line's addition, or None when no rank straggles:
        ``straggler: rank 3 (node1) compute 2.5x median (+1.50 ms/step)``."""
        if not self.stragglers:
            return None
        noun = "straggler" if len(self.stragglers) == 1 else "stragglers"
        return f"{noun}: " + "; ".join(straggler.describe() for straggler in self.stragglers)

    def records(self) -> list[dict[str, Any]]:
        """The stragglers as JSON records: the ``stragglers`` list of rank 0's epoch record."""
        return [straggler.to_dict() for straggler in self.stragglers]

    def to_dict(self) -> dict[str, Any]:
        return {"median_work_seconds_per_step": round(self.median_work_seconds_per_step, 6),
                "ratios": {str(rank): round(ratio, 3) for rank, ratio in self.ratios.items()},
                "synchronous": self.synchronous, "stragglers": self.records()}


def _milliseconds(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def find_stragglers(timings: Iterable[RankTiming], *, synchronous: bool = True,
                    threshold: float = THRESHOLD,
                    min_excess_seconds: float = MIN_EXCESS_SECONDS) -> Finding:
    """Judge one epoch's per-rank timings (see the module's docstring for the rule).

    ``synchronous``: ranks wait for each other in collectives (sync, bmuf, easgd), so
    communication is waiting, not work; False for asynchronous trainers. Ranks that took no
    step this epoch are left out. Stragglers come slowest first.
    """
    ranks = [timing for timing in timings if timing.steps > 0]
    own = ("data", "compute") if synchronous else PHASES
    if not ranks:
        return Finding(0.0, {}, (), synchronous)
    work = {t.rank: sum(t.per_step(phase) for phase in own) for t in ranks}
    median = statistics.median(work.values())
    if median <= 0:  # nothing measured (metrics off): nobody can be judged
        return Finding(0.0, dict.fromkeys(work, 1.0), (), synchronous)
    phase_medians = {phase: statistics.median(t.per_step(phase) for t in ranks)
                     for phase in own}
    stragglers = []
    for timing in ranks:
        ratio, excess = work[timing.rank] / median, work[timing.rank] - median
        if ratio < threshold or excess < min_excess_seconds:
            continue
        # Where the extra time goes: the phase furthest above what the median rank spends on it.
        cause = max(own, key=lambda phase: timing.per_step(phase) - phase_medians[phase])
        cause_ratio = timing.per_step(cause) / phase_medians[cause] \
            if phase_medians[cause] > 0 else None
        stragglers.append(Straggler(
            timing.rank, timing.node, ratio, work[timing.rank], excess, cause, cause_ratio,
            {phase: timing.per_step(phase) for phase in PHASES}))
    stragglers.sort(key=lambda straggler: (-straggler.ratio, straggler.rank))
    return Finding(median, {rank: value / median for rank, value in sorted(work.items())},
                   tuple(stragglers), synchronous)


def timings_from_rows(rows: Iterable[Iterable[float]], steps: int,
                      node_names: Iterable[str] | None = None) -> list[RankTiming]:
    """:class:`RankTiming` per rank from the epoch's gathered rows, rank ``r`` in row ``r``
    unless the row names it.

    A row is ``[loss, data_s, compute_s, comm_s, seconds, node_index]``, the vector every worker
    contributes to the epoch's one all-gather, and optionally the rank (its slot in the job: under
    per-step recovery the rows are only those of the groups alive); the node is
    ``node<node_index>`` unless ``node_names`` names them.
    """
    names = list(node_names) if node_names is not None else None
    timings = []
    for index, row in enumerate(rows):
        values = list(row)
        _, data_s, compute_s, comm_s, seconds, node_index = values[:6]
        rank = int(values[6]) if len(values) > 6 else index
        node = names[index] if names is not None else f"node{int(node_index)}"
        timings.append(RankTiming(rank, node, steps, seconds, data_s, compute_s, comm_s))
    return timings
