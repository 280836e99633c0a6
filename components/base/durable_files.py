"""Writes that survive a crash or a power loss: the data flushed before a rename publishes it,
and the folder flushed after, so that the rename itself is on disk.

Without the first flush a crash can leave the new name on an empty file; without the second the
rename can be lost and the old file come back. Used for checkpoints, the staged dataset and the
local runner's status.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def fsync_folder(folder: Path) -> None:
    """Flush a folder's entries (the renames and new names in it) to disk; a no-op where a
    folder cannot be opened or flushed (some network filesystems refuse)."""
    try:
        handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass  # the files themselves were flushed; only the folder's entry is not
    finally:
        os.close(handle)


def fsync_file(path: Path) -> None:
    """Flush a file that was written and closed elsewhere."""
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def replace_atomically(path: Path, write: Any) -> None:
    """Write ``path`` by calling ``write(stream)`` on a binary temporary file beside it; flush
    it, rename it over ``path`` and flush the folder. A crash at any moment leaves the old file
    or the new one, never a part; the temporary file is removed when ``write`` raises."""
    import tempfile  # here: the local runner imports this module and never calls this

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
    fsync_folder(path.parent)


def write_json(data: dict[str, Any], path: Path, sort_keys: bool = True) -> None:
    """``data`` as indented JSON at ``path``, replaced atomically (:func:`replace_atomically`).
    ``sort_keys=False`` keeps the dicts' own order (e.g. start-up phases in time order)."""
    encoded = (json.dumps(data, indent=2, sort_keys=sort_keys) + "\n").encode()
    replace_atomically(path, lambda stream: stream.write(encoded))
