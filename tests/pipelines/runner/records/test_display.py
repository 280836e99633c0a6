"""The final table of a run: every node under its parent, loop children told apart; the live
progress lines, a failure's cause said once."""

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


def test_a_failures_cause_is_shown_once_and_each_failed_step_keeps_its_ending() -> None:
    """Two steps fail in parallel: `a` said why in its output, so its line keeps the ending
    alone; `b` said nothing, so its line has its whole message; the DAG above them and the
    workflow do not repeat what the steps said."""
    import io

    from sublimate.pipelines.runner.records.display import console_reporter
    from sublimate.pipelines.runner.records.run_types import RunEvent

    why = "rank 1 (node1) failed: ValueError: bad shape; its log: /runs/x/1/stderr.log"
    a = NodeResult(id="a", name="a", display_name="a", template="a", type=NodeType.POD)
    b = NodeResult(id="b", name="b", display_name="b", template="b", type=NodeType.POD)
    dag = NodeResult(id="d", name="d", display_name="d", template="d", type=NodeType.DAG,
                     children=["a", "b"])
    out = io.StringIO()
    report = console_reporter(out)
    now = datetime.now(UTC)
    for event in [
        RunEvent("log", "wf", now, node=a, line=f"train: error: {why}"),
        RunEvent("node", "wf", now, NodePhase.FAILED, a, message=f"Error (exit code 1): {why}"),
        RunEvent("node", "wf", now, NodePhase.FAILED, b, message="Error (exit code 3)"),
        RunEvent("node", "wf", now, NodePhase.FAILED, dag,
                 message=f"task 'a' failed: Error (exit code 1): {why}"),
        RunEvent("workflow", "wf", now, NodePhase.FAILED,
                 message=f"task 'd' failed: task 'a' failed: Error (exit code 1): {why}"),
    ]:
        report(event)
    lines = [line.split("] ", 1)[-1] for line in out.getvalue().splitlines()]
    assert lines == [f"a | train: error: {why}",
                     "a: Failed (Error (exit code 1))",
                     "b: Failed (Error (exit code 3))",
                     "d: Failed (task 'a' failed)",
                     "workflow wf: Failed (task 'd' failed)"]
