"""The model registry (components/model/registry.py) on a local folder and on a real S3 server:
round trips, real races between processes, publishes that fail or are killed midway, rollback."""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import os
import queue
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import pytest

from sublimate.components.model.registry import (
    CLAIM_FILE,
    MODEL_FILE,
    ChampionMoved,
    ModelVersion,
    Registry,
    RegistryError,
)
from tests.s3_server import S3Server

BACKENDS = ["local", "s3"]


@pytest.fixture(params=BACKENDS)
def registry_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new, empty registry: a local folder, or a prefix in a new bucket on the real S3
    server (only the server's AWS variables in the environment, so child processes use it)."""
    if request.param == "local":
        return str(tmp_path / "registry")
    server: S3Server = request.getfixturevalue("s3_env")
    bucket = f"models-{uuid.uuid4().hex[:12]}"
    server.filesystem().mkdir(bucket)
    return f"s3://{bucket}/team/registry"


def model_files(folder: Path, accuracy: float = 0.9, size: int = 3000) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.pt").write_bytes(os.urandom(size))
    (folder / "metrics.json").write_text(json.dumps({"accuracy": accuracy, "loss": 0.25}))
    (folder / "report").mkdir(exist_ok=True)
    (folder / "report" / "summary.txt").write_text("fine\n")
    return folder


def lineage(**extra: object) -> dict:
    return {"dataset": {"url": "s3://data/digits", "digest": "sha256:abc"},
            "settings": {"epochs": 3, "algorithm": "sync"}, "workflow": {"name": "wf-1",
            "uid": "1234"}, "image": "ghcr.io/x:1", "code_version": "0.1.0", **extra}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stored_names(url: str) -> set[str]:
    """Every file under the registry's versions/ folder, relative to it (leftovers included)."""
    registry = Registry(url)
    root = registry._path("versions")
    registry._fs.invalidate_cache(root)
    try:
        found = registry._fs.find(root)
    except FileNotFoundError:
        return set()
    return {path[len(root) + 1:] for path in found}


def test_publish_list_get_download_round_trip(registry_url: str, tmp_path: Path) -> None:
    registry = Registry(registry_url)
    assert registry.versions() == []
    assert registry.champion() is None and registry.history() == []
    source = model_files(tmp_path / "run")
    first = registry.publish(source, lineage())
    second = registry.publish(model_files(tmp_path / "run2", accuracy=0.95),
                              lineage(metrics={"accuracy": 0.95}))

    assert [v.id for v in registry.versions()] == [first.id, second.id]  # oldest first
    assert first.id < second.id or first.created <= second.created
    got = registry.get(first.id)
    assert got == first
    assert got.lineage == lineage()
    assert got.metrics == {"accuracy": 0.9, "loss": 0.25}  # from metrics.json
    assert registry.get(second.id).metrics == {"accuracy": 0.95}  # the lineage's own
    assert set(got.files) == {"model.pt", "metrics.json", "report/summary.txt"}
    assert got.files["model.pt"] == {"size": 3000, "sha256": sha256(source / "model.pt")}
    assert got.url == f"{registry_url}/versions/{first.id}"

    dest = registry.download(first.id, tmp_path / "downloaded")
    for name in got.files:
        assert sha256(dest / name) == sha256(source / name), name
    record = json.loads((dest / MODEL_FILE).read_text())
    assert record["id"] == first.id and record["lineage"] == lineage()
    assert not list(dest.rglob("*.partial"))
    # Nothing of the registry's own bookkeeping is listed as a model file.
    assert CLAIM_FILE not in got.files and MODEL_FILE not in got.files


def test_promote_rollback_and_history(registry_url: str, tmp_path: Path) -> None:
    registry = Registry(registry_url)
    a, b, c = (registry.publish(model_files(tmp_path / name), lineage()) for name in "abc")
    with pytest.raises(RegistryError, match="no champion to roll back from"):
        registry.rollback("nothing yet")
    registry.promote(a.id, "first")
    registry.promote(b.id, "better", by="workflow/wf-2")
    registry.promote(b.id, "a retried step")  # already the champion: no second entry
    registry.promote(c.id, "better still")
    assert registry.champion() == c

    assert registry.rollback("c misbehaves in production") == b
    assert registry.champion() == b
    assert registry.rollback("b too") == a  # each rollback undoes one more promotion
    with pytest.raises(RegistryError, match=f"{a.id} has no earlier champion"):
        registry.rollback("a is the first")
    assert registry.champion() == a

    history = registry.history()
    assert [(e["version"], e["previous"], e["action"]) for e in history] == [
        (a.id, None, "promote"), (b.id, a.id, "promote"), (c.id, b.id, "promote"),
        (b.id, c.id, "rollback"), (a.id, b.id, "rollback")]
    assert [e["reason"] for e in history][:2] == ["first", "better"]
    assert history[1]["by"] == "workflow/wf-2" and history[0]["by"]
    assert all(set(e) >= {"version", "previous", "reason", "time", "by"} for e in history)


def test_promote_of_an_unknown_version_is_refused_naming_it(registry_url: str,
                                                            tmp_path: Path) -> None:
    registry = Registry(registry_url)
    registry.promote(registry.publish(model_files(tmp_path / "run"), lineage()).id, "first")
    before = registry.history()
    missing = "20200101T000000Z-deadbeef"
    with pytest.raises(RegistryError) as refused:
        registry.promote(missing, "typo")
    assert missing in str(refused.value) and registry_url in str(refused.value)
    with pytest.raises(RegistryError, match="'latest' is not a version id"):
        registry.promote("latest", "typo")
    with pytest.raises(RegistryError, match=missing):
        registry.get(missing)
    assert registry.history() == before


def test_publish_refuses_what_it_cannot_store(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "registry")
    with pytest.raises(RegistryError, match="not a folder"):
        registry.publish(tmp_path / "missing", {})
    (tmp_path / "empty").mkdir()
    with pytest.raises(RegistryError, match="the folder is empty"):
        registry.publish(tmp_path / "empty", {})
    source = model_files(tmp_path / "run")
    with pytest.raises(RegistryError, match="cannot be stored as JSON"):
        registry.publish(source, {"when": object()})
    (source / MODEL_FILE).write_text("{}")
    with pytest.raises(RegistryError, match=r"'model\.json' is the registry's own record"):
        registry.publish(source, {})
    assert registry.versions() == [] and stored_names(str(tmp_path / "registry")) == set()


def test_a_publish_that_fails_midway_leaves_the_registry_as_it_was(
        registry_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Registry(registry_url)
    kept = registry.publish(model_files(tmp_path / "kept"), lineage())
    registry.promote(kept.id, "first")
    before = (registry.versions(), registry.champion(), registry.history(),
              stored_names(registry_url))

    real_upload = Registry._upload
    uploaded: list[str] = []

    def failing_upload(self: Registry, source: Path, target: str) -> dict:
        if uploaded:
            raise OSError(28, "No space left on device")
        uploaded.append(target)
        return real_upload(self, source, target)

    monkeypatch.setattr(Registry, "_upload", failing_upload)
    with pytest.raises(RegistryError, match=r"nothing was published.*disk full"):
        registry.publish(model_files(tmp_path / "new"), lineage())
    assert uploaded  # it did fail midway, after one file was stored
    after = (registry.versions(), registry.champion(), registry.history(),
             stored_names(registry_url))
    assert after == before  # not even an invisible leftover


def _publish_until_killed(url: str) -> str:
    """A child process that publishes and stops (SIGSTOP-like, by sleeping) after storing its
    first file, so that the test can SIGKILL it mid-publish."""
    return textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from sublimate.components.model.registry import Registry
        real = Registry._upload
        def upload(self, source, target):
            info = real(self, source, target)
            print("stored", target, flush=True)
            time.sleep(120)
            return info
        Registry._upload = upload
        Registry({url!r}).publish(Path(sys.argv[1]), {{"workflow": "killed"}})
    """)


def test_a_publish_killed_midway_is_invisible_and_cleaned_later(
        registry_url: str, tmp_path: Path) -> None:
    registry = Registry(registry_url)
    kept = registry.publish(model_files(tmp_path / "kept"), lineage())
    registry.promote(kept.id, "first")
    before = (registry.versions(), registry.champion(), registry.history())

    child = subprocess.Popen([sys.executable, "-c", _publish_until_killed(registry_url),
                              str(model_files(tmp_path / "new"))],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline() if child.stdout else ""
        assert line.startswith("stored "), child.communicate(timeout=30)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    leftovers = {name.split("/")[0] for name in stored_names(registry_url)} - {kept.id}
    assert len(leftovers) == 1  # its claim and first file really are on storage
    (leftover,) = leftovers

    assert (registry.versions(), registry.champion(), registry.history()) == before
    with pytest.raises(RegistryError, match="no version"):
        registry.get(leftover)
    # A later publish removes a leftover only once it is old enough (a slow publish may still
    # be running): not at the default age, yes with stale_after=0.
    registry.publish(model_files(tmp_path / "later"), lineage())
    assert any(name.startswith(leftover) for name in stored_names(registry_url))
    Registry(registry_url, stale_after=0).publish(model_files(tmp_path / "later2"), lineage())
    assert not any(name.startswith(leftover) for name in stored_names(registry_url))
    assert len(registry.versions()) == 3


def _race_worker(url: str, folder: str, rounds: int, start: object, results: object) -> None:
    """One of the racing processes: publish a version and promote it, ``rounds`` times, with
    a rollback after every second promotion."""
    registry = Registry(url)
    published, rollbacks = [], 0
    start.wait()  # type: ignore[attr-defined]
    for round_ in range(rounds):
        version = registry.publish(model_files(Path(folder) / str(round_), size=20000),
                                   {"worker": folder, "round": round_})
        published.append(version.id)
        registry.promote(version.id, f"{folder} round {round_}")
        if round_ % 2:
            try:
                registry.rollback(f"{folder} undoes round {round_}")
                rollbacks += 1
            except RegistryError as error:
                # Legitimate only when the racing rollbacks left nothing to undo.
                assert "no earlier champion" in str(error), error
    results.put((published, rollbacks))  # type: ignore[attr-defined]


@pytest.mark.parametrize("workers,rounds", [(4, 4)])
def test_concurrent_publishers_and_promoters_leave_a_consistent_registry(
        registry_url: str, tmp_path: Path, workers: int, rounds: int) -> None:
    # Separate processes (spawned: no fork of s3fs's event loop thread), released together.
    context = multiprocessing.get_context("spawn")
    start, results = context.Event(), context.Queue()
    processes = [context.Process(target=_race_worker,
                                 args=(registry_url, str(tmp_path / f"w{i}"), rounds, start,
                                       results))
                 for i in range(workers)]
    for process in processes:
        process.start()
    start.set()
    outcomes = []
    deadline = time.monotonic() + 240
    while len(outcomes) < workers:  # fail at once when a worker dies, not at the deadline
        with suppress(queue.Empty):
            outcomes.append(results.get(timeout=0.5))
        crashed = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
        assert not crashed and time.monotonic() < deadline, f"workers failed: {crashed}"
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    published = {vid for ids, _ in outcomes for vid in ids}
    rollbacks = sum(count for _, count in outcomes)
    assert len(published) == workers * rounds  # unique ids, none overwritten

    registry = Registry(registry_url)
    versions = registry.versions()
    assert {v.id for v in versions} == published
    for version in versions:  # every version complete: each file there, whole
        dest = registry.download(version.id, tmp_path / "check" / version.id)
        assert {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()} == \
            {*version.files, MODEL_FILE}
    assert all(name.split("/")[0] in published for name in stored_names(registry_url))

    history = registry.history()
    assert [e["seq"] for e in history] == list(range(1, len(history) + 1))  # no gaps, no dups
    assert history[0]["previous"] is None
    for earlier, entry in itertools.pairwise(history):
        assert entry["previous"] == earlier["version"], entry
    promotions = [e for e in history if e["action"] == "promote"]
    assert sorted(e["version"] for e in promotions) == sorted(published)  # each exactly once
    assert len(history) - len(promotions) == rollbacks
    # Replaying the log as a stack (promote pushes, rollback pops) gives every entry's version.
    stack: list[str] = []
    for entry in history:
        if entry["action"] == "promote":
            stack.append(entry["version"])
        else:
            stack.pop()
        assert stack[-1] == entry["version"], entry
    champion = registry.champion()
    assert champion is not None and champion.id in published and champion.id == stack[-1]


def test_exclusive_create_refuses_a_second_writer(registry_url: str) -> None:
    registry = Registry(registry_url)
    path = registry._path("champion", "00000001.json")
    assert registry._create_exclusive(path, b'{"first": true}')
    assert not registry._create_exclusive(path, b'{"second": true}')
    assert registry._fs.cat_file(path) == b'{"first": true}'


def test_a_store_without_an_exclusive_create_is_read_but_never_written(tmp_path: Path) -> None:
    """A minimal fsspec backend, as many are: it accepts ``open(path, "xb")`` and overwrites."""
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    class OverwritingStore(MemoryFileSystem):
        protocol = "overwriting"
        store: dict = {}  # noqa: RUF012 - fsspec's own convention: one store per class
        pseudo_dirs = [""]  # noqa: RUF012

        def _open(self, path: str, mode: str = "rb", **kwargs: object) -> object:
            return super()._open(path, "wb" if mode == "xb" else mode, **kwargs)

    fsspec.register_implementation("overwriting", OverwritingStore, clobber=True)
    store = OverwritingStore()
    with store.open("/probe", "xb") as first:
        first.write(b"1")
    with store.open("/probe", "xb") as second:  # no FileExistsError: the first is gone
        second.write(b"2")
    assert store.cat_file("/probe") == b"2"
    registry = Registry("overwriting://team/registry")
    assert registry.versions() == [] and registry.champion() is None  # reading is fine
    for write in (lambda: registry.publish(model_files(tmp_path / "run"), lineage()),
                  lambda: registry.promote("20261203T153317Z-2962629a", "better"),
                  lambda: registry.rollback("worse")):
        with pytest.raises(RegistryError, match=r"cannot publish, promote or roll back on a "
                                                r"'overwriting' store.*use a shared folder or "
                                                r"s3://"):
            write()
    assert store.find("/team") == []  # refused before anything was stored


def test_download_refuses_a_damaged_file(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "registry")
    version = registry.publish(model_files(tmp_path / "run"), lineage())
    stored = tmp_path / "registry" / "versions" / version.id / "model.pt"
    stored.write_bytes(b"bit rot")
    with pytest.raises(RegistryError, match=r"model\.pt of version .* does not match"):
        registry.download(version.id, tmp_path / "dest")
    assert not (tmp_path / "dest" / "model.pt").exists()


def test_storage_errors_name_the_registry_and_the_fix(s3_env: S3Server) -> None:
    missing = Registry("s3://no-such-bucket-here/registry")
    with pytest.raises(RegistryError, match=r"'s3://no-such-bucket-here/registry'.*bucket "
                                            r"'no-such-bucket-here' does not exist.*create"):
        missing.versions()
    os.environ["AWS_SECRET_ACCESS_KEY"] = "wrong"  # restored by s3_env's monkeypatch
    with pytest.raises(RegistryError, match="credentials refused") as refused:
        Registry("s3://no-such-bucket-here/registry").champion()
    assert "wrong" not in str(refused.value)


def test_import_stays_light() -> None:
    code = ("import sys, sublimate.components.model.registry; print(sorted(m for m in "
            "('torch', 'hera', 'sublimate.pipelines') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_model_version_is_frozen() -> None:
    version = ModelVersion(id="x", created="t", lineage={}, metrics={}, files={}, url="u")
    setter: Callable[[], None] = lambda: setattr(version, "id", "y")  # noqa: E731
    with pytest.raises(AttributeError):
        setter()


def test_a_promotion_judged_against_a_champion_that_moved_is_refused(registry_url: str,
                                                                     tmp_path: Path) -> None:
    """The gate compared against champion A; a concurrent pipeline promoted B meanwhile: the
    first pipeline's promotion (expect=A) changes nothing."""
    registry = Registry(registry_url)
    first, second, late = (registry.publish(model_files(tmp_path / name), lineage(n=name))
                           for name in ("a", "b", "c"))
    registry.promote(first.id, "first", expect=None)
    registry.promote(second.id, "a concurrent pipeline", expect=first.id)
    with pytest.raises(ChampionMoved, match=f"the champion is {second.id}, not {first.id}"):
        registry.promote(late.id, "judged against the first", expect=first.id)
    assert registry.champion().id == second.id
    assert [entry["version"] for entry in registry.history()] == [first.id, second.id]
