"""Atomic checkpoint files on the shared volume.

A checkpoint is written to a temporary file in the same folder, flushed to disk, then renamed over
the old one, so a crash at any moment leaves either the previous checkpoint or the new one, never a
truncated file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch


def _replace_atomically(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def save(state: dict[str, Any], path: Path) -> None:
    _replace_atomically(path, lambda stream: torch.save(state, stream))


def load(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def write_json(data: dict[str, Any], path: Path) -> None:
    encoded = (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()
    _replace_atomically(path, lambda stream: stream.write(encoded))
