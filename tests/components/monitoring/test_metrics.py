"""Prometheus endpoints, TensorBoard events and the run report of real local runs."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sublimate.components.monitoring import metrics as monitoring
from tests.conftest import REPO, require_module


def test_endpoints_never_collide_and_are_recorded(tmp_path: Path) -> None:
    run_dir = tmp_path / "run-x"
    first = monitoring.WorkerMetrics("run-x", "0", "node0")
    second = monitoring.WorkerMetrics("run-x", "1", "node1")
    try:
        with socket.socket() as blocker:  # the base port is taken (another job on this host)
            blocker.bind(("127.0.0.1", 0))
            blocker.listen()
            taken = blocker.getsockname()[1]
            # both ask for the same base port and local rank, as simulated nodes on one host do
            addresses = [m.serve("127.0.0.1", port=taken) for m in (first, second)]
        assert len({*addresses, f"127.0.0.1:{taken}"}) == 3
        for key, m in (("rank-0", first), ("rank-1", second)):
            monitoring.record_endpoint(run_dir, key, m.address, m.labels)
        endpoints = monitoring.read_endpoints(run_dir)
        assert {k: v["address"] for k, v in endpoints.items()} == \
            {"rank-0": addresses[0], "rank-1": addresses[1]}
        assert endpoints["rank-1"]["node"] == "node1"

        times = monitoring.StepTimes()
        times.data, times.compute, times.comm, times.steps = 0.1, 0.6, 0.1, 16
        times.flush(first, hidden_comm=0.2, samples_per_step=32, done_steps=16, total_steps=64)
        values = monitoring.scrape(endpoints["rank-0"]["url"])
        assert values["sublimate_train_steps_total{rank=0}"] == 16
        assert values["sublimate_train_samples_total{rank=0}"] == 16 * 32
        assert values["sublimate_train_step_seconds_total{phase=comm,rank=0}"] == \
            pytest.approx(0.3)
        assert values["sublimate_train_progress_ratio{rank=0}"] == 0.25
        assert values["process_cpu_seconds_total{rank=0}"] > 0  # labelled process collector
        assert times.take_epoch() == pytest.approx((0.1, 0.4, 0.3))
    finally:
        first.close()
        second.close()


def test_launch_to_first_step_is_a_gauge_with_its_phases() -> None:
    metrics = monitoring.WorkerMetrics("run-y", "0", "node0")
    try:
        address = metrics.serve("127.0.0.1", port=0)
        metrics.observe_startup(3.25, {"launcher": 0.25, "agents": 2.0, "first_step": 1.0})
        values = monitoring.scrape(f"http://{address}/metrics")
        assert values[f"{monitoring.STARTUP_GAUGE}{{rank=0}}"] == 3.25
        assert values["sublimate_startup_phase_seconds{phase=agents,rank=0}"] == 2.0
    finally:
        metrics.close()


def test_time_split_and_live_line_format() -> None:
    split = monitoring.time_split(0.07, 0.71, 0.22)
    assert monitoring.format_split(split) == "compute 71% comm 22% data 7%"
    assert monitoring.time_split(0, 0, 0) == {"data": 0.0, "compute": 0.0, "comm": 0.0}


def _start_run(home: Path, *params: str) -> subprocess.Popen[str]:
    flags = [token for param in params for token in ("-p", param)]
    return subprocess.Popen(
        [sys.executable, "-m", "sublimate.pipelines", "run", "-o", "json", *flags],
        cwd=REPO, env={**os.environ, "SUBLIMATE_HOME": str(home)}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _scalars(folder: Path, tag: str) -> list[float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return [event.value for event in events.Scalars(tag)]


def test_a_sync_run_serves_metrics_while_training_and_leaves_events_and_a_report(
        tmp_path: Path) -> None:
    require_module("tensorboard", "pip install -e . installs it")
    home = tmp_path / "home"
    run_dir = home / "volumes" / "sublimate-data" / "runs" / "watched"
    process = _start_run(home, "run-id=watched", "epochs=40")
    scrapes: dict[str, list[dict[str, float]]] = {}
    try:
        deadline = time.monotonic() + 240
        # scrape every rank while it trains until each shows its step counter moving
        while process.poll() is None and time.monotonic() < deadline:
            for key, endpoint in monitoring.read_endpoints(run_dir).items():
                with contextlib.suppress(OSError):  # not up yet, or already finished
                    scrapes.setdefault(key, []).append(monitoring.scrape(endpoint["url"], 1.0))
            moving = [key for key, seen in scrapes.items() if len({
                s.get(f"sublimate_train_steps_total{{rank={key[5:]}}}") for s in seen}) > 1]
            if len(moving) == 2:
                break
            time.sleep(0.1)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        process.kill()
    result = json.loads(stdout)
    assert result["phase"] == "Succeeded", stderr
    assert sorted(scrapes) == ["rank-0", "rank-1"]
    for key, seen in scrapes.items():
        rank = key[5:]
        steps = [s[f"sublimate_train_steps_total{{rank={rank}}}"] for s in seen
                 if f"sublimate_train_steps_total{{rank={rank}}}" in s]
        assert steps == sorted(steps) and steps[-1] > steps[0], key
        assert max(s[f"sublimate_train_samples_per_second{{rank={rank}}}"] for s in seen) > 0
        assert seen[-1][f"process_resident_memory_bytes{{rank={rank}}}"] > 0

    # the live view: one concise line per epoch with the time split
    assert "[node0] epoch 40/40 step 880/880 loss " in stderr
    assert "| compute " in stderr and "training finished: 880 steps" in stderr

    # TensorBoard: per rank and aggregated, one point per epoch
    for label in ("rank-0", "rank-1", "aggregate"):
        losses = _scalars(run_dir / "tensorboard" / label, "train/loss")
        assert len(losses) == 40 and losses[-1] < losses[0]
        assert min(_scalars(run_dir / "tensorboard" / label, "train/samples_per_second")) > 0
    accuracy = json.loads((run_dir / "metrics.json").read_text())["accuracy"]
    assert _scalars(run_dir / "tensorboard" / "evaluate", "test/accuracy") == \
        [pytest.approx(accuracy, abs=1e-6)]

    # the report the evaluate step left
    report = json.loads((run_dir / "report" / "report.json").read_text())
    assert report["run"] == "watched" and report["algorithm"] == "sync"
    assert report["world_size"] == 2 and report["steps"] == 880
    assert report["test"]["accuracy"] == pytest.approx(accuracy)
    assert len(report["epochs_log"]) == 40
    assert sorted(report["time_split"]) == ["rank-0", "rank-1"]
    for name in ("overview", "loss", "accuracy", "throughput", "time-split"):
        assert (run_dir / "report" / f"{name}.png").stat().st_size > 1000


def test_an_async_run_reports_every_process(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run_dir = home / "volumes" / "sublimate-data" / "runs" / "ps-run"
    process = _start_run(home, "run-id=ps-run", "epochs=3", "algorithm=async")
    stdout, stderr = process.communicate(timeout=300)
    assert json.loads(stdout)["phase"] == "Succeeded", stderr
    endpoints = monitoring.read_endpoints(run_dir)
    assert sorted(endpoints) == ["ps", "trainer-0", "trainer-1"]
    assert len({e["address"] for e in endpoints.values()}) == 3
    assert "[ps0] epoch 3/3 updates 132/132 loss " in stderr and "| compute" in stderr
    report = json.loads((run_dir / "report" / "report.json").read_text())
    assert report["algorithm"] == "async" and report["async"]["updates_applied"] == 132
    assert sorted(report["time_split"]) == ["trainer-0", "trainer-1"]
    assert [point["epoch"] for point in report["epochs_log"]] == [1, 2, 3]


def test_each_rank_publishes_its_ratio_to_the_median_and_whether_it_straggles() -> None:
    from sublimate.components.monitoring.stragglers import RankTiming, find_stragglers

    finding = find_stragglers([RankTiming(rank, f"node{rank}", 1, 3.0, 0.0, compute, 0.0)
                               for rank, compute in enumerate((1.0, 1.0, 1.0, 2.5))])
    ranks = [monitoring.WorkerMetrics("run-s", str(rank), f"node{rank}") for rank in (0, 3)]
    try:
        urls = [f"http://{m.serve('127.0.0.1', port=0)}/metrics" for m in ranks]
        before = monitoring.scrape(urls[1])
        assert not any(key.startswith(monitoring.STEP_RATIO_GAUGE) for key in before)
        for metrics in ranks:  # every rank judges the same gathered figures, publishes its own
            rank = int(metrics.labels["rank"])
            metrics.observe_step_ratio(finding.ratio_of(rank), finding.is_straggler(rank))
        slow, typical = monitoring.scrape(urls[1]), monitoring.scrape(urls[0])
        assert slow[f"{monitoring.STEP_RATIO_GAUGE}{{rank=3}}"] == 2.5
        assert slow[f"{monitoring.STRAGGLER_GAUGE}{{rank=3}}"] == 1.0
        assert typical[f"{monitoring.STEP_RATIO_GAUGE}{{rank=0}}"] == 1.0
        assert typical[f"{monitoring.STRAGGLER_GAUGE}{{rank=0}}"] == 0.0
        ranks[1].observe_step_ratio(1.1, False)  # the next epoch: caught up
        assert monitoring.scrape(urls[1])[f"{monitoring.STRAGGLER_GAUGE}{{rank=3}}"] == 0.0
    finally:
        for metrics in ranks:
            metrics.close()
