"""Training on a cluster on one machine (`scheduler=local_netns`): every node in its own network
namespace, links with a rate, and faults on demand against a running `sublimate run`."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from sublimate.components.base.process_identity import start_ticks
from sublimate.components.launch import faults, netns_cluster
from sublimate.components.model import checkpoint
from tests.components.launch.test_netns_scheduler import netns
from tests.conftest import (
    CRASH_SIGNS,
    finish_run,
    first_checkpoint,
    results_folder,
    run_cli,
    run_outputs,
    start_run,
)

__all__ = ["netns"]  # the fixture, used by every test below

# Every test here runs local_netns: the same prerequisites (root, the tools) as its own tests,
# checked the same way (a skip with the reason outside CI, a failure in CI).
pytestmark = pytest.mark.usefixtures("netns")

THREE_NODES = ["-p", "scheduler=local_netns", "-p", "nodes=3", "-p", "global-batch-size=60"]


# Slow enough that the link, not this machine's two shared cores, sets the step time: at
# 100 Mbit/s the digits MLP's all-reduce (139 kB per rank and step) takes 11 ms, about what
# an unshaped step takes here anyway, so the rate could not show; at 20 Mbit/s it takes 56 ms.
RATE, RATE_BITS = "20mbit", 20e6


def test_three_nodes_on_shaped_links_train_like_local_cwd_at_the_links_rate(
        tmp_path: Path) -> None:
    settings = ["-p", "nodes=3", "-p", "global-batch-size=60", "-p", "epochs=3"]
    shaped = run_cli("run", *settings, "-p", "scheduler=local_netns", "-p", f"link-rate={RATE}",
                     home=tmp_path / "netns")
    assert shaped.returncode == 0, shaped.stdout[-3000:] + shaped.stderr[-3000:]
    plain = run_cli("run", *settings, "-p", "scheduler=local_cwd", home=tmp_path / "cwd")
    assert plain.returncode == 0, plain.stderr[-3000:]
    # Same seed, same data order, same world: synchronous SGD lands on the same model.
    assert float(run_outputs(shaped.stdout)["metric"]) == pytest.approx(
        float(run_outputs(plain.stdout)["metric"]), abs=0.01)
    results = results_folder(tmp_path / "netns")
    summary = json.loads((results / "train-summary.json").read_text())
    assert summary["world_size"] == 3
    # The gradients went over every node's own link: each rank's namespace counts what left it
    # (loopback excluded: inside a node it is the node's own), and an all-reduce of G bytes
    # among n ranks must send at least (n-1)/n x G from every rank, at every step.
    state = checkpoint.load(results / "model.pt")
    assert state is not None
    gradient = sum(t.numel() * t.element_size() for t in state["state_dict"].values())
    floor = summary["steps"] * gradient * 2 / 3
    report = json.loads((results / "report" / "report.json").read_text())
    sent, split = report["net_sent_bytes"], report["time_split"]
    assert sorted(sent) == ["rank-0", "rank-1", "rank-2"]
    assert all(sent[rank] >= floor for rank in sent), (sent, floor)
    # ...and at the link's rate: those bytes cannot leave faster than RATE, so the steps (data,
    # compute and communication) took at least their transfer time at that rate: a floor that
    # load only raises (0.9 of it leaves room for tbf's 4 ms burst and the few bytes sent
    # outside the steps). Unshaped, the same steps took 0.6 s here, a sixth of it.
    for rank, bytes_sent in sent.items():
        at_rate = bytes_sent * 8 / RATE_BITS
        steps = sum(split[rank][f"{phase}_seconds"] for phase in ("data", "compute", "comm"))
        print(f"{rank}: {bytes_sent / 1e6:.1f} MB sent (floor {floor / 1e6:.1f} MB); steps took "
              f"{steps:.2f} s ({split[rank]['comm_seconds']:.2f} s communicating), the bytes "
              f"{at_rate:.2f} s at {RATE}")
        assert steps >= 0.9 * at_rate
    # The job's cluster was torn down with it (tests/components/launch/test_netns_scheduler.py
    # checks for leaks of namespaces, links and processes in every way a job can end).
    (state_file,) = results.glob("logs/**/cluster.json")
    cluster = json.loads(state_file.read_text())
    assert cluster["state"] != netns_cluster.RUNNING
    assert all(start_ticks(node["init_pid"]) != node["init_start"]
               for node in cluster["nodes"])


def _start(home: Path, *params: str) -> subprocess.Popen[str]:
    return start_run(home, *THREE_NODES, *params)


def test_a_killed_node_is_relaunched_from_the_last_checkpoint(tmp_path: Path) -> None:
    home = tmp_path / "home"
    process = _start(home, "-p", "epochs=12", "-p", "checkpoint-every=20",
                     "-p", "max-restarts=1", "-p", "recovery=restart")
    run_dir, committed = first_checkpoint(home, process)
    faults.kill_node(netns_cluster.load_running(run_dir), 1)  # every process of node 1
    output = finish_run(process)
    assert process.returncode == 0, output[-4000:]
    assert re.search(r"lost node1 \(10\.[0-9.]+\)", output), output[-3000:]
    assert "relaunching from the last checkpoint (relaunch 1 of 1)" in output
    # The cancel's and the lost store's tracebacks stay in the nodes' logs, and c10d's reverse
    # lookups of namespace addresses are not printed: the lines above are the story.
    assert not [sign for sign in CRASH_SIGNS if sign in output] and \
        "hostname of the client socket" not in output and "unshare: " not in output, \
        output[-3000:]
    resumed = [int(step) for step in re.findall(r"resumed from checkpoint at step (\d+)", output)]
    # The relaunch repeats at most checkpoint-every steps: it resumes from the last commit.
    assert resumed and resumed[0] >= committed, output[-3000:]
    assert "epoch 12/12 step 276/276" in output


def test_a_lost_node_with_no_relaunch_left_names_the_node_and_the_setting(
        tmp_path: Path) -> None:
    # restart mode's default: no relaunch. The run's last line says which node was lost and
    # which setting would have gone on, not a bare "Error (exit code 1)".
    home = tmp_path / "home"
    process = _start(home, "-p", "epochs=12", "-p", "checkpoint-every=20",
                     "-p", "recovery=restart")
    run_dir, _ = first_checkpoint(home, process)
    faults.kill_node(netns_cluster.load_running(run_dir), 1)
    output = finish_run(process)
    assert process.returncode == 1, output[-4000:]
    last = output.strip().splitlines()[-1]
    assert re.search(r"lost node1 \(10\.[0-9.]+\) while the job ran", last), last
    assert "max-restarts is 0: set -p max-restarts=N to relaunch from the last checkpoint, " \
        "or -p recovery=per-step to go on without the node" in last, last


def test_a_link_cut_longer_than_the_collective_timeout_fails_fast_and_resumes(
        tmp_path: Path) -> None:
    home = tmp_path / "home"
    process = _start(home, "-p", "epochs=12", "-p", "checkpoint-every=20",
                     "-p", "max-restarts=2", "-p", "collective-timeout=4",
                     "-p", "recovery=restart")
    run_dir, committed = first_checkpoint(home, process)
    cluster = netns_cluster.load_running(run_dir)
    cut_at = time.monotonic()
    cutter = threading.Thread(target=faults.cut_link, args=(cluster, 1, 12.0))
    cutter.start()
    output = finish_run(process)
    cutter.join()
    assert process.returncode == 0, output[-4000:]
    resumed = [int(step) for step in re.findall(r"resumed from checkpoint at step (\d+)", output)]
    assert resumed and resumed[0] >= committed, output[-3000:]
    assert time.monotonic() - cut_at > 12  # it finished after the link came back


def test_a_slowed_node_is_named_as_the_straggler(tmp_path: Path) -> None:
    home = tmp_path / "home"
    process = _start(home, "-p", "epochs=30", "-p", "checkpoint-every=0",
                     "-p", "eval-every-epoch=false")
    deadline = time.monotonic() + 120
    running = False
    while not running and time.monotonic() < deadline and process.poll() is None:
        found = list(home.glob("volumes/sublimate-data/runs/*/logs/**/cluster.json"))
        running = bool(found) and \
            json.loads(found[0].read_text()).get("state") == netns_cluster.RUNNING
        time.sleep(0.05)
    assert running, "the cluster never came up"
    faults.slow_node(netns_cluster.load_running(results_folder(home)), 2, cpu=0.15)
    output = finish_run(process)
    assert process.returncode == 0, output[-4000:]
    assert re.search(r"stragglers?: rank 2 \(node2\) compute [0-9.]+x median", output), \
        output[-3000:]
    report = json.loads((results_folder(home) / "report" / "report.json").read_text())
    # The slowed node comes first (stragglers come slowest first); on a machine busy with other
    # tests another rank may pass the rule too, for moments, and follow it.
    straggler = report["stragglers"]["ranks"][0]
    assert (straggler["rank"], straggler["node"], straggler["cause"]) == (2, "node2", "compute")


def start_elastic(home: Path, *params: str) -> subprocess.Popen[str]:
    """An elastic job of 2 to 3 nodes (12 epochs, a checkpoint every 20 steps, collectives
    that give up on a lost peer after 5 s) started in the background, for a node to be lost."""
    return start_run(home, "-p", "scheduler=local_netns", "-p", "nodes=2:3",
                     "-p", "global-batch-size=60", "-p", "epochs=12",
                     "-p", "checkpoint-every=20", "-p", "collective-timeout=5",
                     "-p", "recovery=restart", *params)


def finish_on_two_without(home: Path, node: int, *params: str) -> str:
    """Run :func:`start_elastic`, kill ``node`` after the first checkpoint, and check that the
    two that remain finished the job as a world of 2, resumed from a committed step; returns
    the run's output."""
    process = start_elastic(home, "-p", "max-restarts=2", *params)
    run_dir, committed = first_checkpoint(home, process)
    faults.kill_node(netns_cluster.load_running(run_dir), node)
    output = finish_run(process)
    assert process.returncode == 0, output[-4000:]
    assert re.search(rf"train: finished on 2 of 3 nodes \(elastic, lost node{node}", output), \
        output[-3000:]
    resumed = [int(step) for step in re.findall(r"resumed from checkpoint at step (\d+)", output)]
    assert resumed and resumed[0] >= committed, output[-3000:]
    summary = json.loads((results_folder(home) / "train-summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 276
    assert summary["resumed_from_step"] >= committed
    return output


def test_an_elastic_job_loses_a_node_and_finishes_on_the_minimum(tmp_path: Path) -> None:
    """nodes=2:3: node 2 is killed after the first checkpoint; the two that remain notice
    (collective timeout, rendezvous keep-alive), meet again as a world of 2 and resume from the
    committed step with the data re-divided (each rank's share of the global batch grows)."""
    finish_on_two_without(tmp_path / "home", 2)


def test_an_elastic_job_that_loses_node0_is_relaunched_from_the_last_checkpoint(
        tmp_path: Path) -> None:
    """nodes=2:3 and node 0 killed: it hosts the rendezvous store, so the two that remain
    cannot meet again and fail too. Whether the launcher saw node 0 lost before they failed or
    not (within one poll), the attempt is LOST and relaunched from the checkpoint (it ended
    FAILED, never relaunched, when the loss had been tolerated first)."""
    home = tmp_path / "home"
    process = start_elastic(home)
    run_dir, committed = first_checkpoint(home, process)
    faults.kill_node(netns_cluster.load_running(run_dir), 0)
    output = finish_run(process)
    assert process.returncode == 0, output[-4000:]
    assert re.search(r"lost node0 \(10\.[0-9.]+\)", output), output[-3000:]
    # elastic runs relaunch 3 times by default (max-restarts auto), and the launcher says so
    assert re.search(r"train: submitted \S+ \(2:3 nodes x 1 procs, algorithm sync, up to 3 "
                     r"relaunches\)", output), output[-3000:]
    assert "relaunching from the last checkpoint (relaunch 1 of 3)" in output, output[-3000:]
    resumed = [int(step) for step in re.findall(r"resumed from checkpoint at step (\d+)", output)]
    assert resumed and resumed[0] >= committed, output[-3000:]
    summary = json.loads((results_folder(home) / "train-summary.json").read_text())
    assert summary["steps"] == 276
