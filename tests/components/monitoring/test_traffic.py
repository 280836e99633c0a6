"""The bytes each process sends, counted where each collective is issued: exact on the formula,
and checked against the kernel's own counters of real network namespaces (``net_sent_bytes``:
the oracle, which also holds TCP/IP headers and acknowledgements, so it may only be a little
larger)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sublimate.components.monitoring.traffic import Traffic, format_bytes, ring_all_reduce_bytes
from tests.components.launch.test_netns_scheduler import netns
from tests.conftest import results_folder, run_cli

__all__ = ["netns"]  # the fixture of the namespace test below

MLP_BYTES = (64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10) * 4  # the digits MLP, float32


def test_a_ring_all_reduce_sends_2_n_minus_1_over_n_of_the_tensor() -> None:
    traffic = Traffic()
    traffic.all_reduce(1000, parties=4)
    traffic.all_reduce(1000, parties=1)  # alone: nothing leaves the process
    traffic.broadcast(1000, parties=4)
    assert (traffic.payload_bytes, traffic.wire_bytes, traffic.collectives) == (2000, 2250.0, 2)
    assert ring_all_reduce_bytes(1000, 2) == 1000.0
    restored = Traffic()
    restored.load_state_dict(traffic.state_dict())
    assert restored == traffic
    restored.load_state_dict(None)  # a checkpoint of an earlier release
    assert restored == Traffic()
    assert [format_bytes(v) for v in (None, 999, 1500, 2.5e6)] == ["n/a", "999 B", "1.50 kB",
                                                                   "2.50 MB"]


def _run(home: Path, *params: str) -> tuple[dict, dict]:
    done = run_cli("run", "-p", "scheduler=local_netns", "-p", "nodes=2", "-p", "epochs=4",
                   "-p", "checkpoint-every=0", *params, home=home, timeout=400)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    results = results_folder(home)
    summary = json.loads((results / "train-summary.json").read_text())
    report = json.loads((results / "report" / "report.json").read_text())
    return summary, report


@pytest.mark.usefixtures("netns")
def test_counted_bytes_match_what_the_namespaces_sent(tmp_path: Path) -> None:
    # 4 epochs of 22 steps: 88 DDP steps; 11 DiLoCo rounds (no round after the last epoch's
    # record, which is where the namespace's figure is read).
    sync, sync_report = _run(tmp_path / "sync", "-p", "algorithm=sync")
    diloco, diloco_report = _run(tmp_path / "diloco", "-p", "algorithm=diloco",
                                 "-p", "outer-gradient-dtype=bfloat16")
    int8, int8_report = _run(tmp_path / "int8", "-p", "algorithm=diloco",
                             "-p", "outer-codec=int8")
    # counted: every step's gradient buckets (DDP's comm hook); every round's pseudo-gradient,
    # sent in bfloat16 (FaultTolerance.average); with 2 workers the ring sends 2(2-1)/2 = 1x;
    # int8 all-gathered (FaultTolerance.average_encoded): a byte per value and a float32 scale
    # per 256 of them, sent once to the one other worker
    assert sync["sent_payload_bytes_per_worker"] == 88 * MLP_BYTES
    assert diloco["sent_payload_bytes_per_worker"] == 11 * MLP_BYTES // 2
    values = MLP_BYTES // 4
    assert int8["sent_payload_bytes_per_worker"] == 11 * (values + 4 * -(-values // 256))
    for summary, report in ((sync, sync_report), (diloco, diloco_report), (int8, int8_report)):
        counted = summary["sent_wire_bytes_per_worker"]
        assert counted == summary["sent_payload_bytes_per_worker"]
        for process, sent in report["net_sent_bytes"].items():
            # the namespace's counters hold the payload plus headers, acknowledgements,
            # rendezvous and quorums: a few percent more, never less
            assert counted <= sent <= 1.15 * counted, (summary["algorithm"], process, sent)
