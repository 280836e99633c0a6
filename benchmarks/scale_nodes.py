"""Many small nodes on one machine: the default pipeline on 2, 4, 8, 16 and 32 `local_netns`
nodes (needs root), per rendezvous backend, with the growth of each cost fitted; and the time to
recover from one lost node, per N, in both recovery modes.

    python benchmarks/scale_nodes.py [--nodes 2,4,8,16,32] [--rendezvous static,c10d,etcd-v2]
                                     [--recovery restart] [--results FILE] [--plot PNG]
    python benchmarks/scale_nodes.py --from FILE --plot PNG      # plot saved results again
    python benchmarks/scale_nodes.py --nodes 2,4,8 --recovery restart,per-step \
                                     --kill-node 1 --kill-at-epoch 3 [--results FILE]

Each run is ``sublimate run -p scheduler=local_netns -p nodes=N -p epochs=1 -p rendezvous=R``
(digits, MLP, sync SGD over gloo, global batch 64: 22 steps). Per run, from its
``train-summary.json`` (rank 0's start-up phases) and ``metrics/rank-*.jsonl``:

- ``imports``: the agent importing torch and the worker (rank 0's);
- ``rendezvous``: the agent meeting the other nodes (rank 0's ``agent_rendezvous``);
- ``first step``: launch to the end of the first step;
- ``all-reduce``: per step, the mean over ranks of ``comm_seconds / steps``;
- ``PSS/node``: the peak over the run of the proportional set size of every process below
  ``sublimate run`` outside the host's network namespace, divided by the nodes (sampled
  every 1 s from ``/proc/PID/smaps_rollup``; the sampler costs CPU, so not faster);
- ``wall``: the whole ``sublimate run``; ``accuracy``: the test accuracy, which must not change
  with N (same global batch, same seed).

Then each column's growth as ``a x N^b`` (least squares on logarithms) over the runs that
succeeded. ``--plot`` draws rendezvous, first step and all-reduce against N (log-log), one line
per backend and recovery mode, from this run's results or from ``--from`` a saved ``--results``.

With ``--kill-node I --kill-at-epoch E`` every run trains ``E + --epochs-after`` epochs (a
checkpoint every 2 epochs) and node I is killed whole (every process of its namespace, as chaos
kills) as soon as an epoch record of epoch E appears (step 22 x E, or a few steps later: the
records are polled every 20 ms). What each mode recorded then gives the time from the kill to
training again:

- ``restart`` (``max-restarts 1``; c10d, as restarts need): the launcher's ``relaunches`` in
  ``train-summary.json``: the kill to the lost attempt's end (the loss seen, the job cancelled),
  then the relaunch to its first step (start-up, rendezvous, resuming from the checkpoint); and
  the steps done again (the step reached at the kill less the step resumed from);
- ``per-step``: the launcher's ``fault_tolerance`` section: the kill to the replacement's start
  (the loss seen), its start to its first committed step, and the steps lost (the one in flight;
  the others never stop) and the steps the others committed until the replacement healed.

The machine is shared: the 1-minute load before and after each run is printed; read the figures
as indicative and the exponents as the result.

``--smoke`` (tests/test_benchmarks.py) goes through every mode at 2 nodes: the N table (static),
then node 1 killed after epoch 1 under restart and per-step (40 epochs after), the results and
the plot in a temporary folder (removed afterwards), read back as ``--from`` does: seconds,
figures that mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sublimate.components.launch import faults, netns_cluster

COLUMNS = ("imports", "rendezvous_s", "first_step", "all_reduce_ms", "pss_node_mib", "wall")
# What the plot draws against N: (column, axis label).
PLOTTED = (("rendezvous_s", "rendezvous (s)"), ("first_step", "launch to first step (s)"),
           ("all_reduce_ms", "all-reduce per step (ms)"))
STEPS_PER_EPOCH = 22  # digits' 1,437 training examples at global batch 64
SMOKE = {"nodes": "2", "rendezvous": "static", "epochs_after": 40}  # --smoke's sizes
SMOKE_LINE = "smoke mode: sizes too small for the figures to mean anything"


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(
                int(entry))
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def _pss_by_namespace(root: int) -> dict[str, int]:
    """kB of PSS per network namespace, over every process below ``root``."""
    host = os.readlink("/proc/self/ns/net")
    totals: dict[str, int] = {}
    for pid in _descendants(root):
        try:
            namespace = os.readlink(f"/proc/{pid}/ns/net")
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    if namespace != host:
                        totals[namespace] = totals.get(namespace, 0) + int(line.split()[1])
                    break
        except OSError:
            continue
    return totals


def _runs(home: Path) -> Path:
    return home / "volumes" / "sublimate-data" / "runs"


def _killer(home: Path, node: int, epoch: int, process: subprocess.Popen[str],
            kill: dict[str, Any]) -> None:
    """Kill ``node`` whole once any rank has recorded ``epoch``; note when, and the step."""
    while process.poll() is None:
        for path in _runs(home).glob("*/metrics/rank-*.jsonl"):
            records = [json.loads(line) for line in path.read_text().splitlines()
                       if line.endswith("}")]
            if any(record.get("epoch", 0) >= epoch for record in records):
                faults.kill_node(netns_cluster.load_running(path.parent.parent), node)
                kill.update(time=time.time(),
                            step=max(record.get("step", 0) for record in records))
                return
        time.sleep(0.02)


def run(nodes: int, rendezvous: str, recovery: str, home: Path,
        kill_node: int | None = None, kill_at_epoch: int = 0, epochs_after: int = 0) -> dict:
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    params = ["scheduler=local_netns", f"nodes={nodes}", f"recovery={recovery}",
              f"epochs={1 if kill_node is None else kill_at_epoch + epochs_after}"]
    if recovery != "per-step":  # per-step: every node meets only itself
        params.append(f"rendezvous={rendezvous}")
    if kill_node is not None:
        # every 2 epochs: the kill (just after epoch E = 3) lands mid-interval, where an
        # average loss lands, not just after a checkpoint
        params.append(f"checkpoint-every={2 * STEPS_PER_EPOCH}")
        if recovery == "restart":
            params.append("max-restarts=1")  # one relaunch
    process = subprocess.Popen(
        [sys.executable, "-m", "sublimate.pipelines", "run",
         *(flag for param in params for flag in ("-p", param))],
        env={**os.environ, "SUBLIMATE_HOME": str(home)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    kill: dict[str, Any] = {}
    if kill_node is not None:
        threading.Thread(target=_killer, args=(home, kill_node, kill_at_epoch, process, kill),
                         daemon=True).start()
    peak: dict[str, int] = {}

    def sample() -> None:
        while process.poll() is None:
            now = _pss_by_namespace(process.pid)
            if len(now) >= len(peak) and sum(now.values()) > sum(peak.values()):
                peak.clear()
                peak.update(now)
            time.sleep(1.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = process.communicate()
    wall = time.perf_counter() - started
    sampler.join()
    result = {"nodes": nodes, "backend": "static" if recovery == "per-step" else rendezvous,
              "recovery": recovery,
              "load": f"{load_before:.0f}->{os.getloadavg()[0]:.0f}", "wall": wall,
              "ok": process.returncode == 0}
    if not result["ok"]:
        result["error"] = output.strip().splitlines()[-1] if output.strip() else "?"
        return result
    (folder,) = _runs(home).iterdir()
    summary = json.loads((folder / "train-summary.json").read_text())
    if kill_node is not None:
        result.update(recovered(summary, kill))
    startup = summary.get("startup") or {}
    comm = []
    for path in (folder / "metrics").glob("rank-*.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines() if line]
        steps = max(record["step"] for record in records) or 1
        comm.append(sum(record.get("comm_seconds", 0) for record in records) / steps)
    accuracy = (summary.get("accuracy_curve") or [[0, 0, None]])[-1][2]
    result.update(imports=startup.get("agent_imports"),
                  rendezvous_s=startup.get("agent_rendezvous"),
                  first_step=summary.get("launch_to_first_step_seconds"),
                  all_reduce_ms=1000 * sum(comm) / max(len(comm), 1),
                  # over the nodes (the bridge's namespace holds a few hundred kB more)
                  pss_node_mib=sum(peak.values()) / 1024 / nodes,
                  pss_total_mib=sum(peak.values()) / 1024, accuracy=accuracy)
    return result


def recovered(summary: dict[str, Any], kill: dict[str, Any]) -> dict[str, Any]:
    """The time from the kill to training again, in two parts, from what the launcher recorded
    (see the module's docstring); empty when the kill did not happen or was not recovered."""
    if not kill:
        return {"recovery_error": "the node was not killed (the job ended first)"}
    relaunches = summary.get("relaunches") or []
    if relaunches and "trained_again_at" in relaunches[-1]:
        last = relaunches[-1]
        return {"killed_step": kill["step"], "seen_s": last["previous_ended_at"] - kill["time"],
                "back_s": last["trained_again_at"] - last["relaunched_at"],
                "recovery_s": last["trained_again_at"] - kill["time"],
                "steps_again": kill["step"] - (last["resumed_from_step"] or 0),
                "others_meanwhile": 0}
    failures = (summary.get("fault_tolerance") or {}).get("failures") or []
    replaced = [f for f in failures if f.get("replacement_trained_after_seconds") is not None]
    if replaced:
        failure = replaced[0]
        return {"killed_step": failure.get("step"), "seen_s": failure["replaced_at"] - kill["time"],
                "back_s": failure["replacement_trained_after_seconds"],
                "recovery_s": failure["replaced_at"]
                + failure["replacement_trained_after_seconds"] - kill["time"],
                "steps_again": failure.get("steps_lost"),
                # the steps the survivors committed until the replacement healed
                "others_meanwhile": (failure.get("healed_at_step") or 0) - (failure["step"] or 0)}
    if failures:
        return {"recovery_error": "the job ended before the replacement trained: give more "
                "--epochs-after"}
    return {"recovery_error": "no relaunch or replacement recorded"}


def fitted(results: list[dict], column: str) -> str:
    points = [(math.log(r["nodes"]), math.log(r[column])) for r in results
              if r.get("ok") and r.get(column)]
    if len(points) < 2:
        return "-"
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum(
        (x - mean_x) ** 2 for x, _ in points)
    return f"N^{slope:.2f}"


def print_table(results: list[dict]) -> None:
    print("| N | rendezvous | recovery | load | imports | rendezvous | first step | all-reduce "
          "| PSS/node | PSS all | wall | accuracy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for result in results:
        print_row(result)


def print_row(result: dict) -> None:
    head = f"| {result['nodes']} | {result['backend']} | {result['recovery']} | {result['load']} "
    if not result["ok"]:
        print(f"{head}| failed: {result['error'][:90]} | | | | | | {result['wall']:.0f} s | |",
              flush=True)
        return
    print(f"{head}| {result['imports'] or 0:.1f} s | {result['rendezvous_s'] or 0:.1f} s "
          f"| {result['first_step'] or 0:.1f} s | {result['all_reduce_ms']:.1f} ms "
          f"| {result['pss_node_mib']:.0f} MiB | {result['pss_total_mib']:,.0f} MiB "
          f"| {result['wall']:.0f} s | {result['accuracy']} |", flush=True)


def print_growth(results: list[dict], columns: tuple[str, ...] = COLUMNS) -> None:
    print("\ngrowth (a x N^b over the runs that succeeded):")
    for recovery, backend in _series(results):
        chosen = [r for r in results if r["backend"] == backend and r["recovery"] == recovery]
        print(f"  {backend}, {recovery}: " + ", ".join(
            f"{column} {fitted(chosen, column)}" for column in columns))


def print_recovery(results: list[dict]) -> None:
    print("\n| N | recovery | load | killed at step | kill -> attempt ended / replacement "
          "started | -> training again | kill -> training again | steps done again | steps the "
          "others trained meanwhile | wall |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if not r["ok"] or "recovery_s" not in r:
            print(f"| {r['nodes']} | {r['recovery']} | {r['load']} | failed: "
                  f"{r.get('error') or r.get('recovery_error')} | | | | | | {r['wall']:.0f} s |")
            continue
        print(f"| {r['nodes']} | {r['recovery']} | {r['load']} | {r['killed_step']} "
              f"| {r['seen_s']:.1f} s | {r['back_s']:.1f} s | {r['recovery_s']:.1f} s "
              f"| {r['steps_again']} | {r['others_meanwhile']} | {r['wall']:.0f} s |",
              flush=True)


def _measured_recovery(result: dict) -> bool:
    """A run of ``--kill-node`` (recovered or not), not a row of the N table."""
    return "recovery_s" in result or "recovery_error" in result


def _series(results: list[dict]) -> list[tuple[str, str]]:
    """(recovery, backend) pairs in the order they were run."""
    return list(dict.fromkeys((r["recovery"], r["backend"]) for r in results))


def plot(results: list[dict], path: Path) -> None:
    """Rendezvous, first step and all-reduce against N, log-log, a line per series."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(PLOTTED), figsize=(11, 3.4))
    for axis, (column, label) in zip(axes, PLOTTED, strict=True):
        axis.set(xscale="log", yscale="log", xlabel="nodes (N)", title=label)
        failures = []
        for recovery, backend in _series(results):
            series = [r for r in results if r["recovery"] == recovery and r["backend"] == backend]
            points = sorted((r["nodes"], r[column]) for r in series if r["ok"] and r.get(column))
            if points:
                name = backend if recovery == "restart" else recovery
                line, = axis.plot(*zip(*points, strict=True), marker="o", label=name)
                failures += [(r["nodes"], line.get_color()) for r in series if not r["ok"]]
        for nodes, color in failures:  # a failed run has no figures: a cross on the top edge
            axis.plot(nodes, axis.get_ylim()[1], marker="x", markersize=9, color=color,
                      clip_on=False)
        # N's own values as ticks (log axes would label powers of 10 and their minor ticks)
        nodes = sorted({r["nodes"] for r in results})
        axis.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        axis.set_xticks(nodes, [str(n) for n in nodes])
        axis.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8, title="x: a run failed" if any(not r["ok"] for r in results)
                   else None, title_fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=72)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="2,4,8,16,32")
    parser.add_argument("--rendezvous", help="backends, comma-separated (default: static,c10d; "
                        "with --kill-node c10d, as restarts need a dynamic rendezvous)")
    parser.add_argument("--recovery", default="restart")
    parser.add_argument("--results", type=Path, help="save every run's figures (JSON) here")
    parser.add_argument("--from", dest="saved", type=Path,
                        help="print and plot saved --results instead of running")
    parser.add_argument("--plot", type=Path, help="draw the N table as a PNG")
    parser.add_argument("--kill-node", type=int, help="measure recovery: kill this node")
    parser.add_argument("--kill-at-epoch", type=int, default=3)
    parser.add_argument("--epochs-after", type=int, default=80,
                        help="epochs trained after the kill's (long enough for a per-step "
                             "replacement to start and train)")
    parser.add_argument("--smoke", action="store_true",
                        help="every code path at tiny sizes, in seconds (tests)")
    args = parser.parse_args()
    if not args.smoke:
        report(args)
        return
    parser.set_defaults(**SMOKE)
    args = parser.parse_args()
    print(SMOKE_LINE, flush=True)
    folder = Path(tempfile.mkdtemp(prefix="scale-nodes-smoke-"))
    try:
        args.results, args.plot = folder / "results.json", folder / "scale-nodes.png"
        results = measure(args, [])  # the N table
        recovery = argparse.Namespace(**{**vars(args), "recovery": "restart,per-step",
                                         "rendezvous": "c10d", "kill_node": 1,
                                         "kill_at_epoch": 1})
        measure(recovery, results)  # the recovery from a lost node, in both modes
        args.saved = args.results  # then all of it read back, as --from does
        report(args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def measure(args: argparse.Namespace, results: list[dict]) -> list[dict]:
    """Run every (recovery, backend, N) of ``args``, printing a row and saving ``results`` (to
    which they are added) after each."""
    args.rendezvous = args.rendezvous or ("c10d" if args.kill_node is not None else "static,c10d")
    if not results:
        print_table([])
    for recovery in args.recovery.split(","):
        # per-step: every node meets only itself, whatever the rendezvous setting
        backends = ["static"] if recovery == "per-step" else args.rendezvous.split(",")
        for backend in backends:
            for nodes in (int(n) for n in args.nodes.split(",")):
                with tempfile.TemporaryDirectory(prefix="scale-nodes-") as home:
                    result = run(nodes, backend, recovery, Path(home), args.kill_node,
                                 args.kill_at_epoch, args.epochs_after)
                results.append(result)
                print_row(result)
                if args.results:  # after every run: a long run's figures survive a crash
                    args.results.write_text(json.dumps(results, indent=1))
    return results


def report(args: argparse.Namespace) -> None:
    """Measure (or read ``--from``), then the growth, the recovery table and the plot."""
    if args.saved:
        results = json.loads(args.saved.read_text())
        print_table([r for r in results if not _measured_recovery(r)])
    else:
        results = measure(args, [])
    print_growth(results)
    if any(_measured_recovery(r) for r in results):
        print_recovery([r for r in results if _measured_recovery(r)])
        print_growth([r for r in results if "recovery_s" in r], ("seen_s", "back_s",
                                                                  "recovery_s"))
    if args.plot:
        plot([r for r in results if not _measured_recovery(r)], args.plot)
        print(f"plot: {args.plot} ({args.plot.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
