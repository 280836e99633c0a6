"""Cancellation scopes: a deadline or Ctrl-C stops every process under a subtree.

``stop`` is ``argo stop``'s end of a pod (SIGTERM, SIGKILL after a grace period); ``terminate``
is ``argo terminate``'s (SIGKILL at once), for a second Ctrl-C.
"""

from __future__ import annotations

import threading
from typing import Protocol


class Stoppable(Protocol):
    """What an executor hands the scope for a running pod (a local process group, a fake).

    A handle may also have ``kill()`` (end it now, no grace period); one without it is stopped
    with ``stop()`` when a scope is terminated.
    """

    def stop(self) -> None: ...


class CancelScope:
    """A node subtree that can be stopped; stopping reaches all nested scopes' processes."""

    def __init__(self, lock: threading.RLock, parent: CancelScope | None = None) -> None:
        self.lock = lock
        self.parent = parent
        self.reason: str | None = None
        self.children: set[CancelScope] = set()
        self.processes: set[Stoppable] = set()
        self._timer: threading.Timer | None = None
        self._stopped = threading.Event()  # wakes a sleep() in this scope

    def child(self) -> CancelScope:
        scope = CancelScope(self.lock, self)
        with self.lock:
            self.children.add(scope)
        return scope

    def stop_reason(self) -> str | None:
        scope: CancelScope | None = self
        while scope is not None:
            if scope.reason is not None:
                return scope.reason
            scope = scope.parent
        return None

    def stop(self, reason: str) -> None:
        for process in self._claim(reason):
            process.stop()

    def terminate(self, reason: str) -> None:
        """Stop the subtree with no grace period: every process is killed now."""
        for process in self._claim(reason, force=True):
            kill = getattr(process, "kill", None)
            if callable(kill):
                kill()
            else:
                process.stop()

    def _claim(self, reason: str, force: bool = False) -> list[Stoppable]:
        """Set the reason (the first one stays, unless ``force``) and list every process under
        the subtree."""
        victims: list[Stoppable] = []
        with self.lock:
            if self.reason is None or force:
                self.reason = reason
            pending = [self]
            while pending:
                scope = pending.pop()
                scope._stopped.set()
                victims.extend(scope.processes)
                pending.extend(scope.children)
        return victims

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a retry's backoff), or less if the scope is stopped meanwhile."""
        if self.stop_reason() is None:
            self._stopped.wait(seconds)

    def deadline(self, seconds: float, reason: str) -> None:
        self._timer = threading.Timer(seconds, self.stop, args=(reason,))
        self._timer.daemon = True
        self._timer.start()

    def add(self, process: Stoppable) -> bool:
        """Register a started process; returns False (and stops it) if already stopped."""
        with self.lock:
            self.processes.add(process)
            stopped = self.stop_reason() is not None
        if stopped:
            process.stop()
        return not stopped

    def discard(self, process: Stoppable) -> None:
        with self.lock:
            self.processes.discard(process)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.parent is not None:
            with self.lock:
                self.parent.children.discard(self)
