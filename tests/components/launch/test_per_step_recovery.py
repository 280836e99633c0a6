"""Per-step recovery end to end (``recovery=per-step``, torchft): real `sublimate run`s whose
nodes are lost on cue, shaped like torchft's own integration tests (an event injector that fails
a replica at a step): node 0 (once the host of the job's rendezvous store), a node in the middle
of the all-reduce between the groups, two nodes at once with a minimum of two groups, every node
at once, and a chaos run on a cluster on one machine. Each run must finish with no job restart
(but the last, which must fall back to its checkpoint), lose at most the step in flight, and
leave no process, namespace or link behind. A sync transaction holds ``commit-every`` steps
(16 by default): a loss costs the steps since the last commit, and a dropped transaction goes back
to the model and optimizer it started from, bit for bit (the chaos test's oracle).

The faults come from the workers' fault injection (``SUBLIMATE_FAIL_AT_STEP`` and friends, by
slot: node x procs-per-node + local rank) and from the launcher's chaos (``chaos-mtbf``); the
figures asserted are the launcher's summary (``train-summary.json``'s ``fault_tolerance``), built
from what each node's processes recorded."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.components.launch.test_netns_scheduler import assert_no_leaks, netns, snapshot
from tests.conftest import env_flags, results_folder, run_cli, run_outputs

__all__ = ["netns"]

PER_STEP = ["-p", "recovery=per-step"]
THREE = ["-p", "nodes=3", "-p", "global-batch-size=60"]


def _run(home: Path, *params: str, faults: dict[str, str] | None = None,
         timeout: float = 400) -> tuple[str, dict[str, Any]]:
    # the faults reach the steps only when passed (--env), as a user passes them
    done = run_cli("run", *params, *env_flags(faults), home=home, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    assert not _leftovers(home), f"left running: {_leftovers(home)}"
    summary = json.loads((results_folder(home) / "train-summary.json").read_text())
    return output, summary


def _leftovers(home: Path) -> list[str]:
    """Processes of this run (they carry its SUBLIMATE_HOME) still alive: workers, agents, the
    lighthouse."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if f"SUBLIMATE_HOME={home}".encode() in environ.split(b"\0") and \
                entry.name != str(os.getpid()):
            found.append(cmdline.decode(errors="replace")[:120])
    return found


def _failures(summary: dict[str, Any]) -> list[dict[str, Any]]:
    return summary["fault_tolerance"]["failures"]


def _model(home: Path) -> dict[str, torch.Tensor]:
    return torch.load(results_folder(home) / "model.pt", weights_only=False)["state_dict"]


def test_a_failure_free_per_step_run_trains_the_restart_modes_model_bit_for_bit(
        tmp_path: Path) -> None:
    # The same seed, data order and global batch: the flat all-reduce through torchft averages
    # exactly what DDP does, and the groups start together (no one copies another's state).
    settings = ["-p", "epochs=3"]
    _, per_step = _run(tmp_path / "per-step", *settings, *PER_STEP)
    _run(tmp_path / "restart", *settings)
    restart, healed = _model(tmp_path / "restart"), _model(tmp_path / "per-step")
    assert restart.keys() == healed.keys()
    for name, tensor in restart.items():
        assert torch.equal(tensor, healed[name]), name
    section = per_step["fault_tolerance"]
    assert section["nodes_lost"] == 0 and section["dropped_steps"] == 0
    assert section["steps_committed"] == section["steps_attempted"] == 2 * 3 * 22
    assert per_step["recovery"] == "per-step" and per_step["world_size"] == 2
    # The leader (the quorum's first group) records its end before it writes the model and the
    # summary, after which the launcher stops whatever still runs: stopped between the two, it
    # counted as a node lost at the last step (a CI flake, reproduced with four runs at once).
    # (The summary itself is rewritten by the launcher afterwards; the model is not.)
    run = results_folder(tmp_path / "per-step")
    ends = [event["time"] for events in (run / "fault-tolerance").glob("node*.jsonl")
            for event in map(json.loads, events.read_text().splitlines())
            if event["event"] == "end"]
    assert len(ends) == 2 and min(ends) <= (run / "model.pt").stat().st_mtime


def test_losing_node_0_costs_its_step_in_flight_and_its_replacement_copies_a_peer(
        tmp_path: Path) -> None:
    # nodes=3:3: every step needs the three groups, so the others wait for node 0's replacement
    # (node 0 hosts nothing the others need: the lighthouse is a role of its own, and every
    # node has its own store), which copies their state and the job goes on from there.
    # A checkpoint is on the volume (step 90) when node 0 dies, and its replacement, started
    # with the environment it had (as Volcano's RestartPod starts a pod again), must not read
    # it: it knows itself a replacement by its own start record in this launch.
    output, summary = _run(tmp_path, *PER_STEP, "-p", "nodes=3:3", "-p", "global-batch-size=60",
                           "-p", "epochs=10", "-p", "checkpoint-every=30",
                           faults={"SUBLIMATE_FAIL_AT_STEP": "100", "SUBLIMATE_FAIL_RANK": "0"})
    assert "relaunching" not in output, output[-3000:]
    assert "resumed from checkpoint" not in output, output[-3000:]
    assert "lost node0; the others go on without it" in output
    (failure,) = _failures(summary)
    section = summary["fault_tolerance"]
    # killed after step 100, inside a transaction: it had committed the steps before that one
    assert failure["node"] == 0 and 100 - section["steps_per_commit"] < failure["step"] <= 100
    assert 0 < failure["steps_lost"] <= section["steps_per_commit"]
    assert failure["healed_at_step"] == failure["step"]  # nothing committed without it
    assert failure["replacement_trained_after_seconds"] > 0
    assert section["committed_ratio"] >= section["committed_bound"] - 0.02
    assert summary["steps"] == 10 * 23
    assert float(run_outputs(output)["accuracy"]) >= 0.9


def test_a_node_killed_in_the_all_reduce_between_groups_drops_that_step_only(
        tmp_path: Path) -> None:
    # commit-every=1: every step its own transaction, the finest grain
    output, summary = _run(tmp_path, *PER_STEP, *THREE, "-p", "epochs=30",
                           "-p", "commit-every=1", faults={
        "SUBLIMATE_FAIL_IN_ALLREDUCE_AT_STEP": "40", "SUBLIMATE_FAIL_RANK": "1"})
    assert "fault injection: killing slot 1 during the all-reduce of step 40" in output
    assert "relaunching" not in output
    (failure,) = _failures(summary)
    assert failure["node"] == 1 and failure["steps_lost"] == 1
    # the survivors were in that all-reduce with it: each dropped step 40 (and took it again)
    dropped = re.findall(r"node([02]): step (\d+) dropped, every group takes it again", output)
    assert dropped and {step for _, step in dropped} == {"40"}, output[-3000:]
    assert summary["steps"] == 30 * 23


# The most a survivor may stand still after a node dies in the all-reduce: the Lighthouse's
# join timeout (0.5 s) and a step, with room for a loaded machine; far below the collective
# timeout (30 s) that the survivors away from the dead node waited out before.
STALL_BOUND_SECONDS = 5.0


def test_a_node_killed_in_the_all_reduce_of_six_stalls_no_survivor(tmp_path: Path) -> None:
    # From 5 nodes up, only the dead node's two ring neighbours see its connections reset; the
    # other three waited in gloo's recv for the neighbours' data until the collective timeout,
    # and the neighbours alone were too few for a quorum (the Lighthouse refuses half or fewer
    # of the groups heartbeating). A failed group is now closed at once, which fails its
    # neighbours' waits in turn.
    output, summary = _run(tmp_path, *PER_STEP, "-p", "nodes=6", "-p", "global-batch-size=120",
                           "-p", "epochs=6", faults={
                               "SUBLIMATE_FAIL_IN_ALLREDUCE_AT_STEP": "40",
                               "SUBLIMATE_FAIL_RANK": "2"})
    (failure,) = _failures(summary)
    # the transaction it died in: from its last commit (an epoch is 11 steps) to step 40
    assert failure["node"] == 2 and failure["step"] == 33 and failure["steps_lost"] == 7
    dropped = re.findall(r"node(\d): steps 34-40 dropped, every group takes them again "
                         r"\(([^)]*)\)", output)
    assert sorted(node for node, _ in dropped) == ["0", "1", "3", "4", "5"], output[-3000:]
    assert not [why for _, why in dropped if "Timed out" in why], dropped
    assert failure["survivor_steps_dropped"] == 5 * 7
    assert 0 < failure["survivors_stalled_seconds"] <= STALL_BOUND_SECONDS, failure
    assert "the others went on" in output and summary["steps"] == 6 * 11


def test_two_nodes_lost_below_the_minimum_of_groups_training_waits_then_goes_on(
        tmp_path: Path) -> None:
    # nodes=2:3: a step needs two groups. Losing two of three at once leaves one, which waits
    # for a replacement instead of training alone; that replacement copies its state. The other
    # replacement joins whenever it is ready: on a loaded machine its start-up (imports, then
    # its peer's state) may outlast the steps left, and the job ends without it.
    output, summary = _run(tmp_path, *PER_STEP, "-p", "nodes=2:3", "-p",
                           "global-batch-size=60", "-p", "epochs=8",
                           faults={"SUBLIMATE_FAIL_AT_STEP": "60", "SUBLIMATE_FAIL_RANK": "1,2"})
    assert "relaunching" not in output
    failures = _failures(summary)
    assert sorted(failure["node"] for failure in failures) == [1, 2]
    per_commit = summary["fault_tolerance"]["steps_per_commit"]
    (committed,) = {failure["step"] for failure in failures}  # killed in the same transaction
    assert 60 - per_commit < committed <= 60, failures
    for failure in failures:
        assert 0 < failure["steps_lost"] <= per_commit
    # No step was committed while node 0 was alone: the first replacement to train copied the
    # state of the last commit before the kills; a second one that trained joined the two
    # later.
    trained = [failure for failure in failures if "replacement_trained_after_seconds" in failure]
    assert trained, failures
    for failure in trained:
        assert failure["replacement_trained_after_seconds"] > 0
        assert failure["healed_at_step"] is not None, failure
    assert min(failure["healed_at_step"] for failure in trained) == committed, failures
    assert summary["steps"] == 8 * 23


@pytest.mark.parametrize("algorithm", ["bmuf", "easgd", "diloco"])
def test_two_of_three_nodes_lost_at_once_cost_their_round_under_each_paradigm(
        tmp_path: Path, algorithm: str) -> None:
    # nodes=2:3: a round needs two groups, so the survivor waits for a replacement, which must
    # heal from it, not meet the other replacement at step 0 and train the job again (DiLoCo,
    # 2 chaos kills of 3 nodes, did and reported "0 steps lost"); and the report must name the
    # kills that were made, counted in rounds.
    output, summary = _run(tmp_path, *PER_STEP, "-p", "nodes=2:3", "-p",
                           "global-batch-size=60", "-p", f"algorithm={algorithm}",
                           "-p", "epochs=12",  # diloco reached 0.8997 in 8
                           faults={"SUBLIMATE_FAIL_AT_STEP": "60", "SUBLIMATE_FAIL_RANK": "1,2"})
    assert "relaunching" not in output, output[-3000:]
    assert "fault injection: killing rank 1 at step 60" in output
    assert "fault injection: killing rank 2 at step 60" in output
    section = summary["fault_tolerance"]
    assert section["unit"] == "round"
    failures = section["failures"]
    assert sorted(failure["node"] for failure in failures) == [1, 2], failures
    rounds = {failure["step"] for failure in failures}
    assert len(rounds) == 1, failures  # killed together after local step 60: the same round
    (round_killed,) = rounds
    assert round_killed is not None and 0 < round_killed <= 60, failures
    for failure in failures:
        assert failure["steps_lost"] <= 1, failure
    trained = [failure for failure in failures if "replacement_trained_after_seconds" in failure]
    assert trained, failures
    for failure in trained:  # healed from the survivor, at or after the round it died in
        assert failure["healed_at_step"] is not None and \
            failure["healed_at_step"] >= round_killed, failure
    # no round was committed while the survivor was alone: the first replacement healed at it
    assert min(failure["healed_at_step"] for failure in trained) == round_killed, failures
    assert not re.search(r"node[12]: training again, step 1:", output), output[-3000:]
    assert f"lost node1, after round {round_killed}" in output
    assert summary["steps"] == 12 * 23
    assert float(run_outputs(output)["accuracy"]) >= 0.9


def test_losing_every_node_at_once_falls_back_to_the_last_checkpoint(tmp_path: Path) -> None:
    output, summary = _run(tmp_path, *PER_STEP, "-p", "epochs=4", "-p", "checkpoint-every=20",
                           faults={"SUBLIMATE_FAIL_AT_STEP": "50", "SUBLIMATE_FAIL_RANK": "0,1"})
    # No live peer is left to copy from: the job restarts as a whole, from its checkpoint.
    assert "relaunching from the last checkpoint" in output, output[-3000:]
    assert summary["resumed_from_step"] == 40
    # the report says so: it said "no job restart" after this one
    assert summary["fault_tolerance"]["job_restarts"] == 1
    assert "no job restart" not in output, output[-3000:]
    assert "in the last attempt, after 1 relaunch(es) of the whole job" in output
    assert summary["steps"] == 4 * 22
    assert float(run_outputs(output)["accuracy"]) >= 0.85


# `netns` (root and the tools): also what puts this test with the others that make network
# namespaces, on one xdist worker: its leak check looks at the whole machine.
@pytest.mark.usefixtures("netns")
def test_five_chaos_kills_node_0_among_them_cost_no_restart_and_not_one_bit_of_the_model(
        tmp_path: Path) -> None:
    before = snapshot()
    # nodes=4:4: a step commits only with all four groups, so every committed step is the
    # failure-free run's step, computed on the same batch from the same state: a replacement
    # copies a live peer's model and optimizer, and a dropped transaction (up to 16 steps, each
    # already applied) goes back to the model and optimizer it started from and is taken again.
    # Whatever chaos does, the model must come out bit for bit the failure-free one.
    # 40 epochs: about 10 s of training, so that the fifth kill (mean 2 s apart, from the first
    # step) lands before the job ends; at 15 epochs a fast run ended after three
    settings = ["-p", "nodes=4:4", "-p", "epochs=40", *PER_STEP]
    # seed 3 draws nodes 1, 3, 0, 3, 1 (tests/components/launch/test_per_step_launcher.py
    # checks that a seed always draws the same schedule)
    output, summary = _run(tmp_path / "chaos", *settings, "-p", "scheduler=local_netns",
                           "-p", "chaos-mtbf=2", "-p", "chaos-kills=5", "-p", "chaos-seed=3")
    assert "chaos killed 5 node(s): node1, node3, node0, node3, node1" in output
    # the killed nodes' holders (unshare) complain of the SIGKILL: not a failure to show
    assert "unshare: " not in output, output[-3000:]
    assert "relaunching" not in output, output[-3000:]
    section = summary["fault_tolerance"]
    assert section["nodes_lost"] == 5
    for failure in section["failures"]:
        assert failure["steps_lost"] <= section["steps_per_commit"] == 16, failure
    assert section["committed_ratio"] >= section["committed_bound"] - 0.02
    _run(tmp_path / "calm", *settings)  # local_cwd, no chaos
    calm, chaos = _model(tmp_path / "calm"), _model(tmp_path / "chaos")
    for name, tensor in calm.items():
        assert torch.equal(tensor, chaos[name]), name
    assert_no_leaks(before)
