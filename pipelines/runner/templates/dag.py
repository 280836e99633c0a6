"""DAG templates: tasks start as soon as their ``depends``/``dependencies`` allow.

``DagPlan`` decides, with no threads and no processes, which tasks run next and which are
omitted: a task is decided once every task it names has ended; it runs if its ``depends``
expression holds (a bare name means "succeeded or skipped", or failed with ``continueOn``),
and is omitted otherwise, or when the DAG is stopping. A failure that no task handles
(``task.Failed``, ``task.Errored``, ``AnySucceeded``, ``AllFailed``) fails the DAG and, with
``dag.failFast`` (the default), stops new tasks from starting; running ones finish. The
template-level ``failFast`` (off by default) is stricter: any failed or errored child, handled
or not, stops new tasks and loop items, and the DAG fails with Argo's failFast message
(``calls.ChildSlots``). ``run_dag`` runs the decisions, one thread per task.
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, NamedTuple

from sublimate.pipelines.argo_terms import FAILURE_HANDLING_RESULTS, NodePhase, NodeType

from ..errors import NodeError
from ..expressions.conditions import Ast, depends_references, evaluate_depends, parse_depends
from ..expressions.substitution import Vars, substitute_text
from ..pods.scope import CancelScope
from ..records.run_types import NodeResult
from .calls import FAIL_FAST, continues, parallelism_slots
from .outputs import result_vars, template_outputs

if TYPE_CHECKING:
    from ..records.run_folder import RunRecord
    from .context import RunContext


# NamedTuples rather than frozen dataclasses: cheaper to define at every `sublimate run` start.
class Decision(NamedTuple):
    """A task decided: it runs, or it is omitted (``message`` says why)."""

    task: str
    runs: bool
    message: str = ""


class TaskEnd(NamedTuple):
    """How a task ended, as ``depends`` sees it: its phase and, for a loop, its children's
    (None for a task without a loop)."""

    phase: NodePhase
    members: tuple[NodePhase, ...] | None
    daemoned: bool = False  # a daemon, ready and serving: its dependants may start


class DagPlan:
    """Which tasks of one DAG run next, given how the others ended."""

    def __init__(self, dag: dict, target: str = "") -> None:
        """``target``: the DAG's ``target`` as resolved (space-separated task names); none
        means every task."""
        self.tasks: dict[str, dict] = {t["name"]: t for t in dag["tasks"]}
        self.logic: dict[str, Ast] = {}
        for name, task in self.tasks.items():
            if task.get("depends"):
                self.logic[name] = parse_depends(str(task["depends"]))
            elif task.get("dependencies"):
                ast: Ast = ("ref", task["dependencies"][0], None)
                for dep in task["dependencies"][1:]:
                    ast = ("and", ast, ("ref", dep, None))
                self.logic[name] = ast
        self.refs = {n: depends_references(a) for n, a in self.logic.items()}
        if target:
            self._keep(target.split(" "))
        # Dependencies whose failure some task handles: it does not fail the DAG.
        self.handled = {dep for name, refs in self.refs.items() if name in self.tasks
                        for dep, result in refs if result in FAILURE_HANDLING_RESULTS}
        self.fail_fast = dag.get("failFast", True) not in (False, "false")
        self.pending = list(self.tasks)
        self.running: set[str] = set()
        self.ended: dict[str, TaskEnd] = {}
        self.halted = ""  # why no new task starts (failFast)
        self.unhandled: list[str] = []  # failed tasks that fail the DAG, in the order they ended

    def _keep(self, targets: list[str]) -> None:
        """Only the targets and what they depend on, transitively (dag.go executeDAG: each
        target task is executed, and executeDAGTask executes its dependencies first; no other
        task gets a node)."""
        needed: set[str] = set()
        pending = list(targets)  # an empty name (two spaces) names no task, as on Argo
        while pending:
            name = pending.pop()
            if name not in self.tasks:
                raise ValueError(f"target {name} does not exist")  # dag.go GetTask's panic
            if name not in needed:
                needed.add(name)
                pending += self.dependencies(name)
        self.tasks = {n: t for n, t in self.tasks.items() if n in needed}

    def dependencies(self, name: str) -> list[str]:
        return list(dict.fromkeys(dep for dep, _ in self.refs.get(name, [])))

    def roots(self) -> list[str]:
        """The tasks that wait for nothing: the DAG's first wave."""
        return [name for name in self.tasks if not self.refs.get(name)]

    @property
    def complete(self) -> bool:
        return not self.pending and not self.running

    def next(self, stop_reason: str | None = None) -> list[Decision]:
        """Decide every pending task whose dependencies have all ended, in manifest order; an
        omission is an ending too, so tasks after it may be decided in the same call."""
        decisions = []
        for name in list(self.pending):
            if any(dep not in self.ended for dep in self.dependencies(name)):
                continue
            self.pending.remove(name)
            reason = self.halted or stop_reason
            if reason:
                decisions.append(self._omit(name, f"not started: {reason}"))
                continue
            if name in self.logic and not evaluate_depends(self.logic[name], self._holds):
                detail = self.tasks[name].get("depends") or self.tasks[name].get("dependencies")
                decisions.append(self._omit(name, f"omitted: depends condition {detail!r} is "
                                                  "false"))
                continue
            self.running.add(name)
            decisions.append(Decision(name, True))
        if not self.running:
            for name in self.pending:  # only a dependency cycle can leave tasks here
                decisions.append(self._omit(name, "dependency cycle"))
            self.pending.clear()
        return decisions

    def finished(self, name: str, phase: NodePhase,
                 members: tuple[NodePhase, ...] | None = None, daemoned: bool = False) -> None:
        """A running task ended (or, ``daemoned``, is a daemon now serving); ``members`` are a
        loop's children's phases (None: no loop)."""
        self.running.discard(name)
        self.ended[name] = TaskEnd(phase, members, daemoned)
        if phase.failed and not continues(self.tasks[name], phase) and name not in self.handled:
            self.unhandled.append(name)
            if self.fail_fast and not self.halted:
                self.halted = f"task {name!r} failed (failFast)"

    def _omit(self, name: str, message: str) -> Decision:
        self.ended[name] = TaskEnd(NodePhase.OMITTED, None)
        return Decision(name, False, message)

    def _holds(self, dep: str, result: str | None) -> bool:
        end = self.ended[dep]
        phase = end.phase
        if result is None:  # dag.go: Succeeded || Skipped || Daemoned, or continueOn
            return phase in (NodePhase.SUCCEEDED, NodePhase.SKIPPED) or end.daemoned or (
                phase.failed and continues(self.tasks[dep], phase))
        if result == "Errored":
            return phase == NodePhase.ERROR
        # dag.go evaluateDependsLogic: both are computed over a TaskGroup's children only (false
        # for any other node), and AllFailed counts Failed children, not Errored ones.
        if result == "AnySucceeded":
            return any(p == NodePhase.SUCCEEDED for p in end.members or ())
        if result == "AllFailed":
            return bool(end.members) and all(p == NodePhase.FAILED for p in end.members or ())
        if result == "Daemoned":
            return end.daemoned
        return phase == result


def members(node: NodeResult, nodes: dict[str, NodeResult]) -> tuple[NodePhase, ...] | None:
    """A loop's children's phases (none for an empty loop); None for a task without a loop."""
    if node.type == NodeType.TASK_GROUP:
        return tuple(nodes[c].phase for c in node.children)
    return None


_RESULT_WORDS = {
    None: "succeeds",
    "Succeeded": "succeeds",
    "Failed": "fails",
    "Errored": "errors",
    "Skipped": "is skipped",
    "Omitted": "is omitted",
    "Daemoned": "is daemoned",
}


def describe_depends(ast: Ast) -> str:
    """A ``depends`` expression in words: ``train succeeds``, ``B and C succeed``."""
    plain = _plain_refs(ast)
    if plain:
        if len(plain) == 1:
            return f"{plain[0]} succeeds"
        return f"{', '.join(plain[:-1])} and {plain[-1]} succeed"
    return _words(ast)


def _plain_refs(ast: Ast) -> list[str]:
    """The task names of an ``a && b && c`` expression of bare names; empty for anything else."""
    if ast[0] == "ref":
        return [ast[1]] if ast[2] is None else []
    if ast[0] == "and":
        left, right = _plain_refs(ast[1]), _plain_refs(ast[2])
        return left + right if left and right else []
    return []


def _words(ast: Ast, inside: str = "") -> str:
    kind = ast[0]
    if kind == "ref":
        task, result = ast[1], ast[2]
        if result == "AnySucceeded":
            return f"any of {task} succeeds"
        if result == "AllFailed":
            return f"all of {task} fail"
        return f"{task} {_RESULT_WORDS.get(result, f'is {result}')}"
    if kind == "not":
        return f"not ({_words(ast[1])})"
    text = f"{_words(ast[1], kind)} {kind} {_words(ast[2], kind)}"
    return f"({text})" if inside and inside != kind else text


def run_dag(run: RunContext, template: dict, local: Vars, node: NodeResult, scope: CancelScope
            ) -> NodeResult:
    record = run.record
    record.transition(node, NodePhase.RUNNING)
    try:
        target = substitute_text(str(template["dag"].get("target") or ""), local, "dag.target")
        plan = DagPlan(template["dag"], target)
    except (ValueError, NodeError) as exc:  # executeDAG panics on an unknown target
        return record.finish(node, NodePhase.ERROR, f"dag.target: {exc}")
    slots = parallelism_slots(template, local)
    results: dict[str, NodeResult] = {}
    task_vars: Vars = {}
    done: queue.Queue[tuple[str, NodeResult]] = queue.Queue()
    while True:
        halted = FAIL_FAST if slots is not None and slots.halted else None
        for decision in plan.next(scope.stop_reason() or halted):
            name, task = decision.task, plan.tasks[decision.task]
            if not decision.runs:
                results[name] = _omit(record, node, name, task, decision.message)
                continue
            stop = scope.stop_reason()
            if stop:  # stopped while this wave starts: the rest start no thread (issue 40)
                results[name] = _omit(record, node, name, task, f"not started: {stop}")
                plan.finished(name, NodePhase.OMITTED)
                continue
            # dag.go resolves a task's arguments with the global scope as of its start: the
            # workflow outputs earlier tasks set, the current status and duration.
            call_vars = {**local, **run.live_globals(), **task_vars}
            threading.Thread(
                target=lambda n=name, t=task, v=call_vars: done.put((n, run.call(
                    t, v, f"{node.name}.{n}", n, node, scope, slots, "tasks"))),
                daemon=True,
            ).start()
        if plan.complete:
            break
        name, result = done.get()
        results[name] = result
        task_vars.update(result_vars("tasks", name, result, record.nodes))
        plan.finished(name, result.phase, members(result, record.nodes), result.daemoned)
    stop = scope.stop_reason()
    problem = template_outputs(run, template, {**local, **task_vars}, node)
    if stop:
        return record.finish(node, NodePhase.FAILED, stop)
    if slots is not None and slots.halted:  # template-level failFast (operator.go
        return record.finish(node, NodePhase.FAILED, FAIL_FAST)  # checkParallelism)
    if plan.unhandled:
        first = results[plan.unhandled[0]]
        return record.finish(node, NodePhase.FAILED, f"task {plan.unhandled[0]!r} "
                                                     f"{first.phase.lower()}: {first.message}")
    if problem:
        return record.finish(node, NodePhase.ERROR, problem)
    return record.finish(node, NodePhase.SUCCEEDED)


def _omit(record: RunRecord, parent: NodeResult, name: str, task: dict, message: str
          ) -> NodeResult:
    node = record.add_node(f"{parent.name}.{name}", name, task.get("template", ""),
                           NodeType.SKIPPED, parent)
    return record.finish(node, NodePhase.OMITTED, message)
