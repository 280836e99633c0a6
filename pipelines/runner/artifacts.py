"""The run's local artifact store: files and folders copied as they are (no archiving).

Argo's ``archive`` settings are ignored on purpose: a local store has nothing to gain from
tarballs, and keeping plain files lets users inspect outputs directly.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def save(source: Path, store: Path) -> Path:
    """Copy a node's output file or folder into ``store`` (replacing an earlier copy)."""
    _replace_with_copy(source, store)
    return store


def place(stored: Path, target: Path) -> None:
    """Put a stored artifact at a node's input path before the node starts."""
    _replace_with_copy(stored, target)


def _replace_with_copy(source: Path, target: Path) -> None:
    if target.exists():
        _remove(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target, symlinks=True)
    else:
        shutil.copy2(source, target)


def place_raw(data: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(data)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
