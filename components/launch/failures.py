"""Why a training job failed, in one line; and the noise of a failure kept out of the step's log.

When a worker raises, torchrun and the workers around it print about a hundred lines: the
worker's traceback (``[rank1]: ...``), each peer's traceback about the connection it lost, each
agent's ``ChildFailedError`` with its report, and, when the launcher cancels a job, each agent's
``SignalException``. The cause was one line among them. Here:

* :func:`error_file_env` points torchrun's error files at the run folder
  (:mod:`sublimate.components.base.elastic_errors`), where every failing process writes why;
* :func:`explain` reads them after a failed job and names the first rank that failed, its
  exception and its log, in one line (the step's message, and so the run's last line);
* :func:`quiet` drops that noise from the followed logs; every line stays in the node's own log
  file (``logs/torchx/...``) and the error files.

Light imports only, as the launcher.
"""

from __future__ import annotations

import json
import re
import signal
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sublimate.components.base import run_files
from sublimate.components.base.disk_full import FULL_ERRNOS, full_disk_note
from sublimate.components.base.elastic_errors import LOG_DIR_ENV, Failure, log_dir, read_failures
from sublimate.components.base.runtime import shown_path

# A failure's message in the step's one line, at most (gloo's run to a paragraph).
MESSAGE_CHARS = 240
# TorchX's macro for a replica's index, replaced in every role's env (torchx.specs.macros).
REPLICA_ID_MACRO = "${replica_id}"


def error_file_env(run_dir: Path) -> dict[str, str]:
    """The workers' environment that puts torchrun's log folder (and so every worker's error
    file) under the run folder, one folder per node."""
    return {LOG_DIR_ENV: str(log_dir(run_dir, REPLICA_ID_MACRO))}


def app_id_of(handle: str) -> str:
    """The TorchX job's id in a handle (``local_cwd://torchx/<app id>``)."""
    return handle.rstrip("/").rsplit("/", 1)[-1]


def node_log(run_dir: Path, app_id: str, replica: int | None, scheduler: str,
             role: str = "worker") -> Path | None:
    """A node's own log (stderr) on the local schedulers; None on a cluster, where it is the
    pod's."""
    if scheduler not in ("local_cwd", "local_netns") or replica is None:
        return None
    return Path(run_dir) / run_files.LOGS / "torchx" / app_id / role / str(replica) / \
        "stderr.log"


def describe(failure: Failure, run_dir: Path, scheduler: str) -> str:
    """``rank 1 (node1) failed: ValueError: bad shape; its log: <path>``."""
    log = node_log(run_dir, failure.app_id, failure.node, scheduler)
    where = f"its log: {shown_path(log)}" if log is not None and log.is_file() \
        else f"its traceback: {shown_path(failure.error_file)}"
    verb = "" if failure.message.startswith("exited") else "failed: "
    # (a full disk's line is kept whole: two paths, the disk's and the file's, that a cut hides)
    message = failure.message if len(failure.message) <= MESSAGE_CHARS \
        or failure.message.startswith(tuple(FULL_ERRNOS.values())) \
        else failure.message[:MESSAGE_CHARS - 3] + "..."  # the whole one is in its error file
    return f"{failure.who} {verb}{message}; {where}"


@dataclass(frozen=True)
class Killed:
    """A worker process torchrun saw end by a signal (it writes no error file): ``SIGKILL``
    from outside, the kernel's out-of-memory killer, a crash (``SIGSEGV``)."""

    node: int
    local_rank: int
    signal: int

    def describe(self, log: Path | None) -> str:
        try:
            name = signal.Signals(self.signal).name
        except ValueError:
            name = f"signal {self.signal}"
        where = f"; its log: {shown_path(log)}" if log is not None and log.is_file() else ""
        return (f"local rank {self.local_rank} of node{self.node} was killed by {name} "
                f"(from outside, or out of memory){where}")


# What the followed logs told of processes ended by a signal, by TorchX job (quiet() notes it
# from torchrun's own line, explain() reads it): the launcher follows one job at a time.
_KILLED: dict[str, list[Killed]] = {}
_KILLED_LOCK = threading.Lock()


def explain(run_dir: Path, handle: str, scheduler: str, state: str,
            failed: Iterable[tuple[str, int]] = ()) -> str:
    """Why the job ``handle`` failed, in one line: a worker that a signal ended (it could write
    no error of its own; the errors of its peers only followed), else the first rank that
    failed, with its exception and log; else the replicas (``(role, index)``) that failed."""
    app_id = app_id_of(handle)
    failures = read_failures(run_dir, app_id)
    with _KILLED_LOCK:
        killed = list(_KILLED.get(app_id, []))
    if killed:
        first = killed[0]
        cause = first.describe(node_log(run_dir, app_id, first.node, scheduler))
        return cause + (f"; then {describe(failures[0], run_dir, scheduler)}"
                        if failures else "")
    if failures:
        first_failure = failures[0]
        others = len({failure.rank for failure in failures[1:]} - {first_failure.rank})
        after = f" ({others} other rank{'s' if others > 1 else ''} failed after it)" \
            if others else ""
        return describe(first_failure, run_dir, scheduler) + after
    replicas = list(failed)
    # No process said why: one whose run folder's disk is full could not (its error file)
    full = full_disk_note(run_dir)
    said = f"; {full}" if full else ""
    if not replicas:
        return f"training job {handle} ended {state}{said}"
    names = ", ".join(f"node{index}" if role == "worker" else f"{role} {index}"
                      for role, index in replicas)
    log = node_log(run_dir, app_id, replicas[0][1], scheduler, replicas[0][0])
    where = f"; its log: {shown_path(log)}" if log is not None and log.is_file() else ""
    return f"training job {handle} ended {state}: {names} failed{where}{said}"


def silent(run_dir: Path, handle: str, nodes: Iterable[int]) -> list[int]:
    """Which of the failed ``nodes`` of job ``handle`` told nothing: lost whole (killed from
    outside, its machine gone) rather than failed in their code, which every training process
    reports (``elastic_errors``), or had a worker killed, which its torchrun reports."""
    app_id = app_id_of(handle)
    with _KILLED_LOCK:
        reported = {killed.node for killed in _KILLED.get(app_id, [])}
    reported |= {failure.node for failure in read_failures(run_dir, app_id)
                 if failure.node is not None}
    return [node for node in nodes if node not in reported]


def restarts(run_dir: Path, handle: str, scheduler: str) -> list[str]:
    """What made torchrun restart the workers of a job that went on to succeed, one line per
    restart (its first failure; a worker a signal ended, which wrote none, first)."""
    app_id = app_id_of(handle)
    with _KILLED_LOCK:
        killed = list(_KILLED.get(app_id, []))
    if killed:
        return [f"{ended.describe(node_log(run_dir, app_id, ended.node, scheduler))}; "
                "torchrun restarted the workers" for ended in killed]
    first: dict[int, Failure] = {}
    for failure in read_failures(run_dir, app_id):
        first.setdefault(failure.restart, failure)
    return [f"{describe(failure, run_dir, scheduler)}; torchrun restarted the workers"
            for _, failure in sorted(first.items())]


def relaunch_note(run_dir: Path) -> str:
    """Where a relaunch starts: the last committed checkpoint, or step 0 when none was."""
    committed = Path(run_dir) / run_files.CHECKPOINTS / run_files.LATEST
    if committed.is_file() or (Path(run_dir) / run_files.SERVER_CHECKPOINT).is_file():
        return "from the last checkpoint"
    return "from step 0: no checkpoint was committed"


def relaunches_section(run_dir: Path, relaunches: list[dict[str, float]]) -> list[dict[str, Any]]:
    """What each relaunch of a ``recovery=restart`` job cost, for ``train-summary.json``'s
    ``relaunches``: when the attempt before it ended (the loss seen and the job cancelled) and
    when it started (epoch seconds); for the last one, which wrote the summary, when it trained
    again (its start plus the workers' launch-to-first-step: a relaunch's start-up is timed
    from its start) and the step it resumed from."""
    try:
        summary = json.loads((run_dir / run_files.SUMMARY).read_text())
    except (OSError, ValueError):
        summary = {}
    section = [{key: round(value, 3) for key, value in relaunch.items()}
               for relaunch in relaunches]
    first_step = summary.get("launch_to_first_step_seconds")
    if section and first_step is not None:
        last = section[-1]
        last["trained_again_at"] = round(last["relaunched_at"] + first_step, 3)
        last["resumed_from_step"] = summary.get("resumed_from_step")
    return section


# --- the followed logs ------------------------------------------------------------------------

# A worker's uncaught exception, as torch.distributed's excepthook (and the entry point) print
# it: every line prefixed with the rank.
_RANK_LINE = re.compile(r"\[rank\d+\]: ")
# torchrun's own messages about the failure it reports (glog format, from torch's elastic).
_AGENT_NOISE = re.compile(
    r"^[EW]\d{4} [\d:. ]+\d+ \S*torch/distributed/elastic/.*("
    r"failed \(exitcode|no error file defined for parent|closing signal|death signal|"
    r"RendezvousConnectionError)")
# A line of torch's elastic logging (glog format): an exception it logs comes one line at a time,
# each with this prefix (``E1204 ... api.py:836] Traceback (most recent call last):`` ...); the
# source's path is torch's own, or the whole file path where torch is not under the working folder.
_ELASTIC_LOG = re.compile(r"^[EW]\d{4} [\d:. ]+\d+ (\S*torch/distributed/elastic/\S+:\d+)\] (.*)$")
# torchrun's line about a worker that a signal ended: ``failed (exitcode: -9) local_rank: 0``.
_SIGNALLED = re.compile(r"failed \(exitcode: (-\d+)\) local_rank: (\d+)")
# c10d's C++ warnings about the store connection the failed node took with it, and the C++
# stack that follows each ("Exception raised from ...", "frame #N: ...").
_STORE_LOST = re.compile(r"^\[[EW]\d{4} [\d:. ]+\S+\] \[c10d\] \w+ failed on SocketImpl")
_CPP_STACK = re.compile(r"^(Exception raised from .* \(most recent call first\):|frame #\d+: |"
                        r"<omitting python frames>)")
# c10d's reverse lookup of a peer's address, which has no name in a local_netns namespace:
# harmless (the address is used, not the name), and printed by every node on every run.
_HOSTNAME_WARNING = re.compile(r"\[c10d\] The hostname of the client socket cannot be retrieved")
# What a local_netns node's holder (util-linux's `unshare --fork --kill-child`) says when its
# node is killed (SIGKILL to the node's init, as a fault or chaos kills it): it would die of its
# child's signal and cannot install SIG_DFL for SIGKILL, so it prints this and exits 1. The kill
# is reported by the launcher; this line would read like a failure of its own.
_HOLDER_OF_A_KILLED_NODE = re.compile(r"^unshare: sigprocmask unblock failed: Invalid argument$")
# How the exceptions of torchrun itself end: the failure it reports, the cancel it received.
_AGENT_EXCEPTIONS = re.compile(
    r"^torch\.distributed\.elastic\.(multiprocessing\.errors\.ChildFailedError|"
    r"multiprocessing\.api\.SignalException|rendezvous\.api\.RendezvousConnectionError)")
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
# The exception torchrun's agent raises in itself on SIGTERM (its launcher stopping it).
_AGENT_STOPPED = "torch.distributed.elastic.multiprocessing.api.SignalException: "
# CPython's last resort when a traceback's exception cannot be printed because the process is
# losing its stderr (a cancelled agent at exit): the exception described field by field.
_LOST_STDERR = re.compile(r"^(object (address|refcount|type|type name|repr) *: |lost sys\.stderr$)")
_LOST_STDERR_TYPE = re.compile(r"^object type name: (\w+)")
# Those exceptions of torchrun's, by their bare type name.
_AGENT_EXCEPTION_NAMES = {
    "SignalException": "torch.distributed.elastic.multiprocessing.api.SignalException",
    "ChildFailedError": "torch.distributed.elastic.multiprocessing.errors.ChildFailedError",
    "RendezvousConnectionError":
        "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError",
}


# Python's report of a logging call that raised (logging.Handler.handleError): this line, the
# traceback, "Call stack:" and the caller's frames, then the record's "Message:" and, last,
# "Arguments:". torchrun's agent logs its worker's death with a traceback, which torch's
# formatter renders after importing torch._dynamo (seconds); an agent stopped meanwhile (a lost
# node's, as it is replaced) raises SignalException inside that import, and the log showed it.
_LOGGING_ERROR = "--- Logging error ---"
_LOGGING_ERROR_END = "Arguments: "
_LOGGING_ERROR_LINES = 1000  # a report longer than this is not held back: it passes as it is


def _stopped_agents_logging_errors_dropped(lines: Iterable[str]) -> Iterator[str]:
    """``lines`` less each logging error whose exception is torchrun's agent being stopped;
    any other passes whole."""
    held: list[str] = []
    for line in lines:
        if not held:
            if line == _LOGGING_ERROR:
                held = [line]
            else:
                yield line
            continue
        held.append(line)
        if line.startswith(_LOGGING_ERROR_END) or len(held) > _LOGGING_ERROR_LINES:
            if not (line.startswith(_LOGGING_ERROR_END)
                    and any(_AGENT_EXCEPTIONS.match(kept) and "SignalException" in kept
                            for kept in held)):
                yield from held
            held = []
    yield from held


def quiet(lines: Iterable[str], app_id: str = "", node: int | None = None) -> Iterator[str]:
    """``lines`` of one node's log without the noise of a failure (see the module's doc): a
    worker's uncaught traceback, torchrun's tracebacks and reports about it, its messages
    about the processes it ends, and a log call of its that a stop interrupted. A traceback that
    is anything else (one a program prints and goes on) passes whole. A worker that torchrun
    saw killed by a signal, on node ``node`` of the job ``app_id``, is noted for
    :func:`explain`."""
    lines = _stopped_agents_logging_errors_dropped(lines)
    held: list[str] = []  # a plain traceback, until its last exception line decides
    exception = ""  # the last exception line of the held traceback ("" while inside it)
    report_rules = 0  # '=' lines left to drop of torchrun's report after ChildFailedError
    in_rank_block = in_cpp_stack = False
    logged_from = ""  # the source of a traceback torch's elastic logging is printing
    for line in lines:
        logged = _ELASTIC_LOG.match(line)
        if logged_from and logged and logged.group(1) == logged_from:
            continue
        logged_from = ""
        if logged and logged.group(2).startswith("Traceback (most recent call last):"):
            logged_from = logged.group(1)  # a worker's exit, logged by its agent
            continue
        if report_rules:
            report_rules -= _is_rule(line)
            continue
        if _RANK_LINE.match(line) or (in_rank_block and not line.strip()):
            in_rank_block = True
            continue
        in_rank_block = False
        if held:
            if not exception:  # inside the traceback: frames are indented; then its exception
                held.append(line)
                if line.strip() and not line[:1].isspace() \
                        and not line.startswith(("Traceback ", *_CHAINED)):
                    exception = line
                continue
            if not line.strip():
                held.append(line)
                continue
            if _LOST_STDERR.match(held[-1]) and _LOST_STDERR.match(line):
                held.append(line)  # the exception's fields: its type name decides
                named = _LOST_STDERR_TYPE.match(line)
                if named:
                    exception = _AGENT_EXCEPTION_NAMES.get(named.group(1), exception)
                continue
            if line.startswith(_CHAINED):  # another exception of the same chain follows
                held.append(line)
                exception = ""
                continue
            yield from _settle(held, exception)
            if _AGENT_EXCEPTIONS.match(exception) and "ChildFailedError" in exception:
                report_rules = 2  # its report follows, between two '=' rules
            held, exception = [], ""
            if report_rules:
                report_rules -= _is_rule(line)
                continue
        if line.startswith("Traceback (most recent call last):"):
            held = [line]
            continue
        if _STORE_LOST.match(line) or _CPP_STACK.match(line):
            in_cpp_stack = True
            continue
        if in_cpp_stack and not line.strip():  # the blank line that ends a C++ stack
            in_cpp_stack = False
            continue
        in_cpp_stack = False
        if _AGENT_NOISE.match(line) or _HOSTNAME_WARNING.search(line) \
                or _HOLDER_OF_A_KILLED_NODE.match(line):
            ended = _SIGNALLED.search(line)
            if ended and node is not None:
                with _KILLED_LOCK:
                    _KILLED.setdefault(app_id, []).append(
                        Killed(node, int(ended.group(2)), -int(ended.group(1))))
            continue
        yield line
    if held:
        yield from _settle(held, exception)


def _is_rule(line: str) -> bool:
    """A line of '=' only: the rules around torchrun's failure report."""
    return set(line.strip()) == {"="}


def _settle(held: list[str], exception: str) -> list[str]:
    """A finished plain traceback: dropped when torchrun's own, or when torchrun's agent was
    being stopped anywhere in its chain (a stop that lands in the agent's own bookkeeping
    ends in whatever that raises, e.g. multiprocessing's "semaphore or lock released too many
    times"); kept otherwise."""
    if exception and _AGENT_EXCEPTIONS.match(exception):
        return []
    if any(line.startswith(_AGENT_STOPPED) for line in held):
        return []
    return held
