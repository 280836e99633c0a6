"""The run folder and the run's status: the one owner of nodes, phases and ``status.json``.

Every node is created and every phase changes here, under one lock, so ``status.json`` (rewritten
atomically on each transition) and the reporter's events always agree with the nodes. Naming
(the run's name, node ids, node folders) is pure, so a dry run can show the paths a run would
use without creating anything.

``status.json`` is written to a temporary file, fsynced, and renamed over the old one, so a crash
(or a power cut) leaves the old status or the new one, never a torn or empty file; the folder is
fsynced too when the run starts and ends, so those two renames survive a power cut. The writes
while the run goes on are made by a thread of their own (``_StatusWriter``): a transition marks
the status out of date and returns, and the thread writes the latest state (one write for all
the transitions made meanwhile), so no step waits for the disk. The final status is written by
the thread that concludes the run, before ``run_workflow`` returns; a status on disk lags the
run by at most the write in progress and the writer's rest after it (``WRITER_REST``).

It also names the runner (``runner``: pid, start time in clock ticks since boot, host), so that a
run whose runner was killed (SIGKILL, the OOM killer, a reboot) is not shown Running forever:
:func:`settle_interrupted_runs`, called by the next ``sublimate run``, finds each status that says
Running while its runner no longer runs, and concludes it Failed, saying so.

A full disk (``disk_full``) stops the run rather than crash a thread or leave it Running: a
write of the status, the manifest or a pod's log that does not fit removes its temporary file
and tells the engine (``on_disk_full``), which stops the run with one line naming the disk and
the file. The final status is then written in place over the last one when the atomic write
does not fit (:func:`overwrite_in_place`: the same blocks, padded, so that it needs none
more), else the last good status stays; either way ``status.json`` parses.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import string
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sublimate.components.base.durable_files import fsync_folder
from sublimate.components.base.process_identity import start_ticks, still_runs
from sublimate.pipelines.argo_terms import NodePhase, NodeType

from ..pods.paths import PathMap
from .run_types import NodeResult, RunEvent, RunResult, iso, now

_ALPHABET = string.ascii_lowercase + string.digits


def suffix() -> str:
    # os.urandom rather than secrets/uuid: those imports cost more than the whole run setup.
    return "".join(_ALPHABET[b % len(_ALPHABET)] for b in os.urandom(5))


def draw_name(metadata: dict) -> str:
    """The run's name as Argo gives it: ``metadata.name``, else ``generateName`` + 5 characters."""
    return metadata.get("name") or f"{metadata.get('generateName') or 'workflow-'}{suffix()}"


def make_run_dir(home: Path, metadata: dict) -> tuple[str, Path]:
    """Create ``<home>/runs/<name>``, never reusing a folder; returns the name and the folder."""
    runs = home / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    fixed = metadata.get("name")
    base = fixed or metadata.get("generateName") or "workflow-"
    name = draw_name(metadata)
    while True:
        try:
            (runs / name).mkdir()
            return name, runs / name
        except FileExistsError:
            # Never reuse a run dir: a fixed name gets a suffix, like generateName.
            name = f"{fixed}-{suffix()}" if fixed else f"{base}{suffix()}"


def _fnv32a(text: str) -> int:
    value = 0x811C9DC5
    for byte in text.encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def node_id(workflow: str, node_name: str) -> str:
    """Argo's node id: the workflow's name for the root node, else name + hash of the node name."""
    return workflow if node_name == workflow else f"{workflow}-{_fnv32a(node_name)}"


def pod_name(workflow: str, node_name: str, template: str) -> str:
    """Argo's v2 pod name (``workflow/util/pod_name.go`` ``GeneratePodName``): the workflow's
    name for its root node, else ``<workflow>-<template>-<fnv32a(node name)>``."""
    if node_name == workflow:
        return workflow
    prefix = f"{workflow}-{template}" if template else workflow
    return f"{prefix[:242]}-{_fnv32a(node_name)}"


def _template_of(node: NodeResult) -> str:
    """``GetTemplateFromNode``: a templateRef's template by its own name (the runner names its
    copy ``<WorkflowTemplate>.<template>``); a step group has none (steps.go)."""
    if node.type == NodeType.STEP_GROUP:
        return ""
    return node.template.rsplit(".", 1)[-1]


class RunRecord:
    """A run's nodes, phase and outputs, mirrored to ``<run dir>/status.json`` and the reporter."""

    def __init__(self, name: str, run_dir: Path, params: dict[str, str],
                 reporter: Callable[[RunEvent], None]) -> None:
        self.name = name
        self.run_dir = run_dir
        self.params = params
        self.reporter = reporter
        self.lock = threading.RLock()
        self.nodes: dict[str, NodeResult] = {}
        self.outputs: dict[str, dict[str, str]] = {}
        self.links: dict[str, Path] = {}
        self.started_at = now()
        self.finished_at = None
        self.phase = NodePhase.RUNNING
        self.message = ""
        self.concluded = False
        pid = os.getpid()
        self.runner = {"pid": pid, "start_ticks": start_ticks(pid), "host": host_name()}
        # Container path -> local folder of every volume a step mounted that outlives its pod,
        # so that workflow outputs naming such paths can be linked from the run folder.
        self.shared_mounts = PathMap(run_dir / "fs")
        # Secret values (``k8s_objects``): masked in status.json, results and events.
        self.secrets: frozenset[str] = frozenset()
        self._noted: set[str] = set()
        # Called once, with its one line, when a write of the run's own files finds the disk
        # full (the engine stops the run); the line is kept in ``disk_full``.
        self.on_disk_full: Callable[[str], None] | None = None
        self.disk_full = ""
        self.writer = _StatusWriter(self)

    def remember_secrets(self, values: frozenset[str] | set[str]) -> frozenset[str]:
        """Add secret values to mask; returns every one the run knows."""
        with self.lock:
            if not values <= self.secrets:
                self.secrets = self.secrets | values
            return self.secrets

    def note(self, key: str, text: str) -> None:
        """Say something about the run once (per ``key``), on the console and to a test."""
        with self.lock:
            if key in self._noted:
                return
            self._noted.add(key)
        self.emit(RunEvent("note", self.name, now(), message=text))

    # ------------------------------------------------------------------------- nodes

    def add_node(self, name: str, display: str, template: str, kind: NodeType,
                 parent: NodeResult | None) -> NodeResult:
        node = NodeResult(node_id(self.name, name), name, display, template, kind,
                          parent=parent.id if parent else None)
        with self.lock:
            self.nodes[node.id] = node
            if parent is not None:
                parent.children.append(node.id)
        return node

    def transition(self, node: NodeResult, phase: NodePhase, message: str = "") -> None:
        with self.lock:
            stamp = now()
            if phase == NodePhase.RUNNING and node.started_at is None:
                node.started_at = stamp
            if phase.done:
                node.started_at = node.started_at or stamp
                node.finished_at = stamp
            node.phase = phase
            if message:
                node.message = message
            self.status_changed()
        self.emit(RunEvent("node", self.name, stamp, phase=phase, node=node,
                           message=node.message))

    def finish(self, node: NodeResult, phase: NodePhase, message: str = "") -> NodeResult:
        self.transition(node, phase, message)
        return node

    def log_line(self, node: NodeResult, line: str) -> None:
        self.emit(RunEvent("log", self.name, now(), node=node, line=line))

    def set_output(self, kind: str, name: str, value: str) -> None:
        """A workflow output (``globalName``): ``kind`` is ``parameters`` or ``artifacts``."""
        with self.lock:
            self.outputs.setdefault(kind, {})[name] = value

    def failures(self) -> str:
        """``{{workflow.failures}}`` as Argo's operator.go sets it before the exit handler: every
        node Failed or Error, of any type, as ``failedNodeStatus`` JSON (Go's ``json.Marshal``:
        compact, ``<>&`` escaped, ``null`` for none), then ``strconv.Quote``'d, so the value
        is a quoted JSON string (a shell's quotes restore the JSON)."""
        with self.lock:
            failed = [n for n in self.nodes.values() if n.phase.failed]
        listed = [{
            "displayName": n.display_name,
            "message": n.message,
            "templateName": _template_of(n),
            "phase": n.phase,
            "podName": pod_name(self.name, n.name, _template_of(n)),
            "finishedAt": (n.finished_at.strftime("%Y-%m-%dT%H:%M:%SZ")
                           if n.finished_at else None),
        } for n in failed]
        text = json.dumps(listed or None, ensure_ascii=False, separators=(",", ":"))
        for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
            text = text.replace(char, escaped)
        return json.dumps(text, ensure_ascii=False)

    # ------------------------------------------------------------------ the workflow

    def started(self) -> None:
        self.writer.request(sync_folder=True)
        self.emit(RunEvent("workflow", self.name, self.started_at, phase=NodePhase.RUNNING))

    def conclude(self, phase: NodePhase, message: str) -> None:
        """The run's final phase; nodes still open (stopped mid-way) are closed as Failed. The
        first conclusion stands (a terminated run is concluded while its driver still runs)."""
        with self.lock:
            if self.concluded:
                return
            self.concluded = True
            for node in self.nodes.values():
                if not node.done:
                    node.phase = NodePhase.FAILED
                    node.message = node.message or message or "stopped"
                    node.finished_at = now()
            self.phase = phase
            self.message = message
            self.finished_at = now()
            self._link_outputs()
            self.writer.close()
            self._write_final_status()  # a full disk may fail a run that succeeded
            phase, message = self.phase, self.message
        self.emit(RunEvent("workflow", self.name, self.finished_at, phase=phase,
                           message=message))

    def _link_outputs(self) -> None:
        """``outputs/<name>`` in the run folder for each workflow output parameter that names a
        path on a volume: the one place a user is pointed to reaches the results on it."""
        folder = self.run_dir / "outputs"
        for name, value in (self.outputs.get("parameters") or {}).items():
            if not value.startswith("/") or not self.shared_mounts.covers(value):
                continue
            target = self.shared_mounts.local(value)
            if not target.exists() or "/" in name:
                continue
            folder.mkdir(exist_ok=True)
            link = folder / name
            with contextlib.suppress(OSError):
                link.unlink(missing_ok=True)
                link.symlink_to(target)
                self.links[name] = link

    # ----------------------------------------------------------------------- files

    def dump_manifest(self, workflow: dict) -> None:
        """``workflow.yaml``: the manifest as run, with its name and the parameters' values."""
        import yaml  # loaded already by whoever read the manifest

        manifest = copy.deepcopy(workflow)
        # (generateName stays: a resubmitted run draws its name from it, as Argo's does)
        manifest.setdefault("metadata", {})["name"] = self.name
        params = (manifest["spec"].get("arguments") or {}).get("parameters") or []
        for param in params:
            if param.get("name") in self.params:
                param["value"] = self.params[param["name"]]
        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        text = yaml.dump(manifest, Dumper=dumper, sort_keys=False)
        path = self.run_dir / "workflow.yaml"
        try:
            path.write_text(text)
        except OSError as error:
            path.unlink(missing_ok=True)  # a part of it would read as the whole manifest
            from sublimate.components.base.disk_full import disk_full_cause, disk_full_error

            cause = disk_full_cause(error)
            if cause is None:
                raise
            raise disk_full_error(cause, path, f"writing the run's manifest {path}") from error

    def result(self) -> RunResult:
        result = RunResult(
            name=self.name,
            phase=self.phase,
            message=self.message,
            started_at=self.started_at,
            finished_at=self.finished_at,
            run_dir=self.run_dir,
            nodes=list(self.nodes.values()),
            parameters=dict(self.params),
            outputs={k: dict(v) for k, v in self.outputs.items()},
            links=dict(self.links),
            runner=dict(self.runner),
        )
        if self.secrets:
            from ..pods.k8s_objects import redact_result  # only a run with secrets pays for it

            result = redact_result(result, self.secrets)
        return result

    def write_status(self, sync_folder: bool = False) -> None:
        """Write the status now, from this thread (the run's conclusion)."""
        with self.lock:
            status = self.result().to_json()
            version = self.writer.changed()
        self.writer.write(version, status, sync_folder)

    def _write_final_status(self) -> None:
        """The conclusion's status, however full the disk: atomically; when that does not
        fit, in place over the last one, whole, else the last one with the run's end patched
        in; when neither fits, the last good status stays (it still parses)."""
        try:
            self.write_status(sync_folder=True)
            return
        except OSError as error:
            if self.write_failed(error) is None:
                return  # not ours to write any more (the folder removed): nothing to save
        if not self.phase.failed:  # its record could not be kept whole: not a success
            self.phase, self.message = NodePhase.FAILED, self.disk_full
        path = self.run_dir / STATUS_FILE
        final = self.result().to_json()
        try:
            last = json.loads(path.read_text())
        except (OSError, ValueError):
            last = None
        candidates = [final]
        if isinstance(last, dict):
            candidates.append(concluded_status(last, self.phase, self.message,
                                               iso(self.finished_at)))
        with self.writer.file_lock:  # the writer thread's last snapshot, older, stays out
            self.writer.written = self.writer.version
            for status in candidates:
                try:
                    if overwrite_in_place(path, json.dumps(status)):
                        return
                except OSError:
                    continue

    def write_failed(self, error: BaseException) -> str | None:
        """A write of the runner's failed: a full disk stops the run, once (``on_disk_full``),
        with the line that says which disk and what was written (the run folder's disk when
        the error names no file), which is returned; None for any other failure, which leaves
        the run to go on."""
        # (loaded only once a write failed: a run's start-up imports only what it uses)
        from sublimate.components.base.disk_full import describe, disk_full_cause, said

        cause = disk_full_cause(error)
        if cause is None:
            return None
        message = said(error) or (
            describe(cause, cause.filename, f"writing {cause.filename}") if cause.filename
            else describe(cause, self.run_dir, "writing into the run folder"))
        with self.lock:
            first = not self.disk_full
            self.disk_full = self.disk_full or message
        if first and self.on_disk_full is not None and not self.concluded:
            self.on_disk_full(message)
        return message

    def not_started(self, message: str) -> None:
        """The run could not record its start (``message``): it ends Failed, and a folder that
        no status fit in either is removed, as if never made (the console says why)."""
        self.conclude(NodePhase.FAILED, message)
        if not (self.run_dir / STATUS_FILE).exists():
            import shutil  # only a run that could not start

            shutil.rmtree(self.run_dir, ignore_errors=True)

    def status_changed(self) -> None:
        """The status on disk is out of date: the writer thread will write it."""
        self.writer.request()

    def emit(self, event: RunEvent) -> None:
        if self.secrets and (event.message or event.line):
            from ..pods.k8s_objects import redact

            event.message = redact(event.message, self.secrets)
            event.line = redact(event.line, self.secrets) if event.line else event.line
        with contextlib.suppress(Exception):  # a broken reporter must not break the run
            self.reporter(event)


STATUS_FILE = "status.json"
# The room kept after the status in its file, at least, in spaces (JSON allows them after the
# value), the file then filled to its last block: the final status fits over it in place
# (``overwrite_in_place``) when the disk has no block left for a new file. Blocks of 4 KiB, the
# usual, cost nothing more: a file takes whole blocks anyway, and most statuses are one or two.
STATUS_ROOM = 1024
BLOCK_BYTES = 4096


def with_room(text: str) -> str:
    """``text`` (ASCII: JSON's escapes) padded to whole blocks, with ``STATUS_ROOM`` spaces at
    least, and a newline last."""
    end = -(-(len(text) + STATUS_ROOM) // BLOCK_BYTES) * BLOCK_BYTES
    return text + " " * (end - len(text) - 1) + "\n"
WRITER_REST = 4  # the status writer rests this many times what its last write cost


class _StatusWriter:
    """Writes a run's ``status.json`` off the threads that change it. ``request`` marks the
    status out of date and wakes the writer thread, which takes a snapshot under the record's
    lock, then writes it (temporary file, fsync, rename) outside it; transitions made while it
    writes are in its next snapshot. Each write carries the version it snapshot, and an older
    version never replaces a newer one (the conclusion, written by its own thread)."""

    def __init__(self, record: RunRecord) -> None:
        self.record = record
        self.wake = threading.Condition()
        self.file_lock = threading.Lock()
        self.version = 0  # of the record's state; under the record's lock
        self.requested = 0  # the version asked for (under ``wake``)
        self.written = -1  # the version on disk (under ``file_lock``)
        self.sync_folder = False
        self.closed = False
        self.thread: threading.Thread | None = None

    def changed(self) -> int:
        """A new version of the state (the caller holds the record's lock)."""
        self.version += 1
        return self.version

    def request(self, sync_folder: bool = False) -> None:
        with self.record.lock:
            version = self.changed()
        with self.wake:
            if self.closed:
                return
            self.requested = version
            self.sync_folder |= sync_folder
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="status-writer",
                                               daemon=True)
                self.thread.start()
            self.wake.notify()

    def _loop(self) -> None:
        done = 0
        while True:
            with self.wake:
                while self.requested == done and not self.closed:
                    self.wake.wait()
                if self.closed:
                    return
                done, sync_folder, self.sync_folder = self.requested, self.sync_folder, False
            began = time.thread_time()
            with self.record.lock:
                version = self.version
                status = self.record.result().to_json()
            try:
                self.write(version, status, sync_folder)
            except OSError as error:  # no thread dies of it: a full disk stops the run
                self.record.write_failed(error)
            # A snapshot costs the GIL in proportion to the nodes (0.3 s at 10,000): written
            # back to back, it starved every other thread, and a stopped fan-out of 10,000
            # took 48 s to end (issue 40). Resting WRITER_REST times its cost keeps its share
            # of the interpreter to a fifth; a small run's writes (under 1 ms) do not rest.
            spent = time.thread_time() - began
            if spent > 0.001:
                with self.wake:
                    self.wake.wait_for(lambda: self.closed, WRITER_REST * spent)

    def write(self, version: int, status: dict, sync_folder: bool) -> None:
        text = with_room(json.dumps(status, indent=1))
        with self.file_lock:
            if version <= self.written:
                return  # a newer state is on disk already
            path = self.record.run_dir / STATUS_FILE
            write_durably(path, text, sync_folder=sync_folder,
                          what=f"writing the run's {STATUS_FILE} in {path.parent}")
            self.written = version

    def close(self) -> None:
        """No more writes from the thread (the caller writes the last one itself)."""
        with self.wake:
            self.closed = True
            self.wake.notify()


def host_name() -> str:
    return os.uname().nodename


def write_durably(path: Path, text: str, sync_folder: bool = True, what: str = "") -> None:
    """Replace ``path`` with ``text`` atomically: a temporary file, fsynced before the rename
    (else a crash can leave the new name on an empty file), then, with ``sync_folder``, the folder
    fsynced after it (else the rename itself can be lost). A write that fails removes the
    temporary file; one that finds the disk full raises a ``DiskFullError`` saying ``what``."""
    tmp = path.with_name(f"{path.name}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        from sublimate.components.base.disk_full import (
            DiskFullError,
            disk_full_cause,
            disk_full_error,
        )

        cause = disk_full_cause(error)
        if cause is None or isinstance(error, DiskFullError):
            raise
        raise disk_full_error(cause, path, what or f"writing {path}") from error
    if sync_folder:
        fsync_folder(path.parent)


def overwrite_in_place(path: Path, text: str) -> bool:
    """Write ``text`` over ``path``'s own bytes, padded with spaces to its length (which JSON
    allows after a value), when it is shorter: a disk too full for a temporary file still
    takes it, since no block is added or freed (the status keeps room for it: ``with_room``).
    Not atomic, as a rename is: the last resort of a run that must say how it ended. False
    when ``text`` is not shorter (nothing written)."""
    data = text.encode()
    with open(path, "r+b") as out:
        size = os.fstat(out.fileno()).st_size
        if len(data) >= size:
            return False
        out.write(data + b" " * (size - len(data) - 1) + b"\n")
        out.flush()
        os.fsync(out.fileno())
    return True


def concluded_status(status: dict, phase: str, message: str, finished: str | None) -> dict:
    """A status that said Running, concluded: ``phase`` with ``message``, its open nodes
    Failed with the same message (unless they had their own)."""
    for node in status.get("nodes") or []:
        if isinstance(node, dict) and node.get("phase") in (NodePhase.PENDING,
                                                              NodePhase.RUNNING):
            node.update(phase=NodePhase.FAILED, message=node.get("message") or message,
                        finished_at=finished)
    status.update(phase=phase, message=message, finished_at=finished)
    return status


@dataclass(frozen=True)
class InterruptedRun:
    """A run whose runner died while it ran, as :func:`settle_interrupted_runs` concluded it."""

    name: str
    run_dir: Path
    message: str


def runner_gone(status: dict) -> str | None:
    """Why a status that says Running is not running: its runner (on this host) no longer runs.
    None while it runs, or when that cannot be told (another host, or no runner recorded)."""
    runner = status.get("runner")
    if status.get("phase") != NodePhase.RUNNING or not isinstance(runner, dict):
        return None
    pid, ticks = runner.get("pid"), runner.get("start_ticks")
    if not isinstance(pid, int) or runner.get("host") != host_name():
        return None
    if still_runs(pid, ticks if isinstance(ticks, int) else None):
        return None
    return f"the runner was killed (pid {pid} no longer runs)"


def settle_interrupted_runs(home: Path) -> list[InterruptedRun]:
    """Conclude as Failed every run under ``home`` whose status says Running but whose runner no
    longer runs, and its open nodes with it; their finish time is the status's last write."""
    runs = home / "runs"
    settled: list[InterruptedRun] = []
    if not runs.is_dir():
        return settled
    for folder in sorted(runs.iterdir()):
        path = folder / STATUS_FILE
        try:
            text = path.read_text()
            last_write = datetime.fromtimestamp(path.stat().st_mtime, UTC)
        except OSError:
            continue
        if f'"phase": "{NodePhase.RUNNING}"' not in text:
            continue  # cheap: most runs are over, and their statuses need not be parsed
        try:
            status = json.loads(text)
        except ValueError:
            continue
        message = runner_gone(status)
        if message is None:
            continue
        concluded_status(status, NodePhase.FAILED, message, iso(last_write))
        with contextlib.suppress(ValueError, TypeError):
            started = datetime.fromisoformat(status["started_at"].replace("Z", "+00:00"))
            status["duration_s"] = round((last_write - started).total_seconds(), 3)
        try:
            write_durably(path, json.dumps(status, indent=1))
        except OSError:
            continue  # not ours to write (another user's home): leave it as it is
        from ..pods.k8s_objects import remove_secret_root

        remove_secret_root(folder)  # its pods' secret volumes, on the tmpfs
        settled.append(InterruptedRun(str(status.get("name") or folder.name), folder, message))
    return settled
