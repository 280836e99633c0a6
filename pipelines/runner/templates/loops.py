"""Loops: a task or step with ``withItems``, ``withParam`` or ``withSequence`` fans out.

Its children run in parallel under a ``TaskGroup`` node named like Argo's ``task(3:value)``;
the group fails when a child fails (even with ``continueOn``, which only lets its dependents and
its DAG go on, as in Argo), and its outputs are
the children's aggregated in item order as JSON lists, as Argo does. ``run_concurrently`` is the
fan-out itself, also used for a step group's parallel steps.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from sublimate.pipelines.argo_terms import NodePhase, NodeType

from ..errors import NodeError
from ..expressions.substitution import Vars, as_text, substitute, substitute_text
from ..records.run_types import NodeResult

if TYPE_CHECKING:
    from ..records.run_folder import RunRecord

# Runs one item: (the child's node name, its display name, the item's variables, the TaskGroup
# node) -> the child's node.
RunItem = Callable[[str, str, Vars, NodeResult], NodeResult]


Item = TypeVar("Item")


def run_concurrently(work: Callable[[int, Item], None], items: Sequence[Item]) -> None:
    """``work(i, item)`` for every item, all at once, and wait for all: Argo starts a step
    group's steps and a loop's items together (parallelism slots limit their pods)."""
    threads = [threading.Thread(target=work, args=(i, item), daemon=True)
               for i, item in enumerate(items)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def loop_items(call: dict, call_vars: Vars, where: str) -> list | None:
    """The call's items, or None when it does not loop; ``NodeError``/``ValueError`` when
    they cannot be resolved."""
    if "withItems" in call:
        return list(substitute(call["withItems"], call_vars,  # type: ignore[call-overload]
                               f"{where}.withItems"))
    if "withParam" in call:
        text = substitute_text(as_text(call["withParam"]), call_vars, f"{where}.withParam")
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise NodeError(f"{where}.withParam: {text!r} is not a JSON list") from exc
        if not isinstance(items, list):
            raise NodeError(f"{where}.withParam: {text!r} is not a JSON list")
        return items
    if "withSequence" in call:
        seq: dict = substitute(call["withSequence"], call_vars,  # type: ignore[assignment]
                               f"{where}.withSequence")
        start = int(seq.get("start", 0))
        if "count" in seq:
            numbers = list(range(start, start + int(seq["count"])))
        else:
            end = int(seq.get("end", 0))
            numbers = list(range(start, end + 1) if end >= start else range(start, end - 1, -1))
        fmt = seq.get("format")
        return [fmt % n if fmt else str(n) for n in numbers]
    return None


def item_vars(item: object) -> Vars:
    out = {"item": as_text(item)}
    if isinstance(item, dict):
        for key, value in item.items():
            out[f"item.{key}"] = as_text(value)
    return out


def item_display(display: str, index: int, item: object) -> str:
    """A child's display name: ``task(0:a)``, ``task(1:os:linux,v:1)``."""
    if isinstance(item, dict):
        label = ",".join(f"{k}:{as_text(v)}" for k, v in sorted(item.items()))
    else:
        label = as_text(item)
    return f"{display}({index}:{label})"


def loop_index(node: NodeResult) -> int:
    """The item index of a loop child named like Argo's ``task(3:value)``."""
    _, _, rest = node.display_name.partition("(")
    index, _, _ = rest.partition(":")
    return int(index) if index.isdigit() else 0


def run_loop(record: RunRecord, call: dict, items: list, name: str, display: str,
             parent: NodeResult, run_item: RunItem) -> NodeResult:
    """Run every item at once under a TaskGroup node; ``run_item`` runs one of them."""
    group = record.add_node(name, display, call["template"], NodeType.TASK_GROUP, parent)
    if not items:
        return record.finish(group, NodePhase.SKIPPED, "Skipped, empty loop items")
    record.transition(group, NodePhase.RUNNING)
    children: list[NodeResult | None] = [None] * len(items)

    def run(i: int, item: object) -> None:
        child = item_display(display, i, item)
        children[i] = run_item(f"{parent.name}.{child}", child, item_vars(item), group)

    run_concurrently(run, items)
    # dag.go executeDAGTask: the group takes the phase of its last failed or errored child in
    # item order, whatever the call's continueOn; continueOn is applied by those who read the
    # group's phase (dependents, the DAG's or step group's own phase), as for any other node.
    failed = [c for c in children if c is not None and c.phase.failed]
    if failed:
        return record.finish(group, failed[-1].phase, f"child {failed[-1].display_name!r} "
                                                      f"{failed[-1].phase.lower()}")
    return record.finish(group, NodePhase.SUCCEEDED)


def group_vars(base: str, children: list[NodeResult]) -> Vars:
    """A loop's outputs: each output parameter and the results as JSON lists, in item order."""
    # Children register as their threads start; Argo aggregates in item order.
    ordered = sorted(children, key=loop_index)
    out: Vars = {}
    names = dict.fromkeys(p for c in ordered for p in c.parameters)
    for pname in names:
        out[f"{base}.outputs.parameters.{pname}"] = json.dumps(
            [c.parameters[pname] for c in ordered if pname in c.parameters])
    out[f"{base}.outputs.parameters"] = json.dumps(
        [c.parameters for c in ordered if c.parameters])
    results = [_json_or_text(c.result) for c in ordered if c.result is not None]
    out[f"{base}.outputs.result"] = json.dumps(results)
    return out


def _json_or_text(text: str | None) -> object:
    try:
        value = json.loads(text or "")
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, dict) else text
