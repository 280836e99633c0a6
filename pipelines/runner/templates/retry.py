"""Retries: a template with a ``retryStrategy`` runs as attempts under a ``Retry`` node.

As in Argo, attempts are child nodes ``name(0)``, ``name(1)``, ...; ``retryPolicy`` says which
endings are retried (``OnFailure`` by default; ``OnTransientError`` retries nothing here, as
nothing is transient locally), ``limit`` how many times, and ``backoff`` how long to wait
(``duration * factor**n``, at most ``cap``, all waits within ``maxDuration``; durations as
``durations.parse_duration``). The Retry node ends like its last
attempt and carries its outputs.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, NamedTuple

from sublimate.pipelines.argo_terms import NodePhase, NodeType

from ..errors import NodeError
from ..expressions.substitution import Vars, substitute
from ..manifest.durations import parse_duration
from ..pods.scope import CancelScope
from ..records.run_types import NodeResult

if TYPE_CHECKING:
    from .context import RunContext

_RETRIED = {
    "Always": frozenset({NodePhase.FAILED, NodePhase.ERROR}),
    "OnFailure": frozenset({NodePhase.FAILED}),
    "OnError": frozenset({NodePhase.ERROR}),
}


class RetryPolicy(NamedTuple):  # not a dataclass: cheaper to define at every start
    limit: int
    delay: float
    factor: float
    max_total: float | None
    retry_on: frozenset[NodePhase]
    policy: str
    cap: float | None = None

    def wait_before(self, attempt: int) -> float:
        """Seconds to wait after attempt ``attempt`` (0-based) before the next one:
        operator.go, ``duration * factor^n`` (a factor of 0 or less: no growth), at most
        ``cap``."""
        wait = self.delay * (self.factor**attempt if self.factor > 0 else 1)
        return min(wait, self.cap) if self.cap is not None else wait

    def describe(self) -> str:
        text = f"retried up to {self.limit}x ({self.policy})"
        if self.delay:
            text += f", backoff {self.delay:g}s x{self.factor:g}"
            if self.max_total is not None:
                text += f" within {self.max_total:g}s"
        return text


def retry_policy(retry: dict, scope: Vars, where: str) -> RetryPolicy:
    """``NodeError``/``ValueError`` when a value cannot be resolved or parsed."""
    retry = substitute(retry, scope, f"{where}.retryStrategy")  # type: ignore[assignment]
    limit = int(retry.get("limit", 0) if retry.get("limit") is not None else 0)
    backoff = retry.get("backoff") or {}
    policy = retry.get("retryPolicy") or "OnFailure"
    return RetryPolicy(
        limit=limit,
        delay=parse_duration(backoff.get("duration", 0)),
        factor=float(int(backoff.get("factor", 1))),  # intstr.Int32: an integer
        max_total=parse_duration(backoff["maxDuration"]) if "maxDuration" in backoff else None,
        cap=parse_duration(backoff["cap"]) if "cap" in backoff else None,
        retry_on=_RETRIED.get(policy, frozenset()),
        policy=policy,
    )


def retry_strategy(template: dict, spec: dict) -> dict | None:
    """The strategy a template runs under (operator.go ``retryStrategy``): its own when it
    sets one, even an empty one (which retries nothing and adds no Retry node), else the
    workflow's ``spec.retryStrategy``, the default of every template kind."""
    if template.get("retryStrategy") is not None:
        return template["retryStrategy"] or None
    return spec.get("retryStrategy") or None


def run_with_retries(run: RunContext, template: dict, kind: NodeType, inputs: Vars,
                     node: NodeResult, scope: CancelScope, art_args: dict[str, dict],
                     strategy: dict) -> NodeResult:
    record = run.record
    try:
        policy = retry_policy(strategy, {**run.live_globals(), **inputs}, template["name"])
    except (NodeError, ValueError) as exc:
        return record.finish(node, NodePhase.ERROR, f"retryStrategy: {exc}")
    record.transition(node, NodePhase.RUNNING)
    started = time.monotonic()
    attempt = 0
    while True:
        child = record.add_node(f"{node.name}({attempt})", f"{node.display_name}({attempt})",
                                template["name"], kind, node)
        child = run.attempt(template, kind, inputs, child, scope, attempt, art_args)
        if child.phase not in policy.retry_on or attempt >= policy.limit or scope.stop_reason():
            break
        wait = policy.wait_before(attempt)
        if policy.max_total is not None and time.monotonic() - started + wait > policy.max_total:
            break
        if wait > 0:
            scope.sleep(wait)  # a stop ends the backoff, and the loop with the next check
            if scope.stop_reason():
                break
        attempt += 1
    node.parameters, node.artifacts = child.parameters, child.artifacts
    node.result, node.exit_code = child.result, child.exit_code
    node.daemoned, node.pod_ip = child.daemoned, child.pod_ip  # a daemon: Running, daemoned
    return record.finish(node, child.phase, child.message)
