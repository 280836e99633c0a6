"""What the per-kind modules (``dag``, ``steps``, ``loops``, ``retry``, ``exit_handler``,
``hooks``, ``pod``, ``calls``, ``outputs``) need of a run: :class:`RunContext`.

``engine.Run`` is the one implementation; the per-kind modules depend on this protocol, not on
the engine, so that the engine imports them and none of them imports it back (a test fails on
any import cycle: ``tests/test_architecture.py``). A per-kind module runs a child template
through ``execute``/``attempt``/``call``, records nodes and outputs through ``record``, and
reads the run's variables, scopes and executor here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sublimate.pipelines.argo_terms import NodeType

    from ..expressions.substitution import Vars
    from ..pods.executor import Executor
    from ..pods.plan import Layout
    from ..pods.scope import CancelScope
    from ..records.control import Suspensions
    from ..records.run_folder import RunRecord
    from ..records.run_types import NodeResult, RunEvent
    from .daemons import Daemons


class RunContext(Protocol):
    """One run, as a template kind sees it."""

    name: str  # the workflow's name (and its run folder's)
    params: dict[str, str]  # the workflow's parameters, resolved
    templates: dict[str, dict]  # the workflow's templates by name
    globals: Vars  # the workflow.* variables, global outputs included (under ``lock``)
    lock: threading.RLock  # the run record's lock: nodes, phases, globals
    record: RunRecord  # the nodes, phases and outputs; status.json
    layout: Layout  # where the run's files and volumes live
    executor: Executor  # what runs a planned pod
    root_scope: CancelScope  # the workflow's: a deadline or a stop signal stops it
    exit_scope: CancelScope  # the exit handler's, outside the workflow's scope
    pod_slots: threading.Semaphore | None  # the workflow's parallelism, if limited
    daemons: Daemons  # the daemoned nodes, ended with their steps or DAG
    suspensions: Suspensions | None  # the suspend nodes waiting (a workflow with suspend)
    passed_env: dict[str, str]  # `sublimate run --env`: to every pod, masked as secrets

    def execute(self, template_name: str, arguments: dict, name: str, display: str,
                parent: NodeResult | None, scope: CancelScope, extra: Vars | None = None
                ) -> NodeResult:
        """Run a template invocation (with its retries); ``arguments`` already substituted."""
        ...

    def attempt(self, template: dict, kind: NodeType, inputs: Vars, node: NodeResult,
                parent_scope: CancelScope, attempt: int, art_args: dict[str, dict]
                ) -> NodeResult:
        """One try of a template, under a scope of its own that its deadline stops."""
        ...

    def call(self, call: dict, call_vars: Vars, name: str, display: str, parent: NodeResult,
             scope: CancelScope, slots: threading.Semaphore | None, prefix: str) -> NodeResult:
        """Run a DAG task or a step, expanding loops; returns its node (or TaskGroup)."""
        ...

    def live_globals(self) -> Vars:
        """The ``workflow.*`` variables as of now (status, duration, global outputs)."""
        ...

    def watch_node(self, name: str, callback: Callable[[RunEvent], None]) -> None:
        """Call ``callback`` on every phase change of the node named ``name``."""
        ...

    def unwatch_node(self, name: str) -> None: ...

    def watch_all(self, callback: Callable[[RunEvent], None] | None) -> None:
        """Call ``callback`` on every node's phase changes (None: no longer)."""
        ...


__all__ = ["RunContext"]
