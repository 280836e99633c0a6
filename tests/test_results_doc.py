"""docs/results.md's and docs/frontier.md's figures are the ones their studies' reports hold
(docs/results/*/): the ratios, rates and epochs the prose quotes, recomputed from the points
they come from."""

from __future__ import annotations

import csv
import json
import re
from typing import Any

from tests.conftest import REPO

RESULTS = REPO / "docs" / "results"


def _text() -> str:  # results.md and its frontier studies' page, lines joined
    return " ".join(" ".join((REPO / "docs" / page).read_text().split())
                    for page in ("results.md", "frontier.md"))


def _points(study: str) -> list[dict[str, str]]:
    with open(RESULTS / study / "points.csv", newline="") as stream:
        return list(csv.DictReader(stream))


def _point(study: str, **axes: str) -> dict[str, str]:
    (found,) = [p for p in _points(study) if all(p[k] == v for k, v in axes.items())]
    return found


def _quoted(pattern: str) -> re.Match[str]:
    match = re.search(pattern, _text())
    assert match, f"docs/results.md or frontier.md no longer says /{pattern}/: update this test"
    return match


def test_two_nodes_against_one_on_the_compute_bound_model() -> None:
    one, two = (_point("scaling-compute", nodes=n, algorithm="sync") for n in ("1", "2"))
    throughput = float(two["samples_per_second"]) / float(one["samples_per_second"])
    sooner = float(one["time_to_target_seconds"]) / float(two["time_to_target_seconds"])
    quoted = _quoted(r"([\d.]+)x the throughput and ([\d.]+)x faster to 0\.95 with sync")
    assert quoted.groups() == (f"{throughput:.2f}", f"{sooner:.2f}")


def test_the_rate_sync_used_on_each_link() -> None:
    def mbit(link: str) -> float:
        point = _point("paradigms", algorithm="sync", **{"link-rate": link})
        return float(point["net_sent_bytes_per_worker"]) * 8 / float(point["train_seconds"]) / 1e6

    assert _quoted(r"is (\d+) Mbit/s on the wire").group(1) == f"{mbit('100mbit'):.0f}"
    # rounded in the prose: "about" a round figure
    assert _quoted(r"CPU-bound \(about (\d+) Mbit/s used\)").group(1) == \
        f"{round(mbit('1gbit'), -1):.0f}"


def _loss_curve(batch: int, warmup: float) -> list[tuple[int, float]]:
    report: dict[str, Any] = json.loads((RESULTS / "large-batch" / "report.json").read_text())
    (point,) = [p for p in report["points"] if p["params"] == {
        "global-batch-size": batch, "warmup-epochs": warmup}]
    return [(int(epoch), float(loss)) for epoch, loss in point["loss_curve"]]


def test_where_the_large_batches_diverge() -> None:
    quoted = _quoted(r"the loss rises to ([\d,]+) at epoch (\d+) \(2,048\) and to ([\d,]+) at "
                     r"epoch (\d+) \(4,096\)")
    for (loss, epoch), batch in zip((quoted.groups()[:2], quoted.groups()[2:]), (2048, 4096),
                                    strict=True):
        worst_epoch, worst = max(_loss_curve(batch, 0.0), key=lambda point: point[1])
        assert (int(epoch), int(loss.replace(",", ""))) == (worst_epoch, round(worst)), batch


def test_async_measured_again_over_tcp() -> None:
    sync, async_ = (_point("paradigms-rpc-over-tcp", algorithm=a) for a in ("sync", "async"))
    before = _point("paradigms", algorithm="async", **{"link-rate": "1gbit"})
    quoted = _quoted(r"async trained at ([\d,]+) samples/s in ([\d.]+) s \(([\d.]+)x the "
                     r"table's ([\d,]+)\), sync at ([\d,]+), so sync's lead is ([\d.]+)x in "
                     r"throughput and ([\d.]+)x in time to ([\d.]+) "
                     r"\(([\d.]+) s against ([\d.]+) s\)")
    rate, before_rate = float(async_["samples_per_second"]), float(before["samples_per_second"])
    sync_rate = float(sync["samples_per_second"])
    to_target = [float(p["time_to_target_seconds"]) for p in (sync, async_)]
    target = json.loads((RESULTS / "paradigms-rpc-over-tcp" / "report.json").read_text())
    assert quoted.groups() == (
        f"{rate:,.0f}", f"{float(async_['train_seconds']):.1f}", f"{rate / before_rate:.1f}",
        f"{before_rate:,.0f}", f"{sync_rate:,.0f}", f"{sync_rate / rate:.2f}",
        f"{to_target[1] / to_target[0]:.1f}", f"{target['target']:.3f}",
        f"{to_target[0]:.1f}", f"{to_target[1]:.1f}")


def test_the_frontiers_closest_point_to_the_goal() -> None:
    goal = json.loads((RESULTS / "frontier" / "frontier.json").read_text())["goal"]
    rows = {(row["label"], row["nodes"], row["seed"]): row for row in goal}
    closest = [rows[("diloco H=512 int8", 4, seed)] for seed in (0, 1)]
    quoted = _quoted(r"DiLoCo H = 512 `int8` on 4 nodes meets every part but the time: "
                     r"([\d.]+) point below sync \(seed 0\) and ([\d.]+) above \(seed 1\), "
                     r"(\d+)x fewer bytes, computing (\d+)-(\d+)% of its time at 100 and "
                     r"10 Mbit/s, in ([\d.]+)x and ([\d.]+)x less time")
    shares = [row[key] for row in closest
              for key in ("compute_share_100mbit", "compute_share_10mbit")]
    assert quoted.groups() == (
        f"{closest[0]['accuracy_gap'] * 100:.2f}", f"{-closest[1]['accuracy_gap'] * 100:.2f}",
        f"{closest[0]['fewer_bytes']:.0f}", f"{min(shares) * 100:.0f}",
        f"{max(shares) * 100:.0f}", f"{closest[0]['less_time']}", f"{closest[1]['less_time']}")
    # and no point meets every part of it, which the section says
    assert not any(row["meets_10mbit"] and row["meets_compute"] for row in goal)
