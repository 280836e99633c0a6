"""Staging from a real S3 server on loopback (SeaweedFS), end to end through the step's CLI."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from sublimate.components.data import object_store, transfer
from sublimate.components.data.datasets import (
    METADATA_FILE,
    build_builtin,
    sha256_of,
    verify_dataset,
)
from sublimate.components.steps import publish, stage_data
from sublimate.components.steps.stage_data import MANIFEST_FILE, dataset_id
from tests.conftest import require, run_cli
from tests.s3_server import SECRET_KEY, S3Server

# Every test here uses the `server` fixture (tests/conftest.py), which requires SeaweedFS: a
# skip with the reason outside CI, a failure in CI.


@pytest.fixture
def bucket(server: S3Server) -> str:
    name = f"b-{uuid.uuid4().hex[:12]}"
    server.filesystem().mkdir(name)
    return name


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_builtin("digits", tmp_path_factory.mktemp("src") / "digits")


def _stage(url: str, root: Path, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    code = stage_data.main(["--dataset", url, "--data-root", str(root)])
    captured = capsys.readouterr()
    output = captured.out + captured.err
    assert SECRET_KEY not in output, "a secret reached the step's output"
    return code, output


def _copy_dataset(source: Path, target: Path) -> Path:
    target.mkdir(parents=True)
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


def _change_shard(folder: Path, shard: str) -> None:
    """Rewrite one shard with different content and fix its entry in metadata.json."""
    with np.load(folder / shard) as arrays:
        x, y = arrays["x"].copy(), arrays["y"].copy()
    x[0] = 1.0 - x[0]
    with open(folder / shard, "wb") as handle:
        np.savez(handle, x=x, y=y)
    metadata = json.loads((folder / METADATA_FILE).read_text())
    for split in metadata["splits"].values():
        for entry in split["shards"]:
            if entry["file"] == shard:
                entry.update(bytes=(folder / shard).stat().st_size,
                             sha256=sha256_of(folder / shard))
    (folder / METADATA_FILE).write_text(json.dumps(metadata, indent=2, sort_keys=True))


def _no_leftovers(root: Path) -> None:
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == [] \
        if root.exists() else True


def test_push_stage_and_restage_transfers_nothing(s3_env: S3Server, bucket: str,
                                                  tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    url = f"s3://{bucket}/digits"
    report = publish.push("digits", url)
    assert report.files == 4
    root = tmp_path / "data"
    code, output = _stage(url, root, capsys)
    assert code == 0, output
    assert "stage-data: transferred 4 files" in output and "reused 0 files" in output
    staged = root / dataset_id(url)
    verify_dataset(staged)
    manifest = json.loads((staged / MANIFEST_FILE).read_text())
    assert manifest["source"] == url and sorted(manifest["files"]) == sorted(
        p.name for p in staged.iterdir() if p.name != MANIFEST_FILE)
    assert SECRET_KEY not in (staged / MANIFEST_FILE).read_text()

    again = stage_data.stage_dataset(url, root)
    assert (again.files_fetched, again.bytes_fetched) == (0, 0)
    code, output = _stage(url, root, capsys)
    assert code == 0 and "already complete; nothing to transfer" in output
    assert "transferred 0 files, 0 bytes" in output
    _no_leftovers(root)


def test_only_the_changed_object_is_fetched_again(s3_env: S3Server, bucket: str,
                                                  digits_folder: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    source = _copy_dataset(digits_folder, tmp_path / "src")
    url = f"s3://{bucket}/mine/"
    publish.push(str(source), url)
    root = tmp_path / "data"
    first = stage_data.stage_dataset(url, root)
    assert first.files_fetched == 4
    kept = root / dataset_id(url) / "train-00000-of-00002.npz"
    inode = kept.stat().st_ino

    _change_shard(source, "test-00000-of-00001.npz")
    publish.push(str(source), url)
    second = stage_data.stage_dataset(url, root)
    assert sorted(second.fetched) == [METADATA_FILE, "test-00000-of-00001.npz"]
    assert second.files_reused == 2
    assert second.bytes_fetched == sum((source / n).stat().st_size for n in second.fetched)
    staged = root / dataset_id(url)
    assert verify_dataset(staged) == verify_dataset(source)
    assert kept.stat().st_ino == inode, "an unchanged shard was copied instead of linked"
    _no_leftovers(root)


def test_a_damaged_local_copy_is_repaired_from_the_source(s3_env: S3Server, bucket: str,
                                                          tmp_path: Path) -> None:
    url = f"s3://{bucket}/digits"
    publish.push("digits", url)
    root = tmp_path / "data"
    staged = stage_data.stage_dataset(url, root).folder
    shard = staged / "train-00001-of-00002.npz"
    shard.write_bytes(b"\0" * shard.stat().st_size)  # same size, wrong bytes
    report = stage_data.stage_dataset(url, root)
    assert report.fetched == [METADATA_FILE, "train-00001-of-00002.npz"]
    verify_dataset(staged)


@pytest.fixture
def staged_copy(s3_env: S3Server, bucket: str, tmp_path: Path) -> tuple[str, Path, str]:
    """A complete staged copy: the failures below must leave it exactly as it was."""
    url = f"s3://{bucket}/digits"
    publish.push("digits", url)
    folder = stage_data.stage_dataset(url, tmp_path / "data").folder
    return url, folder, (folder / MANIFEST_FILE).read_text()


def _assert_intact(folder: Path, manifest: str) -> None:
    verify_dataset(folder)
    assert (folder / MANIFEST_FILE).read_text() == manifest
    _no_leftovers(folder.parent)


@pytest.mark.parametrize(("env", "cause"), [
    ({"AWS_SECRET_ACCESS_KEY": "wrong-secret-value"}, "credentials refused or access denied"),
    ({"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}, "no credentials found"),
    ({"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9"}, "cannot reach the endpoint "
                                                    "http://127.0.0.1:9"),
])
def test_store_failures_name_the_url_and_keep_the_earlier_copy(
        staged_copy: tuple[str, Path, str], env: dict[str, str | None], cause: str,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    url, folder, manifest = staged_copy
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name)
        else:
            monkeypatch.setenv(name, value)
    code, output = _stage(url, folder.parent, capsys)
    assert code == 2
    assert f"stage-data: error: dataset '{url}': {cause}" in output
    assert "wrong-secret-value" not in output
    _assert_intact(folder, manifest)


def test_missing_bucket_and_prefix(s3_env: S3Server, bucket: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture) -> None:
    code, output = _stage("s3://no-such-bucket-x1/digits", tmp_path, capsys)
    assert code == 2
    assert ("dataset 's3://no-such-bucket-x1/digits': bucket 'no-such-bucket-x1' does not exist"
            in output)
    code, output = _stage(f"s3://{bucket}/nothing-here", tmp_path, capsys)
    assert code == 2
    assert f"dataset 's3://{bucket}/nothing-here': no such directory" in output
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("part_size", [None, 32 << 10], ids=["whole", "ranged-parts"])
def test_an_object_replaced_mid_copy_is_an_error(staged_copy: tuple[str, Path, str],
                                                 server: S3Server, digits_folder: Path,
                                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture,
                                                 part_size: int | None) -> None:
    url, folder, manifest = staged_copy
    if part_size:
        monkeypatch.setattr(transfer, "PART_SIZE", part_size)
    source = _copy_dataset(digits_folder, tmp_path / "v2")
    _change_shard(source, "test-00000-of-00001.npz")
    publish.push(str(source), url)  # a new version, which we are about to fetch ...
    key = f"{url.removeprefix('s3://')}/test-00000-of-00001.npz"
    original = stage_data.read_metadata_from

    def replace_the_shard_after_listing(*args: object, **kwargs: object) -> object:
        metadata = original(*args, **kwargs)  # type: ignore[arg-type]
        server.filesystem().pipe(key, b"... and someone overwrites it while we copy")
        return metadata

    monkeypatch.setattr(stage_data, "read_metadata_from", replace_the_shard_after_listing)
    code, output = _stage(url, folder.parent, capsys)
    assert code == 2
    assert f"dataset '{url}/test-00000-of-00001.npz': it changed while it was being copied" \
        in output
    _assert_intact(folder, manifest)


class _RecordingClient:
    """Passes GETs to the real client and keeps their arguments."""

    def __init__(self, client: object) -> None:
        self.client, self.calls = client, []

    def get_object(self, **kwargs: object) -> object:
        self.calls.append(kwargs)
        return self.client.get_object(**kwargs)  # type: ignore[attr-defined]


def test_large_objects_arrive_in_ranged_parts_each_pinned_to_the_etag(
        s3_env: S3Server, bucket: str, digits_folder: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"s3://{bucket}/digits"
    publish.push(str(digits_folder), url)
    part = 64 << 10
    monkeypatch.setattr(transfer, "PART_SIZE", part)
    clients: list[_RecordingClient] = []
    real = object_store.transfer_client

    def recording(*args: object) -> _RecordingClient:
        clients.append(_RecordingClient(real(*args)))  # type: ignore[arg-type]
        return clients[-1]

    monkeypatch.setattr(object_store, "transfer_client", recording)
    report = stage_data.stage_dataset(url, tmp_path / "data")
    staged = report.folder
    assert report.files_fetched == 4
    assert verify_dataset(staged) == verify_dataset(digits_folder)
    for path in digits_folder.iterdir():
        assert (staged / path.name).read_bytes() == path.read_bytes()
    calls = [call for client in clients for call in client.calls]
    assert sum("Range" in call for call in calls) > 4, "no object was split into parts"
    listing = {info["name"].rsplit("/", 1)[-1]: info for info in
               s3_env.filesystem().ls(url.removeprefix("s3://"), detail=True)}
    for name, info in listing.items():
        mine = [call for call in calls if call["Key"].endswith(f"/{name}")]
        assert mine and all(call["IfMatch"] == info["ETag"] for call in mine)
        size = int(info["size"])
        if size > part:
            expected = {f"bytes={start}-{min(start + part, size) - 1}"
                        for start in range(0, size, part)}
            assert {call["Range"] for call in mine} == expected and len(mine) == len(expected)
        else:
            assert [call.get("Range") for call in mine] == [None]
    _no_leftovers(tmp_path / "data")


def test_endpoint_from_aws_endpoint_url_and_a_profile(server: S3Server, bucket: str,
                                                      tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.s3_server import ACCESS_KEY

    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    credentials = tmp_path / "credentials"
    credentials.write_text(f"[team]\naws_access_key_id = {ACCESS_KEY}\n"
                           f"aws_secret_access_key = {SECRET_KEY}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_PROFILE", "team")
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.endpoint)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    url = f"s3://{bucket}/digits"
    publish.push("digits", url)
    assert stage_data.stage_dataset(url, tmp_path / "data").files_fetched == 4


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=640k", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    require(done.returncode == 0,
            f"cannot mount a small tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_disk_full_is_an_error_and_keeps_the_earlier_copy(
        s3_env: S3Server, bucket: str, digits_folder: Path, small_disk: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture) -> None:
    source = _copy_dataset(digits_folder, tmp_path / "src")
    url = f"s3://{bucket}/mine"
    publish.push(str(source), url)
    code, output = _stage(url, small_disk, capsys)
    assert code == 0, output
    folder = small_disk / dataset_id(url)
    manifest = (folder / MANIFEST_FILE).read_text()
    _change_shard(source, "train-00000-of-00002.npz")  # 260 kB more than the disk has left
    publish.push(str(source), url)
    code, output = _stage(url, small_disk, capsys)
    assert code == 2
    assert f"dataset '{url}': disk full: no space left on {small_disk}" in output
    _assert_intact(folder, manifest)


def test_a_full_run_trains_from_s3_and_a_second_run_stages_nothing(
        server: S3Server, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    env = server.env()
    url = f"s3://{bucket}/digits"
    pushed = run_cli("data", "push", "digits", url, home=tmp_path / "home", env=env)
    if "invalid choice: 'data'" in pushed.stderr:  # until pipelines/cli.py registers `data`
        monkeypatch.setattr(os, "environ", {**os.environ, **env})
        publish.push("digits", url)
    else:
        assert pushed.returncode == 0, pushed.stderr
    home = tmp_path / "home"
    results = []
    for epochs in ("20", "1"):
        completed = run_cli("run", "-q", "-o", "json", "-p", f"dataset={url}",
                            "-p", f"epochs={epochs}", home=home, env=env)
        assert completed.stdout, completed.stderr
        result = json.loads(completed.stdout)
        assert result["phase"] == "Succeeded", completed.stderr
        assert SECRET_KEY not in completed.stdout + completed.stderr
        results.append(result)
    nodes = {n["display_name"]: n for n in results[0]["nodes"]}
    assert float(nodes["evaluate"]["outputs"]["parameters"]["accuracy"]) >= 0.95
    logs = [_stage_log(home, result["name"]) for result in results]
    assert "transferred 4 files" in logs[0]
    assert "nothing to transfer" in logs[1] and "transferred 0 files, 0 bytes" in logs[1]
    assert all(SECRET_KEY not in log for log in logs)


def _stage_log(home: Path, run: str) -> str:
    for log in (home / "runs" / run / "nodes").glob("*/main.log"):
        text = log.read_text()
        if "stage-data:" in text:
            return text
    raise AssertionError(f"no stage-data log in run {run}")
