"""Staged datasets under crashes and on filesystems without RENAME_EXCHANGE: a killed staging
leaves nothing behind after the next one, a reader always finds a complete copy, and what is
published was fsynced first."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sublimate.components.base.process_identity import start_ticks
from sublimate.components.data.datasets import METADATA_FILE, build_builtin, verify_dataset
from sublimate.components.steps import stage_data
from sublimate.components.steps.stage_data import STAGING_MARK, dataset_id


def _no_rename_exchange(monkeypatch: pytest.MonkeyPatch) -> None:
    """Behave as NFS or CephFS do: renameat2(RENAME_EXCHANGE) fails with EINVAL."""
    def refuse(a: Path, b: Path, flags: int) -> None:
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(b))

    monkeypatch.setattr(stage_data, "_renameat2", refuse)


def _republish(source: Path, note: str) -> None:
    """Change the published dataset, so that the next staging must replace the copy."""
    metadata = json.loads((source / METADATA_FILE).read_text())
    metadata["note"] = note
    (source / METADATA_FILE).write_text(json.dumps(metadata))


def _hidden(data_root: Path) -> list[str]:
    return sorted(path.name for path in data_root.iterdir() if path.name.startswith("."))


def test_without_rename_exchange_a_reader_always_finds_a_complete_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_rename_exchange(monkeypatch)
    source = build_builtin("digits", tmp_path / "published" / "digits")
    data_root = tmp_path / "data"
    target = data_root / dataset_id(str(source))
    stage_data.stage(str(source), data_root)

    # Every rename is a moment a reader may look: check right after each one...
    missing: list[str] = []
    real_rename = os.rename

    def rename_then_look(a: object, b: object, **kwargs: object) -> None:
        real_rename(a, b, **kwargs)  # type: ignore[arg-type]
        if not (target / METADATA_FILE).is_file():
            missing.append(f"after rename({a}, {b})")

    monkeypatch.setattr(os, "rename", rename_then_look)
    # ... and keep looking from another thread all along.
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            if not (target / METADATA_FILE).is_file():
                missing.append("seen by the reader")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for version in range(3):
            _republish(source, f"v{version}")
            report = stage_data.stage_dataset(str(source), data_root)
            assert METADATA_FILE in report.fetched
            assert json.loads((target / METADATA_FILE).read_text())["note"] == f"v{version}"
    finally:
        stop.set()
        reader.join()
    assert missing == []
    verify_dataset(target)
    # The layout: a link into the staging folder of the current copy; the earlier ones are gone.
    assert target.is_symlink() and not os.readlink(target).startswith("/")
    (current,) = _hidden(data_root)
    assert os.readlink(target) == f"{current}/dataset"


def test_without_rename_exchange_a_built_dataset_is_linked_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_rename_exchange(monkeypatch)
    folder = stage_data.stage("digits", tmp_path / "data")
    assert folder.is_symlink()
    verify_dataset(folder)
    again = stage_data.stage_dataset("digits", tmp_path / "data")
    assert again.files_reused and not again.files_built
    assert len(_hidden(tmp_path / "data")) == 1


# `stage-data` that stalls once its first file has landed: a copy half made, to kill.
STALLING_STAGER = """
import os, sys, time
from sublimate.components.data import transfer
from sublimate.components.steps import stage_data

land = transfer._land

def land_then_stall(*args):
    land(*args)
    open(os.environ["STALL_STAGING"], "w").write("fetching")
    time.sleep(300)

transfer._land = land_then_stall
sys.exit(stage_data.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("with_exchange", [True, False])
def test_a_killed_staging_leaves_nothing_after_the_next_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_exchange: bool) -> None:
    source = build_builtin("digits", tmp_path / "published" / "digits")
    data_root = tmp_path / "data"
    stalled = tmp_path / "stalled"
    stager = subprocess.Popen(
        [sys.executable, "-c", STALLING_STAGER, "--dataset", str(source),
         "--data-root", str(data_root)],
        env={**os.environ, "STALL_STAGING": str(stalled)})
    try:
        deadline = time.monotonic() + 60
        while not stalled.exists() and stager.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stalled.exists(), "the staging never fetched a file"
        stager.send_signal(signal.SIGKILL)
        stager.wait(timeout=30)
    finally:
        if stager.poll() is None:
            stager.kill()
            stager.wait()
    target = data_root / dataset_id(str(source))
    left = _hidden(data_root)
    assert left and all(name.startswith(f".{target.name}{STAGING_MARK}") for name in left)
    assert not target.exists()

    if not with_exchange:
        _no_rename_exchange(monkeypatch)
    stage_data.stage(str(source), data_root)
    verify_dataset(target)
    # With RENAME_EXCHANGE nothing hidden stays; without it, only the current copy's folder.
    expected = [] if with_exchange else [os.readlink(target).split("/")[0]]
    assert _hidden(data_root) == expected
    assert not set(left) & set(expected)


def test_stale_staging_folders_are_judged_by_their_owner(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    data_root = tmp_path / "data"
    target = data_root / "digits"
    data_root.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    here, me = stage_data._host(), os.getpid()
    ticks = start_ticks(me)
    names = {
        "dead": f".digits~{here}~{pid}~12345~aa",
        "recycled": f".digits~{here}~{me}~{(ticks or 0) + 1}~bb",  # this pid, another start
        "alive": f".digits~{here}~{me}~{ticks}~cc",
        "foreign": f".digits~elsewhere~{me}~1~dd",
        "foreign-old": f".digits~elsewhere~{me}~1~ee",
        "unrelated": ".digits.abc123",
    }
    for name in names.values():
        (data_root / name).mkdir()
    old = time.time() - stage_data.FOREIGN_STALE_S - 60
    os.utime(data_root / names["foreign-old"], (old, old))
    removed = {path.name for path in stage_data._remove_stale_stagings(target)}
    assert removed == {names["dead"], names["recycled"], names["foreign-old"]}
    assert set(_hidden(data_root)) == {names["alive"], names["foreign"], names["unrelated"]}


def test_everything_published_was_fsynced_first(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    source = build_builtin("digits", tmp_path / "published" / "digits")
    data_root = tmp_path / "data"
    events: list[tuple[str, str]] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(a: object, b: object, **kwargs: object) -> None:
        events.append(("rename", str(b)))
        real_rename(a, b, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    target = stage_data.stage(str(source), data_root)
    publish = events.index(("rename", str(target)))
    synced = {path for kind, path in events[:publish] if kind == "fsync"}
    staged = Path(next(b for kind, b in events if kind == "rename" and "~" in b)).parent
    for name in [*os.listdir(target), ""]:
        assert str(staged / name).rstrip("/") in synced, f"{name or 'the folder'} not fsynced"
    assert ("fsync", str(data_root)) in events[publish:]  # the rename itself made durable
