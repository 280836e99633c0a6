"""How a run's pods see the manifest's paths: the ``--mounts`` modes, and which one this
machine gives a run.

``overlay`` (``views``): each pod has a private view of the whole tree, its folders at the
manifest's paths; ``namespace`` (``mounts``): its folders at those paths in a mount namespace
that shares this machine's files; ``rewrite`` (``paths``): the paths are rewritten where they are
spelt out. ``auto`` is the first of these the machine allows, each probed by a forked child.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from ..errors import ManifestError
from .mounts import unavailable
from .views import probe

MODES = ("auto", "overlay", "namespace", "rewrite")


class NamespaceError(ManifestError):
    """A ``--mounts`` mode was asked for where this machine cannot give it."""


class Mode(NamedTuple):
    """How a run's pods find the manifest's paths, and what to tell the user about it once."""

    name: str  # "overlay", "namespace" or "rewrite"
    note: str = ""


# In the home: that pods can have private views on this machine, so a run need not probe.
VIEWS_PROBE_FILE = ".private-views"


def resolve(mode: str, local_executor: bool, folder: Path, home: Path | None = None) -> Mode:
    """The mode a run uses. ``auto`` is ``overlay`` (a private view of the whole tree per pod:
    ``views``) where the machine allows it with the run's layers in ``folder``, else
    ``namespace`` (this module: real paths, the host's files shared), else ``rewrite``, saying
    why in ``note``; pods that are not local processes (a test's fake executor) use
    ``rewrite``. A mode asked for where it cannot be done is a ``NamespaceError`` saying why."""
    if mode not in MODES:
        raise NamespaceError(f"--mounts must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "rewrite" or (mode == "auto" and not local_executor):
        return Mode("rewrite")
    no_view = ""
    if mode in ("auto", "overlay"):
        no_view = probe(folder, home / VIEWS_PROBE_FILE if home is not None else None)
        if not no_view:
            return Mode("overlay")
        if mode == "overlay":
            raise NamespaceError(f"--mounts overlay: pods cannot have private views here "
                                 f"({no_view}); use --mounts namespace or rewrite")
    reason = unavailable()
    if not reason:
        return Mode("namespace", f"pods share this machine's files (no private view per pod "
                                 f"here: {no_view}); outputs are read where they were written"
                    if no_view else "")
    if mode == "namespace":
        raise NamespaceError(f"--mounts namespace: mount namespaces are not available here "
                             f"({reason}); use --mounts rewrite")
    return Mode("rewrite", f"pods share this machine's files and see the manifest's paths "
                           f"only where written (no private view: {no_view}; no mount "
                           f"namespace: {reason})")


def resolve_soon(mode: str, local_executor: bool, folder: Path, home: Path
                 ) -> Callable[[], Mode]:
    """``resolve`` while the run starts: ``auto`` probes in a thread (each probe forks a child
    that builds a namespace, a few ms, more on a busy machine) and the first pod waits for it;
    a mode asked for is resolved now, so that one this machine cannot give stops the run
    before it starts."""
    if mode != "auto" or not local_executor:
        known = resolve(mode, local_executor, folder, home)
        return lambda: known
    found: list[Mode] = []

    def probe() -> None:
        try:
            found.append(resolve(mode, True, folder, home))
        except Exception as exc:  # a probe that breaks must not break the run: say it
            found.append(Mode("rewrite", f"pods see the manifest's paths only where written "
                                         f"(the mounts probe failed: {exc!r})"))

    thread = threading.Thread(target=probe, name="mounts-probe", daemon=True)
    thread.start()

    def result() -> Mode:
        thread.join()
        return found[0]

    return result


