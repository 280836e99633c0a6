"""A full disk said in one line (``disk_full``): which disk, what was being written, whatever
wrapped the kernel's error. On a real small tmpfs: the ``ENOSPC`` is the kernel's."""

from __future__ import annotations

import errno
import pickle
import sys
from pathlib import Path

import pytest

from sublimate.components.base.disk_full import (
    DiskFullError,
    describe,
    disk_full_cause,
    explain,
    full_disk_note,
    writing,
)
from sublimate.components.base.termination import disk_full_in_one_line
from tests.small_disk import fill, small_disk


def _overfill(path: Path) -> OSError:
    """The kernel's own ENOSPC, from a write larger than the disk."""
    try:
        path.write_bytes(bytes(64 * 1024))
    except OSError as error:
        return error
    raise AssertionError(f"{path}: the write fitted")


def test_a_write_that_does_not_fit_names_the_disk_and_what_was_written(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "16k") as disk:
        with pytest.raises(DiskFullError) as raised, \
                writing(disk / "state.bin", "saving the state to state.bin"):
            raise _overfill(disk / "state.bin")
        error = raised.value
        assert str(error) == (f"disk full: no space left on {disk} (tmpfs) while saving the "
                              "state to state.bin")
        assert isinstance(error, OSError) and error.errno == errno.ENOSPC
        # carried across processes (DCP gathers each rank's failure by pickling it)
        again = pickle.loads(pickle.dumps(error))
        assert (str(again), again.errno) == (str(error), errno.ENOSPC)
        assert explain(error) == str(error)
        (disk / "state.bin").unlink()  # what the write took of the disk
        assert full_disk_note(disk) is None
        fill(disk)
        assert full_disk_note(disk / "run") == (f"disk full: no space left on {disk} (tmpfs), "
                                                f"which holds {disk / 'run'}")


def test_the_full_disk_is_found_behind_whatever_wrapped_it(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "16k") as disk:
        kernels = _overfill(disk / "x")
    # torch's zip writer: RuntimeError("unexpected pos ...") while handling the OSError
    try:
        try:
            raise kernels
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos 704 "
                               "vs 598") from None
    except RuntimeError as wrapped:
        assert disk_full_cause(wrapped) is kernels  # (from None hides it, not from us)
    grouped = ExceptionGroup("transfers", [ValueError("other"), kernels])
    assert disk_full_cause(grouped) is kernels

    class CheckpointException(Exception):  # DCP's: each rank's (exception, traceback)
        def __init__(self, failures: dict[int, tuple[BaseException, object]]) -> None:
            super().__init__("CheckpointException ranks:dict_keys([1])")
            self.failures = failures

    assert disk_full_cause(CheckpointException({1: (kernels, None)})) is kernels
    assert disk_full_cause(RuntimeError("unrelated")) is None and explain(ValueError()) is None


def test_a_quota_is_said_as_a_quota(tmp_path: Path) -> None:
    # EDQUOT needs a quota set up on the disk; the words are all that differ from ENOSPC.
    quota = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert describe(quota, tmp_path, "writing x").startswith("disk quota exceeded on /")
    with pytest.raises(DiskFullError, match=r"^disk quota exceeded on .* while writing x$"), \
            writing(tmp_path, "writing x"):
        raise quota


def test_a_step_whose_disk_is_full_ends_in_one_line(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture) -> None:
    termination = tmp_path / "termination-log"
    monkeypatch.setenv("SUBLIMATE_TERMINATION_LOG", str(termination))
    with small_disk(tmp_path / "disk", "16k") as disk:
        output = disk / "outputs" / "result"
        monkeypatch.setattr(sys, "argv", ["step", "--output-path", str(output)])

        @disk_full_in_one_line("a-step")
        def main() -> int:
            output.parent.mkdir()
            with open(output, "wb") as out:  # fails on close, naming no file
                out.write(bytes(64 * 1024))
            return 0

        assert main() == 1
    line = (f"disk full: no space left on {disk} (tmpfs) while writing (the error names no "
            "file; this disk has no space left)")
    assert capsys.readouterr().err == f"a-step: error: {line}\n"
    assert termination.read_text() == line
