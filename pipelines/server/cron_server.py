"""CronWorkflows (Argo's ``server/cronworkflow/`` for the API, ``workflow/cron/`` for the
scheduling): kept in ``server/cron-workflows/<namespace>/<name>.json``, checked as Argo's
``validate.CronWorkflow`` checks them, and started on their schedules by one scheduler thread
per server (``CronScheduler``), which keeps each one's ``status`` as Argo's cron controller
does: ``active`` workflows, ``lastScheduledTime``, ``succeeded``/``failed`` counts,
``conditions`` and ``phase``.

The scheduler sleeps until the next schedule is due (or, while a cron's workflows run, wakes
each second to see them end); a request that changes a CronWorkflow wakes it. It starts with
the first request to the templates' or crons' routes (``app`` builds no scheduler itself), and
reads every stored CronWorkflow then: a schedule missed while the server was down runs once if
``startingDeadlineSeconds`` still allows it, as Argo's controller does on its start."""

from __future__ import annotations

import copy
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sublimate.pipelines.runner import ManifestError
from sublimate.pipelines.runner.manifest.library import cron_workflow, rfc3339

from .convert import DONE_PHASES, to_workflow
from .cron import MAX_NAME, Schedule, ScheduleError, parse_schedule, stop_reached, when_holds, zone
from .errors import ALREADY_EXISTS, ApiError, invalid
from .routing import Handler, Request, route
from .selectors import parse_selector
from .templates import API_VERSION, ObjectStore, attached, checked_object, resolve_references

# The server (``app.ArgoApiServer``), as ``routing.ServerState`` and what is attached to it;
# not imported: ``app`` imports this module.
Server = Any


FOLDER = Path("server") / "cron-workflows"
RESOURCE = "cronworkflows.argoproj.io"
LABEL_CRON_WORKFLOW = "workflows.argoproj.io/cron-workflow"
LABEL_COMPLETED = "cronworkflows.argoproj.io/completed"  # stopStrategy reached
ANNOTATION_LAST_USED_SCHEDULE = "cronworkflows.argoproj.io/last-used-schedule"
CONCURRENCY_POLICIES = ("", "Allow", "Forbid", "Replace")
DEFAULT_SUCCESSFUL_HISTORY = 3  # Argo's, when successfulJobsHistoryLimit is unset
DEFAULT_FAILED_HISTORY = 1
SPEC_ERROR = "SpecError"
SUBMISSION_ERROR = "SubmissionError"
# How often the scheduler looks at running children (to count them and apply the history
# limits as they end), and the longest it sleeps otherwise (a wall clock that jumps is seen).
ACTIVE_POLL_S = 1.0
LONGEST_SLEEP_S = 60.0
REPLACED = "Stopped with strategy 'Terminate'"  # Argo's message for a workflow terminated
_FIELDS = ("workflowSpec", "workflowMetadata", "schedule", "schedules", "timezone",
           "concurrencyPolicy", "suspend", "startingDeadlineSeconds",
           "successfulJobsHistoryLimit", "failedJobsHistoryLimit", "stopStrategy", "when")


class CronStore(ObjectStore):
    def __init__(self, home: Path) -> None:
        super().__init__(Path(home) / FOLDER, RESOURCE, "CronWorkflow")


def crons(server: Server) -> CronStore:
    return attached(server, "cron_workflows", lambda: CronStore(server.store.home))


def scheduler(server: Server) -> CronScheduler:
    """The server's scheduler, started by the first request that may need it."""
    return attached(server, "cron_scheduler", lambda: CronScheduler(server).start())


# ------------------------------------------------------------------------------ checks


def schedules_of(spec: dict) -> list[Schedule]:
    where = zone(spec.get("timezone") or None)
    return [parse_schedule(text, where) for text in spec.get("schedules") or []]


def signature(spec: dict) -> str:
    """Argo's ``GetScheduleWithTimezoneString``: what ``last-used-schedule`` records."""
    prefix = f"CRON_TZ={spec['timezone']} " if spec.get("timezone") else ""
    return ",".join(prefix + text for text in spec.get("schedules") or [])


def checked_cron(server: Server, namespace: str, body: object,
                 field: str = "cronWorkflow") -> dict:
    """``body`` as a CronWorkflow of ``namespace`` as Argo's ``validate.CronWorkflow`` takes
    one: its name short enough for the ``-<unix time>`` of the workflows it starts, each
    schedule parsed, the time zone known, the policies valid, and the workflow it starts
    checked by the runner; 400 naming the field. The older ``spec.schedule`` (Argo < 3.6)
    becomes one of ``spec.schedules``, as Hera 7 and Argo v4 write it."""
    cron = checked_object(body, field, "CronWorkflow", namespace, max_name=MAX_NAME)
    spec = cron["spec"]
    unknown = sorted(key for key in spec if key not in _FIELDS)
    if unknown:
        raise invalid(f"{field}.spec.{unknown[0]}: not a CronWorkflow field")
    schedules = spec.get("schedules")
    if schedules is None:
        schedules = []
    if not isinstance(schedules, list) or not all(isinstance(text, str) for text in schedules):
        raise invalid(f"{field}.spec.schedules: must be a list of strings")
    legacy = spec.pop("schedule", None)
    if legacy is not None and not isinstance(legacy, str):
        raise invalid(f"{field}.spec.schedule: must be a string")
    if legacy and legacy not in schedules:
        schedules.append(legacy)
    if not schedules:
        raise invalid(f"{field}.spec.schedules: cron workflow must have at least one schedule")
    spec["schedules"] = schedules
    timezone = spec.get("timezone")
    if timezone is not None and not isinstance(timezone, str):
        raise invalid(f"{field}.spec.timezone: must be a string")
    try:
        where = zone(timezone or None)
    except ScheduleError as error:
        raise invalid(f"{field}.spec.timezone: invalid timezone {timezone!r}: {error}") from error
    for index, text in enumerate(schedules):
        try:
            parse_schedule(text, where)
        except ScheduleError as error:
            raise invalid(f"{field}.spec.schedules[{index}]: cron schedule {text!r} is "
                          f"malformed: {error}") from error
    policy = spec.get("concurrencyPolicy", "")
    if policy not in CONCURRENCY_POLICIES:
        raise invalid(f"{field}.spec.concurrencyPolicy: '{policy}' is not a valid "
                      f"concurrencyPolicy (Allow, Forbid or Replace)")
    for key in ("startingDeadlineSeconds", "successfulJobsHistoryLimit",
                "failedJobsHistoryLimit"):
        value = spec.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise invalid(f"{field}.spec.{key}: must be an integer")
    if (spec.get("startingDeadlineSeconds") or 0) < 0:
        raise invalid(f"{field}.spec.startingDeadlineSeconds: must be positive")
    if not isinstance(spec.get("suspend", False), bool):
        raise invalid(f"{field}.spec.suspend: must be true or false")
    stop = spec.get("stopStrategy")
    if stop is not None and (not isinstance(stop, dict)
                             or not isinstance(stop.get("expression"), str)
                             or not stop["expression"].strip()):
        raise invalid(f"{field}.spec.stopStrategy.expression: required, a string")
    if not isinstance(spec.get("when", ""), str):
        raise invalid(f"{field}.spec.when: must be a string")
    extra = spec.get("workflowMetadata")
    if extra is not None and not isinstance(extra, dict):
        raise invalid(f"{field}.spec.workflowMetadata: must be an object")
    for key in ("labels", "annotations"):
        values = (extra or {}).get(key)
        if values is not None and (not isinstance(values, dict) or not all(
                isinstance(value, str) for value in values.values())):
            raise invalid(f"{field}.spec.workflowMetadata.{key}: must map names to strings")
    if not isinstance(spec.get("workflowSpec"), dict):
        raise invalid(f"{field}.spec.workflowSpec: required, an object")
    workflow = fired_workflow(cron, datetime.now(UTC), field)
    try:
        server.launcher.lint(namespace, resolve_references(server, namespace, workflow))
    except ApiError as error:
        raise invalid(f"{field}.spec.workflowSpec: cannot validate Workflow: "
                      f"{error.message}") from error
    cron.pop("status", None)  # the server's to keep, as Argo's controller keeps it
    return cron


def fired_workflow(cron: dict, scheduled: datetime, field: str = "cronWorkflow") -> dict:
    """The Workflow ``cron`` starts for its schedule at ``scheduled``, as Argo's controller
    makes it (``ConvertCronWorkflowToWorkflowWithProperties``, the runner's
    ``cron_workflow``): named ``<cron>-<unix time>``, labelled with the cron's name, annotated
    with the scheduled time in the schedule's zone."""
    spec = cron["spec"]
    try:
        moment = scheduled.astimezone(zone(spec.get("timezone") or None))
        metadata, workflow_spec, _ = cron_workflow(cron, moment)
    except (ManifestError, ScheduleError) as error:
        raise invalid(f"{field}.{error}") from error
    metadata["namespace"] = cron["metadata"]["namespace"]
    return {"apiVersion": API_VERSION, "kind": "Workflow", "metadata": metadata,
            "spec": workflow_spec}


# ------------------------------------------------------------------------------ routes

_BASE = "/api/v1/cron-workflows/{namespace}"


def create(request: Request) -> tuple[int, dict]:
    server = request.server
    cron = checked_cron(server, request.namespace, request.object().get("cronWorkflow"))
    cron["status"] = {}
    created = crons(server).create(cron)
    scheduler(server).changed(request.namespace, created["metadata"]["name"], created)
    return 200, created


def lint(request: Request) -> tuple[int, dict]:
    return 200, checked_cron(request.server, request.namespace,
                             request.object().get("cronWorkflow"))


def list_crons(request: Request) -> tuple[int, dict]:
    selector = parse_selector(request.one("listOptions.labelSelector"))
    items = [cron for cron in crons(request.server).list(request.namespace)
             if selector(cron["metadata"].get("labels") or {})]
    return 200, {"apiVersion": API_VERSION, "kind": "CronWorkflowList",
                 "metadata": {"resourceVersion": "1"}, "items": items}


def get(request: Request) -> tuple[int, dict]:
    return 200, crons(request.server).get(request.namespace, request.name)


def _keep_status(old: dict, new: dict) -> None:
    # The status is the scheduler's (a cluster's controller's): an update leaves it, and the
    # annotation that says which schedule it counted from.
    new["status"] = old.get("status") or {}
    used = (old["metadata"].get("annotations") or {}).get(ANNOTATION_LAST_USED_SCHEDULE)
    if used is not None:
        new["metadata"].setdefault("annotations", {})[ANNOTATION_LAST_USED_SCHEDULE] = used
    if (old["metadata"].get("labels") or {}).get(LABEL_COMPLETED):
        new["metadata"].setdefault("labels", {})[LABEL_COMPLETED] = "true"


def update(request: Request) -> tuple[int, dict]:
    server = request.server
    crons(server).get(request.namespace, request.name)  # 404 before any check, as Argo
    cron = checked_cron(server, request.namespace, request.object().get("cronWorkflow"))
    if cron["metadata"]["name"] != request.name:
        raise invalid(f"cronWorkflow.metadata.name: '{cron['metadata']['name']}' is not "
                      f"'{request.name}', the name in the path")
    updated = crons(server).update(cron, keep=_keep_status)
    scheduler(server).changed(request.namespace, request.name, updated)
    return 200, updated


def delete(request: Request) -> tuple[int, dict]:
    server = request.server
    crons(server).delete(request.namespace, request.name)
    # Kubernetes deletes what a CronWorkflow owns with it (its workflows' ownerReferences).
    scheduler(server).deleted(request.namespace, request.name)
    return 200, {}


def _suspended(value: bool) -> Handler:
    def handler(request: Request) -> tuple[int, dict]:
        def change(cron: dict) -> bool:
            cron["spec"]["suspend"] = value
            return True

        changed = crons(request.server).modify(request.namespace, request.name, change)
        scheduler(request.server).changed(request.namespace, request.name, None)
        return 200, changed

    return handler


CRON_ROUTES = [
    route("POST", _BASE, create),
    route("GET", _BASE, list_crons),
    route("POST", f"{_BASE}/lint", lint),
    route("GET", f"{_BASE}/{{name}}", get),
    route("PUT", f"{_BASE}/{{name}}", update),
    route("DELETE", f"{_BASE}/{{name}}", delete),
    route("PUT", f"{_BASE}/{{name}}/suspend", _suspended(True)),
    route("PUT", f"{_BASE}/{{name}}/resume", _suspended(False)),
]


# --------------------------------------------------------------------------- scheduling


@dataclass
class _Entry:
    signature: str  # the schedules (and zone) counted from
    horizon: datetime  # every due time up to here was seen
    anchor: datetime  # where an @every schedule counts from


def _now() -> datetime:
    return datetime.now(UTC)


def _parse_time(text: object) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def _set_condition(status: dict, kind: str, message: str) -> None:
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != kind]
    conditions.append({"type": kind, "status": "True", "message": message})
    status["conditions"] = conditions


def _clear_condition(status: dict, kind: str) -> bool:
    conditions = status.get("conditions") or []
    kept = [c for c in conditions if c.get("type") != kind]
    if len(kept) == len(conditions):
        return False
    if kept:
        status["conditions"] = kept
    else:
        status.pop("conditions", None)
    return True


def _history_limit(spec: dict, key: str, default: int) -> int:
    value = spec.get(key)
    return value if isinstance(value, int) and value >= 0 else default


class CronScheduler:
    """Starts each CronWorkflow's workflows when due. One daemon thread; ``clock`` gives the
    time (tests may pass another); ``pass_once`` is one look at every CronWorkflow and says
    how long to sleep."""

    def __init__(self, server: Server, clock: Callable[[], datetime] = _now) -> None:
        self.server = server
        self.store = crons(server)
        self.clock = clock
        self.entries: dict[tuple[str, str], _Entry] = {}
        self.lock = threading.RLock()  # one pass at a time; requests' changes between passes
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="cron scheduler")

    def start(self) -> CronScheduler:
        self.thread.start()
        return self

    def stop(self, wait_s: float = 10) -> None:
        self.stopping.set()
        self.wake.set()
        self.thread.join(wait_s)

    def changed(self, namespace: str, name: str, cron: dict | None) -> None:
        """A request changed the CronWorkflow: with ``cron`` (created or updated) its
        schedules count from now (Argo's controller re-adds it to its cron engine); then the
        scheduler looks again."""
        if cron is not None:
            now = self.clock()
            with self.lock:
                self.entries[(namespace, name)] = _Entry(signature(cron["spec"]), now,
                                                         now.replace(microsecond=0))
        self.wake.set()

    def deleted(self, namespace: str, name: str) -> None:
        """The CronWorkflow is gone: so are its workflows (ended first if running)."""
        with self.lock:
            self.entries.pop((namespace, name), None)
            children = self._children().get((namespace, name), [])
        for child in children:
            child_name = child["metadata"]["name"]
            self.server.launcher.terminate(child_name, f"CronWorkflow {name} was deleted",
                                           wait_s=30)
            self.server.store.remove(child_name)
        self.wake.set()

    def _loop(self) -> None:
        while not self.stopping.is_set():
            self.wake.clear()
            try:
                sleep_s = self.pass_once()
            except Exception:  # a bug: said, and the scheduler goes on
                traceback.print_exc(file=sys.stderr)
                sleep_s = 5.0
            self.wake.wait(sleep_s)

    def pass_once(self) -> float:
        """Every CronWorkflow looked at once: its ended workflows counted, then started if
        due; the seconds until one may be due next."""
        with self.lock:
            now = self.clock()
            children = self._children()
            soonest: datetime | None = None
            watching = False
            known = set()
            for namespace in self.store.namespaces():
                for cron in self.store.list(namespace):
                    key = (namespace, cron["metadata"]["name"])
                    known.add(key)
                    try:
                        due, active = self._look_at(cron, children.get(key, []), now)
                    except Exception as error:  # one cron's trouble is its own
                        traceback.print_exc(file=sys.stderr)
                        self._note(key, SUBMISSION_ERROR,
                                   f"sublimate server: {type(error).__name__}: {error}")
                        continue
                    watching = watching or active
                    if due is not None and (soonest is None or due < soonest):
                        soonest = due
            for gone in set(self.entries) - known:
                self.entries.pop(gone, None)
        sleep_s = LONGEST_SLEEP_S
        if soonest is not None:
            sleep_s = min(sleep_s, (soonest - self.clock()).total_seconds())
        if watching:
            sleep_s = min(sleep_s, ACTIVE_POLL_S)
        return max(sleep_s, 0.01)

    def _children(self) -> dict[tuple[str, str], list[dict]]:
        """The workflows each CronWorkflow started (its label), as Argo shows them."""
        store, launcher = self.server.store, self.server.launcher
        found: dict[tuple[str, str], list[dict]] = {}
        for name in store.names():
            record = store.record(name)
            if record is None:
                continue
            owner = (record.get("labels") or {}).get(LABEL_CRON_WORKFLOW)
            if not owner:
                continue
            workflow = to_workflow(record, store.status(name), launcher.is_live(name))
            found.setdefault((record.get("namespace", ""), owner), []).append(workflow)
        return found

    def _look_at(self, cron: dict, children: list[dict], now: datetime
                 ) -> tuple[datetime | None, bool]:
        """Argo's ``syncCronWorkflow`` (history limits, then the active list and counts)
        and its cron engine's turn: start the workflow of a schedule due since the last look.
        The next due time, and whether workflows of it still run."""
        namespace, name = cron["metadata"]["namespace"], cron["metadata"]["name"]
        key = (namespace, name)
        self._enforce_history(cron, children)
        cron = self._reconcile(namespace, name, children)
        active = bool((cron.get("status") or {}).get("active"))
        if (cron["metadata"].get("labels") or {}).get(LABEL_COMPLETED) == "true":
            return None, active  # stopped by its stopStrategy: Argo's controller skips it
        spec = cron["spec"]
        try:
            schedules = schedules_of(spec)
        except ScheduleError as error:  # (a file edited by hand: the API refuses these)
            self._note(key, SPEC_ERROR, str(error))
            return None, active
        entry = self.entries.get(key)
        due: datetime | None = None
        if entry is None or entry.signature != signature(spec):
            if entry is None:  # first seen by this process: the server (re)started
                due = self._missed(cron, schedules, now)
            entry = self.entries[key] = _Entry(signature(spec), now, now.replace(microsecond=0))
        else:
            found = [s.last_between(entry.horizon, now, entry.anchor) for s in schedules]
            candidates = [moment for moment in found if moment is not None]
            # several due at once (the machine slept): one run, for the latest, as Argo's
            # cron engine runs a late entry once
            due = max(candidates) if candidates else None
            entry.horizon = now
        if due is not None:
            self._fire(cron, due)
            active = True
        upcoming = [s.next_after(now, entry.anchor) for s in schedules]
        following = [moment for moment in upcoming if moment is not None]
        return (min(following) if following else None), active

    def _missed(self, cron: dict, schedules: list[Schedule], now: datetime) -> datetime | None:
        """Argo's ``shouldOutstandingWorkflowsBeRun``: the latest schedule missed since
        ``lastScheduledTime``, if it is within ``startingDeadlineSeconds`` of now and the
        schedules are the ones last used."""
        spec, status = cron["spec"], cron.get("status") or {}
        used = (cron["metadata"].get("annotations") or {}).get(ANNOTATION_LAST_USED_SCHEDULE)
        last = _parse_time(status.get("lastScheduledTime"))
        deadline = spec.get("startingDeadlineSeconds")
        if used != signature(spec) or last is None or deadline is None:
            return None
        for schedule in schedules:
            missed = schedule.last_between(last, now - timedelta(microseconds=1), last)
            if missed is not None and now < missed + timedelta(seconds=deadline):
                return missed
        return None

    def _fire(self, cron: dict, scheduled: datetime) -> None:
        """Argo's ``cronWfOperationCtx.run``: the stop strategy, ``suspend``, ``when`` and the
        concurrency policy decide; then the workflow for ``scheduled`` starts."""
        namespace, name = cron["metadata"]["namespace"], cron["metadata"]["name"]
        spec = cron["spec"]
        status = cron.get("status") or {}
        updates: dict[str, Any] = {}
        failure: tuple[str, str] | None = None
        stopped = False
        try:
            stop = spec.get("stopStrategy")
            stopped = bool(stop) and stop_reached(stop["expression"], cron)
        except ScheduleError as error:
            failure = (SPEC_ERROR, f"failed to check CronWorkflow '{name}' stopping condition: "
                                   f"{error}")
        started: dict | None = None
        if failure is None and not stopped and not spec.get("suspend") \
                and status.get("phase") != "Stopped":
            try:
                started = self._start(cron, scheduled)
            except ScheduleError as error:
                failure = (SUBMISSION_ERROR, f"run policy error: {error}")
            except ApiError as error:
                if error.code != ALREADY_EXISTS:  # a duplicate of this schedule's: no error
                    failure = (SUBMISSION_ERROR, f"Failed to submit Workflow: {error.message}")
            except Exception as error:
                traceback.print_exc(file=sys.stderr)
                failure = (SUBMISSION_ERROR, f"Failed to submit Workflow: "
                                             f"{type(error).__name__}: {error}")
        if started is not None:
            updates = {"started": started, "scheduled": scheduled}

        def change(stored: dict) -> bool:
            metadata, now_status = stored["metadata"], stored.setdefault("status", {})
            metadata.setdefault("annotations", {})[ANNOTATION_LAST_USED_SCHEDULE] = \
                signature(stored["spec"])
            if stopped:
                self._set_stopped(stored)
            if failure is not None:
                _set_condition(now_status, *failure)
                if failure[0] == SUBMISSION_ERROR:
                    now_status["failed"] = int(now_status.get("failed") or 0) + 1
            if updates:
                record = updates["started"]
                now_status["active"] = [*(now_status.get("active") or []), _reference(record)]
                now_status["phase"] = "Active"
                now_status["lastScheduledTime"] = rfc3339(updates["scheduled"].astimezone(UTC))
                _clear_condition(now_status, SUBMISSION_ERROR)
            return True

        self.store.modify(namespace, name, change)

    def _start(self, cron: dict, scheduled: datetime) -> dict | None:
        """``when``, then the concurrency policy, then the workflow started; its record, or
        None when the policy says not now."""
        spec, status = cron["spec"], cron.get("status") or {}
        if not when_holds(spec.get("when") or "", cron):
            return None
        running = [ref["name"] for ref in status.get("active") or []
                   if self.server.launcher.is_live(ref.get("name", ""))]
        policy = spec.get("concurrencyPolicy") or "Allow"
        if running and policy == "Forbid":
            return None
        if running and policy == "Replace":
            for workflow_name in running:
                self.server.launcher.terminate(workflow_name, REPLACED, wait_s=30)
        workflow = fired_workflow(cron, scheduled)
        shown = copy.deepcopy(workflow["spec"])
        namespace = cron["metadata"]["namespace"]
        to_run = resolve_references(self.server, namespace, workflow)
        return self.server.launcher.start(namespace, to_run, None, shown)

    def _reconcile(self, namespace: str, name: str, children: list[dict]) -> dict:
        """Argo's ``reconcileActiveWfs``: running children listed in ``active``; each that
        ended leaves it, counted as succeeded or failed, and the stop strategy looked at."""
        by_uid = {child["metadata"]["uid"]: child for child in children}

        def change(cron: dict) -> bool:
            status = cron.setdefault("status", {})
            active = list(status.get("active") or [])
            changed = False
            listed = {ref.get("uid") for ref in active}
            for child in children:
                if child["metadata"]["uid"] not in listed and not _ended(child):
                    active.append(_reference(child["metadata"]))
                    changed = True
            kept = []
            for ref in active:
                child = by_uid.get(ref.get("uid"))
                if child is not None and not _ended(child):
                    kept.append(ref)
                    continue
                changed = True
                if child is None:
                    continue
                phase = child["status"].get("phase")
                counter = "succeeded" if phase == "Succeeded" else "failed"
                status[counter] = int(status.get(counter) or 0) + 1
                stop = cron["spec"].get("stopStrategy")
                if stop:
                    try:
                        if stop_reached(stop["expression"], cron):
                            self._set_stopped(cron)
                    except ScheduleError as error:
                        _set_condition(status, SPEC_ERROR, f"failed to check CronWorkflow "
                                                           f"'{name}' stopping condition: {error}")
            if changed:
                if kept:
                    status["active"] = kept
                else:
                    status.pop("active", None)
            return changed

        return self.store.modify(namespace, name, change)

    def _enforce_history(self, cron: dict, children: list[dict]) -> None:
        """Argo's ``enforceHistoryLimit``: the newest ``successfulJobsHistoryLimit`` (3)
        succeeded and ``failedJobsHistoryLimit`` (1) failed workflows kept, older ones
        deleted."""
        spec = cron["spec"]
        ended = [child for child in children if _ended(child)]
        succeeded = [child for child in ended if child["status"]["phase"] == "Succeeded"]
        failed = [child for child in ended if child["status"]["phase"] != "Succeeded"]
        for group, keep in ((succeeded, _history_limit(spec, "successfulJobsHistoryLimit",
                                                       DEFAULT_SUCCESSFUL_HISTORY)),
                            (failed, _history_limit(spec, "failedJobsHistoryLimit",
                                                    DEFAULT_FAILED_HISTORY))):
            group.sort(key=lambda child: (child["status"].get("finishedAt") or "",
                                          child["metadata"]["name"]), reverse=True)
            for child in group[keep:]:
                child_name = child["metadata"]["name"]
                if not self.server.launcher.is_live(child_name):
                    self.server.store.remove(child_name)

    def _set_stopped(self, cron: dict) -> None:
        cron.setdefault("status", {})["phase"] = "Stopped"
        cron["metadata"].setdefault("labels", {})[LABEL_COMPLETED] = "true"

    def _note(self, key: tuple[str, str], kind: str, message: str) -> None:
        def change(cron: dict) -> bool:
            status = cron.setdefault("status", {})
            if any(c.get("type") == kind and c.get("message") == message
                   for c in status.get("conditions") or []):
                return False
            _set_condition(status, kind, message)
            return True

        try:
            self.store.modify(*key, change)
        except Exception:  # the cron is gone, or its file unwritable: said, not raised
            traceback.print_exc(file=sys.stderr)


def _ended(workflow: dict) -> bool:
    return workflow["status"].get("phase") in DONE_PHASES


def _reference(record: dict) -> dict:
    """A Kubernetes ObjectReference to a workflow (a server record or a Workflow's metadata)."""
    return {"kind": "Workflow", "apiVersion": API_VERSION, "name": record["name"],
            "namespace": record["namespace"], "uid": record.get("uid", ""),
            "resourceVersion": str(record.get("resourceVersion", "1"))}


__all__ = ["CRON_ROUTES", "CronScheduler", "CronStore", "checked_cron", "crons",
           "fired_workflow", "scheduler"]
