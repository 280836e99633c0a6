"""The staging engine on local folders (no server needed): incremental re-runs, atomic swap,
progress lines, the dataset entry point, the credentials helper."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sublimate.components.data import object_store
from sublimate.components.data.datasets import (
    METADATA_FILE,
    build_builtin,
    read_split,
    verify_dataset,
)
from sublimate.components.data.transfer import Progress
from sublimate.components.steps import stage_data
from sublimate.components.steps.stage_data import MANIFEST_FILE, dataset_id


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return build_builtin("digits", tmp_path / "published" / "digits")


def test_restage_of_an_unchanged_folder_transfers_nothing(source: Path, tmp_path: Path) -> None:
    first = stage_data.stage_dataset(str(source), tmp_path / "data")
    assert first.files_fetched == 4 and first.bytes_fetched == sum(
        p.stat().st_size for p in source.iterdir())
    again = stage_data.stage_dataset(str(source), tmp_path / "data")
    assert (again.files_fetched, again.bytes_fetched, again.files_reused) == (0, 0, 4)


def test_a_changed_source_is_noticed_and_swapped_in_whole(source: Path, tmp_path: Path) -> None:
    staged = stage_data.stage(f"file://{source}", tmp_path / "data")
    # Republish different content under the same URL.
    shutil.rmtree(source)
    build_builtin("digits", source)
    metadata = json.loads((source / METADATA_FILE).read_text())
    metadata["note"] = "v2"
    (source / METADATA_FILE).write_text(json.dumps(metadata))
    report = stage_data.stage_dataset(f"file://{source}", tmp_path / "data")
    assert METADATA_FILE in report.fetched
    assert json.loads((staged / METADATA_FILE).read_text())["note"] == "v2"
    verify_dataset(staged)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [staged.name]


def test_a_corrupt_source_is_refused_and_the_earlier_copy_kept(source: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture
                                                               ) -> None:
    staged = stage_data.stage(str(source), tmp_path / "data")
    before = (staged / MANIFEST_FILE).read_text()
    # The source now claims a digest that its shard does not have (a corrupt publish).
    metadata = json.loads((source / METADATA_FILE).read_text())
    metadata["splits"]["test"]["shards"][0]["sha256"] = "0" * 64
    (source / METADATA_FILE).write_text(json.dumps(metadata))
    assert stage_data.main(["--dataset", str(source), "--data-root", str(tmp_path / "data")]) == 2
    assert "content does not match its checksum" in capsys.readouterr().err
    assert (staged / MANIFEST_FILE).read_text() == before
    verify_dataset(staged)
    assert [p.name for p in (tmp_path / "data").iterdir()] == [staged.name]


def test_progress_line_reports_files_bytes_and_rate() -> None:
    lines: list[str] = []
    with Progress(10, 5_000_000, interval=0.05, out=lines.append) as progress:
        progress.add(2_500_000, files=5)
        import time

        time.sleep(0.2)
    assert lines and lines[-1].startswith("stage-data: 5/10 files, 2.5/5.0 MB, ")
    assert lines[-1].endswith(" MB/s")


def test_entry_point_dataset_is_built_once(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    dataset = "py:sublimate.components.examples.example_datasets:blobs"
    assert stage_data.main(["--dataset", dataset, "--data-root", str(tmp_path)]) == 0
    folder = tmp_path / dataset_id(dataset)
    assert folder.name.startswith("blobs-")
    metadata = verify_dataset(folder)
    assert metadata["num_classes"] == 6 and metadata["feature_shape"] == [20]
    assert len(read_split(folder, "test").y) == 600
    assert stage_data.main(["--dataset", dataset, "--data-root", str(tmp_path)]) == 0
    assert "nothing to transfer" in capsys.readouterr().out


@pytest.mark.parametrize(("dataset", "message"), [
    ("py:nowhere_module:fn", "cannot load nowhere_module:fn"),
    ("py:sublimate.components.examples.example_datasets", "expected py:module:function"),
    ("py:os:getcwd", "os:getcwd() must return a dict of split name -> datasets.Split"),
])
def test_bad_entry_points(tmp_path: Path, dataset: str, message: str,
                          capsys: pytest.CaptureFixture) -> None:
    assert stage_data.main(["--dataset", dataset, "--data-root", str(tmp_path)]) == 2
    assert f"stage-data: error: dataset '{dataset}': {message}" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_credentials_env_refers_to_the_secret_by_name_only() -> None:
    entries = object_store.credentials_env("team-s3")
    built = [entry.build() for entry in entries]
    names = [env.name for env in built]
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL_S3"} <= set(names)
    for env in built:
        ref = env.value_from.secret_key_ref
        assert (ref.name, ref.key, ref.optional, env.value) == ("team-s3", env.name, True, None)


def test_public_url_and_redact(monkeypatch: pytest.MonkeyPatch) -> None:
    assert object_store.public_url("https://user:pw@host/x") == "https://host/x"
    assert object_store.public_url("s3://bucket/x") == "s3://bucket/x"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret")
    assert object_store.redact("key very-secret leaked") == "key *** leaked"
