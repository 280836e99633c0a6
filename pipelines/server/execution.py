"""Running accepted workflows: each in a thread of the server's process, through the local
runner's ``Run`` (the same engine as ``sublimate run``), its progress in its run folder's
``status.json``, which the store reads back. A run records its runner's pid, so a run this
server was running when it died is found by ``settle_interrupted_runs`` when it starts again
and shown Failed, with a message that says the server stopped."""

from __future__ import annotations

import copy
import re
import sys
import threading
import traceback
from dataclasses import dataclass

from sublimate.pipelines.argo_terms import NodePhase
from sublimate.pipelines.runner import ManifestError, ParameterError, RunOptions
from sublimate.pipelines.runner.engine import Run, prepare_workflow
from sublimate.pipelines.runner.records.run_folder import draw_name, settle_interrupted_runs

from .errors import already_exists, invalid
from .routing import NAME
from .store import WorkflowStore, timestamp

SERVER_STOPPED = "the sublimate server stopped while the workflow ran"
_NAME = NAME
_GENERATE_NAME = re.compile(r"[a-z0-9][-a-z0-9.]*")


@dataclass
class _Live:
    run: Run
    thread: threading.Thread


class Launcher:
    def __init__(self, store: WorkflowStore) -> None:
        self.store = store
        self._live: dict[str, _Live] = {}
        self._lock = threading.Lock()

    def is_live(self, name: str) -> bool:
        with self._lock:
            return name in self._live

    def settle(self) -> list[str]:
        """At start-up: the runs whose runner (a previous server, or ``sublimate run``) died
        while they ran are concluded Failed; the server's own say the server stopped."""
        settled = []
        for interrupted in settle_interrupted_runs(self.store.home):
            record_path = self.store.records / f"{interrupted.name}.json"
            record = self.store.record(interrupted.name) if record_path.exists() else None
            if record is not None:
                record["interrupted"] = f"{SERVER_STOPPED}: {interrupted.message}"
                self.store.save(record)
            settled.append(interrupted.name)
        return settled

    def lint(self, namespace: str, workflow: object,
             parameters: dict[str, str] | None = None) -> dict:
        """The workflow as the runner would run it, checked; ``ApiError`` (400) if it would not."""
        manifest = _manifest(namespace, workflow)
        _prepare(manifest, parameters or {})
        return manifest

    def start(self, namespace: str, workflow: object, parameters: dict[str, str] | None = None,
              shown_spec: dict | None = None) -> dict:
        """Accept ``workflow``: name it, check it, start its run with ``parameters``; its
        server record, whose spec is ``shown_spec`` when given (a submitted template's
        ``workflowTemplateRef``, as Argo shows it)."""
        manifest = _manifest(namespace, workflow)
        metadata = manifest["metadata"]
        with self.store.lock:
            fixed = metadata.get("name")
            if fixed:
                if self.store.taken(fixed):
                    raise already_exists(fixed)
                name = fixed
            else:
                name = draw_name(metadata)
                while self.store.taken(name):
                    name = draw_name(metadata)
            to_run = copy.deepcopy(manifest)
            to_run["metadata"]["name"] = name
            to_run["metadata"].pop("generateName", None)
            prepared, resolved = _prepare(to_run, parameters or {})
            try:
                run = Run(prepared, resolved,
                          RunOptions(home=self.store.home, reporter=_quiet, follow_logs=False))
            except (ManifestError, ParameterError, ValueError) as error:
                raise invalid(str(error)) from error
            record = {
                "name": run.name, "namespace": namespace,
                "uid": run.globals.get("workflow.uid") or "",
                "creationTimestamp": timestamp(run.record.started_at),
                "labels": metadata.get("labels") or {},
                "annotations": metadata.get("annotations") or {},
                "spec": shown_spec if shown_spec is not None else manifest.get("spec") or {},
                **({"generateName": metadata["generateName"]}
                   if metadata.get("generateName") else {}),
            }
            thread = threading.Thread(target=self._run, args=(run,), daemon=True,
                                      name=f"workflow {run.name}")
            with self._lock:  # live before its record shows: never seen as "never started"
                self._live[run.name] = _Live(run, thread)
            try:
                self.store.save(record)
            except BaseException:
                with self._lock:
                    self._live.pop(run.name, None)
                self.store.remove(run.name)  # nothing ran: as if never accepted
                raise
            thread.start()
        return record

    def terminate(self, name: str, message: str, wait_s: float) -> None:
        """End a live run now (every process killed), concluded Failed with ``message``."""
        with self._lock:
            live = self._live.get(name)
        if live is None:
            return
        # As Run.terminate, with the server's reason: the exit handler's processes too.
        live.run.exit_scope.terminate(message)
        live.run.root_scope.terminate(message)
        live.run.record.conclude(NodePhase.FAILED, message)
        live.thread.join(wait_s)

    def stop_all(self, message: str, wait_s: float) -> None:
        with self._lock:
            names = list(self._live)
        for name in names:
            self.terminate(name, message, wait_s)

    def _run(self, run: Run) -> None:
        try:
            run.run()
        except Exception:  # the run's own record says Failed; the server goes on
            traceback.print_exc(file=sys.stderr)
        finally:
            with self._lock:
                self._live.pop(run.name, None)


def _quiet(_event: object) -> None:
    """The runner's events: the server has no console to print them to; clients poll."""


def _manifest(namespace: str, workflow: object) -> dict:
    """The submitted workflow, its shape checked field by field, in ``namespace``."""
    if not isinstance(workflow, dict):
        raise invalid("workflow: required, an object (the Workflow to create)")
    if workflow.get("kind", "Workflow") != "Workflow":
        raise invalid(f"workflow.kind: must be Workflow, not {workflow.get('kind')!r}")
    metadata = workflow.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise invalid("workflow.metadata: must be an object")
    if not metadata.get("name") and not metadata.get("generateName"):
        raise invalid("workflow.metadata: name or generateName is required")
    # Kubernetes' rules for an object's name (a run folder is named after it: never a path)
    for key, pattern in (("name", _NAME), ("generateName", _GENERATE_NAME)):
        value = metadata.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > 253
                                  or not pattern.fullmatch(value)):
            raise invalid(f"workflow.metadata.{key}: {value!r} is not a valid Kubernetes name "
                          f"(lower case letters, digits, '-' and '.')")
    for key in ("labels", "annotations"):
        values = metadata.get(key)
        if values is not None and (not isinstance(values, dict) or not all(
                isinstance(value, str) for value in values.values())):
            raise invalid(f"workflow.metadata.{key}: must map names to strings")
    if not isinstance(workflow.get("spec"), dict):
        raise invalid("workflow.spec: required, an object")
    manifest = copy.deepcopy(workflow)
    manifest.setdefault("apiVersion", "argoproj.io/v1alpha1")
    manifest["kind"] = "Workflow"
    manifest["metadata"] = {**copy.deepcopy(metadata), "namespace": namespace}
    return manifest


def _prepare(manifest: dict, parameters: dict[str, str]) -> tuple[dict, dict[str, str]]:
    try:
        return prepare_workflow(copy.deepcopy(manifest), parameters)
    except (ManifestError, ParameterError) as error:
        raise invalid(str(error)) from error
