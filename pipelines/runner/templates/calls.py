"""A DAG task or a step, invoked once: its ``when``, its arguments, then its template.

Loops (``loops``) call ``call_one`` once per item. ``continues`` is ``continueOn``: whether a
failed call leaves its DAG, steps or loop going.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING

from sublimate.pipelines.argo_terms import NodePhase, NodeType

from ..errors import NodeError
from ..expressions.conditions import ExpressionError, evaluate_when
from ..expressions.substitution import Vars, as_text, substitute, substitute_text
from ..pods.scope import CancelScope
from ..records.run_types import NodeResult

if TYPE_CHECKING:
    from .context import RunContext


def continues(call: dict, phase: NodePhase) -> bool:
    cont = call.get("continueOn") or {}
    key = "failed" if phase == NodePhase.FAILED else "error"
    return cont.get(key) in (True, "true")


def when_text(call: dict, call_vars: Vars, where: str) -> str | None:
    """The call's ``when`` with its variables substituted, or None when it has none."""
    if call.get("when") is None:
        return None
    return substitute_text(as_text(call["when"]), call_vars, f"{where}.when")


def call_arguments(call: dict, call_vars: Vars, where: str) -> dict:
    """The call's arguments, substituted: ``{"parameters": {name: value}, "artifacts": {...}}``."""
    args: dict = substitute(call.get("arguments") or {}, call_vars,  # type: ignore[assignment]
                            f"{where}.arguments")
    artifacts = {a["name"]: a for a in args.get("artifacts") or []}
    for name, art in artifacts.items():
        if art.get("fromExpression"):
            # dag.go/steps.go resolveArtifact: the expression names the artifact to pass on.
            from .outputs import artifact_source

            path = artifact_source(art, call_vars, f"{where}.arguments.artifacts.{name}")
            artifacts[name] = {**art, "from": path}
    return {
        "parameters": {p["name"]: p.get("value", "") for p in args.get("parameters") or []},
        "artifacts": artifacts,
    }


def call_one(run: RunContext, call: dict, call_vars: Vars, name: str, display: str,
             parent: NodeResult, scope: CancelScope, slots: threading.Semaphore | None,
             where: str) -> NodeResult:
    record = run.record
    try:
        condition = when_text(call, call_vars, where)
        if condition is not None and not evaluate_when(condition):
            node = record.add_node(name, display, call["template"], NodeType.SKIPPED, parent)
            return record.finish(node, NodePhase.SKIPPED, f"when {condition!r} evaluated false")
        arguments = call_arguments(call, call_vars, where)
    except (NodeError, ExpressionError) as exc:
        node = record.add_node(name, display, call["template"], NodeType.POD, parent)
        return record.finish(node, NodePhase.ERROR, str(exc))
    if slots is not None and not acquire_slot(slots, scope):  # stopped while it waited
        node = record.add_node(name, display, call["template"], NodeType.SKIPPED, parent)
        return record.finish(node, NodePhase.OMITTED,
                             f"not started: {scope.stop_reason() or 'stopped'}")
    try:
        stop = scope.stop_reason() or (FAIL_FAST if isinstance(slots, ChildSlots)
                                       and slots.halted else None)
        if stop:
            node = record.add_node(name, display, call["template"], NodeType.SKIPPED, parent)
            return record.finish(node, NodePhase.OMITTED, f"not started: {stop}")
        result = run.execute(call["template"], arguments, name, display, parent, scope)
        if isinstance(slots, ChildSlots) and slots.fail_fast and result.phase.failed:
            # node_counters.go getUnsuccessfulChildren counts any Failed or Errored child,
            # continueOn or not: from now on checkParallelism starts no child of the template.
            slots.halted = True
        return result
    finally:
        if slots is not None:
            slots.release()


# operator.go checkParallelism: the message of a template that stopped on template-level failFast.
FAIL_FAST = "template has failed or errored children and failFast enabled"


class Slots(threading.Semaphore):
    """``parallelism``'s slots (a workflow's pods, a template's calls): a semaphore whose
    waiters a stop of their scope releases all at once.

    ``threading.Semaphore`` hands a freed slot to one waiter at a time, so a stopped fan-out
    of thousands ended one hand-over after another, each a switch among thousands of threads
    (0.5 ms each: 4.4 s for 9,000 waiting items; issue 40). Here each waiter waits on a lock
    of its own, registered with its scope as one more thing to stop; freed slots go to the
    waiters in the order they came. A subclass, so that every ``threading.Semaphore`` in the
    runner's signatures takes it; none of the base class's state is used."""

    def __init__(self, value: int = 1) -> None:  # no super().__init__(): its state is unused
        self._guard = threading.Lock()
        self._free = value
        self._waiting: deque[_SlotWaiter] = deque()

    def acquire(self, blocking: bool = True, timeout: float | None = None,
                scope: CancelScope | None = None) -> bool:
        """A slot (True), or False when ``timeout`` passed or ``scope`` was stopped first."""
        with self._guard:
            if self._free > 0:
                self._free -= 1
                return True
            if not blocking:
                return False
            waiter = _SlotWaiter(self._guard)
            self._waiting.append(waiter)
        if scope is not None:
            scope.add(waiter)  # a scope stopped already stops it at once
        try:
            waiter.gate.acquire(timeout=-1 if timeout is None else timeout)
        finally:
            # A stopped scope forgets its waiters with it: thousands of waiters released at
            # once each taking the run's lock again only slow the stop down.
            if scope is not None and scope.stop_reason() is None:
                scope.discard(waiter)
        with self._guard:
            waiter.cancelled = not waiter.granted  # a timeout: the next release skips it
            return waiter.granted

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self, n: int = 1) -> None:
        with self._guard:
            for _ in range(n):
                self._hand_over()

    def _hand_over(self) -> None:
        """One freed slot to the first waiter still waiting, or back to the pool (under
        ``_guard``)."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.cancelled:
                waiter.granted = True
                waiter.gate.release()
                return
        self._free += 1


class _SlotWaiter:
    """One thread waiting for a slot: its ``gate`` opens when it is granted one, or when its
    scope stops it (``stop``, as a scope stops a pod)."""

    def __init__(self, guard: threading.Lock) -> None:
        self.guard = guard
        self.gate = threading.Lock()
        self.gate.acquire()
        self.granted = False
        self.cancelled = False

    def stop(self) -> None:
        with self.guard:
            if self.granted or self.cancelled:
                return  # it holds a slot: its caller sees the stop and gives it back
            self.cancelled = True
        self.gate.release()


def acquire_slot(slots: threading.Semaphore, scope: CancelScope) -> bool:
    """A slot of ``slots``, or False once ``scope`` is stopped while waiting for it."""
    if isinstance(slots, Slots):
        return slots.acquire(scope=scope)
    return slots.acquire()


class ChildSlots(Slots):
    """A DAG/steps template's gate for its calls: ``parallelism`` slots, and its template-level
    ``failFast`` (workflow_types.go ``IsFailFast``: true only when set): once a child failed or
    errored, ``halted`` is set and no further child starts; running ones finish."""

    def __init__(self, limit: int | None, fail_fast: bool) -> None:
        super().__init__(limit if limit is not None else 1 << 30)
        self.fail_fast = fail_fast
        self.halted = False


def parallelism_slots(template: dict, local: Vars) -> ChildSlots | None:
    """A DAG/steps template's ``parallelism`` (how many of its calls may run at once) and
    ``failFast``; None when it has neither."""
    limit = template.get("parallelism")
    fail_fast = template.get("failFast") in (True, "true")
    if limit is None and not fail_fast:
        return None
    return ChildSlots(None if limit is None else
                      int(substitute_text(str(limit), local, "parallelism")), fail_fast)
