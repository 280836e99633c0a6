"""Every benchmark and experiment runs here in its smoke mode, so a change that breaks one fails a
test instead of rotting unseen (benchmarks/paradigms.py died after its table from the day DiLoCo
landed, and so never measured the monitoring and evaluation costs it exists for).

``python SCRIPT --smoke`` goes through every code path the script has (each table and ratio it
prints, each mode) at the tiniest sizes, in seconds, writing only into a temporary folder; its
figures mean nothing, and nothing here reads them. What is asserted is that it ends well and
prints what it exists to print: each table's header and rows, each ratio, and for
benchmarks/paradigms.py a row for every paradigm of ``settings.PARADIGMS``. A new script must
get a smoke run here (:func:`test_every_script_has_a_smoke_test`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from sublimate.components.base.settings import PARADIGM_NAMES
from tests.components.launch.test_netns_scheduler import assert_no_leaks, netns, snapshot
from tests.conftest import REPO, require_module

__all__ = ["netns"]  # the fixture: root and the tools for network namespaces

SMOKE_LINE = "smoke mode: sizes too small for the figures to mean anything"
# The files of benchmarks/ and experiments/ that are not scripts of their own, and what runs them.
HELPERS = {
    "benchmarks/ddp_baseline.py": "paradigms.py's baseline, run under torchrun by its smoke run",
    "experiments/__init__.py": "the package of the studies",
    "experiments/sweep_study.py": "the studies' common code: every study's smoke run goes "
                                  "through it",
}


@dataclass(frozen=True)
class Smoke:
    script: str  # relative to the repository
    seconds: float  # about how long it takes on 2 idle cores: the long ones go first
    says: tuple[str, ...]  # patterns (re.M) its output must match: headers, rows, ratios
    root: bool = False  # makes network namespaces (local_netns)
    module: str = ""  # an optional module it needs, and how to install it
    install: str = ""
    files: tuple[str, ...] = ()  # a study's: what it writes into --output
    timeout: float = 300  # a cap for a failure's wait, never how long it takes

    def __str__(self) -> str:
        return Path(self.script).stem if self.script.startswith("benchmarks/") else \
            f"experiments-{Path(self.script).stem}"


SMOKES = [
    Smoke("benchmarks/before_after.py", 6, (
        r"^paradigm +samples/s before +after +ratio +step wall before +after +ratio$",
        r"^sync +\d+\.\d \(.*\) +\d+\.\d \(.*\) +\d+\.\d{3} .* \d+\.\d{3}$")),
    Smoke("benchmarks/checkpoints.py", 5, (
        r"^\| format \| step \(baseline\) \| first: cost",
        r"^\| files \| \d+\.\d\d s \|", r"^\| dcp \| \d+\.\d\d s \|",
        r"^files / dcp cost per checkpoint: \d")),
    Smoke("benchmarks/engine_sizes.py", 1, (
        r"^\| nodes \(x 8 GPUs\) \| sublimate: tasks",
        r"^\| 2 \| 1 \| [\d,]+ B \| 2 \| [\d,]+ B \|",
        r"^\| 4 \| 1 \| [\d,]+ B \| 4 \| ~[\d,]+ B \(extrapolated\)",
        r"^\| WorkflowTemplate \| JSON", r"^\| sublimate-train\.yaml \| [\d,]+ B \|",
        r"^local runner, 4 trivial steps", r"^  runner peak RSS \d+ MiB")),
    Smoke("benchmarks/fault_tolerance.py", 20, (
        r"^  pair 1: restart \d+ samples/s, per-step \d+ samples/s, ratio \d",
        r"^failure-free throughput, per-step / restart: \d",
        r"^failure-free per-step: accuracy 0\.\d+",
        r"^under chaos, restart: chaos killed 1 node\(s\)",
        r"^under chaos, per-step: chaos killed 1 node\(s\)",
        r"^  per-step: node\d lost ", r"^  per-step: \d+ of \d+ group-steps committed"),
        root=True),
    Smoke("benchmarks/forked_agents.py", 14, (
        r"^  2 nodes, afresh  CPU +\d", r"^  2 nodes, forked  CPU +\d",
        r"^  2 nodes, forked / afresh: CPU \d+\.\d\d, wall \d+\.\d\d",
        r"^  per-step, 3 nodes, node 0 killed at step 5, forked: its replacement trained again")),
    Smoke("benchmarks/link_rates.py", 4, (
        r"^ link rate +samples/s +comm share", r"^ +1gbit +\d+ +\d+\.\d%"), root=True),
    Smoke("benchmarks/paradigms.py", 35, (
        r"^contender +samples/s +vs baseline +comm ops/epoch +time to 0\.95$",
        r"^ddp baseline \(torchrun\) +\d+ +1\.000",
        # a row for every paradigm, a new one included (a missing row was this test's issue)
        *(rf"^{name} +\d+ +\d+\.\d{{3}} +[\d.]+ (all-reduce|push/pull) "
          for name in PARADIGM_NAMES),
        r"^sync, metrics off +\d+ +\d+\.\d{3}$",
        r"^sync component / hand-written DDP: \d+\.\d{3} ",
        r"^sync metrics on / metrics off: \d+\.\d{3} ",
        r"^  evaluation itself +\d", r"^  eval on / off: training loop \d+\.\d{3} x, train step")),
    Smoke("benchmarks/render_cache.py", 14, (
        r"^dry run: CPU-s +cached +\d", r"^dry run: wall s +cached +\d",
        r"^default run: CPU-s +cached +\d.* ratio \d", r"^default run: wall s +cached +\d")),
    Smoke("benchmarks/report_plots.py", 2, (
        r"^before: each panel drawn on its own +process CPU \d",
        r"^now: panels cut from the overview +process CPU \d",
        r"^ratio now/before \(process CPU, medians\): \d",
        r"^ratio now/before \(plotting CPU, medians\): \d")),
    Smoke("benchmarks/runner_overhead.py", 1, (
        r"^three trivial steps, 1 interleaved rounds",
        r"^  sublimate run, echo steps +\d", r"^  sublimate run, python steps +\d",
        r"^  baseline, echo steps +\d", r"^  by hand, echo +\d", r"^  by hand, python +\d",
        r"^  sublimate run / baseline, echo steps +\d")),
    Smoke("benchmarks/scale_nodes.py", 29, (
        r"^\| N \| rendezvous \| recovery \| load \| imports",
        # the N table's run, then the runs of the recovery table (killed, and recovered)
        r"^\| 2 \| static \| restart \| \S+ \| \d+\.\d s \|",
        r"^\| 2 \| c10d \| restart \| \S+ \| \d+\.\d s \|",
        r"^\| 2 \| static \| per-step \| \S+ \| \d+\.\d s \|",
        r"^growth \(a x N\^b over the runs that succeeded\):",
        r"^\| N \| recovery \| load \| killed at step",
        r"^\| 2 \| restart \| \S+ \| \d+ \| \d+\.\d s \|", r"^\| 2 \| per-step \| ",
        r"^plot: \S+scale-nodes\.png \([\d,]+ bytes\)"), root=True),
    Smoke("benchmarks/staging.py", 6, (
        *(rf"^{name}: \d+ files x " for name in ("small", "tiny", "large")),
        r"^  sublimate stage +\d+\.\d{3} s", r"^  boto3 download_file loop +\d+\.\d{3} s",
        r"^  ceiling: aiobotocore->RAM +\d+\.\d{3} s"),
        module="boto3", install="pip install -e '.[bench]' -c constraints.txt"),
    Smoke("benchmarks/stall.py", 7, (
        r"^N= 2 run 1: stalled ", r"^N +stalled s \(median, min-max\)", r"^2 +\S"), root=True),
    Smoke("benchmarks/startup.py", 9, (
        r"^  bare torchrun \+ DDP, launch to first step +\d",
        r"^  train step, +launch to first step +\d",
        r"^  ratio train step / bare: first step \d+\.\d\d x, wall \d",
        r"^  train step's phases \(median\): launcher \d")),
    Smoke("benchmarks/streaming_memory.py", 9, (
        r"^cap 512 MB per training child", r"^streaming, whole split +\d+ +\d+",
        r"^in-memory, prefix +\d+ +\d+", r"^paired blocks \(2 pairs of 3 steps",
        r"^streaming / in-memory samples/s: median \d")),
    Smoke("benchmarks/web_graph.py", 4, (
        r"^graph of \d+ nodes",
        r"^first paint \(navigation -> drawn\) +median +\d+\.\d ms .* ratio to 1 s \d+\.\d{3}$",
        r"^live update \(written -> DOM\) +median +\d+\.\d ms .* ratio to 1 s \d+\.\d{3}$"),
        module="selenium", install="pip install -e '.[test]' -c constraints.txt"),
    Smoke("benchmarks/torchft_step_cost.py", 3, (
        r"^  5 steps: wall \d+\.\d{3} ms, CPU", r"^per step: wall \d+\.\d{3} ms .* commit \d")),
    Smoke("experiments/diloco.py", 23, (
        r"^\| point \| link \| epochs \| final accuracy \| training s",
        r"^\| sync \| 100mbit \| 1 \| 0\.\d{4} \|", r"^\| streaming H=32 F=2 \| 100mbit \| 1 \|",
        r"^\| diloco H=128 \| 100mbit \| 3 \|", r"^budget \(the fastest point's training",
        r'"100mbit_compute_share"'),
        root=True, files=("frontier.json", "frontier.png", "accuracy-over-time.png",
                          "paradigms/report.md", "streaming/study.json",
                          "longer-slowest/report.json")),
    Smoke("experiments/frontier.py", 60, (
        r"^\| point \| nodes \| link \| seeds \| final accuracy \| sent per worker",
        r"^\| sync \| 2 \| 100mbit \| 1 \| 0\.\d{4} \|",
        r"^\| streaming H=8 F=2 delay 1 int8 \| 2 \| 100mbit \| 1 \|",
        r"^\| diloco H=128 int8 \| 2 \| 100mbit \| 1 \|",
        r"^\| point \| nodes \| seed \| below sync \| fewer bytes \| less time \|",
        r"^\| diloco H=8 int8 \| 2 \| 0 \| [+-]0\.\d{4} \| [\d.]+x \| [\d.]+x \| \d+% \|"),
        root=True, files=("frontier.json", "frontier.png", "sync/report.md",
                          "streaming/study.json", "compute/report.json")),
    Smoke("experiments/large_batch.py", 13, (
        r"^\| global batch \| scaled lr \| accuracy, no warmup \| accuracy, 1-epoch warmup \|",
        r"^\| 64 \| 0\.1 \| 0\.\d{4} \| 0\.\d{4} \|$"),
        files=("accuracy-by-batch.png", "report.md", "points.csv", "study.json")),
    Smoke("experiments/paradigms.py", 15, (
        r"^\| id \| algorithm \| link \| seed \| accuracy",
        *(rf"^\| p\d+ \| {name} \| 1gbit \| 0 \| 0\.\d{{4}} \|" for name in ("sync", "async"))),
        root=True, files=("accuracy-curves.png", "report.md", "study.json")),
    Smoke("experiments/scaling.py", 8, (
        r"^\| nodes \| algorithm \| samples/s \| comm share \| time to",
        r"^\| 2 \| sync \| \d+ \| \d+% \|"),
        root=True, files=("scaling.png", "report.md", "study.json")),
]


def test_a_studys_dry_run_prints_each_sweep_and_leaves_no_folder(tmp_path: Path) -> None:
    # it made each part's temporary SUBLIMATE_HOME before it knew it would not run it
    done = subprocess.run([sys.executable, "experiments/frontier.py", "--dry-run"], cwd=REPO,
                          env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    commands = done.stdout.splitlines()
    assert len(commands) == 6 and all(c.startswith("sublimate run sweep -p 'grid=")
                                      for c in commands), done.stdout
    assert list(tmp_path.iterdir()) == []


def test_every_script_has_a_smoke_test() -> None:
    scripts = {path.relative_to(REPO).as_posix()
               for folder in ("benchmarks", "experiments") for path in (REPO / folder).glob("*.py")}
    tested = [smoke.script for smoke in SMOKES]
    assert len(tested) == len(set(tested)), "a script listed twice"
    missing = scripts - set(HELPERS) - set(tested)
    assert missing == set(), f"give these scripts a --smoke mode and a Smoke here: {missing}"
    stale = (set(tested) | set(HELPERS)) - scripts
    assert stale == set(), f"listed here, gone from the repository: {stale}"


def run_smoke(smoke: Smoke, tmp_path: Path) -> str:
    """``python SCRIPT --smoke`` (a study: into a folder of this test), its output checked; the
    whole process group stopped if it outlives its timeout or the test."""
    output_dir = tmp_path / "output"
    command = [sys.executable, smoke.script, "--smoke"]
    if smoke.files:
        command += ["--output", str(output_dir)]
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "SUBLIMATE_HOME": str(tmp_path / "home")}, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=smoke.timeout)
    except subprocess.TimeoutExpired:
        _stop(process)
        output, _ = process.communicate()
        pytest.fail(f"{smoke.script} --smoke ran past {smoke.timeout:g}s:\n{output[-4000:]}")
    finally:
        if process.poll() is None:
            _stop(process)
    assert process.returncode == 0, f"{smoke.script} --smoke failed:\n{output[-6000:]}"
    assert SMOKE_LINE in output, output[-3000:]
    missing = [pattern for pattern in smoke.says if not re.search(pattern, output, re.M)]
    assert missing == [], f"{smoke.script} --smoke did not print {missing}:\n{output[-6000:]}"
    absent = [name for name in smoke.files if not (output_dir / name).is_file()]
    assert absent == [], f"{smoke.script} --smoke did not write {absent}"
    return output


def _stop(process: subprocess.Popen[str]) -> None:
    """As Ctrl-C would, to the whole group (the script and what it started), then SIGKILL."""
    for signal_number, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, signal_number)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def longest_first(root: bool) -> list[Smoke]:
    """xdist hands tests out in order: the long ones first, so that the short ones fill each
    worker's end (as tests/conftest.py orders the suite)."""
    return sorted((smoke for smoke in SMOKES if smoke.root == root),
                  key=lambda smoke: -smoke.seconds)


@pytest.mark.parametrize("smoke", longest_first(root=False), ids=str)
def test_smoke(smoke: Smoke, tmp_path: Path) -> None:
    if smoke.module:
        require_module(smoke.module, smoke.install)
    run_smoke(smoke, tmp_path)


@pytest.mark.parametrize("smoke", longest_first(root=True), ids=str)
def test_smoke_on_a_cluster_on_one_machine(smoke: Smoke, tmp_path: Path, netns: None) -> None:
    """The scripts that make network namespaces (root): on the netns tests' one worker, as their
    leak checks look at the whole machine; nothing of the clusters is left behind."""
    before = snapshot()
    run_smoke(smoke, tmp_path)
    assert_no_leaks(before)
