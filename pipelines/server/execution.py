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
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sublimate.pipelines.argo_terms import NodePhase
from sublimate.pipelines.runner import ManifestError, ParameterError, RunOptions
from sublimate.pipelines.runner.engine import Run, prepare_workflow
from sublimate.pipelines.runner.records.run_folder import draw_name, settle_interrupted_runs

from . import policy
from .errors import already_exists, invalid

if TYPE_CHECKING:
    from sublimate.pipelines.runner.reruns import Rerun
from .store import NAME, WorkflowStore, timestamp
from .templates import check_string_maps, name_values

SERVER_STOPPED = "the sublimate server stopped while the workflow ran"
_GENERATE_NAME = re.compile(r"[a-z0-9][-a-z0-9.]*")


@dataclass
class _Live:
    run: Run
    thread: threading.Thread


class Launcher:
    def __init__(self, store: WorkflowStore, allow_privileged: bool = False) -> None:
        self.store = store
        # pods with more than a container's privileges, from HTTP (``policy``)
        self.allow_privileged = allow_privileged
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
        prepared, _ = _prepare(manifest, parameters or {})
        policy.check(prepared, self.allow_privileged)
        return manifest

    def start(self, namespace: str, workflow: object, parameters: dict[str, str] | None = None,
              shown_spec: dict | None = None) -> dict:
        """Accept ``workflow``: name it, check it, start its run with ``parameters``; its
        server record, whose spec is ``shown_spec`` when given (a submitted template's
        ``workflowTemplateRef``, as Argo shows it)."""
        manifest = _manifest(namespace, workflow)
        metadata = manifest["metadata"]
        # spec.suspend: created suspended, resumed by PUT .../resume (the runner itself has no
        # such field: a local run has no one to resume it but the server)
        suspended = manifest["spec"].pop("suspend", None) in (True, "true")
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
            policy.check(prepared, self.allow_privileged)
            try:
                run = Run(prepared, resolved, self._options())
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
            self._launch(run, record, suspended=suspended)
        return record

    def _launch(self, run: Run, record: dict, suspended: bool = False,
                rerun: Rerun | None = None, fresh: bool = True) -> None:
        """Save ``record`` and run ``run`` in a thread of its own (under the store's lock);
        ``fresh``: a new run (not a retry in an earlier one's folder), removed if it cannot
        start."""
        if suspended:
            run.resumed.clear()
        thread = threading.Thread(target=self._run, args=(run, rerun), daemon=True,
                                  name=f"workflow {run.name}")
        with self._lock:  # live before its record shows: never seen as "never started"
            self._live[run.name] = _Live(run, thread)
        try:
            self.store.save(record)
        except BaseException:
            with self._lock:
                self._live.pop(run.name, None)
            if fresh:
                self.store.remove(run.name)  # nothing ran: as if never accepted
            raise
        thread.start()

    def retry(self, name: str, restart_successful: bool, selector: str,
              parameters: list[str]) -> dict:
        """``argo retry``: the finished run ``name`` again, in its folder, its record kept."""
        from sublimate.pipelines.runner.reruns import retry

        with self.store.lock:
            if self.is_live(name):
                raise invalid(f"workflow {name} is running: only a finished one is retried")
            record = self.store.record(name)
            assert record is not None  # the caller found it
            rerun = _rerun(lambda: retry(self.store.runs / name, self._options(),
                                         restart_successful, selector,
                                         name_values(parameters, "parameters"), self._policy))
            record.pop("interrupted", None)  # this run's record is the new run's
            record["resourceVersion"] = str(int(record.get("resourceVersion", "1")) + 1)
            if record.get("source") == "sublimate run":
                record.pop("source")  # the server runs it now: its record is the server's
            self._launch(rerun.run, record, rerun=rerun, fresh=False)
        return record

    def resubmit(self, name: str, memoized: bool, parameters: list[str]) -> dict:
        """``argo resubmit [--memoized]``: a new run of the manifest ``name`` ran."""
        from sublimate.pipelines.runner.reruns import resubmit

        with self.store.lock:
            earlier = self.store.record(name)
            assert earlier is not None
            rerun = _rerun(lambda: resubmit(self.store.runs / name, self._options(), memoized,
                                            name_values(parameters, "parameters"), self._policy))
            run = rerun.run
            metadata = run.workflow.get("metadata") or {}
            record = {
                "name": run.name, "namespace": earlier["namespace"],
                "uid": run.globals.get("workflow.uid") or "",
                "creationTimestamp": timestamp(run.record.started_at),
                "labels": metadata.get("labels") or {},
                "annotations": metadata.get("annotations") or {},
                "spec": earlier.get("spec") or {},
                "generateName": metadata.get("generateName") or f"{name}-",
            }
            self._launch(run, record, rerun=rerun)
        return record

    def is_suspended(self, name: str) -> bool:
        with self._lock:
            live = self._live.get(name)
        return live is not None and not live.run.resumed.is_set()

    def suspend(self, name: str) -> None:
        live = self._running(name, "suspended")
        live.run.resumed.clear()

    def resume(self, name: str, selector: str) -> list[str]:
        """``argo resume``: the workflow resumed, and its suspend nodes (those ``selector``
        matches); the names of the nodes resumed."""
        live = self._running(name, "resumed")
        resumed: list[str] = []
        if not selector:
            live.run.resumed.set()
        suspensions = live.run.suspensions
        if suspensions is not None:
            from sublimate.pipelines.runner.records.control import ControlError

            try:
                resumed = suspensions.resume(selector, {}, "the sublimate server")
            except ControlError as error:
                if selector:
                    raise invalid(str(error)) from error
        elif selector:
            raise invalid(f"workflow {name} has no suspend node to resume")
        return resumed

    def set_nodes(self, name: str, selector: str, phase: str, message: str,
                  outputs: dict[str, str]) -> list[str]:
        """``argo node set``: the suspend nodes ``selector`` matches end with ``phase``
        (Succeeded: resumed with the supplied ``outputs``, checked against their enums;
        Failed or Error: stopped); the names of the nodes set."""
        live = self._running(name, "set")
        if live.run.suspensions is None:
            raise invalid(f"workflow {name} has no suspend node to set")
        from sublimate.pipelines.runner.records.control import ControlError

        try:
            if phase in ("", "Succeeded"):
                return live.run.suspensions.resume(selector, outputs, "the sublimate server",
                                                   message)
            if phase in ("Failed", "Error"):
                return live.run.suspensions.stop(selector, message, "the sublimate server")
        except ControlError as error:
            raise invalid(str(error)) from error
        raise invalid(f"phase: {phase} is an invalid phase to set to")

    def stop(self, name: str, selector: str, message: str) -> None:
        """``argo stop``: its running steps stopped, its exit handler run; with ``selector``,
        only the matching suspend nodes fail."""
        live = self._running(name, "stopped")
        if selector:
            from sublimate.pipelines.runner.records.control import ControlError

            if live.run.suspensions is None:
                raise invalid(f"workflow {name} has no suspend node to stop")
            try:
                live.run.suspensions.stop(selector, message or "stopped", "the sublimate server")
            except ControlError as error:
                raise invalid(str(error)) from error
            return
        live.run.resumed.set()  # a suspended workflow stops too
        live.run.root_scope.stop(message or "stopped")

    def _running(self, name: str, doing: str) -> _Live:
        with self._lock:
            live = self._live.get(name)
        if live is None:
            raise invalid(f"workflow {name} is not running here: only a workflow this server "
                          f"runs is {doing} (a `sublimate run` in a terminal: sublimate stop "
                          f"or resume there)")
        return live

    def _policy(self, workflow: dict) -> None:
        policy.check(workflow, self.allow_privileged)

    def _options(self) -> RunOptions:
        return RunOptions(home=self.store.home, reporter=_quiet, follow_logs=False,
                          allow_privileged=self.allow_privileged)

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

    def _run(self, run: Run, rerun: Rerun | None) -> None:
        try:
            run.run()
        except Exception:  # the run's own record says Failed; the server goes on
            traceback.print_exc(file=sys.stderr)
        finally:
            if rerun is not None:
                rerun.close()
            with self._lock:
                self._live.pop(run.name, None)


def _rerun(make: Callable[[], Rerun]) -> Rerun:
    """A retry or resubmit made; what cannot be, said as a 400 naming why."""
    from sublimate.pipelines.runner.templates.rerun import RerunError

    try:
        return make()
    except (RerunError, ManifestError, ParameterError, ValueError) as error:
        raise invalid(str(error)) from error


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
    for key, pattern in (("name", NAME), ("generateName", _GENERATE_NAME)):
        value = metadata.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > 253
                                  or not pattern.fullmatch(value)):
            raise invalid(f"workflow.metadata.{key}: {value!r} is not a valid Kubernetes name "
                          f"(lower case letters, digits, '-' and '.')")
    check_string_maps(metadata, "workflow.metadata")
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
