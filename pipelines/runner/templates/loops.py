"""Loops: a task or step with ``withItems``, ``withParam`` or ``withSequence`` fans out.

Its children run in parallel under a ``TaskGroup`` node named like Argo's ``task(3:value)``;
the group fails when a child fails (even with ``continueOn``, which only lets its dependents and
its DAG go on, as in Argo), and its outputs are
the children's aggregated in item order as JSON lists, as Argo does. ``run_concurrently`` is the
fan-out itself, also used for a step group's parallel steps.

A run makes at most ``RunOptions.max_nodes`` nodes (``sublimate run --max-nodes``). Argo has no
such count: it bounds a workflow by its object in etcd (the controller's packer compresses the
status past 1 MiB, then offloads it to a database or fails the workflow "workflow is longer
than maximum allowed size"); a local run has no etcd, and its memory, its threads and its
``status.json`` grow with its nodes. So a loop whose items alone would pass the cap is refused
before any item exists: a literal one before the run starts (``check_loop_sizes``), one known
only as it runs (``withParam``, a parameter's count) as its task starts (``loop_items``), its
items counted before they are built, so ``withSequence: {count: 1000000}`` costs nothing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from sublimate.pipelines.argo_terms import NodePhase, NodeType

from ..errors import ManifestError, NodeError
from ..expressions.substitution import Vars, as_text, substitute, substitute_text
from ..records.run_types import NodeResult

if TYPE_CHECKING:
    from ..records.run_folder import RunRecord

# Runs one item: (the child's node name, its display name, the item's variables, the TaskGroup
# node) -> the child's node.
RunItem = Callable[[str, str, Vars, NodeResult], NodeResult]


Item = TypeVar("Item")


def run_concurrently(work: Callable[[int, Item], None], items: Sequence[Item],
                     stopped: Callable[[], str | None] | None = None,
                     skip: Callable[[int, Item, str], None] | None = None) -> None:
    """``work(i, item)`` for every item, all at once, and wait for all: Argo starts a step
    group's steps and a loop's items together (parallelism slots limit their pods).

    Once ``stopped()`` gives a reason, the items not started yet get ``skip(i, item, reason)``
    here instead of a thread each: starting a thread waits for it to run, which among
    thousands of busy threads takes milliseconds, so a stopped fan-out of thousands would
    otherwise keep its runner going for minutes (issue 40: SIGTERM must end any run in 10 s)."""
    threads = []
    for i, item in enumerate(items):
        reason = stopped() if stopped is not None else None
        if reason is not None and skip is not None:
            skip(i, item, reason)
            continue
        thread = threading.Thread(target=work, args=(i, item), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()


RAISE_CAP = "sublimate run --max-nodes N raises it"


def over_cap(where: str, count: int, cap: int, made: int = 0) -> str:
    """The one line of a loop refused by the node cap."""
    so_far = f"{made:,} made so far; " if made else ""
    return (f"{where}: {count:,} items would take this run past its cap of {cap:,} nodes "
            f"({so_far}{RAISE_CAP})")


def cap_reached(template: str, cap: int) -> str:
    """The one line of a run stopped by the node cap (what grew it: a template's calls)."""
    return f"template {template!r}: this run reached its cap of {cap:,} nodes ({RAISE_CAP})"


def loop_items(call: dict, call_vars: Vars, where: str, room: int | None = None,
               cap: int = 0) -> list | None:
    """The call's items, or None when it does not loop; ``NodeError``/``ValueError`` when
    they cannot be resolved. ``room``: how many more nodes the run may make (of ``cap``); a
    loop of more items is a ``NodeError`` (``over_cap``), counted before they are built."""

    def fits(count: int, field: str) -> None:
        if room is not None and count > room:
            raise NodeError(over_cap(f"{where}.{field}", count, cap, cap - room))

    if "withItems" in call:
        fits(len(call["withItems"]) if isinstance(call["withItems"], list) else 0, "withItems")
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
        fits(len(items), "withParam")
        return items
    if "withSequence" in call:
        seq: dict = substitute(call["withSequence"], call_vars,  # type: ignore[assignment]
                               f"{where}.withSequence")
        numbers = sequence_numbers(seq)
        fits(len(numbers), "withSequence")
        fmt = seq.get("format")
        return [fmt % n if fmt else str(n) for n in numbers]
    return None


def sequence_numbers(seq: dict) -> range:
    """A ``withSequence``'s numbers (operator.go expandSequence): a range, so that its length
    is known before a single item is made; ``ValueError`` for a value that is not a number."""
    start = int(seq.get("start", 0))
    if "count" in seq:
        return range(start, start + int(seq["count"]))
    end = int(seq.get("end", 0))
    return range(start, end + 1) if end >= start else range(start, end - 1, -1)


def check_loop_sizes(spec: dict, params: dict[str, str], cap: int) -> None:
    """Refuse, before the run starts, a loop whose items alone would pass the cap
    (``ManifestError``, ``over_cap``'s line): its size known from the manifest, with the
    workflow's parameters substituted (``count: "{{workflow.parameters.n}}"``); loops sized
    by anything else are counted as they start (``loop_items``)."""
    scope = {f"workflow.parameters.{name}": value for name, value in params.items()}
    for template in spec.get("templates") or []:
        for where, call in _calls(template):
            size = _known_size(call, scope)
            if size is not None and size[1] >= cap:  # with the workflow's own node, past it
                raise ManifestError(over_cap(f"template {template.get('name')!r}: {where}."
                                             f"{size[0]}", size[1], cap))


def _calls(template: dict) -> Iterator[tuple[str, dict]]:
    for task in (template.get("dag") or {}).get("tasks") or []:
        yield f"tasks.{task.get('name')}", task
    for group in template.get("steps") or []:
        for step in group or []:
            yield f"steps.{step.get('name')}", step


def _known_size(call: dict, scope: Vars) -> tuple[str, int] | None:
    """A loop's field and its number of items, when the manifest and the workflow's
    parameters alone say it (None: no loop, or one known only as it runs)."""
    if isinstance(call.get("withItems"), list):
        return "withItems", len(call["withItems"])
    if isinstance(call.get("withSequence"), dict):
        try:
            seq: dict = substitute(call["withSequence"], scope,  # type: ignore[assignment]
                                   "withSequence")
            return "withSequence", len(sequence_numbers(seq))
        except (NodeError, ValueError, TypeError):
            return None  # a task's input, say: counted when the loop starts
    if isinstance(call.get("withParam"), str) and "{{" in call["withParam"]:
        try:
            items = json.loads(substitute_text(call["withParam"], scope, "withParam"))
        except (NodeError, ValueError):
            return None
        return ("withParam", len(items)) if isinstance(items, list) else None
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
             parent: NodeResult, run_item: RunItem,
             stopped: Callable[[], str | None] | None = None) -> NodeResult:
    """Run every item at once under a TaskGroup node; ``run_item`` runs one of them. Once
    ``stopped()`` gives a reason, the items not started yet are omitted here, as ``call_one``
    omits an item that the stop finds waiting."""
    group = record.add_node(name, display, call["template"], NodeType.TASK_GROUP, parent)
    if not items:
        return record.finish(group, NodePhase.SKIPPED, "Skipped, empty loop items")
    record.transition(group, NodePhase.RUNNING)
    children: list[NodeResult | None] = [None] * len(items)

    def run(i: int, item: object) -> None:
        child = item_display(display, i, item)
        children[i] = run_item(f"{parent.name}.{child}", child, item_vars(item), group)

    def omit(i: int, item: object, reason: str) -> None:
        child = item_display(display, i, item)
        node = record.add_node(f"{parent.name}.{child}", child, call["template"],
                               NodeType.SKIPPED, group)
        children[i] = record.finish(node, NodePhase.OMITTED, f"not started: {reason}")

    run_concurrently(run, items, stopped, omit)
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
