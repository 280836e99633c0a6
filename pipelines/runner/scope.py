"""Cancellation scopes: a deadline or Ctrl-C stops every process under a subtree."""

from __future__ import annotations

import threading
from typing import Protocol


class Stoppable(Protocol):
    """What an executor hands the scope for a running pod (a local process group, a fake)."""

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
        victims: list[Stoppable] = []
        with self.lock:
            if self.reason is None:
                self.reason = reason
            pending = [self]
            while pending:
                scope = pending.pop()
                victims.extend(scope.processes)
                pending.extend(scope.children)
        for process in victims:
            process.stop()

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
