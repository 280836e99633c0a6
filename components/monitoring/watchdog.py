"""The launcher's progress watchdog: a training job that stops stepping fails, with a reason.

A hung collective, a worker stuck on the shared volume or a deadlocked data loader leave every
process alive, so neither torchrun nor the scheduler notices: the job would wait forever. Each
training process therefore leaves a small heartbeat in the run folder, and the launcher, which
polls the job anyway, reads them.

**Heartbeats** (:class:`ProgressReporter`, written by the workers): ``<run>/progress/rank-<r>.json``
(:data:`run_files.PROGRESS`), one per process, replaced atomically::

    {"rank": 3, "node": "node1", "step": 340, "time": 1796290144.72, "state": "running",
     "attempt": "1796290101.250", "restart": 0, "pid": 4121, "every": 5.0}

``state`` is ``starting`` (written when the reporter is created, before rendezvous and data
loading), ``running`` (from the step loop, at most every ``every`` seconds), ``paused`` (an
announced long non-step phase, e.g. a checkpoint: ``what`` says which) or ``finished``.
``time`` is the writer's wall clock: nodes' clocks must agree to well within the stall
allowance, as NTP keeps them. ``attempt`` is the launch's id (:data:`ATTEMPT_ENV`, set by the
launcher on every role), ``restart`` torchrun's restart count.

**The decision** (:class:`Watchdog`, in the launcher): a rank is overdue when its last heartbeat
is older than its allowance:

* ``running``: ``stall_seconds`` (the step-progress rule). It must exceed the longest pause
  between two ``step()`` calls that is not announced (a slow step, plus the reporter's own
  interval);
* ``paused`` (an evaluation or a checkpoint, announced with :meth:`ProgressReporter.pause`):
  ``startup_seconds``, the long allowance, as the ``startup-seconds`` setting promises: an
  evaluation of a large test set or a checkpoint to a slow volume may take longer than any step,
  and a short ``stall-seconds`` must not kill it. A rank frozen inside a checkpoint's barrier is
  therefore found after the long allowance, not the short one;
* ``starting``, or no heartbeat yet (counted from the watchdog's start, i.e. the
  job's submission): ``startup_seconds`` too. Start-up (scheduling, image pull, rendezvous,
  imports, data loading) takes minutes on a cluster and can never be judged by the
  step-progress rule; a torchrun restart writes ``starting`` again, so a restarted worker gets
  the start-up allowance again;
* ``finished``: never overdue.

While any rank is in a long phase (``starting`` or ``paused``, within its allowance), overdue
``running`` ranks are not a stall: in collective training they are waiting for it (a rank
restoring a checkpoint, rank 0 saving one). Heartbeats of another attempt of the same run (a
retried workflow step, an earlier ``sublimate run`` with the same run id) are ignored: the
watchdog reads only files carrying its own ``attempt``, or, without one, files written after it
started.

In synchronous training one hung rank stops all of them (the others wait in the collective), so
a stall usually names every rank; the steps the ranks reported are sampled every ``every``
seconds, so "stopped at step 340" says where the job stood, not which rank hung first.

Pure Python, no torch: the launcher imports it before the job starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sublimate.components.base import run_files

ATTEMPT_ENV = "SUBLIMATE_ATTEMPT"  # the launch's id, set by the launcher on every role
EVERY_SECONDS = 5.0  # a rank's heartbeat interval while it steps
STALL_SECONDS = 300.0  # no step progress for this long while running: a stall
STARTUP_SECONDS = 900.0  # allowance for start-up, restarts and announced pauses (long phases)
CHECK_EVERY_SECONDS = 2.0  # how often the launcher should call Watchdog.check
STARTING, RUNNING, PAUSED, FINISHED = "starting", "running", "paused", "finished"
LONG_PHASES = (STARTING, PAUSED)  # their peers are waiting for them, not stalled


def progress_dir(run_dir: Path) -> Path:
    return Path(run_dir) / run_files.PROGRESS


def progress_file(run_dir: Path, rank: int) -> Path:
    return progress_dir(run_dir) / f"rank-{rank}.json"


class ProgressReporter:
    """One process's heartbeat writer. Creating it writes ``starting``.

    The step loop calls :meth:`step` after every step; it costs one clock read and a compare
    until the next heartbeat is due. A loop that already read ``time.perf_counter()`` can skip
    even that: ``if now >= reporter.due: reporter.step(step)``. Writing never raises: a
    heartbeat that cannot be written (a full or flaky volume) is retried at the next interval,
    and the training goes on.
    """

    __slots__ = ("attempt", "due", "every_seconds", "node", "path", "rank", "restart")

    def __init__(self, run_dir: Path, rank: int, node: str,
                 every_seconds: float = EVERY_SECONDS, attempt: str | None = None,
                 step: int = 0) -> None:
        """``attempt`` defaults to :data:`ATTEMPT_ENV`; ``step``: where this process starts
        (a resumed run's checkpoint step, when known)."""
        self.path = progress_file(run_dir, rank)
        self.rank, self.node, self.every_seconds = rank, node, every_seconds
        self.attempt = attempt if attempt is not None else os.environ.get(ATTEMPT_ENV)
        self.restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        self.due = 0.0  # perf_counter time of the next heartbeat: the first step writes one
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write(STARTING, step)

    def step(self, step: int) -> None:
        """After step ``step``: a ``running`` heartbeat when one is due, else nothing."""
        now = time.perf_counter()
        if now < self.due:
            return
        self.due = now + self.every_seconds
        self._write(RUNNING, step)

    def pause(self, step: int, what: str) -> None:
        """Announce a long non-step phase (``what``: e.g. ``checkpoint``), judged by the start-up
        allowance; the next :meth:`step` reports ``running`` again at once."""
        self._write(PAUSED, step, what=what)
        self.due = 0.0

    def finish(self, step: int) -> None:
        """This process is done stepping: a finished rank is never a stall."""
        self._write(FINISHED, step)

    def _write(self, state: str, step: int, **extra: Any) -> None:
        record = {"rank": self.rank, "node": self.node, "step": step,
                  "time": round(time.time(), 3), "state": state, "attempt": self.attempt,
                  "restart": self.restart, "pid": os.getpid(), "every": self.every_seconds,
                  **extra}
        # Written beside the file and renamed over it: a reader never sees half a heartbeat.
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            temporary.write_text(json.dumps(record))
            os.replace(temporary, self.path)
        except OSError:
            pass  # monitoring never fails training; the next heartbeat tries again


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """One rank's last heartbeat, as read back."""

    rank: int
    node: str
    step: int
    time: float
    state: str
    what: str | None = None
    pid: int | None = None  # in the rank's own PID namespace (local_netns nodes have theirs)


def read_heartbeats(run_dir: Path, attempt: str | None = None,
                    since: float | None = None) -> dict[int, Heartbeat]:
    """Every rank's last heartbeat of this attempt: ``attempt`` must match when given, else
    files written before ``since`` are ignored. Unreadable or partial files are skipped."""
    beats = {}
    for path in sorted(progress_dir(run_dir).glob("rank-*.json")):
        try:
            record = json.loads(path.read_text())
            beat = Heartbeat(int(record["rank"]), str(record.get("node", "?")),
                             int(record["step"]), float(record["time"]),
                             str(record["state"]), record.get("what"), record.get("pid"))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if attempt is not None and record.get("attempt") != attempt:
            continue  # a previous attempt of the same run
        if attempt is None and since is not None and beat.time < since:
            continue
        beats[beat.rank] = beat
    return beats


@dataclass(frozen=True, slots=True)
class Stall:
    """What the watchdog found: the ranks that stopped reporting, where, and for how long."""

    seconds: float  # how long the most recently heard of the stalled ranks has been silent
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]  # the node of each rank in ``ranks``
    states: tuple[str, ...]  # each one's last state: running, paused, starting, or "" (none)
    step: int | None  # the last step the stalled ranks reported (their lowest); None: no step
    job_step: int | None  # the last step any rank of the job reported
    all_ranks: bool  # every unfinished rank is stalled
    paused_for: str | None = None  # what a stalled paused rank announced (e.g. checkpoint)

    @property
    def never_stepped(self) -> tuple[int, ...]:
        """Stalled ranks still in start-up: no heartbeat, or only ``starting``."""
        return tuple(rank for rank, state in zip(self.ranks, self.states, strict=True)
                     if state in ("", STARTING))

    @property
    def message(self) -> str:
        """``no progress for 120s: ranks 1,3 (node1, node2) stopped reporting at step 340;
        last step of the job 342``."""
        groups = {RUNNING: "stopped reporting at step {step}",
                  PAUSED: "paused ({what}) since step {step}",
                  STARTING: "never reached a first step"}
        parts = []
        for state, words in groups.items():
            members = [(rank, node) for rank, node, rank_state
                       in zip(self.ranks, self.nodes, self.states, strict=True)
                       if rank_state == state or (state == STARTING and rank_state == "")]
            if members:
                nodes = ", ".join(dict.fromkeys(node for _, node in members))
                parts.append(f"{_ranks(rank for rank, _ in members)} ({nodes}) "
                             + words.format(step=self.step, what=self.paused_for or "pause"))
        text = f"no progress for {self.seconds:.0f}s: " + "; ".join(parts)
        if self.job_step is not None:
            text += f"; last step of the job {self.job_step}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 1), "ranks": list(self.ranks),
                "nodes": list(self.nodes), "states": list(self.states), "step": self.step,
                "job_step": self.job_step, "all_ranks": self.all_ranks,
                "message": self.message}


def _ranks(ranks: Iterable[int]) -> str:
    ranks = list(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {','.join(map(str, ranks))}"


class Watchdog:
    """Decides, from the heartbeats, whether the job stopped making progress (module docstring).

    ``expected_ranks``: the world size (ranks ``0..n-1``) or the ranks themselves;
    ``nodes``: rank -> node, for ranks that never reported (``node?`` otherwise);
    ``since``: the attempt's start (default: now; create the watchdog just before submitting).
    """

    def __init__(self, run_dir: Path, stall_seconds: float = STALL_SECONDS,
                 expected_ranks: int | Iterable[int] = 1, *,
                 startup_seconds: float = STARTUP_SECONDS, attempt: str | None = None,
                 since: float | None = None, nodes: Mapping[int, str] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.stall_seconds, self.startup_seconds = stall_seconds, startup_seconds
        self.expected = tuple(range(expected_ranks)) if isinstance(expected_ranks, int) \
            else tuple(sorted(expected_ranks))
        self.attempt = attempt
        self.since = time.time() if since is None else since
        self.nodes = dict(nodes or {})

    def check(self, now: float | None = None) -> Stall | None:
        """A :class:`Stall` when some ranks stopped making progress, else None.

        ``now``: wall-clock time (default ``time.time()``). Reads one small file per rank: call
        it every few seconds (:data:`CHECK_EVERY_SECONDS`), not at the launcher's poll rate.
        """
        now = time.time() if now is None else now
        beats = read_heartbeats(self.run_dir, self.attempt, self.since)
        overdue: list[tuple[int, float, Heartbeat | None]] = []  # (rank, silent for, beat)
        in_long_phase = False  # a rank starts, restarts or is paused, within its allowance
        for rank in self.expected:
            beat = beats.get(rank)
            if beat is not None and beat.state == FINISHED:
                continue
            long_phase = beat is None or beat.state in LONG_PHASES
            silent = now - (self.since if beat is None else beat.time)
            if silent > (self.startup_seconds if long_phase else self.stall_seconds):
                overdue.append((rank, silent, beat))
            elif long_phase and beat is not None:
                in_long_phase = True
        # Running ranks silent in a collective while a peer starts, restarts or checkpoints are
        # waiting for it, not stalled; a peer overdue in its own long phase is still reported.
        if in_long_phase:
            overdue = [entry for entry in overdue
                       if entry[2] is None or entry[2].state != RUNNING]
        if not overdue:
            return None
        stepped = [beat.step for _, _, beat in overdue
                   if beat is not None and beat.state != STARTING]
        job_steps = [beat.step for beat in beats.values() if beat.state != STARTING]
        unfinished = [rank for rank in self.expected
                      if rank not in beats or beats[rank].state != FINISHED]
        paused = [beat.what for _, _, beat in overdue
                  if beat is not None and beat.state == PAUSED and beat.what]
        return Stall(
            seconds=min(silent for _, silent, _ in overdue),
            ranks=tuple(rank for rank, _, _ in overdue),
            nodes=tuple(beat.node if beat is not None else self.nodes.get(rank, "node?")
                        for rank, _, beat in overdue),
            states=tuple(beat.state if beat is not None else "" for _, _, beat in overdue),
            step=min(stepped) if stepped else None,
            job_step=max(job_steps) if job_steps else None,
            all_ranks=len(overdue) == len(unfinished),
            paused_for=paused[0] if paused else None)

    def heard_from_any(self) -> bool:
        """Whether some rank of this attempt wrote a heartbeat: own code that does not use the
        training library writes none, and is watched only once it does. An earlier attempt's
        files (a retried step, an earlier run on the same run id) do not count."""
        return bool(read_heartbeats(self.run_dir, self.attempt, self.since))

    def clear(self) -> None:
        """Remove earlier heartbeats (the launcher, before submitting; optional: other
        attempts' files are ignored anyway)."""
        for path in progress_dir(self.run_dir).glob("rank-*.json"):
            with contextlib.suppress(OSError):
                path.unlink()
