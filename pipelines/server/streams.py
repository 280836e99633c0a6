"""Streamed answers: Argo's ``WatchWorkflows`` (``/api/v1/workflow-events/{namespace}``) and
``WorkflowLogs``/``PodLogs`` (``/api/v1/workflows/{namespace}/{name}[/{podName}]/log``).

Each is a generator the request's own thread iterates (``routing.Stream``), polling the home's
files a few times a second, so a stream needs no thread of its own and ends with its
generator: when its client has gone (the connection read as closed between two polls, or a
write that fails), when the server closes its socket, or when there is nothing more to send.
Between polls it yields None (nothing yet), so heartbeats go out on quiet streams.

Watch: every workflow of the namespace the selectors choose, as ADDED (a Kubernetes watch
without a resourceVersion), then ADDED, MODIFIED and DELETED as runs appear, change and go;
a run's ``status.json`` (the runner replaces it, at most a few times a second) and the
server's record are ``stat``ed each poll, and a workflow is converted again only when one of
them changed, and sent only when what the client sees of it changed.

Logs: one ``LogEntry`` ``{content, podName}`` per line of the pods' log files in the run folder
(``nodes/<folder>/<container>.log``), as Argo's ``util/logs/workflow-logger.go`` sends them,
``podName`` the name Argo gives the node's pod (``run_folder.pod_name``). The runner masks
secret values in those files as it writes them (``LocalProcess._line``: every value the run
knows when the pod starts), and ``status.json`` keeps no secret values, so the files are sent
as they are. Those files hold no times: a line's time (``logOptions.timestamps``,
``sinceSeconds``, ``sinceTime``) is when this server first saw it written, for lines it saw
appear while following, else the pod's start and the file's last write spread over the
lines already there (``_LogClock``). Every request of the server agrees on a line's time, so a
client that opens a stream again from a line's time (``sublimate logs --follow``) neither
misses nor repeats a line."""

from __future__ import annotations

import bisect
import contextlib
import copy
import heapq
import os
import re
import select
import socket
import threading
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sublimate.pipelines.runner.records.run_folder import STATUS_FILE, pod_name, runner_gone

from .convert import DONE_PHASES, to_workflow
from .errors import invalid, not_found
from .routing import NAME, Request, Route, Stream, route
from .selectors import parse_selector, selected_name, workflow_selector
from .store import WorkflowStore
from .workflow_server import find

WATCH_POLL_S = 0.3  # how often a watch looks at the runs: a status changes a few times a second
LOG_POLL_S = 0.25  # how often a followed log looks for new lines
# Argo's scanner gives a line longer than this in pieces (scanLinesOrGiveLong): a progress bar
# drawn with carriage returns is one endless line.
MAX_LINE = 1024 * 1024
_CHUNK = 64 * 1024  # bytes read from a log at once: one open file and one chunk per pod
MAX_GREP = 1024  # characters of a grep pattern (Python's re backtracks; RE2 does not)
# A container's name (a DNS-1123 label); a log file is named after it, never a path.
_CONTAINER = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_INTEGER = re.compile(r"[+-]?[0-9]{1,19}")
_INT64 = 2**63 - 1
_POD_DONE = frozenset({"Succeeded", "Failed", "Error", "Skipped", "Omitted"})
_WORKFLOW_LABEL = "workflows.argoproj.io/workflow"  # the label Argo gives every pod


# ------------------------------------------------------------------------------ common


def _integer(request: Request, key: str, minimum: int) -> int | None:
    """An int64 query parameter (grpc-gateway parses them from strings), None when absent;
    400 naming it for anything but digits, or below ``minimum``."""
    text = request.one(key).strip()
    if not text:
        return None
    if not _INTEGER.fullmatch(text) or not -_INT64 - 1 <= int(text) <= _INT64:
        raise invalid(f"{key}: {text[:40]!r} is not an integer")
    value = int(text)
    if value < minimum:
        raise invalid(f"{key}: must be at least {minimum}, not {value}")
    return value


def _ended(request: Request) -> bool:
    """The stream's client has gone, or the server is stopping: its listening socket is
    closed (``server_close``) once the runs it ran have ended, and the streams with it."""
    listening = getattr(request.server, "socket", None)
    if listening is not None and listening.fileno() < 0:
        return True
    # The client's socket (``Request.connection`` where ``app`` passes it): a client that
    # closed it reads as an end of file. Without it, a departed client is found by the next
    # write that fails (an event, or an SSE heartbeat).
    connection = getattr(request, "connection", None)
    if connection is None:
        return False
    try:
        readable, _, _ = select.select([connection], [], [], 0)
        return bool(readable) and connection.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True  # reset, or closed under us


def _stat(path: str | Path) -> tuple[int, int, int] | None:
    """What tells one version of a file from the next: a rename (``status.json``) makes a new
    inode, a write moves the mtime or the size."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_ino, found.st_mtime_ns, found.st_size


# ------------------------------------------------------------------------------- watch


def field_cleaner(text: str, prefix: str = "") -> Callable[[dict], dict]:
    """Argo's ``fields`` parameter (``util/fields``): a comma-separated list of dotted paths to
    keep, or with a leading ``-`` to drop, ``prefix`` (``result.object.``) taken off each."""
    if not text:
        return lambda item: item
    exclude = text.startswith("-")
    fields = {part.removeprefix(prefix) for part in text.removeprefix("-").split(",")}

    def clean_item(path: list[str], item: Any) -> None:
        if isinstance(item, dict):
            for key in list(item):
                field_path = ".".join([*path, key])
                path_in = field_path in fields
                # (a string prefix, as Go's strings.HasPrefix: Argo's own rule)
                parent_in = path_in or any(wanted.startswith(field_path) for wanted in fields)
                if (exclude and not path_in) or (not exclude and parent_in):
                    if not path_in:
                        clean_item([*path, key], item[key])
                else:
                    del item[key]
        elif isinstance(item, list):
            for element in item:
                clean_item(path, element)

    def clean(workflow: dict) -> dict:
        cleaned = copy.deepcopy(workflow)
        clean_item([], cleaned)
        # Go's Workflow has these as structs, never pointers: emptied, they are still sent
        for key in ("metadata", "spec"):
            cleaned.setdefault(key, {})
        return cleaned

    return clean


@dataclass
class _Seen:
    signature: tuple
    shown: dict | None  # what the client was sent last; None: not chosen (or not there)


def watch_workflows(request: Request) -> Stream:
    namespace = request.namespace
    field_selector = request.one("listOptions.fieldSelector")
    chosen = workflow_selector(request.one("listOptions.labelSelector"), field_selector,
                               namespace)
    clean = field_cleaner(request.one("fields"), prefix="result.object.")
    timeout_s = _integer(request, "listOptions.timeoutSeconds", minimum=0)
    store = request.server.store
    named = selected_name(field_selector)
    if named is not None:
        # Argo looks a named workflow up first (workflow_server.go WatchWorkflows): a watch
        # of one that does not exist is refused, not left waiting
        record = store.record(named) if NAME.fullmatch(named) else None
        if record is None or record.get("namespace") != namespace:
            raise not_found(namespace, named)
    deadline = time.monotonic() + timeout_s if timeout_s else None
    return Stream(_watch(request, namespace, chosen, clean, deadline))


def _watch(request: Request, namespace: str, chosen: Callable[[dict], bool],
           clean: Callable[[dict], dict], deadline: float | None) -> Iterator[dict | None]:
    look = _Look(request, namespace, chosen, clean)
    while True:
        yield from look.changes()
        yield None
        if _ended(request) or (deadline is not None and time.monotonic() >= deadline):
            return
        time.sleep(WATCH_POLL_S)


# A folder's mtime moves in clock ticks (a few ms): a change in the tick of the last look
# leaves it as it was. A folder changed this recently is looked into again.
_RECENT_NS = 2_000_000_000


class _Look:
    """One watch's view of the home between polls. Each poll costs a listing of the runs and
    one ``stat`` per run (its ``status.json``: replaced by a rename, a new inode each time);
    the server's records are ``stat``ed only while their folder has changed recently (they
    change when a workflow is accepted, suspended or settled, not as it runs)."""

    def __init__(self, request: Request, namespace: str, chosen: Callable[[dict], bool],
                 clean: Callable[[dict], dict]) -> None:
        self.store, self.launcher = request.server.store, request.server.launcher
        self.namespace, self.chosen, self.clean = namespace, chosen, clean
        self.runs, self.records = str(self.store.runs), str(self.store.records)
        self.known: dict[str, _Seen] = {}
        self.records_seen: tuple[int, int, int] | None = None
        self.record_stats: dict[str, tuple[int, int, int] | None] = {}

    def changes(self) -> list[dict]:
        """The events since the last look (every chosen workflow ADDED at the first): one
        that comes into the selection is ADDED, one that leaves it DELETED, as a Kubernetes
        watch with a selector says it."""
        records = _stat(self.records)
        if records != self.records_seen or (
                records is not None and time.time_ns() - records[1] < _RECENT_NS):
            self.records_seen = records
            self.record_stats = {name: _stat(f"{self.records}/{name}.json")
                                 for name in _listed(self.records, ".json")}
        names = sorted(set(_listed(self.runs)) | set(self.record_stats))
        events = []
        for name in names:
            live = self.launcher.is_live(name)
            signature = (_stat(f"{self.runs}/{name}/{STATUS_FILE}"),
                         self.record_stats.get(name), live)
            seen = self.known.get(name)
            if seen is not None and seen.signature == signature:
                continue  # nothing on disk changed: nothing to convert, nothing to send
            shown = _shown(self.store, name, self.namespace, live, self.chosen, self.clean)
            before = seen.shown if seen is not None else None
            self.known[name] = _Seen(signature, shown)
            if shown == before:
                continue  # rewritten, but nothing the client sees changed
            if before is None:
                events.append({"type": "ADDED", "object": shown})
            elif shown is None:
                events.append({"type": "DELETED", "object": before})
            else:
                events.append({"type": "MODIFIED", "object": shown})
        for name in set(self.known) - set(names):
            gone = self.known.pop(name).shown
            if gone is not None:
                events.append({"type": "DELETED", "object": gone})
        return events


def _listed(folder: str, suffix: str = "") -> list[str]:
    """The names in ``folder`` as ``WorkflowStore.names`` takes them (``suffix`` removed)."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return []
    return [entry.removesuffix(suffix) for entry in entries
            if entry.endswith(suffix) and not entry.startswith(".")]


def _shown(store: WorkflowStore, name: str, namespace: str, live: bool,
           chosen: Callable[[dict], bool], clean: Callable[[dict], dict]) -> dict | None:
    record = store.record(name)
    if record is None or record.get("namespace") != namespace:
        return None
    workflow = to_workflow(record, store.status(name), live)
    return clean(workflow) if chosen(workflow) else None


# -------------------------------------------------------------------------------- logs


class _LogClock:
    """When each byte of one log file was written, as well as the server can tell: the file
    holds no times. ``marks`` are (offset, time in ns): the bytes before ``offset`` were there
    at that time; the first is (0, the pod's start). Each look that finds the file longer adds
    a mark at its size, timed by its mtime (its last write); a line's time is its end's,
    interpolated between the marks around it. A mark's time is at least one ns per byte after
    the one before, so that lines' times strictly increase. Kept for the server's life, so that
    every request gives a line the same time."""

    def __init__(self, inode: int, started_ns: int) -> None:
        self.inode = inode
        self.offsets = array("q", [0])
        self.stamps = array("q", [started_ns])

    @property
    def size(self) -> int:
        return self.offsets[-1]

    def advance(self, size: int, mtime_ns: int) -> None:
        if size > self.offsets[-1]:
            earliest = self.stamps[-1] + (size - self.offsets[-1])
            self.offsets.append(size)
            self.stamps.append(max(mtime_ns, earliest))

    def stamp(self, end: int) -> int:
        """The time of the line that ends at byte ``end`` (at most ``size``)."""
        index = max(1, bisect.bisect_left(self.offsets, end))
        low, high = self.offsets[index - 1], self.offsets[index]
        before, after = self.stamps[index - 1], self.stamps[index]
        return before + (after - before) * (end - low) // (high - low)


_CLOCKS: dict[str, _LogClock] = {}
_CLOCKS_LOCK = threading.Lock()


def _clock(path: Path, started_ns: int | None) -> tuple[_LogClock, int] | None:
    """The file's clock, advanced to what is in it now, and its size then (the bytes a reader
    may take: any written after have no time yet); None while there is no file."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    with _CLOCKS_LOCK:
        clock = _CLOCKS.get(str(path))
        if clock is None or clock.inode != found.st_ino or found.st_size < clock.size:
            # (a new file under the same name: a run deleted and made again)
            start = started_ns if started_ns is not None else found.st_mtime_ns
            clock = _CLOCKS[str(path)] = _LogClock(found.st_ino, min(start, found.st_mtime_ns))
        clock.advance(found.st_size, found.st_mtime_ns)
        return clock, clock.size


def rfc3339_nano(stamp_ns: int) -> str:
    """Go's ``time.RFC3339Nano`` in UTC, as the kubelet prefixes a line: trailing zeros of
    the fraction dropped, and the dot with them."""
    seconds, nanos = divmod(stamp_ns, 1_000_000_000)
    text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f".{nanos:09d}".rstrip("0") if nanos else ""
    return f"{text}{fraction}Z"


def _nanoseconds(moment: str | None) -> int | None:
    if not moment:
        return None
    try:
        when = datetime.fromisoformat(moment.replace("Z", "+00:00"))
    except ValueError:
        return None
    return int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1000


@dataclass
class _LogOptions:
    """``logOptions`` (Kubernetes' ``PodLogOptions``), ``grep`` and ``selector``, checked."""

    container: str
    follow: bool
    timestamps: bool
    since_ns: int | None
    tail_lines: int | None
    limit_bytes: int | None
    grep: re.Pattern[str] | None
    previous: bool

    @classmethod
    def of(cls, request: Request) -> _LogOptions:
        container = request.one("logOptions.container") or "main"
        if len(container) > 63 or not _CONTAINER.fullmatch(container):
            raise invalid(f"logOptions.container: {container[:70]!r} is not a container name")
        since_seconds = _integer(request, "logOptions.sinceSeconds", minimum=1)
        since_time = _integer(request, "logOptions.sinceTime.seconds", minimum=-_INT64)
        nanos = _integer(request, "logOptions.sinceTime.nanos", minimum=0) or 0
        if nanos > 999_999_999:
            raise invalid(f"logOptions.sinceTime.nanos: {nanos} is more than a second")
        if since_seconds is not None and since_time is not None:
            raise invalid("logOptions.sinceSeconds: at most one of sinceTime or sinceSeconds "
                          "may be specified")
        since_ns = None
        if since_seconds is not None:
            since_ns = time.time_ns() - since_seconds * 1_000_000_000
        elif since_time is not None:
            since_ns = since_time * 1_000_000_000 + nanos
        stream = request.one("logOptions.stream")
        if stream not in ("", "All"):
            raise invalid(f"logOptions.stream: {stream[:40]!r}: the local runner keeps a "
                          f"container's stdout and stderr in one log, so only All is served")
        pattern = request.one("grep")
        if len(pattern) > MAX_GREP:
            raise invalid(f"grep: a pattern of {len(pattern)} characters; at most {MAX_GREP}")
        try:
            grep = re.compile(pattern) if pattern else None
        except re.error as error:
            raise invalid(f"grep: failed to compile {pattern!r}: {error}") from None
        return cls(container=container, follow=request.flag("logOptions.follow"),
                   timestamps=request.flag("logOptions.timestamps"), since_ns=since_ns,
                   tail_lines=_integer(request, "logOptions.tailLines", minimum=0),
                   limit_bytes=_integer(request, "logOptions.limitBytes", minimum=1),
                   grep=grep, previous=request.flag("logOptions.previous"))


@dataclass
class _PodLog:
    """One pod's log file, read on from where the last read stopped."""

    order: int  # the pod's place among the workflow's pods: ties of times go by it
    pod: str  # Argo's name for the pod
    path: Path
    started_ns: int | None
    options: _LogOptions
    done: bool = False  # the pod has ended: a last line without a newline is whole
    offset: int = -1  # where the next read starts; -1: not read yet (tailLines decides)
    partial: bytes = b""
    budget: int | None = None  # limitBytes left
    spent: bool = False  # limitBytes reached: nothing more of this pod

    def __post_init__(self) -> None:
        self.budget = self.options.limit_bytes

    def entries(self, final: bool = False) -> Iterator[tuple[int, int, str]]:
        """(time, order, content) of the lines written since the last read; a last line
        without its newline only once the pod has ended (``done``) or ``final``."""
        if self.spent:
            return
        clocked = _clock(self.path, self.started_ns)
        if clocked is None:
            return
        clock, size = clocked
        if self.offset < 0:
            tail = self.options.tail_lines
            self.offset = size if tail == 0 else _tail_start(self.path, size, tail)
        while self.offset < size:
            try:
                with open(self.path, "rb") as log:  # reopened per chunk: no pod holds a file
                    log.seek(self.offset)
                    data = log.read(min(_CHUNK, size - self.offset))
            except OSError:
                return  # removed with its run
            if not data:
                break
            self.offset += len(data)
            *lines, self.partial = (self.partial + data).split(b"\n")
            end = self.offset - len(self.partial) - sum(len(line) + 1 for line in lines)
            for line in lines:
                end += len(line) + 1
                yield from self._entry(clock.stamp(end), line)
            while len(self.partial) >= MAX_LINE:
                piece, self.partial = self.partial[:MAX_LINE], self.partial[MAX_LINE:]
                yield from self._entry(clock.stamp(self.offset - len(self.partial)), piece)
            if self.spent:
                return
        if (self.done or final) and self.partial and self.offset >= size:
            piece, self.partial = self.partial, b""
            yield from self._entry(clock.stamp(self.offset), piece)

    def _entry(self, stamp: int, raw: bytes) -> Iterator[tuple[int, int, str]]:
        options = self.options
        if self.spent or (options.since_ns is not None and stamp < options.since_ns):
            return
        text = raw.removesuffix(b"\r").decode("utf-8", "replace")  # as bufio.ScanLines
        stamped = f"{rfc3339_nano(stamp)} {text}"
        if self.budget is not None:
            # limitBytes counts what the kubelet sends Argo, which always asks for times
            size = len(stamped.encode()) + 1
            if size > self.budget:
                self.spent = True
                kept = self.budget - len(rfc3339_nano(stamp)) - 1  # what fits after the time
                if kept <= 0:
                    return
                text = raw[:kept].decode("utf-8", "replace")
                stamped = f"{rfc3339_nano(stamp)} {text}"
            else:
                self.budget -= size
        content = stamped if options.timestamps else text
        if options.grep is None or options.grep.search(content):
            yield stamp, self.order, content


def _tail_start(path: Path, size: int, lines: int | None) -> int:
    """Where the last ``lines`` lines of the file's first ``size`` bytes start (0 for all)."""
    if lines is None:
        return 0
    found = 0
    position = size - 1  # a newline that ends the file starts no line after it
    try:
        with open(path, "rb") as log:
            while position > 0:
                start = max(0, position - _CHUNK)
                log.seek(start)
                chunk = log.read(position - start)
                index = len(chunk)
                while (index := chunk.rfind(b"\n", 0, index)) >= 0:
                    found += 1
                    if found == lines:
                        return start + index + 1
                position = start
    except OSError:
        return size
    return 0


def workflow_logs(request: Request) -> Stream:
    _record, status = find(request)
    options = _LogOptions.of(request)
    wanted = request.params.get("podName") or request.one("podName")
    selector = parse_selector(request.one("selector"), parameter="selector")
    labels = {_WORKFLOW_LABEL: request.name}
    if (wanted and not NAME.fullmatch(wanted)) or options.previous or not selector(labels):
        # no pod has that name (and a name is never a path); no container ran before
        # (logOptions.previous: Kubernetes says so, and Argo sends nothing for that pod)
        return Stream(iter(()))
    pods = _Pods(request.server.store, request.name, options, wanted)
    pods.update(status)
    if not options.follow:
        return Stream(_merged(pods))
    return Stream(_follow(request, pods))


class _Pods:
    """The workflow's pods whose logs are streamed: its Pod nodes that left Pending, in the
    order they started (as Argo starts their streams), each with its container's log."""

    def __init__(self, store: WorkflowStore, name: str, options: _LogOptions,
                 wanted: str) -> None:
        self.store = store
        self.name = name
        self.options = options
        self.wanted = wanted
        self.logs: dict[str, _PodLog] = {}
        self.runs = store.runs.resolve()

    def update(self, status: dict | None) -> None:
        nodes = [node for node in (status or {}).get("nodes") or []
                 if isinstance(node, dict) and node.get("type") == "Pod"
                 and node.get("phase") not in (None, "Pending") and node.get("log")]
        nodes.sort(key=lambda node: node.get("started_at") or "")
        for node in nodes:
            known = self.logs.get(node["id"])
            if known is None:
                known = self._pod(node)
                if known is None:
                    continue
                self.logs[node["id"]] = known
            known.done = node.get("phase") in _POD_DONE

    def _pod(self, node: dict) -> _PodLog | None:
        template = str(node.get("template") or "").rsplit(".", 1)[-1]
        pod = pod_name(self.name, str(node["name"]), template)
        if self.wanted and pod != self.wanted:
            return None
        # The container's log beside the main one (init containers, sidecars, a
        # containerSet's members); only inside the home's runs (a retried run's restored
        # nodes keep the earlier run's logs), never anywhere status.json could point.
        path = Path(str(node["log"])).with_name(f"{self.options.container}.log")
        with contextlib.suppress(OSError, ValueError):
            if path.resolve().is_relative_to(self.runs):
                return _PodLog(len(self.logs), pod, path, _nanoseconds(node.get("started_at")),
                               self.options)
        return None


def _merged(pods: _Pods) -> Iterator[dict | None]:
    """Every pod's lines so far, in time order across the pods (as Argo sorts them)."""
    names = {log.order: log.pod for log in pods.logs.values()}
    for _stamp, order, content in heapq.merge(*(log.entries(final=False)
                                                for log in pods.logs.values())):
        yield {"content": content, "podName": names[order]}


def _follow(request: Request, pods: _Pods) -> Iterator[dict | None]:
    """New lines as they are written, until the workflow has ended and all is sent (Argo's
    logger stops when the workflow is completed or deleted), the client goes, or the server
    stops."""
    store, launcher, name = request.server.store, request.server.launcher, request.name
    status_path = store.runs / name / STATUS_FILE
    seen_status: tuple[int, int, int] | bool | None = False  # never looked
    status = None
    while True:
        current = _stat(status_path)
        if current != seen_status:
            seen_status, status = current, store.status(name)
            pods.update(status)
        over = _over(store, name, status, launcher.is_live(name))
        names = {log.order: log.pod for log in pods.logs.values()}
        batch = sorted(entry for log in pods.logs.values() for entry in log.entries(over))
        for _stamp, order, content in batch:
            yield {"content": content, "podName": names[order]}
        if over:
            return  # read after the end was seen: nothing was written after this read
        yield None
        if _ended(request):
            return
        time.sleep(LOG_POLL_S)


def _over(store: WorkflowStore, name: str, status: dict | None, live: bool) -> bool:
    """The workflow has ended (its logs will not grow): concluded, its runner gone, deleted,
    or accepted by a server that stopped before it started."""
    if status is not None:
        return status.get("phase") in DONE_PHASES or runner_gone(status) is not None
    if live:
        return False
    if not (store.runs / name).is_dir():
        return True
    return (store.records / f"{name}.json").exists()


STREAM_ROUTES: list[Route] = [
    route("GET", "/api/v1/workflow-events/{namespace}", watch_workflows),
    route("GET", "/api/v1/workflows/{namespace}/{name}/log", workflow_logs),
    route("GET", "/api/v1/workflows/{namespace}/{name}/{podName}/log", workflow_logs),
]
