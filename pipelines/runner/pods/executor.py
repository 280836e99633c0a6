"""Executors: what runs a planned pod (``plan.PodRequest``) and reports how it ended.

The engine decides what runs, when, and what a pod's end means for its node; an executor only
runs one request. This module is the interface between them: :class:`Executor`, the
:class:`PodHooks` the engine hands it, the :class:`PodOutcome` it returns, and
:func:`await_pod`, which every executor uses to wait for a pod's only process.
``local_executor.LocalExecutor`` (the default) starts a pod as a local process group, the way
Argo's executor runs a container: the image is not used, the local Python environment stands in
for it. ``images.executor.ImageExecutor`` runs each pod in its template's image instead
(``sublimate run --containers``). Tests pass a fake executor that returns scripted outcomes, so
DAG and steps semantics are checked without starting processes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

from .local_process import LocalProcess
from .scope import Stoppable

if TYPE_CHECKING:
    from .plan import PodRequest


class ContainerEnd(NamedTuple):
    """How one container ended. ``exit_code`` is as Kubernetes reports it (a signal N is
    128 + N); None when it never started (``error`` says why, or the pod stopped first)."""

    name: str
    role: str  # "init", "set" or "sidecar"
    exit_code: int | None
    message: str = ""  # its termination message, when it failed
    error: str = ""  # could not start


@dataclass
class PodOutcome:
    """How a pod ended. ``exit_code`` is None when it never started (``error`` says why)."""

    exit_code: int | None = 0
    stdout: str = ""
    message: str = ""  # the container's termination message (read when it failed)
    error: str = ""  # could not start: "failed to start 'x': No such file or directory"
    stopped: bool = False  # stopped by a deadline or Ctrl-C before it ended on its own
    reason: str = ""  # Kubernetes' reason for a failed container ("OOMKilled"); "" for Error
    # A pod of several containers (init containers, sidecars, a containerSet): each one's end.
    containers: list[ContainerEnd] = field(default_factory=list)


class PodHooks(Protocol):
    """What the engine hands an executor for one pod."""

    def on_line(self, line: str) -> None:
        """A line of the pod's output (stdout or stderr), for live progress."""

    def on_start(self, handle: Stoppable) -> None:
        """The pod is running: the node turns Running, and a deadline or Ctrl-C stopping its
        scope calls ``handle.stop()`` from now on."""

    def on_exit(self, handle: Stoppable) -> None:
        """The pod has ended: its handle is no longer stopped with its scope."""


class Executor(Protocol):
    def run(self, request: PodRequest, hooks: PodHooks) -> PodOutcome:
        """Run a staged request (its folders, script and input artifacts are in place) to
        its end; may be called from several threads at once."""
        ...


def await_pod(process: LocalProcess, request: PodRequest, hooks: PodHooks,
              cleanup: Callable[[], None] | None = None) -> PodOutcome:
    """A pod's only process, started: hand it to the scope, wait for its end, run ``cleanup``
    whatever happens, and read its termination message when it failed on its own. The same
    for every executor (a local process, a container through its engine)."""
    hooks.on_start(process)
    try:
        code, stdout = process.wait()
        code = 128 - code if code < 0 else code  # a signal N: 128 + N, as Kubernetes reports
    finally:
        hooks.on_exit(process)
        if cleanup is not None:
            cleanup()
    message = ""
    if code != 0 and not process.stopped:
        message = termination_message(request.termination_log, request.masked)
    return PodOutcome(exit_code=code, stdout=stdout, message=message,
                      stopped=process.stopped)


def termination_message(path: Path, masked: Iterable[str]) -> str:
    """A failed container's termination message in one line, its secrets' values masked. The
    file (kept in the run folder, as the pod wrote it) is rewritten masked too: what stays on
    disk holds no secret that every output of the run masks."""
    with contextlib.suppress(OSError):
        written = text = path.read_text(errors="replace")
        if masked:
            from .k8s_objects import redact  # a run with secrets has loaded it already

            text = redact(written, masked)
        if text != written:
            path.write_text(text)
        return " ".join(text.split())
    return ""

