"""Lifecycle hooks (``hooks``) and step/task-level ``onExit``, as Argo's controller runs them.

Sources (argoproj/argo-workflows): ``workflow/controller/hooks.go`` (named hooks),
``workflow/controller/exit_handler.go`` (``runOnExitNode``), ``operator.go`` (the workflow's
hooks and exit handler), ``steps.go`` and ``dag.go`` (where a step's or task's hooks are
evaluated and waited for), ``pkg/apis/workflow/v1alpha1/workflow_types.go`` (``LifecycleHook``,
``GetExitHook``) and ``workflow/validate/validate.go`` (``validateHooks``).

- A hook named ``exit`` is an exit handler; any other name needs an ``expression`` (validate.go)
  and fires, once, the first time it holds (hooks.go: a hook node that exists is never started
  again). The name means nothing else.
- ``onExit`` is ``hooks.exit`` with the workflow's arguments, and a hook without arguments gets
  the workflow's (``GetExitHook(spec.arguments)``, ``WithArgs``). Both at once is refused here
  (Argo would silently prefer ``onExit``).
- Workflow level: named hooks are evaluated while the workflow runs, with ``workflow.status``
  ``Running``, and once more when its entrypoint has ended, with its final status; all fired
  hooks end before the exit handler starts (operator.go: ``hookCompleted``). Their nodes are
  ``<workflow>.hooks.<name>``, children of the workflow's node; the exit handler is ``onExit``.
  A failed named hook does not change the workflow's phase (the phase comes from the entrypoint's
  node and the exit handler only).
- Step/task level: named hooks are evaluated as the step's or task's node changes phase, with
  ``steps.<name>.status`` / ``tasks.<name>.status`` set to it (steps.go, dag.go: ``Status.Set``
  before ``executeTmplLifeCycleHook``), in the scope of its template (earlier steps' / finished
  tasks' outputs, the workflow's variables). A task is not evaluated while Pending (dag.go) and a
  step skipped by ``when`` not at all (steps.go: it has no step entry). The exit hook runs once the
  node has completed (Succeeded, Failed or Error; not Skipped or Omitted), and only if its own
  ``expression``, when it has one, holds (exit_handler.go); its arguments may use the node's
  ``outputs.parameters``/``outputs.artifacts`` and ``status``. Hook nodes are
  ``<node>.hooks.<name>`` and ``<node>.onExit``, children of the hooked node, shown as
  ``<step>.hooks.<name>`` / ``<step>.onExit`` (``initializeNode`` trims the boundary's name).
  The step group / the task's dependents wait for every hook (``CheckAllHooksFullfilled``), but
  a hook's failure leaves the step's or task's phase, and its template's, as they were.
- An exit hook is an exit handler: a stop (``argo stop``, Ctrl-C) does not stop it, only a
  termination does (``ShouldExecute(true)``, ``onExitTemplate`` skips the deadline). Named hooks
  run in the hooked node's scope: a stop stops them, and none starts once stopping.
- An expression that cannot be evaluated (an unknown name, a member of nil) is an error: Argo
  marks the entrypoint's node (workflow level) or the task's node Error; here the hook does not
  fire and the workflow, or the hooked node once it ends, ends Error with the message.

Not supported (refused by ``template_checks.hook_problems``): ``templateRef`` in a hook, and hooks
or ``onExit`` on a looped step or task (Argo hooks every item, and a DAG task's group as well).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from sublimate.pipelines.argo_terms import NodePhase, NodeType

from ..errors import NodeError
from ..expressions.conditions import ExpressionError
from ..expressions.substitution import Vars
from ..manifest.template_checks import EXIT
from ..pods.scope import CancelScope
from ..records.run_types import NodeResult, RunEvent
from .calls import call_arguments, call_one
from .outputs import result_vars

if TYPE_CHECKING:
    from .context import RunContext

# The node phases Argo's ``Completed()`` accepts: an exit hook runs only after one of them.
_COMPLETED = (NodePhase.SUCCEEDED, NodePhase.FAILED, NodePhase.ERROR)
# operator.go: the workflow's status from its node's phase (Skipped/Omitted read Succeeded).
_WORKFLOW_STATUS = {NodePhase.SKIPPED: NodePhase.SUCCEEDED, NodePhase.OMITTED: NodePhase.SUCCEEDED}


class Hook(NamedTuple):
    name: str
    template: str
    arguments: dict  # as in the manifest: {"parameters": [...], "artifacts": [...]}
    expression: str | None
    # The workflow's own arguments (a hook without any): values resolved at submission, taken
    # as they are (Argo's substitution leaves unresolved tags in them alone).
    workflow_arguments: bool = False

    def resolve_arguments(self, variables: Vars, where: str) -> dict:
        """``{"parameters": {name: value}, "artifacts": {...}}``; ``NodeError``."""
        if self.workflow_arguments:
            return {"parameters": {p["name"]: p.get("value", "")
                                   for p in self.arguments.get("parameters") or []},
                    "artifacts": {}}
        return call_arguments({"arguments": self.arguments}, variables, where)


def exit_hook(holder: dict, workflow_arguments: dict) -> Hook | None:
    """``GetExitHook(spec.arguments)`` of a spec, step or task: ``onExit``, else ``hooks.exit``;
    either gets the workflow's arguments when it has none of its own."""
    if holder.get("onExit"):
        return Hook(EXIT, str(holder["onExit"]), workflow_arguments, None, True)
    hook = (holder.get("hooks") or {}).get(EXIT)
    if not hook:
        return None
    own = hook.get("arguments") or {}
    return Hook(EXIT, str(hook["template"]), own or workflow_arguments,
                hook.get("expression") or None, not own)


def named_hooks(holder: dict) -> list[Hook]:
    """The hooks other than ``exit``, in manifest order (Argo ranges over a Go map)."""
    return [Hook(str(name), str(hook["template"]), hook.get("arguments") or {},
                 str(hook["expression"]))
            for name, hook in (holder.get("hooks") or {}).items() if name != EXIT]


def workflow_arguments(run: RunContext) -> dict:
    return {"parameters": [{"name": k, "value": v} for k, v in run.params.items()]}


# ------------------------------------------------------------------ hook expressions
#
# A hook's ``expression`` is expr-lang, which Argo evaluates with ``argoexpr.EvalBool``
# (util/expr/argoexpr/eval.go) against ``env.GetFuncMap(scope)`` (util/expr/env/env.go): the
# runner's one expr evaluator (:mod:`.expr_lang`, also behind ``{{=...}}`` tags) does the same.
# As in expr, a name missing from the environment is an error (expr.Env on a map is strict,
# checker/checker.go), a missing map key is nil, and a member of nil is an error. The parser
# loads only for a workflow whose hooks have expressions.


def parse_hook_expression(source: str) -> object:
    """The tree of a hook's ``expression``; ``ExpressionError`` naming what is unsupported."""
    from ..expressions import expr_lang

    return expr_lang.parse(source)


def evaluate_hook_expression(source: str, scope: Mapping[str, object],
                             tree: object | None = None) -> bool:
    """Evaluate a hook's ``expression`` (``tree``: already parsed) against the variables
    ``scope`` (dotted names), as ``argoexpr.EvalBool`` does; ``ExpressionError`` on any
    error, an unknown name included (expr compiles first: it fails even if unused)."""
    from ..expressions import expr_lang

    tree = expr_lang.parse(source) if tree is None else tree
    env = expr_lang.environment(scope)
    # With a map for environment, expr refuses an unknown top-level name at compile time; a
    # missing key below one (tasks.C) is nil, as at run time.
    missing = [path for path in expr_lang.missing_references(tree, env)  # type: ignore[arg-type]
               if re.split(r"[.\[]", path, maxsplit=1)[0] not in env]
    if missing:
        raise ExpressionError(f"unknown name {missing[0]} in {source!r}")
    result = expr_lang.evaluate(source, scope, tree=tree, env=env)  # type: ignore[arg-type]
    if not isinstance(result, bool):
        raise ExpressionError(f"unable to cast expression result {result!r} to bool "
                              f"({source!r})")
    return result


# ------------------------------------------------------------------------- running


def _run_hook(run: RunContext, hook: Hook, hook_vars: Vars, name: str, display: str,
              parent: NodeResult | None, scope: CancelScope) -> NodeResult:
    """One hook's template, its arguments substituted with ``hook_vars``."""
    try:
        arguments = hook.resolve_arguments(hook_vars, display)
    except NodeError as exc:
        node = run.record.add_node(name, display, hook.template, NodeType.POD, parent)
        return run.record.finish(node, NodePhase.ERROR, str(exc))
    return run.execute(hook.template, arguments, name, display, parent, scope)


class _Watch:
    """Named hooks evaluated on every phase change of one node (or of any node, at workflow
    level), each fired at most once in a thread of its own."""

    def __init__(self, run: RunContext, hooks: list[Hook], env: Callable[[NodeResult | None], Vars],
                 fire: Callable[[Hook, Vars], None]) -> None:
        self.run, self.hooks, self.env, self.fire = run, hooks, env, fire
        self.lock = threading.Lock()
        self.fired: set[str] = set()
        self.threads: list[threading.Thread] = []
        self.error = ""  # the first expression that could not be evaluated
        self.trees = {h.name: parse_hook_expression(h.expression or "") for h in hooks}

    def evaluate(self, node: NodeResult | None, scope: CancelScope) -> None:
        if scope.stop_reason():
            return  # nothing new starts once stopping (Argo's Stop strategy: exit hooks only)
        with self.lock:
            pending = [h for h in self.hooks if h.name not in self.fired]
            if not pending:
                return
            with self.run.lock:  # other threads add workflow outputs to the globals
                variables = self.env(node)
            for hook in pending:
                try:
                    holds = evaluate_hook_expression(hook.expression or "", variables,
                                                     self.trees[hook.name])
                except ExpressionError as exc:
                    self.error = self.error or f"hooks.{hook.name}: {exc}"
                    self.fired.add(hook.name)  # an error is reported once, not retried
                    continue
                if holds:
                    self.fired.add(hook.name)
                    thread = threading.Thread(target=self.fire, args=(hook, variables),
                                              daemon=True)
                    self.threads.append(thread)
                    thread.start()

    def wait(self) -> None:
        while True:
            with self.lock:
                threads = [t for t in self.threads if t.is_alive()]
            if not threads:
                return
            for thread in threads:
                thread.join()


def call_with_hooks(run: RunContext, call: dict, call_vars: Vars, name: str, display: str,
                    parent: NodeResult, scope: CancelScope, slots: threading.Semaphore | None,
                    where: str, prefix: str) -> NodeResult:
    """A step or task (not looped) with ``hooks``/``onExit``: its node as ``call_one`` gives it,
    once its hooks have ended (they never change its phase)."""
    hooks = named_hooks(call)
    ref = f"{prefix}.{call['name']}"  # steps.<name> / tasks.<name>
    hooked: list[NodeResult] = []

    def hook_env(node: NodeResult | None) -> Vars:
        assert node is not None
        variables = {**call_vars, **run.globals}
        variables.setdefault("workflow.status", NodePhase.RUNNING)
        variables[f"{ref}.status"] = node.phase
        return variables

    def fire(hook: Hook, variables: Vars) -> None:
        node = hooked[0]
        # hooks.go: the hooked node's outputs join the scope for arguments (resolveExitTmplArgument)
        hook_vars = {**variables, **_outputs(prefix, call["name"], node, run)}
        _run_hook(run, hook, hook_vars, f"{node.name}.hooks.{hook.name}",
                  f"{node.display_name}.hooks.{hook.name}", node, scope)

    watch = _Watch(run, hooks, hook_env, fire) if hooks else None
    if watch is not None:
        def on_event(event: RunEvent) -> None:
            node = event.node
            assert node is not None
            if not hooked:
                hooked.append(node)
            if prefix == "tasks" and node.phase == NodePhase.PENDING:
                return  # dag.go evaluates a task's hooks once it runs or has ended
            if prefix == "steps" and node.type == NodeType.SKIPPED:
                return  # steps.go: a step skipped by `when` has no hooks evaluated
            watch.evaluate(node, scope)

        run.watch_node(name, on_event)
    try:
        node = call_one(run, call, call_vars, name, display, parent, scope, slots, where)
    finally:
        if watch is not None:
            run.unwatch_node(name)
    if watch is not None:
        watch.wait()
    error = watch.error if watch is not None else ""
    final = exit_hook(call, workflow_arguments(run))
    if final is not None and node.phase in _COMPLETED:
        with run.lock:
            variables = hook_env(node)
        runs = True
        if final.expression:
            try:
                runs = evaluate_hook_expression(final.expression, variables)
            except ExpressionError as exc:
                error, runs = error or f"hooks.exit: {exc}", False
        if runs:
            # An exit handler: stopping the workflow does not stop it, terminating does.
            _run_hook(run, final, {**variables, **_outputs(prefix, call["name"], node, run)},
                      f"{node.name}.onExit", f"{node.display_name}.onExit", node,
                      run.exit_scope)
    if error:
        return run.record.finish(node, NodePhase.ERROR, error)
    return node


def _outputs(prefix: str, call_name: str, node: NodeResult, run: RunContext) -> Vars:
    """The hooked node's variables for its hooks' arguments: exit_handler.go
    ``resolveExitTmplArgument`` adds its output parameters and artifacts to the scope (its
    ``status`` is there already)."""
    ref = f"{prefix}.{call_name}"
    return {k: v for k, v in result_vars(prefix, call_name, node, run.record.nodes).items()
            if k.startswith((f"{ref}.outputs.parameters.", f"{ref}.outputs.artifacts."))}


class WorkflowHooks:
    """The workflow's named hooks: evaluated on every node change while it runs, once more
    with its final status, and waited for before its exit handler."""

    def __init__(self, run: RunContext, hooks: list[Hook]) -> None:
        self.run = run
        self.status: str = NodePhase.RUNNING
        self.watch = _Watch(run, hooks, self._env, self._fire)

    def _env(self, node: NodeResult | None) -> Vars:
        return {**self.run.globals, "workflow.status": self.status}

    def _fire(self, hook: Hook, variables: Vars) -> None:
        run = self.run
        name = f"{run.name}.hooks.{hook.name}"
        # No boundary: initializeNode leaves the display name the node's full name.
        parent = run.record.nodes.get(run.name)  # the workflow's node, as addChildNode does
        _run_hook(run, hook, variables, name, name, parent, run.root_scope)

    def start(self) -> None:
        self.run.watch_all(lambda event: self.watch.evaluate(event.node, self.run.root_scope))

    def finish(self, phase: NodePhase) -> str:
        """Evaluate with the final status and wait for every fired hook; an expression error,
        or ``""``."""
        self.run.watch_all(None)
        self.status = _WORKFLOW_STATUS.get(phase, phase)
        self.watch.evaluate(None, self.run.root_scope)
        self.watch.wait()
        return self.watch.error
