"""A test harness: run a workflow (a Hera object, a manifest dict, a YAML file or text) locally
and get back what a test asserts on (argoproj-labs/hera#892).

``run(workflow)`` runs it with the embedded engine, as ``sublimate run`` does, in a temporary home
unless ``home`` is given, and returns a :class:`WorkflowRun`: the workflow's phase and message,
its global output parameters by name, each node by display name (phase, outputs, message,
start and end), the order the nodes started, and the run folder. A Hera ``Workflow`` or
``WorkflowTemplate`` is converted with its ``to_dict()`` (Hera itself is never imported here); a
WorkflowTemplate or ClusterWorkflowTemplate runs as ``argo submit --from`` would submit it.

``sublimate.pipelines.testing`` wraps it as the pytest fixture ``argo_run``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sublimate.pipelines.argo_terms import NodePhase, NodeType

from . import engine
from .manifest.load import load_manifest, normalise_workflow
from .records.run_types import NodeResult, RunEvent, RunOptions, RunResult, SuspendAnswer

if TYPE_CHECKING:
    from .pods.k8s_objects import ObjectLibrary

# Nodes that never ran: a false `when` (Skipped), an unmet `depends` (Omitted).
_NOT_RUN = frozenset({NodePhase.SKIPPED, NodePhase.OMITTED})


def is_hera(workflow: object) -> bool:
    """Whether ``workflow`` looks like a Hera workflow object (duck-typed: it has ``to_dict``)."""
    return not isinstance(workflow, Mapping) and callable(getattr(workflow, "to_dict", None))


def as_manifest(workflow: object, templates: Iterable[object] = ()) -> dict:
    """The manifest dict of a Hera object, a manifest dict, a YAML file path or YAML text.

    ``templates``: WorkflowTemplates a ``workflowTemplateRef``/``templateRef`` refers to (Hera
    objects or dicts) and folders of YAML files to look them up in, as ``sublimate run
    --templates`` does."""
    documents = [_as_dict(t) for t in templates if not isinstance(t, str | Path)]
    folders = [Path(t) for t in templates if isinstance(t, str | Path)]
    if isinstance(workflow, str | Path):
        manifest = load_manifest(workflow, template_dirs=folders)
        if documents:  # the folders are already joined; only the documents remain
            manifest = normalise_workflow(manifest, _by_name(documents))
        return manifest
    manifest = _as_dict(workflow)
    if documents or folders:
        from .manifest.library import TemplateLibrary

        library = TemplateLibrary(folders, [(d, "the templates given") for d in documents])
        manifest = normalise_workflow(manifest, library)
    return manifest


def _as_dict(workflow: object) -> dict:
    if is_hera(workflow):
        return workflow.to_dict()  # type: ignore[attr-defined]
    if isinstance(workflow, Mapping):
        return dict(workflow)
    raise TypeError(f"expected a Hera Workflow/WorkflowTemplate, a manifest dict, a YAML file or "
                    f"YAML text; got {type(workflow).__name__}")


def _by_name(documents: list[dict]) -> dict[str, dict]:
    return {(d.get("metadata") or {}).get("name", ""): d for d in documents}


def parameter_text(value: object) -> str:
    """A parameter value as Argo passes it: text; lists and dicts as JSON, booleans lowercase."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None or isinstance(value, list | dict | tuple):
        return json.dumps(value)
    return str(value)


@dataclass(frozen=True)
class NodeView:
    """One node of a finished run, as a test reads it."""

    phase: NodePhase
    outputs: dict[str, str]  # output parameters by name
    message: str
    started: datetime | None
    finished: datetime | None
    name: str = ""  # the full node name (``wf.main.sum``); the key is the display name
    type: NodeType = NodeType.POD
    template: str = ""
    result: str | None = None  # a script's stdout (``outputs.result``)
    exit_code: int | None = None
    artifacts: dict[str, str] = field(default_factory=dict)  # output artifacts -> stored path
    log: Path | None = None
    # a memoized template's: Argo's memoizationStatus ({hit, key, cacheName})
    memoization: dict | None = None

    @classmethod
    def of(cls, node: NodeResult) -> NodeView:
        return cls(node.phase, dict(node.parameters), node.message, node.started_at,
                   node.finished_at, node.name, node.type, node.template, node.result,
                   node.exit_code, dict(node.artifacts), node.log,
                   dict(node.memoization) if node.memoization else None)

    @property
    def cached(self) -> bool:
        """Whether it was finished from a memoization cache instead of running."""
        return bool(self.memoization and self.memoization.get("hit"))

    @property
    def ran(self) -> bool:
        """Whether it started at all (not Skipped by ``when``, nor Omitted by ``depends``)."""
        return self.phase not in _NOT_RUN

    def log_text(self) -> str:
        """What the pod printed (``main.log``); empty for a node without a log."""
        if self.log is None or not self.log.exists():
            return ""
        return self.log.read_text(errors="replace")


@dataclass(frozen=True)
class WorkflowRun:
    """A finished local run: what a test asserts on. ``result`` is the runner's own record."""

    name: str
    phase: NodePhase
    message: str
    outputs: dict[str, str]  # global output parameters (``globalName``) by name
    nodes: dict[str, NodeView]  # by display name (a name used twice: the first; see node())
    started_order: list[str]  # display names of the nodes that ran, in the order they started
    run_folder: Path
    result: RunResult = field(repr=False, compare=False)

    @classmethod
    def of(cls, result: RunResult) -> WorkflowRun:
        nodes: dict[str, NodeView] = {}
        for node in result.nodes:
            nodes.setdefault(node.display_name, NodeView.of(node))
        ran = [n for n in result.nodes if n.started_at is not None and n.phase not in _NOT_RUN]
        ran.sort(key=lambda n: n.started_at or result.started_at)  # stable: ties keep creation
        return cls(result.name, result.phase, result.message,
                   dict(result.outputs.get("parameters") or {}), nodes,
                   [n.display_name for n in ran], result.run_dir, result)

    @property
    def succeeded(self) -> bool:
        return self.phase == NodePhase.SUCCEEDED

    @property
    def output_artifacts(self) -> dict[str, str]:
        """Global output artifacts by name: the stored file or folder in the run folder."""
        return dict(self.result.outputs.get("artifacts") or {})

    def node(self, name: str) -> NodeView:
        """The node with this display name, or this full node name (``wf.main.sum``, for a
        display name used twice); ``KeyError`` naming the known display names."""
        if name in self.nodes:
            return self.nodes[name]
        for node in self.result.nodes:
            if node.name == name:
                return NodeView.of(node)
        known = ", ".join(sorted(self.nodes))
        raise KeyError(f"no node {name!r} in run {self.name} (nodes: {known})")

    def phases(self) -> dict[str, str]:
        """Display name -> phase, as plain text: ``assert run.phases() == {...}``."""
        return {name: str(view.phase) for name, view in self.nodes.items()}

    def assert_succeeded(self) -> WorkflowRun:
        """Raise ``AssertionError`` unless the run Succeeded, naming each failed node, its message
        and the end of its log; returns the run, so that ``run(wf).assert_succeeded()`` chains."""
        if self.succeeded:
            return self
        lines = [f"workflow {self.name} {self.phase}: {self.message}".rstrip(": ")]
        for name, view in self.nodes.items():
            if view.phase.failed and view.type == NodeType.POD:
                lines.append(f"  {name}: {view.phase} {view.message}".rstrip())
                lines += [f"    | {line}" for line in view.log_text().splitlines()[-10:]]
        lines.append(f"run folder: {self.run_folder}")
        raise AssertionError("\n".join(lines))


def run(workflow: object, parameters: Mapping[str, object] | None = None, *,
        home: str | Path | None = None, timeout: float | None = None,
        templates: Iterable[object] = (), parallelism: int | None = None,
        echo: bool = True, reporter: Callable[[RunEvent], None] | None = None,
        options: RunOptions | None = None, objects: Iterable[object] = (),
        answers: Mapping[str, object] | None = None,
        env: Mapping[str, str] | None = None) -> WorkflowRun:
    """Run ``workflow`` locally to its end and return the :class:`WorkflowRun`.

    ``workflow``: a Hera ``Workflow``/``WorkflowTemplate`` (or ``CronWorkflow``), a manifest dict,
    or a YAML file path or text. ``parameters``: ``-p`` values (any value is made text as Argo
    would). ``home``: the ``$SUBLIMATE_HOME`` of the run (run folders, local volumes); a new
    temporary folder by default, left in place so that the run folder can be inspected.
    ``timeout``: seconds before the run is stopped and ends Failed, as the workflow's
    ``activeDeadlineSeconds`` would (the shorter of the two applies). ``templates``: what
    ``workflowTemplateRef``/``templateRef`` refer to (see :func:`as_manifest`). ``echo``: print
    progress and logs to stderr (pytest shows them for a failed test); ``reporter`` replaces it.
    ``options``: the runner's own ``RunOptions``, replacing ``home``, ``parallelism``, ``echo``
    and ``reporter``. ``objects``: Secret and ConfigMap manifests (dicts) and folders of them,
    for the pods' env, envFrom and volumes and the semaphores (a YAML file's own folder is
    searched too, as ``sublimate run`` searches it). ``answers``: the suspend nodes' answers,
    given up front: a display name or a node field selector (``templateName=approve``) to the
    supplied output parameters to resume with (a mapping; None: their defaults) or a
    ``SuspendAnswer`` (``stop=True`` fails it); a suspend node no answer matches waits for
    ``sublimate resume`` from another process, or for ``timeout``. ``env``: variables passed to
    every pod, as ``sublimate run --env`` passes them (masked as secrets); nothing else of this
    process's environment but a short list reaches a pod (``pods.environment``).

    A manifest the runner cannot run raises ``ManifestError``, bad parameters ``ParameterError``;
    a failed run does not raise (see :meth:`WorkflowRun.assert_succeeded`).
    """
    manifest = as_manifest(workflow, templates)
    if timeout is not None:
        manifest = _with_deadline(manifest, timeout)
    if options is None:
        if reporter is None and not echo:
            reporter = _silent
        elif reporter is None:
            from .records.display import console_reporter

            reporter = console_reporter(None)  # sys.stderr as it is at each event
        folder = Path(home) if home is not None else temporary_home()
        options = RunOptions(home=folder, parallelism=parallelism, reporter=reporter,
                             follow_logs=echo)
    objects = list(objects)
    if objects or _is_file(workflow):
        options = replace(options, objects=object_library(workflow, objects))
    if env:
        options = replace(options, env=dict(env))
    if answers:
        options = replace(options, answers={key: suspend_answer(value)
                                            for key, value in answers.items()})
    params = {name: parameter_text(value) for name, value in (parameters or {}).items()}
    # engine.run_workflow looked up when called, so that a test's monkeypatch of it applies
    return WorkflowRun.of(engine.run_workflow(manifest, params, options))


def object_library(workflow: object, objects: list[object]) -> ObjectLibrary:
    """The Secrets and ConfigMaps of a run: ``objects`` (dicts and folders) and, for a YAML
    file, those of its folder (the file itself among them)."""
    from .pods.k8s_objects import ObjectLibrary

    folders = [Path(o) for o in objects if isinstance(o, str | Path)]
    if _is_file(workflow):
        folders.insert(0, Path(str(workflow)).parent)
    documents = [(_as_dict(o), "the objects given") for o in objects
                 if not isinstance(o, str | Path)]
    return ObjectLibrary(folders, documents)


def _is_file(workflow: object) -> bool:
    """A YAML file's path (YAML text holds a newline), as ``load_manifest`` tells them apart."""
    return isinstance(workflow, Path) or (isinstance(workflow, str) and "\n" not in workflow)


def suspend_answer(value: object) -> SuspendAnswer:
    """An answer as a test writes it: a ``SuspendAnswer``, the supplied outputs, or None."""
    if isinstance(value, SuspendAnswer):
        return value
    if value is None:
        return SuspendAnswer()
    if isinstance(value, Mapping):
        return SuspendAnswer(outputs={str(k): parameter_text(v) for k, v in value.items()})
    raise TypeError(f"a suspend answer is a mapping of output parameters, None or a "
                    f"SuspendAnswer; got {type(value).__name__}")


def temporary_home() -> Path:
    """A new empty home folder for one run, left in place (the run folder is in it)."""
    import tempfile  # only when needed: `sublimate run` never is

    return Path(tempfile.mkdtemp(prefix="sublimate-run-"))


def _silent(event: RunEvent) -> None:
    pass


def _with_deadline(manifest: dict, timeout: float) -> dict:
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    spec = dict(manifest.get("spec") or {})
    current = spec.get("activeDeadlineSeconds")
    try:
        current_s = float(current) if current is not None else None
    except (TypeError, ValueError):
        current_s = None  # a {{...}} expression: the runner reports it
    if current_s is None or timeout < current_s:
        spec["activeDeadlineSeconds"] = int(timeout) if float(timeout).is_integer() else timeout
    return {**manifest, "spec": spec}


def run_workflow(workflow: Any, parameters: Mapping[str, object] | None = None,
                 options: RunOptions | None = None) -> RunResult:
    """``engine.run_workflow`` that also takes a Hera object (converted with ``to_dict()``),
    with ``parameters`` and ``options`` optional (a new temporary home by default, quiet)."""
    if is_hera(workflow):
        workflow = workflow.to_dict()
    if options is None:
        options = RunOptions(home=temporary_home(), reporter=_silent)
    params = {name: parameter_text(value) for name, value in (parameters or {}).items()}
    return engine.run_workflow(workflow, params, options)


__all__ = ["NodeView", "SuspendAnswer", "WorkflowRun", "as_manifest", "is_hera", "run",
           "run_workflow"]
