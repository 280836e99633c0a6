"""A large fan-out through the local runner: its record (`status.json`) grows by a bounded size
per node, and the runner's memory stays bounded (benchmarks/engine_sizes.py runs 1,000)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

NODES = 300
RUN_AND_REPORT_PEAK = """
import resource, subprocess, sys
done = subprocess.run([sys.executable, "-m", "sublimate.pipelines", "run", sys.argv[1]])
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(done.returncode)
"""


def fan_out_manifest(count: int) -> str:
    """A Workflow of ``count`` trivial steps (``true``), 16 at a time (also the benchmark's)."""
    return f"""apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {{generateName: fan-out-}}
spec:
  entrypoint: main
  templates:
  - name: main
    parallelism: 16
    dag:
      tasks:
      - {{name: step, template: step, withSequence: {{count: "{count}"}}}}
  - name: step
    container: {{image: busybox, command: ["true"]}}
"""


def test_a_fan_out_of_300_steps_keeps_a_small_record_per_node(tmp_path: Path) -> None:
    manifest = tmp_path / "fan-out.yaml"
    manifest.write_text(fan_out_manifest(NODES))
    # Run through a parent of its own, whose children's peak memory is the runner's alone.
    done = subprocess.run([sys.executable, "-c", RUN_AND_REPORT_PEAK, str(manifest)],
                          env={**os.environ, "SUBLIMATE_HOME": str(tmp_path / "home")},
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (status,) = (tmp_path / "home" / "runs").glob("*/status.json")
    pods = [node for node in json.loads(status.read_text())["nodes"] if node["type"] == "Pod"]
    assert len(pods) == NODES and all(node["phase"] == "Succeeded" for node in pods)
    # 620 B per node measured; the bound leaves room for a longer name or two more fields
    assert status.stat().st_size < 1024 * NODES
    # the runner (the largest process of the run) stays far below a node's memory
    assert int(done.stdout.splitlines()[-1]) < 400 * 1024  # kB
