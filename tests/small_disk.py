"""A real full disk for a test: a small tmpfs mounted on a folder, and a file that fills it.

The kernel's own ``ENOSPC``, not a mock: what fails is whatever really writes there (torch's zip
writer, DCP's shards, a buffered file's close, the runner's status), as on a full volume. Needs
root (``mount``), which CI has; elsewhere the test is skipped (``require``).
"""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import require


@contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``64k``) mounted on ``folder`` (made if missing) for the block."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                           str(folder)], capture_output=True, text=True, check=False)
    require(done.returncode == 0,
            f"cannot mount a small tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield folder
    finally:
        # lazily if something (a process the test left) still holds it: never left mounted
        if subprocess.run(["umount", str(folder)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "--lazy", str(folder)], capture_output=True, check=False)


def fill(folder: Path) -> Path:
    """Write a file in ``folder`` until its disk has no block left; the file, to free it."""
    path = folder / "filler"
    with open(path, "ab", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 4096)
        except OSError as error:
            assert error.errno == errno.ENOSPC, error
    return path
