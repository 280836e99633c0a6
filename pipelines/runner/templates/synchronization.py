"""``synchronization``: mutexes and semaphores, emulated in-process for one local run.

On a cluster Argo's controller holds these locks across workflows (workflow/sync/). Locally a
run is alone, so a lock is shared only by the nodes of this run that name it:

- a mutex (``mutexes[].name``) admits one holder at a time (sync/mutex.go: a semaphore of 1);
- a semaphore (``semaphores[].configMapKeyRef``) admits as many as its limit, which on a
  cluster is the ConfigMap's value; locally it is ``--semaphore NAME/KEY=N`` or, without one,
  a ConfigMap manifest of that name where the run finds its objects (``k8s_objects``: the
  manifest's folder, ``--templates`` and ``--objects`` folders). None: the run is refused
  before it starts, naming the semaphore.

A template's locks are taken together (sync_manager.go ``TryAcquire``: all or none) when its
node starts, held through its retries, and released when the node ends. While it waits the
node stays Pending with Argo's message (sync/semaphore.go ``checkAcquire``):
``Waiting for <namespace>/Mutex/<name> lock. Lock status: <free>/<limit>``. The workflow-level
``spec.synchronization`` is taken by the run when it starts: the run is the single workflow, so
it gets it at once; it keeps a semaphore's slot, so templates of the same semaphore share what
is left. Database locks (``database``) are refused: they need Argo's database.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import ManifestError
from ..pods.k8s_objects import CONFIG_MAP

if TYPE_CHECKING:
    from ..pods.k8s_objects import ObjectLibrary

_REFUSED_DATABASE = ("synchronization {where}.database: database locks need Argo's "
                     "synchronization database; use a mutex or a configMapKeyRef semaphore")


def _locks(sync: dict | None, namespace: str, where: str) -> list[tuple[str, str]]:
    """``(lock name, semaphore ref)`` for each lock of a ``synchronization``; the ref is "" for a
    mutex. Lock names are Argo's (sync/lock_name.go ``String``)."""
    found: list[tuple[str, str]] = []
    for i, mutex in enumerate((sync or {}).get("mutexes") or []):
        if mutex.get("database"):
            raise ManifestError(_REFUSED_DATABASE.format(where=f"{where}.mutexes[{i}]"))
        found.append((f"{mutex.get('namespace') or namespace}/Mutex/{mutex.get('name')}", ""))
    for i, sem in enumerate((sync or {}).get("semaphores") or []):
        if sem.get("database"):
            raise ManifestError(_REFUSED_DATABASE.format(where=f"{where}.semaphores[{i}]"))
        ref = sem.get("configMapKeyRef") or {}
        key = f"{ref.get('name')}/{ref.get('key')}"
        found.append((f"{sem.get('namespace') or namespace}/ConfigMap/{key}", key))
    return found


def uses_semaphores(workflow: dict) -> bool:
    spec = workflow.get("spec") or {}
    syncs = [spec.get("synchronization")] + [t.get("synchronization")
                                             for t in spec.get("templates") or []]
    return any((s or {}).get("semaphores") for s in syncs)


def configmap_limits(objects: ObjectLibrary) -> dict[str, int]:
    """``{"name/key": limit}`` from the ConfigMap manifests the run's objects hold (those of
    the manifest's folder, ``--templates`` and ``--objects`` folders: ``k8s_objects``); read
    only when a workflow uses semaphores."""
    limits: dict[str, int] = {}
    for configmap in objects.objects(CONFIG_MAP):
        for key, value in configmap.data.items():
            text = value.decode("utf-8", "replace").strip()
            if text.isdigit():
                limits.setdefault(f"{configmap.name}/{key}", int(text))
    return limits


def parse_semaphore_option(text: str) -> tuple[str, int]:
    """``--semaphore NAME/KEY=N``."""
    name, sep, value = text.rpartition("=")
    if not sep or "/" not in name or not value.strip().isdigit():
        raise ValueError(f"--semaphore {text!r}: expected CONFIGMAP/KEY=N")
    return name, int(value)


class Synchronizer:
    """The run's locks: how many holders each admits, and who waits."""

    def __init__(self, workflow: dict, limits: dict[str, int]) -> None:
        spec = workflow["spec"]
        self.namespace = (workflow.get("metadata") or {}).get("namespace") or "default"
        self.templates: dict[str, list[tuple[str, str]]] = {}
        self.limit: dict[str, int] = {}
        self.held: dict[str, int] = {}
        self.cond = threading.Condition()
        for template in spec.get("templates") or []:
            if template.get("synchronization"):
                where = f"templates[{template['name']}].synchronization"
                self.templates[template["name"]] = self._declare(
                    template["synchronization"], limits, where)
        run_locks = self._declare(spec.get("synchronization"), limits, "spec.synchronization")
        for lock in run_locks:
            if lock.split("/")[1] == "Mutex" and any(lock in locks for locks in
                                                     self.templates.values()):
                # The run holds it for its whole life: the template would wait forever.
                raise ManifestError(f"synchronization: mutex {lock!r} is held by the workflow "
                                    "(spec.synchronization) and a template waits for it: the "
                                    "template would never start")
            self.held[lock] = self.held.get(lock, 0) + 1

    def _declare(self, sync: dict | None, limits: dict[str, int], where: str) -> list[str]:
        names = []
        for lock, ref in _locks(sync, self.namespace, where):
            if not ref:
                self.limit[lock] = 1
            elif ref in limits:
                self.limit[lock] = limits[ref]
            else:
                raise ManifestError(
                    f"{where}: semaphore {ref!r} has no limit: give one with "
                    f"--semaphore {ref}=N, or a ConfigMap {ref.split('/')[0]!r} with key "
                    f"{ref.split('/', 1)[1]!r} in the manifest's folder")
            names.append(lock)
        return names

    def _blocking(self, locks: list[str]) -> str:
        """Argo's waiting message for the first lock without a free slot; "" when all have one."""
        for lock in locks:
            limit = self.limit[lock]
            if self.held.get(lock, 0) >= limit:
                free = limit - self.held.get(lock, 0)
                return f"Waiting for {lock} lock. Lock status: {max(free, 0)}/{limit}"
        return ""

    def acquire(self, template: str, on_wait: Callable[[str], None],
                stopped: Callable[[], str | None]) -> list[str] | None:
        """Take every lock of ``template`` at once, waiting while one is full; ``on_wait(message)``
        is called once if it must wait. None: the run stopped while it waited (nothing held)."""
        locks = self.templates.get(template) or []
        if not locks:
            return []
        with self.cond:
            told = False
            while message := self._blocking(locks):
                if stopped():
                    return None
                if not told:
                    on_wait(message)
                    told = True
                self.cond.wait(0.2)  # wakes to see a stop too
            for lock in locks:
                self.held[lock] = self.held.get(lock, 0) + 1
        return locks

    def release(self, locks: list[str]) -> None:
        if not locks:
            return
        with self.cond:
            for lock in locks:
                self.held[lock] -= 1
            self.cond.notify_all()
