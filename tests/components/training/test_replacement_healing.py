"""A replacement's first quorum (``FaultTolerance``): it trains only from a live peer's state, or
from the job's start; a quorum of replacements alone is left and asked again.

DiLoCo on 3 nodes, 2 killed: the survivor was held building a group with a dead peer, and the
two replacements formed a quorum of their own at step 0, trained the job again from scratch and
reported success. torchft's Manager is scripted here (what each quorum leaves its step at: a
heal sets it to the peer's); the rest of ``FaultTolerance`` is the real one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sublimate.components.base.replica_groups import ReplicaGroups
from sublimate.components.training.fault_tolerance import (
    FaultTolerance,
    JobAlreadyDone,
    NoLivePeer,
)


class ScriptedQuorums:
    """torchft's Manager as a replacement sees it: the step each quorum leaves it at (0: no
    peer with the job's state was in it; a heal sets the peer's step)."""

    def __init__(self, steps: list[int]) -> None:
        self.steps, self.quorums, self._step = list(steps), 0, 0
        self.failed: list[Any] = []  # errors of the quorums, in order (None: no error)

    def start_quorum(self) -> None:
        self.quorums += 1
        if self.steps:
            self._step = self.steps.pop(0)

    def wait_quorum(self) -> None:
        pass

    def current_step(self) -> int:
        return self._step

    def errored(self) -> Any:
        return self.failed.pop(0) if self.failed else None


def _replacement(tmp_path: Path, quorums: ScriptedQuorums, progress: int, length: int = 100,
                 wait: float = 30.0, replacement: bool = True) -> FaultTolerance:
    ft = FaultTolerance.__new__(FaultTolerance)  # no torchft Manager: the quorums are scripted
    ft.manager = quorums
    ft.groups = ReplicaGroups(group=1, groups=3, min_groups=1, lighthouse="http://lighthouse:1",
                              replacement=replacement)
    ft._job_progress = (lambda: progress) if replacement else None
    ft._job_length, ft._peer_wait_seconds = length, wait
    ft.recording, ft._events, ft._counters = False, tmp_path / "node1.jsonl", None
    ft.attempted, ft._expected = 0, 0
    return ft


def _events(tmp_path: Path) -> list[str]:
    path = tmp_path / "node1.jsonl"
    return [json.loads(line)["event"] for line in path.read_text().splitlines()] \
        if path.exists() else []


def test_a_quorum_of_replacements_alone_is_left_until_a_peer_with_the_state_joins(
        tmp_path: Path) -> None:
    # The job committed 40 steps; the first two quorums hold replacements only (step 0), the
    # third the survivor, whose state this group copies (step 57).
    quorums = ScriptedQuorums([0, 0, 57])
    ft = _replacement(tmp_path, quorums, progress=40)
    assert ft.start_step() == 57
    assert quorums.quorums == 3
    assert _events(tmp_path) == ["waiting_for_state"]
    ft.start_step()  # healed: later steps ask one quorum each, with no check
    assert quorums.quorums == 4


def test_at_the_jobs_start_a_replacement_trains_from_step_0(tmp_path: Path) -> None:
    quorums = ScriptedQuorums([0])
    assert _replacement(tmp_path, quorums, progress=0).start_step() == 0
    assert quorums.quorums == 1


def test_with_no_live_peer_for_the_bound_it_stops_for_a_relaunch(tmp_path: Path) -> None:
    quorums = ScriptedQuorums([])
    ft = _replacement(tmp_path, quorums, progress=40, wait=0.3)
    with pytest.raises(NoLivePeer, match=r"node1: no live peer holds the job's state \(step 40\)"):
        ft.start_step()
    assert quorums.quorums > 1 and _events(tmp_path) == ["waiting_for_state", "no_peer"]


def test_a_replacement_started_after_the_last_step_has_nothing_to_do(tmp_path: Path) -> None:
    # On Kubernetes it would wait for peers gone with the job's end, fail, and be restarted
    # until Volcano's budget was spent: a finished job failed.
    quorums = ScriptedQuorums([])
    with pytest.raises(JobAlreadyDone, match="committed its last step"):
        _replacement(tmp_path, quorums, progress=100, length=100).start_step()
    assert quorums.quorums == 0 and _events(tmp_path) == ["end"]


def test_a_node_of_the_first_start_asks_one_quorum_and_checks_nothing(tmp_path: Path) -> None:
    quorums = ScriptedQuorums([0])
    assert _replacement(tmp_path, quorums, progress=40, replacement=False).start_step() == 0
    assert quorums.quorums == 1


def test_a_failed_quorum_drops_the_step_and_the_next_quorum_is_checked_again(
        tmp_path: Path) -> None:
    quorums = ScriptedQuorums([0, 0, 57])
    quorums.failed = [RuntimeError("the group could not be built")]
    ft = _replacement(tmp_path, quorums, progress=40)
    assert ft.start_step() == 0  # dropped (commit says False), not trained on
    assert ft.start_step() == 57  # a quorum of replacements left, then the survivor's
    assert quorums.quorums == 3
