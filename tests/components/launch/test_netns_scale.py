"""Many small nodes on one machine: 16 `local_netns` nodes train the default pipeline (static
rendezvous, docs/scale.md) to the same model as 2, and leave nothing behind. About a minute on
2 cores; benchmarks/scale_nodes.py measures 2 to 32."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from sublimate.components.launch import netns_cluster
from tests.components.launch.test_netns_scheduler import assert_cluster_gone, netns
from tests.conftest import results_folder, run_cli, run_outputs

__all__ = ["netns"]


def test_sixteen_nodes_train_like_two_and_leave_nothing(netns: None, tmp_path: Path) -> None:
    sixteen = run_cli("run", "-p", "scheduler=local_netns", "-p", "nodes=16", "-p", "epochs=1",
                      home=tmp_path / "sixteen", timeout=300)
    assert sixteen.returncode == 0, sixteen.stdout[-3000:] + sixteen.stderr[-3000:]
    # Nothing of this job is left: bridge, nodes' namespaces (their links with them), processes,
    # cgroups. (Judged by the job's own record, cluster.json: the machine is shared, and other
    # jobs' clusters come and go meanwhile.)
    (cluster_file,) = results_folder(tmp_path / "sixteen").glob("logs/**/cluster.json")
    assert_cluster_gone(cluster_file)
    host_veth = netns_cluster.Cluster.load(cluster_file).host_veth
    assert not host_veth or subprocess.run(["ip", "link", "show", host_veth],
                                           capture_output=True).returncode != 0
    # One global batch, one seed: 16 nodes take the same steps as 2 and land on the same model.
    two = run_cli("run", "-p", "nodes=2", "-p", "epochs=1", home=tmp_path / "two")
    assert two.returncode == 0, two.stderr[-3000:]
    assert run_outputs(sixteen.stdout)["accuracy"] == run_outputs(two.stdout)["accuracy"]
    run = results_folder(tmp_path / "sixteen")
    summary = json.loads((run / "train-summary.json").read_text())
    assert summary["world_size"] == 16
    assert sorted(path.name for path in (run / "metrics").glob("rank-*.jsonl")) == sorted(
        f"rank-{rank}.jsonl" for rank in range(16))
