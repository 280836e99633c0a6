"""The launcher's progress watchdog: heartbeats from the step loop, and the stall decision."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sublimate.components.base import run_files
from sublimate.components.monitoring import watchdog as wd
from sublimate.components.monitoring.watchdog import ProgressReporter, Watchdog

T0 = 1_800_000_000.0  # the attempt's start, wall clock


def beat(run_dir: Path, rank: int, step: int, at: float, state: str = "running",
         attempt: str | None = "a1", node: str | None = None, **extra: object) -> None:
    """A heartbeat as ProgressReporter writes it."""
    path = run_dir / run_files.PROGRESS / f"rank-{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rank": rank, "node": node or f"node{rank}", "step": step,
                                "time": at, "state": state, "attempt": attempt, **extra}))


def watchdog(run_dir: Path, ranks: int = 4, **options: object) -> Watchdog:
    return Watchdog(run_dir, 120, ranks, startup_seconds=600, attempt="a1", since=T0,
                    **options)  # type: ignore[arg-type]


def read(run_dir: Path, rank: int) -> dict[str, object]:
    return json.loads((run_dir / "progress" / f"rank-{rank}.json").read_text())


def test_the_reporter_writes_starting_then_running_at_most_every_interval(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(wd.ATTEMPT_ENV, "a1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    reporter = ProgressReporter(tmp_path, 3, "node1", every_seconds=3600, step=40)
    first = read(tmp_path, 3)
    assert {key: first[key] for key in ("rank", "node", "step", "state", "attempt", "restart")} \
        == {"rank": 3, "node": "node1", "step": 40, "state": "starting", "attempt": "a1",
            "restart": 2}
    assert abs(first["time"] - time.time()) < 5  # type: ignore[operator]
    reporter.step(41)  # the first step reports at once: the job is past start-up
    assert (read(tmp_path, 3)["state"], read(tmp_path, 3)["step"]) == ("running", 41)
    for step in range(42, 10_042):  # not due: nothing is written
        reporter.step(step)
    assert read(tmp_path, 3)["step"] == 41
    reporter.due = 0.0  # the interval has passed
    reporter.step(10_042)
    assert read(tmp_path, 3)["step"] == 10_042
    reporter.pause(10_042, "checkpoint")
    assert (read(tmp_path, 3)["state"], read(tmp_path, 3)["what"]) == ("paused", "checkpoint")
    reporter.step(10_043)  # back to running at once after a pause
    assert read(tmp_path, 3)["state"] == "running"
    reporter.finish(10_043)
    assert read(tmp_path, 3)["state"] == "finished"
    # replaced atomically: no temporary file is left beside the heartbeat
    assert sorted(p.name for p in (tmp_path / "progress").iterdir()) == ["rank-3.json"]


def test_a_step_that_is_not_due_costs_one_clock_read(tmp_path: Path) -> None:
    reporter = ProgressReporter(tmp_path, 0, "node0", every_seconds=3600)
    reporter.step(1)
    started = time.perf_counter()
    for step in range(100_000):
        reporter.step(step)
    # about 0.1 us each; a generous bound, for a loaded machine
    assert time.perf_counter() - started < 0.5


def test_a_heartbeat_that_cannot_be_written_does_not_fail_training(tmp_path: Path) -> None:
    (tmp_path / "progress").write_text("a file where the folder should be")
    reporter = ProgressReporter(tmp_path, 0, "node0")
    reporter.step(1)
    reporter.finish(1)


def test_start_up_is_not_judged_by_the_step_rule(tmp_path: Path) -> None:
    dog = watchdog(tmp_path)
    assert dog.check(T0 + 500) is None  # nobody reported yet: rendezvous, image pulls
    for rank in range(4):
        beat(tmp_path, rank, 0, T0 + 10, state="starting")
    assert dog.check(T0 + 600) is None
    stall = dog.check(T0 + 611)
    assert stall is not None and stall.ranks == (0, 1, 2, 3) and stall.all_ranks
    assert stall.step is None and stall.job_step is None
    assert stall.never_stepped == (0, 1, 2, 3)
    assert stall.message == ("no progress for 601s: ranks 0,1,2,3 (node0, node1, node2, node3) "
                             "never reached a first step")


def test_ranks_that_never_reported_are_named_with_their_nodes(tmp_path: Path) -> None:
    dog = watchdog(tmp_path, nodes={2: "node1", 3: "node1"})
    beat(tmp_path, 0, 0, T0 + 5, state="starting", node="node0")
    beat(tmp_path, 1, 0, T0 + 5, state="starting", node="node0")
    stall = dog.check(T0 + 601)
    assert stall is not None and stall.ranks == (2, 3) and not stall.all_ranks
    assert stall.message == "no progress for 601s: ranks 2,3 (node1) never reached a first step"


def test_ranks_that_stopped_stepping_are_a_stall(tmp_path: Path) -> None:
    dog = watchdog(tmp_path, nodes={})
    beat(tmp_path, 0, 342, T0 + 1000, node="node0")
    beat(tmp_path, 1, 340, T0 + 880, node="node1")
    beat(tmp_path, 2, 342, T0 + 1000, node="node1")
    beat(tmp_path, 3, 341, T0 + 880, node="node2")
    assert dog.check(T0 + 1000) is None  # 120 s is allowed, not more
    stall = dog.check(T0 + 1001)
    assert stall is not None and stall.ranks == (1, 3) and stall.nodes == ("node1", "node2")
    assert (stall.step, stall.job_step, stall.all_ranks) == (340, 342, False)
    assert stall.message == ("no progress for 121s: ranks 1,3 (node1, node2) stopped reporting "
                             "at step 340; last step of the job 342")
    assert json.loads(json.dumps(stall.to_dict()))["message"] == stall.message


def test_a_whole_synchronous_job_that_stops_names_every_rank(tmp_path: Path) -> None:
    dog = watchdog(tmp_path, ranks=2)
    beat(tmp_path, 0, 500, T0 + 300)
    beat(tmp_path, 1, 498, T0 + 298)
    stall = dog.check(T0 + 500)
    assert stall is not None and stall.all_ranks and stall.ranks == (0, 1)
    assert stall.message == ("no progress for 200s: ranks 0,1 (node0, node1) stopped reporting "
                             "at step 498; last step of the job 500")


def test_a_finished_rank_is_not_a_stall(tmp_path: Path) -> None:
    dog = watchdog(tmp_path, ranks=2)
    beat(tmp_path, 0, 880, T0 + 100, state="finished")
    beat(tmp_path, 1, 880, T0 + 100, state="finished")
    assert dog.check(T0 + 10_000) is None
    beat(tmp_path, 1, 870, T0 + 95)  # rank 1 still running, silent
    stall = dog.check(T0 + 10_000)
    assert stall is not None and stall.ranks == (1,) and stall.all_ranks
    assert stall.message == ("no progress for 9905s: rank 1 (node1) stopped reporting at step "
                             "870; last step of the job 880")


def test_peers_wait_for_a_pause_which_gets_the_startup_allowance(tmp_path: Path) -> None:
    dog = watchdog(tmp_path, ranks=2)  # stall 120 s, start-up 600 s
    beat(tmp_path, 0, 400, T0 + 1000, state="paused", what="checkpoint")
    beat(tmp_path, 1, 400, T0 + 990)  # waits in the checkpoint's barrier
    assert dog.check(T0 + 1130) is None  # rank 1 is silent 140 s, but waits for rank 0
    assert dog.check(T0 + 1600) is None  # a long checkpoint is not a stall...
    stall = dog.check(T0 + 1601)  # ...until it takes longer than the start-up allowance
    assert stall is not None and stall.ranks == (0, 1)
    assert stall.message == ("no progress for 601s: rank 1 (node1) stopped reporting at step "
                             "400; rank 0 (node0) paused (checkpoint) since step 400; last step "
                             "of the job 400")
    # torchrun restarted the workers: start-up again, judged by the long allowance
    beat(tmp_path, 0, 0, T0 + 1700, state="starting", restart=1)
    beat(tmp_path, 1, 0, T0 + 1700, state="starting", restart=1)
    assert dog.check(T0 + 2200) is None


def test_an_evaluation_longer_than_the_stall_allowance_is_not_a_stall(tmp_path: Path) -> None:
    # The settings' promise: evaluations and checkpoints get startup-seconds, not stall-seconds.
    dog = Watchdog(tmp_path, 300, 2, startup_seconds=900, attempt="a1", since=T0)
    beat(tmp_path, 0, 440, T0 + 100, state="paused", what="evaluation")  # rank 0 evaluates
    beat(tmp_path, 1, 440, T0 + 100)  # rank 1 waits for it at the next collective
    assert dog.check(T0 + 100 + 301) is None
    assert dog.check(T0 + 100 + 900) is None
    stall = dog.check(T0 + 100 + 901)
    assert stall is not None and stall.states == ("paused", "running")
    assert stall.paused_for == "evaluation"


def test_heartbeats_of_another_attempt_are_ignored(tmp_path: Path) -> None:
    # the previous attempt of this run stopped at step 340 long ago
    for rank in range(2):
        beat(tmp_path, rank, 340, T0 - 5000, attempt="a0")
    assert watchdog(tmp_path, ranks=2).check(T0 + 30) is None  # still starting, as far as known
    # a watchdog without an attempt id ignores files older than its start instead
    plain = Watchdog(tmp_path, 120, 2, startup_seconds=600, since=T0)
    assert plain.check(T0 + 30) is None
    beat(tmp_path, 0, 12, T0 + 40, attempt=None)
    beat(tmp_path, 1, 11, T0 + 40, attempt=None)
    stall = plain.check(T0 + 200)
    assert stall is not None and stall.step == 11 and stall.job_step == 12


def test_unreadable_heartbeats_are_skipped_and_clear_removes_them(tmp_path: Path) -> None:
    dog = watchdog(tmp_path, ranks=2)
    beat(tmp_path, 0, 5, T0 + 10)
    (tmp_path / "progress" / "rank-1.json").write_text('{"rank": 1, "st')  # a torn write
    assert sorted(wd.read_heartbeats(tmp_path, "a1")) == [0]
    assert dog.check(T0 + 100) is None
    dog.clear()
    assert wd.read_heartbeats(tmp_path, "a1") == {}


def test_a_real_reporter_and_the_watchdog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          ) -> None:
    monkeypatch.setenv(wd.ATTEMPT_ENV, "launch-7")
    dog = Watchdog(tmp_path, 60, 2, startup_seconds=300, attempt="launch-7")
    reporters = [ProgressReporter(tmp_path, rank, f"node{rank}", every_seconds=0)
                 for rank in range(2)]
    for step in range(1, 6):
        for reporter in reporters:
            reporter.step(step)
    reporters[0].step(6)
    now = time.time()
    assert dog.check(now) is None
    stall = dog.check(now + 61)
    assert stall is not None and stall.ranks == (0, 1) and (stall.step, stall.job_step) == (5, 6)
    reporters[0].finish(6)
    reporters[1].finish(6)
    assert dog.check(now + 10_000) is None
