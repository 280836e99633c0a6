"""DiLoCo end to end: ``sublimate run -p algorithm=diloco`` runs on the per-step machinery (a
Lighthouse, a torchrun per node, torchft's Manager) whatever ``recovery`` says, one round (an
outer step) every sync-period steps, and a lost node's replacement heals at a round from a live
peer, outer optimizer and global weights included."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from tests.components.launch.test_per_step_recovery import _failures, _run
from tests.conftest import results_folder, run_outputs

DIGITS_STEPS_PER_EPOCH = 22  # 1438 training examples, global batch 64


def test_diloco_on_two_nodes_trains_digits_one_outer_step_per_round(tmp_path: Path) -> None:
    output, summary = _run(tmp_path, "-p", "algorithm=diloco", "-p", "nodes=2")
    assert float(run_outputs(output)["accuracy"]) >= 0.93
    assert summary["recovery"] == "per-step" and summary["algorithm"] == "diloco"
    section = summary["fault_tolerance"]
    rounds = 20 * DIGITS_STEPS_PER_EPOCH // 8  # sync-period 8: 55 outer steps
    assert section["steps_committed"] == section["steps_attempted"] == 2 * rounds
    assert summary["communication_ops_per_worker"] == rounds


@pytest.mark.parametrize(("codec", "delay"), [("none", 0), ("int8", 0), ("int8", 2)])
def test_a_lost_node_heals_at_a_round_and_the_job_goes_on(tmp_path: Path, codec: str,
                                                          delay: int) -> None:
    # nodes=2:2: a round needs both groups, so node 0 waits at its next round for node 1's
    # replacement, which copies its state (the global weights and outer momentum with it; with
    # int8, the error-feedback residual too, and the all-gather between the groups is what
    # the kill breaks and the replacement joins). With fragment-delay 2 the round's quorum is
    # where it begins, 2 steps before its end: the replacement heals there, and begins it.
    output, summary = _run(tmp_path, "-p", "algorithm=diloco", "-p", "nodes=2:2",
                           "-p", "epochs=10", "-p", f"outer-codec={codec}",
                           "-p", f"fragment-delay={delay}",
                           faults={"SUBLIMATE_FAIL_AT_STEP": "100", "SUBLIMATE_FAIL_RANK": "1"})
    assert "relaunching" not in output, output[-3000:]
    (failure,) = _failures(summary)
    assert failure["node"] == 1 and failure["steps_lost"] <= 1
    assert f"node1: took a live peer's state at step {104 - delay} (was at 0)" in output, \
        output[-3000:]
    # the kill falls between rounds 12 and 13: no round is committed without node 1, and
    # every round is committed by both groups (27 full ones, and finish's for steps 217-220)
    assert failure["step"] == failure["healed_at_step"] == 100 // 8
    section = summary["fault_tolerance"]
    assert section["steps_committed"] == section["steps_attempted"] == 2 * 28, section
    assert summary["steps"] == 10 * DIGITS_STEPS_PER_EPOCH
    assert float(run_outputs(output)["accuracy"]) >= 0.9


# the digits MLP's parameters (64 -> 128 -> 128 -> 10) in Streaming DiLoCo's two fragments:
# its first two Linear layers, then the last
FRAGMENT_VALUES = (64 * 128 + 128 + 128 * 128 + 128, 128 * 10 + 10)


# procs-per-node 2: a node's two processes average their decoded payloads between themselves
# after the all-gather between the groups (FaultTolerance.average_encoded), each counting its own
@pytest.mark.parametrize("procs", [1, 2])
def test_diloco_with_int8_outer_gradients_trains_digits_on_a_quarter_of_the_bytes(
        tmp_path: Path, procs: int) -> None:
    output, summary = _run(tmp_path, "-p", "algorithm=diloco", "-p", "nodes=2",
                           "-p", f"procs-per-node={procs}",
                           "-p", "fragments=2", "-p", "outer-codec=int8")
    assert float(run_outputs(output)["accuracy"]) >= 0.93
    # 440 steps, a round every 8 / 2 steps: 110 rounds, 55 of each fragment, each an
    # all-gather of int8 values and a float32 scale per 256 of them; with 2 workers each
    # sends its payload once (N - 1 = 1), as a ring all-reduce sends 2 (N - 1) / N = 1 tensor
    rounds = 20 * DIGITS_STEPS_PER_EPOCH // 4
    assert summary["communication_ops_per_worker"] == rounds
    int8 = sum(rounds // 2 * (values + 4 * -(-values // 256)) for values in FRAGMENT_VALUES)
    float32 = sum(rounds // 2 * 4 * values for values in FRAGMENT_VALUES)
    assert summary["sent_payload_bytes_per_worker"] == int8
    assert summary["sent_wire_bytes_per_worker"] == int8
    # a quarter, and a scale per 256 values: (1 + 4 / 256) / 4
    assert int8 / float32 == pytest.approx((1 + 4 / 256) / 4, rel=0.01)


# Streaming DiLoCo with overlap: sync-period 8, 2 fragments, a round every 4 steps, each begun
# (its all-gather sent) at the step before it ends, the inner step taken meanwhile.
OVERLAP = ("-p", "algorithm=diloco", "-p", "fragments=2", "-p", "fragment-delay=1",
           "-p", "outer-codec=int8")


def test_overlapped_diloco_trains_digits_and_a_relaunched_job_ends_bit_for_bit(
        tmp_path: Path) -> None:
    # checkpoint-every 19: the checkpoints of steps 19 and 95 fall in a round's flight (begun
    # at 95, ended at 96) and are taken at the round's end. Both nodes are killed at step 103,
    # in a round's flight: the job is relaunched from step 96, each node resuming its own
    # local weights, inner momentum and int8 residual (not the leader's), and must end with
    # the uninterrupted run's model, bit for bit.
    common = (*OVERLAP, "-p", "nodes=2", "-p", "checkpoint-every=19")
    output, summary = _run(tmp_path / "straight", *common)
    assert float(run_outputs(output)["accuracy"]) >= 0.93
    rounds = 20 * DIGITS_STEPS_PER_EPOCH // 4
    assert summary["communication_ops_per_worker"] == rounds + 2  # and finish's, a fragment each
    resumed_output, resumed = _run(tmp_path / "resumed", *common, faults={
        "SUBLIMATE_FAIL_AT_STEP": "103", "SUBLIMATE_FAIL_RANK": "0,1"})
    assert "relaunching from the last checkpoint" in resumed_output, resumed_output[-3000:]
    assert resumed["resumed_from_step"] == 96
    straight_model = torch.load(results_folder(tmp_path / "straight") / "model.pt")
    resumed_model = torch.load(results_folder(tmp_path / "resumed") / "model.pt")
    for name, tensor in straight_model["state_dict"].items():
        assert torch.equal(tensor, resumed_model["state_dict"][name]), name


def test_a_node_lost_in_a_rounds_flight_drops_that_round_and_the_survivors_go_on(
        tmp_path: Path) -> None:
    # nodes=2:3: node 2 dies in the quorum of the round begun at step 51, its share unsent;
    # the survivors' all-gather, in flight while they take step 52, fails there, and that
    # round is dropped (their weights as they were at 52, the global ones as before 51).
    output, summary = _run(tmp_path, *OVERLAP, "-p", "nodes=2:3", "-p", "epochs=10",
                           "-p", "global-batch-size=66",
                           faults={"SUBLIMATE_FAIL_IN_ALLREDUCE_AT_STEP": "51",
                                   "SUBLIMATE_FAIL_RANK": "2"})
    assert "relaunching" not in output, output[-3000:]
    assert "killing slot 2 during the all-reduce of step 51" in output, output[-3000:]
    assert re.search(r"node[01]: step 13 dropped, every group takes it again", output), \
        output[-3000:]
    (failure,) = _failures(summary)
    assert failure["node"] == 2
    section = summary["fault_tolerance"]
    assert section["dropped_steps"] >= 2, section  # the round, on each survivor
    assert float(run_outputs(output)["accuracy"]) >= 0.9


def test_a_round_waits_for_a_node_that_is_late_but_alive(tmp_path: Path) -> None:
    # node 2 stalls 3 s (alive: its heartbeats go on) before the first round, at step 8: the
    # round waits for it, and no node's 8 steps are thrown away. (With the quorum's 0.5 s wait
    # of sync's steps, nodes 0 and 1 took the round alone and node 2 healed from them.)
    output, summary = _run(tmp_path, "-p", "algorithm=diloco", "-p", "nodes=3",
                           "-p", "global-batch-size=66", "-p", "epochs=2",
                           faults={"SUBLIMATE_STALL_AT_STEP": "6", "SUBLIMATE_FAIL_RANK": "2"})
    assert "stalling rank 2 for 3s after step 6" in output, output[-3000:]
    assert "took a live peer's state" not in output, output[-3000:]
    section = summary["fault_tolerance"]
    assert section["steps_committed"] == section["steps_attempted"] == 3 * (2 * 21 // 8 + 1)
    quorums = [json.loads(line) for path in (results_folder(tmp_path) / "fault-tolerance")
               .glob("*.jsonl") for line in path.read_text().splitlines()]
    assert {event["participants"] for event in quorums if event["event"] == "quorum"} == {3}
