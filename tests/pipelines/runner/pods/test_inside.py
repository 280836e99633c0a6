"""Paths resolved inside a root (``pipelines/runner/pods/inside.py``), as a container runtime
resolves a container's paths: an absolute link starts again at the root, ``..`` stops there, a
loop ends in ELOOP, a missing component is FileNotFoundError. Each case runs through the
kernel's ``openat2(RESOLVE_IN_ROOT)`` and through the walk that stands in for it."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from sublimate.pipelines.runner.pods import inside
from sublimate.pipelines.runner.pods.inside import InRoot
from tests.conftest import require


@pytest.fixture(params=["openat2", "walk"])
def how(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "walk":
        monkeypatch.setattr(inside, "_openat2_works", False)
    else:
        root = os.open("/", os.O_PATH)
        try:
            os.close(inside._openat2(root, "etc", os.O_PATH | os.O_CLOEXEC))
        except inside._Unavailable:
            require(False, "no openat2 with RESOLVE_IN_ROOT on this kernel")
        finally:
            os.close(root)
    yield request.param


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """A root holding data/file, and a host folder beside it with a file of the same name."""
    root, host = tmp_path / "root", tmp_path / "host"
    (root / "data").mkdir(parents=True)
    (root / "data" / "file").write_text("inside")
    (host / "data").mkdir(parents=True)
    (host / "data" / "file").write_text("host")
    return root, host


def _read(where: InRoot) -> str:
    fd = inside.open_path(where)
    try:
        with os.fdopen(inside.reopen(fd, os.O_RDONLY), encoding="utf-8") as f:
            return f.read()
    finally:
        os.close(fd)


def test_an_absolute_link_starts_again_at_the_root(tree: tuple[Path, Path], how: str) -> None:
    root, host = tree
    (root / "abs").symlink_to(host / "data")  # the host's folder, by its full path
    (root / "data2").symlink_to("/data")  # the root's own /data
    with pytest.raises(FileNotFoundError):  # <root>/<host path>/file: nothing there
        _read(InRoot(root, "abs/file"))
    assert _read(InRoot(root, "data2/file")) == "inside"
    assert _read(InRoot(root, "/data2/../data2/file")) == "inside"


def test_a_relative_link_climbing_out_stops_at_the_root(tree: tuple[Path, Path],
                                                        how: str) -> None:
    root, _ = tree
    (root / "up").symlink_to("../host/data")  # on this machine: <tmp>/host/data, beside root
    (root / "data" / "sib").symlink_to("../data/file")  # within: followed as written
    assert (root / "up" / "file").read_text() == "host"  # what following it here would read
    with pytest.raises(FileNotFoundError):  # `..` stops at the root: <root>/host/data
        _read(InRoot(root, "up/file"))
    (root / "host" / "data").mkdir(parents=True)
    (root / "host" / "data" / "file").write_text("the root's own host/data")
    assert _read(InRoot(root, "up/file")) == "the root's own host/data"
    assert _read(InRoot(root, "data/sib")) == "inside"
    assert _read(InRoot(root, "data/../../../data/file")) == "inside"  # `..` in the path too


def test_link_loops_end_in_eloop(tree: tuple[Path, Path], how: str) -> None:
    root, _ = tree
    (root / "loop").symlink_to("/loop")
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("a")
    for path in ("loop/x", "a", "a/x"):
        with pytest.raises(OSError) as info:
            inside.open_path(InRoot(root, path))
        assert info.value.errno == errno.ELOOP


def test_a_missing_component_or_a_file_on_the_way(tree: tuple[Path, Path], how: str) -> None:
    root, _ = tree
    with pytest.raises(FileNotFoundError):
        inside.open_path(InRoot(root, "nowhere/file"))
    (root / "dangling").symlink_to("/nowhere")
    with pytest.raises(FileNotFoundError):
        inside.open_path(InRoot(root, "dangling"))
    with pytest.raises(NotADirectoryError):
        inside.open_path(InRoot(root, "data/file/x"))
    assert inside.find(InRoot(root, "data/file")) == root / "data" / "file"
    assert inside.find(InRoot(root, "")) == root
    assert inside.find(InRoot(root, "nowhere")) is None


def test_magic_links_are_refused_or_stay_inside(tree: tuple[Path, Path], how: str) -> None:
    root, _ = tree
    (root / "magic").symlink_to(f"/proc/{os.getpid()}/root/etc")  # the host's /etc by /proc
    assert inside.find(InRoot(root, "magic/hostname")) is None


def test_folders_are_made_where_their_parents_resolve(tree: tuple[Path, Path], how: str) -> None:
    root, host = tree
    (root / "trap").symlink_to(host)  # a link planted on a volume, to a host folder
    # <root>/<host path> does not exist: as `mkdir -p` in the container, nothing is made
    with pytest.raises(FileNotFoundError):
        inside.open_parent(InRoot(root, "trap/new/x"), create=True)
    assert sorted(os.listdir(host)) == ["data"]
    (root / "inner").mkdir()
    (root / "to-inner").symlink_to("/inner")
    fd, name = inside.open_parent(InRoot(root, "to-inner/new/deeper/x"), create=True)
    try:
        assert name == "x"
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)
    assert (root / "inner" / "new" / "deeper" / "x").is_file()
    with pytest.raises(FileNotFoundError):  # without create: nothing is made
        inside.open_parent(InRoot(root, "other/x"))
    assert not (root / "other").exists()
    with pytest.raises(ValueError):
        inside.open_parent(InRoot(root, "/"))


def test_remove_at_removes_a_link_never_its_target(tree: tuple[Path, Path]) -> None:
    root, host = tree
    (root / "trap").symlink_to(host / "data")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        inside.remove_at(fd, "trap")
        inside.remove_at(fd, "data")
        inside.remove_at(fd, "absent")
    finally:
        os.close(fd)
    assert os.listdir(root) == []
    assert (host / "data" / "file").read_text() == "host"


def test_a_whiteout_is_missing(tmp_path: Path, how: str) -> None:
    require(os.geteuid() == 0, "making a whiteout (a 0/0 character device) needs root")
    os.mknod(tmp_path / "gone", stat.S_IFCHR | 0o600, os.makedev(0, 0))
    with pytest.raises(FileNotFoundError):
        inside.open_path(InRoot(tmp_path, "gone"))
