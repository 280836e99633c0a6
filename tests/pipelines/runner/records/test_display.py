"""The final table of a run: every node under its parent, loop children told apart."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from sublimate.pipelines.argo_terms import NodePhase, NodeType
from sublimate.pipelines.runner.records.display import format_table
from sublimate.pipelines.runner.records.run_types import NodeResult, RunResult

# Argo names a loop child after its item; a sweep's item holds every setting of its point.
FIELDS = ",".join(f"setting-{index}:{index}" for index in range(12))


def _node(node_id: str, name: str, parent: str | None, kind: NodeType = NodeType.POD,
          **outputs: str) -> NodeResult:
    return NodeResult(id=node_id, name=name, display_name=name, template=name, type=kind,
                      phase=NodePhase.SUCCEEDED, parent=parent, parameters=outputs)


def test_a_sweeps_table_puts_each_step_under_its_own_point() -> None:
    """Points run two at a time, so their steps start interleaved: p01's train before p00's.
    Each row still sits under its own point, and each point shows what sets it apart."""
    point = {index: f"sweep({index}:algorithm:{algorithm},{FIELDS},"
                    f"learning-rate:{rate})"
             for index, (algorithm, rate) in enumerate([("sync", 0.1), ("bmuf", 0.05)])}
    nodes = [  # in the order they started, as the runner records them
        _node("wf", "wf", None, NodeType.DAG),
        _node("sweep", "sweep", "wf", NodeType.TASK_GROUP),
        _node("p0", point[0], "sweep", NodeType.DAG),
        _node("p1", point[1], "sweep", NodeType.DAG),
        _node("t1", "train", "p1", run="/runs/p01"),
        _node("t0", "train", "p0", run="/runs/p00"),
        _node("e0", "evaluate", "p0", accuracy="0.9"),
        _node("e1", "evaluate", "p1", accuracy="0.8"),
    ]
    result = RunResult(name="wf", phase=NodePhase.SUCCEEDED, message="", nodes=nodes,
                       started_at=datetime.now(UTC), finished_at=None, run_dir=Path("/x"),
                       parameters={})
    rows = [line.split()[0] for line in format_table(result).splitlines()[1:-1]]
    assert rows == ["wf", "sweep",
                    "sweep(0:algorithm:sync,learning-rate:0.1)", "train", "evaluate",
                    "sweep(1:algorithm:bmuf,learning-rate:0.05)", "train", "evaluate"]
    table = format_table(result)
    assert table.index("sweep(0:") < table.index("run=/runs/p00") < table.index("sweep(1:") \
        < table.index("run=/runs/p01")
