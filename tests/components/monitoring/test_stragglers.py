"""Straggler detection: own work per step against the median rank, and where the time goes."""

from __future__ import annotations

import json
import re

import pytest

from sublimate.components.monitoring.stragglers import (
    MIN_EXCESS_SECONDS,
    THRESHOLD,
    RankTiming,
    find_stragglers,
    timings_from_rows,
)


def timing(rank: int, compute: float, data: float = 0.0, comm: float = 0.0, steps: int = 1,
           node: str | None = None, seconds: float | None = None) -> RankTiming:
    return RankTiming(rank, node or f"node{rank // 2}", steps,
                      seconds if seconds is not None else data + compute + comm,
                      data, compute, comm)


def test_the_rank_with_two_and_a_half_times_the_compute_is_flagged() -> None:
    finding = find_stragglers([timing(0, 1.0), timing(1, 1.0), timing(2, 1.0), timing(3, 2.5)])
    assert finding.median_work_seconds_per_step == 1.0
    assert finding.ratios == {0: 1.0, 1: 1.0, 2: 1.0, 3: 2.5}
    [straggler] = finding.stragglers
    assert (straggler.rank, straggler.node, straggler.cause) == (3, "node1", "compute")
    assert straggler.ratio == 2.5 and straggler.cause_ratio == 2.5
    assert straggler.excess_seconds_per_step == 1.5
    assert finding.line() == "straggler: rank 3 (node1) compute 2.5x median (+1.50 s/step)"
    assert finding.is_straggler(3) and not finding.is_straggler(0)
    assert finding.ratio_of(3) == 2.5 and finding.ratio_of(7) == 1.0


def test_under_sync_sgd_the_fast_ranks_wait_in_comm_and_the_slow_one_is_still_found() -> None:
    # Every rank's wall time per step is the same 10 ms: the fast ranks spend the straggler's
    # extra 6 ms waiting in the all-reduce. Most wall or most comm would point at them.
    fast = [timing(rank, compute=0.003, data=0.0005, comm=0.0065, steps=100) for rank in range(3)]
    slow = timing(3, compute=0.009, data=0.0005, comm=0.0005, steps=100)
    ranks = [RankTiming(t.rank, t.node, t.steps, 1.0, t.data_seconds * 100,
                        t.compute_seconds * 100, t.comm_seconds * 100) for t in [*fast, slow]]
    finding = find_stragglers(ranks)
    [straggler] = finding.stragglers
    assert straggler.rank == 3 and straggler.cause == "compute"
    assert straggler.ratio == pytest.approx(0.0095 / 0.0035)
    assert straggler.cause_ratio == pytest.approx(3.0)
    assert straggler.excess_seconds_per_step == pytest.approx(0.006)
    assert straggler.phases_per_step == pytest.approx(
        {"data": 0.0005, "compute": 0.009, "comm": 0.0005})
    assert finding.line() == "straggler: rank 3 (node1) compute 3.0x median (+6.00 ms/step)"


def test_the_cause_is_the_phase_furthest_above_its_median() -> None:
    ranks = [timing(rank, compute=0.010, data=0.002, steps=1) for rank in range(3)]
    ranks.append(timing(3, compute=0.011, data=0.008, steps=1))  # waits on its data
    [straggler] = find_stragglers(ranks).stragglers
    assert straggler.cause == "data" and straggler.cause_ratio == pytest.approx(4.0)
    assert straggler.describe() == "rank 3 (node1) data 4.0x median (+7.00 ms/step)"


def test_a_phase_the_median_rank_does_not_spend_time_on_has_no_ratio() -> None:
    ranks = [timing(rank, compute=0.010) for rank in range(3)] + \
        [timing(3, compute=0.010, data=0.005)]
    [straggler] = find_stragglers(ranks).stragglers
    assert straggler.cause == "data" and straggler.cause_ratio is None
    assert straggler.describe() == "rank 3 (node1) data 1.5x median work (+5.00 ms/step)"


def test_noise_on_tiny_steps_is_not_a_straggler() -> None:
    # A local CPU run: 0.6 ms against 1.0 ms of work per step is 1.7x, but only 0.4 ms more.
    finding = find_stragglers([timing(0, 0.6e-3), timing(1, 1.0e-3)])
    assert finding.stragglers == () and finding.line() is None
    assert finding.ratios[1] == pytest.approx(1.25)


@pytest.mark.parametrize(("slow", "flagged"), [(1.49, False), (1.5, True)])
def test_the_threshold_is_half_above_the_median(slow: float, flagged: bool) -> None:
    assert THRESHOLD == 1.5 and MIN_EXCESS_SECONDS == 0.002
    ranks = [timing(rank, compute=0.1) for rank in range(4)] + [timing(4, compute=0.1 * slow)]
    assert bool(find_stragglers(ranks).stragglers) is flagged


def test_thresholds_can_be_chosen() -> None:
    ranks = [timing(0, 0.6e-3), timing(1, 0.6e-3), timing(2, 1.0e-3)]
    assert find_stragglers(ranks, min_excess_seconds=0.0001).stragglers[0].rank == 2
    assert find_stragglers(ranks, threshold=2.0, min_excess_seconds=0).stragglers == ()


def test_asynchronous_trainers_own_their_communication() -> None:
    ranks = [timing(rank, compute=0.010, comm=0.002, steps=10) for rank in range(3)]
    ranks.append(timing(3, compute=0.010, comm=0.012, steps=10))  # a slow link to the ps
    assert find_stragglers(ranks).stragglers == ()  # synchronous: comm is waiting
    [straggler] = find_stragglers(ranks, synchronous=False,
                                  min_excess_seconds=0.0005).stragglers
    assert straggler.cause == "comm" and straggler.cause_ratio == pytest.approx(6.0)
    assert straggler.ratio == pytest.approx(2.2 / 1.2)


def test_several_stragglers_come_slowest_first() -> None:
    ranks = [timing(rank, compute=0.010) for rank in range(4)]
    ranks += [timing(4, compute=0.015), timing(5, compute=0.030)]
    finding = find_stragglers(ranks, threshold=1.2)
    assert [s.rank for s in finding.stragglers] == [5, 4]
    assert finding.line() == ("stragglers: rank 5 (node2) compute 3.0x median (+20.00 ms/step); "
                              "rank 4 (node2) compute 1.5x median (+5.00 ms/step)")


def test_nothing_to_judge() -> None:
    assert find_stragglers([]).stragglers == ()
    assert find_stragglers([timing(0, 5.0)]).stragglers == ()  # one rank is its own median
    metrics_off = find_stragglers([timing(0, 0.0), timing(1, 0.0)])
    assert metrics_off.stragglers == () and metrics_off.ratios == {0: 1.0, 1: 1.0}
    idle = find_stragglers([timing(0, 1.0), timing(1, 1.0), timing(2, 0.0, steps=0)])
    assert idle.ratios == {0: 1.0, 1: 1.0}  # a rank without steps is left out, not divided by 0


def test_the_finding_is_json_and_comes_from_the_epochs_gathered_rows() -> None:
    # [loss, data_s, compute_s, comm_s, seconds, node_index] per rank, 20 steps
    rows = [[0.5, 0.01, 0.20, 0.30, 0.51, 0], [0.5, 0.01, 0.20, 0.30, 0.51, 0],
            [0.5, 0.01, 0.20, 0.30, 0.51, 1], [0.5, 0.01, 0.49, 0.01, 0.51, 1]]
    timings = timings_from_rows(rows, steps=20)
    assert [(t.rank, t.node) for t in timings] == [(0, "node0"), (1, "node0"), (2, "node1"),
                                                   (3, "node1")]
    finding = find_stragglers(timings)
    document = json.loads(json.dumps(finding.to_dict()))
    assert document["ratios"]["3"] == pytest.approx(2.381, abs=1e-3)
    [record] = document["stragglers"]
    assert record == finding.records()[0]
    assert record["rank"] == 3 and record["node"] == "node1" and record["cause"] == "compute"
    assert record["excess_seconds_per_step"] == pytest.approx(0.0145)
    assert record["phases_per_step"]["compute"] == pytest.approx(0.0245)
    named = timings_from_rows(rows[:2], steps=1, node_names=["ps0", "trainer1"])
    assert [t.node for t in named] == ["ps0", "trainer1"]


def test_the_docs_state_the_excess_the_rule_applies() -> None:
    """Every statement of the rule's per-step excess, in the module and the docs, is the
    constant's (the module once said a millisecond where the rule takes two)."""
    from sublimate.components.monitoring import stragglers
    from tests.conftest import REPO

    words = {"a": 1.0, "one": 1.0, "two": 2.0, "three": 3.0}
    quantity = r"(a|one|two|three|\d+(?:\.\d+)?)"
    statement = re.compile(rf"\b{quantity}\s*(?:ms|milliseconds?)\s+(?:per\s+step|more)"
                           rf"|per\s+step\s+\({quantity}\s*ms\)")
    for name, text in (("stragglers.py", stragglers.__doc__ or ""),
                       ("docs/monitoring.md", (REPO / "docs/monitoring.md").read_text()),
                       ("docs/local-cluster.md", (REPO / "docs/local-cluster.md").read_text())):
        stated = [match.group(1) or match.group(2) for match in statement.finditer(text)]
        assert stated, f"{name} no longer states the excess: update this test's pattern"
        values = {words.get(value) or float(value) for value in stated}
        assert values == {MIN_EXCESS_SECONDS * 1000}, f"{name} states {stated} ms per step"
