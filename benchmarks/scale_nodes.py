"""Many small nodes on one machine: the default pipeline on 2, 4, 8, 16 and 32 `local_netns`
nodes (needs root), per rendezvous backend, with the growth of each cost fitted.

    python benchmarks/scale_nodes.py [--nodes 2,4,8,16,32] [--rendezvous static,c10d]
                                     [--recovery restart]

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
succeeded. The machine is shared: the 1-minute load before and after each run is printed; read
the figures as indicative and the exponents as the result.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

COLUMNS = ("imports", "rendezvous_s", "first_step", "all_reduce_ms", "pss_node_mib", "wall")


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


def run(nodes: int, rendezvous: str, recovery: str, home: Path) -> dict:
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "sublimate.pipelines", "run", "-p", "scheduler=local_netns",
         "-p", f"nodes={nodes}", "-p", "epochs=1", "-p", f"rendezvous={rendezvous}",
         "-p", f"recovery={recovery}"],
        env={**os.environ, "SUBLIMATE_HOME": str(home)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
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
    result = {"nodes": nodes, "backend": rendezvous, "recovery": recovery,
              "load": f"{load_before:.0f}->{os.getloadavg()[0]:.0f}", "wall": wall,
              "ok": process.returncode == 0}
    if not result["ok"]:
        result["error"] = output.strip().splitlines()[-1] if output.strip() else "?"
        return result
    (folder,) = (home / "volumes" / "sublimate-data" / "runs").iterdir()
    summary = json.loads((folder / "train-summary.json").read_text())
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="2,4,8,16,32")
    parser.add_argument("--rendezvous", default="static,c10d")
    parser.add_argument("--recovery", default="restart")
    args = parser.parse_args()
    results = []
    print("| N | rendezvous | recovery | load | imports | rendezvous | first step | all-reduce "
          "| PSS/node | PSS all | wall | accuracy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for recovery in args.recovery.split(","):
        for backend in args.rendezvous.split(","):
            for nodes in (int(n) for n in args.nodes.split(",")):
                with tempfile.TemporaryDirectory(prefix="scale-nodes-") as home:
                    result = run(nodes, backend, recovery, Path(home))
                results.append(result)
                if not result["ok"]:
                    print(f"| {nodes} | {backend} | {recovery} | {result['load']} | failed: "
                          f"{result['error'][:90]} | | | | | | {result['wall']:.0f} s | |",
                          flush=True)
                    continue
                print(f"| {nodes} | {backend} | {recovery} | {result['load']} "
                      f"| {result['imports'] or 0:.1f} s | {result['rendezvous_s'] or 0:.1f} s "
                      f"| {result['first_step'] or 0:.1f} s | {result['all_reduce_ms']:.1f} ms "
                      f"| {result['pss_node_mib']:.0f} MiB | {result['pss_total_mib']:,.0f} MiB "
                      f"| {result['wall']:.0f} s | {result['accuracy']} |", flush=True)
    print("\ngrowth (a x N^b over the runs that succeeded):")
    for recovery in args.recovery.split(","):
        for backend in args.rendezvous.split(","):
            chosen = [r for r in results if r["backend"] == backend
                      and r["recovery"] == recovery]
            print(f"  {backend}, {recovery}: " + ", ".join(
                f"{column} {fitted(chosen, column)}" for column in COLUMNS))


if __name__ == "__main__":
    main()
