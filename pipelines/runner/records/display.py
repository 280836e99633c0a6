"""Console progress reporting and the final results table."""

from __future__ import annotations

import re
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import TextIO

from sublimate.pipelines.argo_terms import NodePhase, NodeType

from .run_types import NodeResult, RunEvent, RunResult

MAX_VALUE = 40
# A loop child is named after its item (``sweep(0:accumulation-steps:1,algorithm:sync,...)``,
# as Argo names it); an item of many fields makes a name of a kilobyte. The run folder keeps
# the whole name; the console shows its start, which holds the loop index.
MAX_NAME = 64
_QUIET_TYPES = frozenset({NodeType.STEP_GROUP})  # bookkeeping nodes that clutter the live view
# How a pod's message starts (its ending), and then why, from its termination message.
_ENDING_AND_WHY = re.compile(r"(?P<ending>(Error|Failed)( \(exit code -?\d+\))?): (?P<why>.+)",
                             re.DOTALL)
RECENT_LOG_LINES = 20  # per node: where its own output said why it failed


class _SaidOnce:
    """What the console has said of failures, so that a failure's cause is said once: a step
    whose output said why it failed ends as ``Failed (Error (exit code 1))``, the retry node
    and the workflow above it say ``task 'train' failed`` without the cause again, and the one
    line that says it all is the run's last (``error: ...``, with the node and its log)."""

    KEPT = 256  # the latest messages said: enough for a parent to find its children's

    def __init__(self) -> None:
        self.said: dict[str, None] = {}  # in the order said (a set that forgets the oldest)
        self.recent: dict[str, deque[str]] = {}

    def printed_log(self, node_id: str, line: str) -> None:
        self.recent.setdefault(node_id, deque(maxlen=RECENT_LOG_LINES)).append(line)

    def new_part(self, node: NodeResult | None, message: str) -> str:
        """What to show of ``node``'s (None: the workflow's) message: a step's own whole,
        or its ending alone when its output said the rest; a parent's, less what was said."""
        shown = message
        if node is not None and not node.children:
            ending = _ENDING_AND_WHY.fullmatch(message)
            if ending and any(ending["why"] in line for line in self.recent.get(node.id, ())):
                shown = ending["ending"]
        else:
            for said in sorted(self.said, key=len, reverse=True):
                if said in shown:
                    shown = shown.replace(said, "").rstrip(": ;")
        self.said[message] = None
        while len(self.said) > self.KEPT:
            del self.said[next(iter(self.said))]
        return shown


def console_reporter(
    stream: TextIO | None = None, follow_logs: bool = True
) -> Callable[[RunEvent], None]:
    """A reporter printing phase transitions with elapsed time and, optionally, log lines."""
    lock = threading.Lock()
    start: list[float] = []
    said = _SaidOnce()

    def report(event: RunEvent) -> None:
        out = stream if stream is not None else sys.stderr
        if not start:
            start.append(event.time.timestamp())
        elapsed = event.time.timestamp() - start[0]
        if event.kind == "note":  # said once by the runner (a mounts fallback, a variable from
            # the environment)
            text = f"note: {event.message}"
        elif event.kind == "log":
            if not follow_logs or event.node is None:
                return
            text = f"{shown_name(event.node.display_name)} | {event.line}"
            said.printed_log(event.node.id, event.line)
        elif event.kind == "node" and event.node is not None:
            if event.node.type in _QUIET_TYPES or event.node.id == event.workflow:
                return  # the root node's phase is the workflow's, reported on its own
            text = f"[{elapsed:7.1f}s] {shown_name(event.node.display_name)}: {event.phase}"
            if event.message and (event.phase not in (NodePhase.RUNNING, NodePhase.SUCCEEDED)
                                  or event.node.type == NodeType.SUSPEND):
                # a waiting suspend node: how to resume it
                if new := said.new_part(event.node, event.message):
                    text += f" ({new})"
            elif _cached(event.node) and event.phase == NodePhase.SUCCEEDED:
                text += f" (cached: {event.node.memoization['key']})"  # type: ignore[index]
        else:
            text = f"[{elapsed:7.1f}s] workflow {event.workflow}: {event.phase}"
            if event.message and (new := said.new_part(None, event.message)):
                text += f" ({new})"
        with lock:
            out.write(text + "\n")
            out.flush()

    return report


def _cached(node: NodeResult) -> bool:
    """A memoization hit (``templates/memoize``): finished from the cache, not run."""
    return bool(node.memoization and node.memoization.get("hit"))


def shown_name(name: str) -> str:
    """A node's name as the console shows it: whole up to ``MAX_NAME`` characters, else cut
    with ``...`` (before the closing parenthesis of a loop child's item)."""
    if len(name) <= MAX_NAME:
        return name
    end = ")" if name.endswith(")") else ""
    return name[: MAX_NAME - 3 - len(end)] + "..." + end


def _truncate(text: str, width: int = MAX_VALUE) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 3] + "..."


def _depths(nodes: list[NodeResult]) -> dict[str, int]:
    by_id = {n.id: n for n in nodes}
    depths: dict[str, int] = {}
    for node in nodes:
        depth, parent = 0, node.parent
        while parent is not None and parent in by_id:
            depth += 1
            parent = by_id[parent].parent
        depths[node.id] = depth
    return depths


def _tree_order(nodes: list[NodeResult]) -> list[NodeResult]:
    """Every node right after its parent, under it (depth first), siblings in the order they
    started: a node started while another branch ran stays under its own parent."""
    known = {node.id for node in nodes}
    children: dict[str | None, list[NodeResult]] = {}
    for node in nodes:
        children.setdefault(node.parent if node.parent in known else None, []).append(node)
    ordered: list[NodeResult] = []
    stack = list(reversed(children.get(None, [])))
    while stack:
        node = stack.pop()
        ordered.append(node)
        stack.extend(reversed(children.get(node.id, [])))
    return ordered


# A loop child's name, as Argo gives it: ``sweep(3:algorithm:bmuf,learning-rate:0.05,...)``.
_LOOP_CHILD = re.compile(r"^(?P<base>[^(]*)\((?P<index>\d+):(?P<item>.*)\)$")


def _distinct_names(nodes: list[NodeResult]) -> dict[str, str]:
    """Loop children's names cut down to what tells them apart: the item's fields that differ
    between the siblings (``sweep(3:algorithm:bmuf,learning-rate:0.05)``), so that the points
    of a sweep whose items hold every setting can be told apart at a glance."""
    names: dict[str, str] = {}
    siblings: dict[tuple[str | None, str], list[tuple[NodeResult, str, list[str]]]] = {}
    for node in nodes:
        match = _LOOP_CHILD.match(node.display_name)
        if match and len(node.display_name) > MAX_NAME:
            fields = match.group("item").split(",")
            siblings.setdefault((node.parent, match.group("base")), []).append(
                (node, match.group("index"), fields))
    for (_, base), group in siblings.items():
        if len(group) < 2:
            continue
        varying = {index for index in range(max(len(fields) for _, _, fields in group))
                   if len({tuple(fields[index:index + 1]) for _, _, fields in group}) > 1}
        for node, index, fields in group:
            kept = ",".join(field for position, field in enumerate(fields) if position in varying)
            names[node.id] = f"{base}({index}:{kept})"
    return names


def format_table(result: RunResult, with_message: bool = True) -> str:
    """The final table: one row per node, under its parent (indented by nesting), phase,
    duration, outputs; then the workflow's phase, and its message unless ``with_message`` is
    false (``sublimate run`` ends with it, on a line of its own)."""
    depths = _depths(result.nodes)
    names = _distinct_names(result.nodes)
    rows = [("NODE", "PHASE", "DURATION", "OUTPUTS")]
    for node in _tree_order(result.nodes):
        if node.type in _QUIET_TYPES:
            continue
        label = "  " * depths[node.id] + shown_name(names.get(node.id, node.display_name))
        duration = "-" if node.duration_s is None else f"{node.duration_s:.1f}s"
        # Paths are what a user copies from here: never shortened.
        outputs = ", ".join(f"{k}={v if v.startswith('/') and ' ' not in v else _truncate(v)}"
                            for k, v in node.parameters.items())
        ended_badly = node.phase in (NodePhase.FAILED, NodePhase.ERROR, NodePhase.OMITTED)
        if not outputs and ended_badly and node.message:
            outputs = _truncate(node.message, 60)
        phase = f"{node.phase} (cached)" if _cached(node) else node.phase
        rows.append((label, phase, duration, outputs))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [
        f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]}".rstrip()
        for row in rows
    ]
    footer = f"{result.name}: {result.phase}"
    if result.message and with_message:
        footer += f" ({result.message})"
    return "\n".join([*lines, footer])
