"""A run again, keeping what an earlier run of it did: ``argo retry`` and
``argo resubmit --memoized`` (``workflow/util/util.go``: FormulateRetryWorkflow,
FormulateResubmitWorkflow), for local runs.

Planning (``plan_retry``, ``plan_resubmit``) reads the earlier run's ``status.json`` and decides
which of its nodes are *carried*: taken as they ended, outputs and all, instead of run again. As
in Argo:

- a failed execution node (a pod, a container, a suspend or an http node; for an attempt of a
  ``retryStrategy``, its retry node) runs again, with everything that comes after it in its
  steps or DAG (later step groups, tasks that depend on it, transitively), unless something
  after it succeeded (its failure was handled: ``continueOn``, ``depends: A.Failed``), when it
  stays as it ended;
- with ``restart_successful`` and a node field selector, the matching nodes run again too, with
  what comes after them;
- every steps, DAG, step group, task group and retry node above a node that runs again is walked
  again; the exit handler always runs again;
- everything else that succeeded is carried.

Running: ``Run.execute`` asks ``CarriedNodes.take`` before it runs an invocation; a carried one is
restored whole (``carry``): its node and every node under it as they ended, their outputs, and the
workflow outputs (``globalName``) they set; the steps and DAGs that hold it read its outputs as if
it had just run. Step groups, loops' task groups and skipped nodes are made again by the walk
(a ``when`` is evaluated again, on the same values).

One local departure, said in a note: a carried node whose outputs name an artifact that no
longer exists here is not carried (it runs again, with what comes after it), so that a later
step is never handed a path to nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from sublimate.pipelines.argo_terms import NodePhase, NodeType

from ..records.control import ControlError, node_fields, parse_selector, selector_matches
from ..records.run_types import CarriedNodes, NodeResult, RunEvent, now, parse_iso
from .dag import DagPlan
from .outputs import set_artifact, set_param

if TYPE_CHECKING:
    from .context import RunContext

# util.go isExecutionNodeType: the nodes that did work, as opposed to the ones that hold others
EXECUTION_TYPES = frozenset({NodeType.POD, NodeType.CONTAINER, NodeType.SUSPEND, NodeType.HTTP})
# the nodes whose children are attempts or items of one call (util.go FindRetryNodeByChild;
# a loop's items come after what its task comes after)
_WRAPPERS = frozenset({NodeType.RETRY, NodeType.TASK_GROUP})


class RerunError(ValueError):
    """A retry or resubmit that cannot be made (nothing was started); one line saying why."""


# --------------------------------------------------------------------------------- planning


def plan_retry(status: dict, workflow: dict, restart_successful: bool = False,
               node_field_selector: str = "") -> CarriedNodes:
    """What ``argo retry [--restart-successful --node-field-selector S]`` keeps of the run whose
    status is ``status`` (run from ``workflow``, as its run folder holds it)."""
    phase = status.get("phase")
    if node_field_selector and not restart_successful:
        raise RerunError("--node-field-selector needs --restart-successful: the nodes it "
                         "names succeeded, and only that option runs succeeded nodes again")
    if phase == NodePhase.SUCCEEDED:
        if not (restart_successful and node_field_selector):
            raise RerunError(f"run {status.get('name')} succeeded: to run some of its nodes "
                             "again, give --restart-successful and --node-field-selector")
    elif phase not in (NodePhase.FAILED, NodePhase.ERROR):
        raise RerunError(f"run {status.get('name')} is {phase}: only a Failed or Error run "
                         "is retried")
    selected: set[str] = set()
    if restart_successful and node_field_selector:
        try:
            terms = parse_selector(node_field_selector)
        except ControlError as error:
            raise RerunError(str(error)) from None
        graph = _Graph(status, workflow)
        selected = {nid for nid, node in graph.nodes.items()
                    if selector_matches(terms, _fields(node))}
        if not selected:
            raise RerunError(f"no node of run {status.get('name')} matches "
                             f"--node-field-selector {node_field_selector}")
    return _plan(status, workflow, selected)


def plan_resubmit(status: dict, workflow: dict) -> CarriedNodes:
    """What ``argo resubmit --memoized`` keeps: as a retry (the run must have failed), taken
    into a new run."""
    phase = status.get("phase")
    if phase not in (NodePhase.FAILED, NodePhase.ERROR):
        raise RerunError(f"run {status.get('name')} is {phase}: --memoized resubmits a Failed "
                         "or Error run only (without it, any finished run is resubmitted)")
    return _plan(status, workflow, set())


def _fields(node: dict) -> dict[str, str]:
    """What a node field selector may test of an earlier node (as ``control.node_fields``)."""
    view = NodeResult(node["id"], node["name"], node.get("display_name", ""),
                      node.get("template", ""), NodeType(node["type"]),
                      NodePhase(node["phase"]))
    return node_fields(view, {})


class _Graph:
    """The earlier run's nodes, and what comes after each in Argo's sense (its node's children
    there: a step's later groups, a task's dependants)."""

    def __init__(self, status: dict, workflow: dict) -> None:
        self.name = str(status.get("name") or "")
        self.nodes: dict[str, dict] = {n["id"]: n for n in status.get("nodes") or []}
        self.templates = {t["name"]: t for t in (workflow.get("spec") or {}).get("templates")
                          or []}

    def parent(self, node: dict) -> dict | None:
        return self.nodes.get(node.get("parent") or "")

    def subtree(self, node: dict) -> Iterable[dict]:
        pending = [node]
        while pending:
            current = pending.pop()
            yield current
            pending += [self.nodes[c] for c in current.get("children") or [] if c in self.nodes]

    def call(self, node: dict) -> dict:
        """The node of the invocation ``node`` is an attempt or an item of (itself if none)."""
        while (parent := self.parent(node)) is not None and parent["type"] in _WRAPPERS:
            node = parent
        return node

    def after(self, node: dict) -> list[dict]:
        """The nodes that come after ``node``'s invocation in the steps or DAG that holds it:
        later step groups, or the tasks that depend on it, transitively."""
        call = self.call(node)
        holder = self.parent(call)
        if holder is None:
            return []
        siblings = [self.nodes[c] for c in holder.get("children") or [] if c in self.nodes]
        if holder["type"] == NodeType.STEP_GROUP:
            steps = self.parent(holder)
            if steps is None:
                return []
            groups = [self.nodes[c] for c in steps.get("children") or [] if c in self.nodes]
            return groups[groups.index(holder) + 1:] if holder in groups else []
        if holder["type"] == NodeType.DAG:
            template = self.templates.get(holder.get("template", ""))
            dag = (template or {}).get("dag")
            if not dag:
                return []
            plan = DagPlan(dag)
            dependants: dict[str, set[str]] = {}
            for task in plan.tasks:
                for dependency in plan.dependencies(task):
                    dependants.setdefault(dependency, set()).add(task)
            found: set[str] = set()
            pending = [call.get("display_name", "")]
            while pending:
                for task in dependants.get(pending.pop(), ()):
                    if task not in found:
                        found.add(task)
                        pending.append(task)
            return [sibling for sibling in siblings if sibling.get("display_name") in found]
        return []

    def descendants(self, node: dict) -> set[str]:
        """``node``, what is under it, and what comes after it with what is under that (util.go
        getChildren on Argo's node graph)."""
        found = {n["id"] for n in self.subtree(node)}
        for later in self.after(node):
            found |= {n["id"] for n in self.subtree(later)}
        return found

    def ancestors(self, node: dict) -> Iterable[dict]:
        parent = self.parent(node)
        while parent is not None:
            yield parent
            parent = self.parent(parent)


def _plan(status: dict, workflow: dict, selected: set[str]) -> CarriedNodes:
    graph = _Graph(status, workflow)
    exit_prefix = f"{graph.name}.onExit"
    # what runs again: the selected nodes, the failed execution nodes (by their retry node)
    # whose failure nothing after them got past, each with what comes after it
    starts = set(selected)
    for node in graph.nodes.values():
        if node["phase"] not in (NodePhase.FAILED, NodePhase.ERROR):
            continue
        if node["type"] not in EXECUTION_TYPES or node["name"].startswith(exit_prefix):
            continue
        call = node
        parent = graph.parent(node)
        if parent is not None and parent["type"] == NodeType.RETRY:
            call = parent
        later = graph.descendants(call) - {call["id"]}
        if not any(graph.nodes[n]["phase"] == NodePhase.SUCCEEDED and n not in selected
                   for n in later):
            starts.add(call["id"])
    gone = _missing_artifacts(graph.nodes.values())
    again: set[str] = set()
    pending = sorted(starts | gone)
    while pending:
        start = pending.pop()
        if start in again:
            continue
        found = graph.descendants(graph.nodes[start])
        again |= found
        pending += sorted(found - again)
    walked = {a["id"] for n in again for a in graph.ancestors(graph.nodes[n])}
    carried = frozenset(
        nid for nid, node in graph.nodes.items()
        if nid not in again and nid not in walked and not node["name"].startswith(exit_prefix)
        and (node["phase"] == NodePhase.SUCCEEDED
             or (node["phase"] in (NodePhase.FAILED, NodePhase.ERROR)
                 and node["type"] in EXECUTION_TYPES)))
    rerun = called_names(graph.nodes, again)
    return CarriedNodes(graph.name, graph.nodes,
                        {graph.nodes[n]["name"]: graph.nodes[n] for n in carried}, rerun)


def called_names(nodes: dict[str, dict], ids: Iterable[str]) -> tuple[str, ...]:
    """The display names of the execution nodes among ``ids``, an attempt named by its retry
    node (``train``, not ``train(0)``): what a person calls the steps."""
    names = set()
    for nid in ids:
        node = nodes[nid]
        if node["type"] not in EXECUTION_TYPES:
            continue
        parent = nodes.get(node.get("parent") or "")
        if parent is not None and parent["type"] == NodeType.RETRY:
            node = parent
        names.add(node.get("display_name", ""))
    return tuple(sorted(names))


def _missing_artifacts(nodes: Iterable[dict]) -> set[str]:
    """Succeeded nodes whose outputs name an artifact no longer here (their run folder or the
    home's repository cleaned): they run again rather than hand on a path to nothing."""
    return {node["id"] for node in nodes if node["phase"] == NodePhase.SUCCEEDED
            and any(str(path).startswith("/") and not os.path.exists(path)
                    for path in ((node.get("outputs") or {}).get("artifacts") or {}).values())}


# ---------------------------------------------------------------------------------- running


def carry(run: RunContext, earlier: dict, name: str, parent: NodeResult | None,
          carried: CarriedNodes) -> NodeResult:
    """Node ``name`` as ``earlier`` ended, with every node under it, their outputs restored
    (the workflow outputs they set too); returns the node."""
    record = run.record
    node = _restore_one(run, earlier, name, parent)
    pending = [(node, earlier)]
    while pending:
        restored, source = pending.pop()
        for child_id in source.get("children") or []:
            child = carried.earlier.get(child_id)
            if child is None:
                continue
            child_name = name + child["name"][len(earlier["name"]):]
            pending.append((_restore_one(run, child, child_name, restored), child))
    record.status_changed()
    # one event, its times as they were: the console shows it ended, as it did
    record.emit(RunEvent("node", record.name, now(), phase=node.phase, node=node,
                         message=node.message))
    return node


def _restore_one(run: RunContext, earlier: dict, name: str, parent: NodeResult | None
                 ) -> NodeResult:
    record = run.record
    node = record.add_node(name, earlier.get("display_name", ""), earlier.get("template", ""),
                           NodeType(earlier["type"]), parent)
    node.phase = NodePhase(earlier["phase"])
    node.message = earlier.get("message") or ""
    node.started_at = parse_iso(earlier["started_at"]) if earlier.get("started_at") else None
    node.finished_at = parse_iso(earlier["finished_at"]) if earlier.get("finished_at") else None
    if earlier.get("log"):
        node.log = Path(earlier["log"])
    if earlier.get("memoizationStatus"):
        node.memoization = dict(earlier["memoizationStatus"])
    node.inputs = dict((earlier.get("inputs") or {}).get("parameters") or {})
    outputs = earlier.get("outputs") or {}
    declared = (run.templates.get(node.template) or {}).get("outputs") or {}
    params = {p.get("name"): p for p in declared.get("parameters") or []}
    for key, value in (outputs.get("parameters") or {}).items():
        set_param(run, node, params.get(key) or {"name": key}, str(value))
    arts = {a.get("name"): a for a in declared.get("artifacts") or []}
    for key, path in (outputs.get("artifacts") or {}).items():
        set_artifact(run, node, arts.get(key) or {"name": key}, str(path))
    if outputs.get("result") is not None:
        node.result = str(outputs["result"])
    if outputs.get("exitCode") not in (None, ""):
        with contextlib.suppress(ValueError):
            node.exit_code = int(outputs["exitCode"])
    return node



__all__ = ["RerunError", "called_names", "carry", "plan_resubmit", "plan_retry"]
