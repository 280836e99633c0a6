"""Mapping of a node's absolute container paths onto local folders by rewriting text.

The fallback where pods cannot run in a mount namespace (``mounts``; ``--mounts rewrite``), and
the runner's own map from container paths to local folders in either mode: each node gets a table
``absolute container path -> local folder`` built from its ``volumeMounts`` (a mount maps to
its volume's folder, honouring ``subPath``) and from every other absolute path the template
declares for outputs, input artifacts, ``valueFrom.path`` and ``workingDir`` (mapped into the
node's private ``fs/`` folder). Those paths are then replaced, longest first and only at
path boundaries, in the command, args, env values, script source and working directory.

Limit: only paths spelt out literally are rewritten; a path computed at run time
(``os.path.join("/mnt", "x")``) is not, and would touch the real filesystem (in namespace mode it
finds the mount).
"""

from __future__ import annotations

import re
from pathlib import Path


def inside(root: Path, sub_path: str) -> Path | None:
    """``root / sub_path`` when it resolves inside ``root``, links followed (a link planted on a
    shared volume by an earlier step can point anywhere on the host); else None."""
    target = root / sub_path
    return target if target.resolve().is_relative_to(root.resolve()) else None


class PathMap:
    def __init__(self, fs_root: Path) -> None:
        self.fs_root = fs_root
        self.entries: dict[str, Path] = {}
        self._pattern: re.Pattern[str] | None = None

    def mount(self, container_path: str, local: Path) -> None:
        self.entries[_normalise(container_path)] = local
        self._pattern = None

    def private(self, container_path: str) -> None:
        """Give an absolute path not under any mount a place in the node's own ``fs/``."""
        path = _normalise(container_path)
        if not path.startswith("/") or self._mounted(path) is not None:
            return
        self.entries[path] = self.fs_root / path.lstrip("/")
        self._pattern = None

    def covers(self, container_path: str) -> bool:
        """Whether a container path lies under one of the mapped paths."""
        return self._mounted(_normalise(container_path)) is not None

    def _mounted(self, path: str) -> str | None:
        for prefix in sorted(self.entries, key=len, reverse=True):
            if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                return prefix
        return None

    def root_of(self, container_path: str) -> Path:
        """The folder whose links a container path must not leave: the volume's folder it
        lies in, else the pod's own ``fs/`` (its private paths are folders of that one tree)."""
        prefix = self._mounted(_normalise(container_path))
        if prefix is None or self.entries[prefix].is_relative_to(self.fs_root):
            return self.fs_root
        return self.entries[prefix]

    def local(self, container_path: str) -> Path:
        """Where a container path lives locally (unmapped paths are used as they are)."""
        path = _normalise(container_path)
        prefix = self._mounted(path)
        if prefix is None:
            return Path(path)
        rest = path[len(prefix) :].lstrip("/")
        return self.entries[prefix] / rest if rest else self.entries[prefix]

    def rewrite(self, text: str) -> str:
        if not self.entries or "/" not in text:
            return text
        if self._pattern is None:
            alternatives = "|".join(
                re.escape(p) for p in sorted(self.entries, key=len, reverse=True)
            )
            # Boundaries: not preceded by a path character, not followed by a name character,
            # so /mnt/work does not match inside /data/mnt/work or /mnt/workspace.
            self._pattern = re.compile(rf"(?<![\w.\-/])({alternatives})(?![\w.\-])")
        return self._pattern.sub(lambda m: str(self.entries[m.group(1)]), text)


    def restore(self, text: str) -> str:
        """The inverse of :meth:`rewrite`, for values a step reports (output parameters).

        A step that prints or writes a path it was given reports the local folder; mapping it
        back makes its outputs what they would be on Argo, and the next node rewrites them again.
        """
        if not self.entries or "/" not in text:
            return text
        by_local = {str(local): path for path, local in self.entries.items()}
        alternatives = "|".join(re.escape(p) for p in sorted(by_local, key=len, reverse=True))
        pattern = re.compile(rf"(?<![\w.\-/])({alternatives})(?![\w.\-])")
        return pattern.sub(lambda m: by_local[m.group(1)], text)


def _normalise(path: str) -> str:
    if len(path) > 1:
        path = path.rstrip("/")
    return path
