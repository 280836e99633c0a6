from __future__ import annotations

from pathlib import Path

import pytest

from sublimate.components.data.datasets import build_builtin, verify_dataset
from sublimate.components.steps.stage_data import dataset_id, main


def test_stages_builtin_and_writes_output(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    output = tmp_path / "out" / "dataset-dir"
    assert main(["--dataset", "digits", "--data-root", str(tmp_path / "data"),
                 "--output-path", str(output)]) == 0
    assert output.read_text() == str(tmp_path / "data" / "digits")
    verify_dataset(Path(output.read_text()))
    assert main(["--dataset", "digits", "--data-root", str(tmp_path / "data")]) == 0
    assert "nothing to transfer" in capsys.readouterr().out


@pytest.mark.parametrize("as_url", [False, True])
def test_stages_a_local_dataset_folder(tmp_path: Path, as_url: bool) -> None:
    source = build_builtin("digits", tmp_path / "published" / "my-digits")
    dataset = f"file://{source}" if as_url else str(source)
    output = tmp_path / "dataset-dir"
    assert main(["--dataset", dataset, "--data-root", str(tmp_path / "data"),
                 "--output-path", str(output)]) == 0
    staged = Path(output.read_text())
    assert staged.parent == tmp_path / "data" and staged.name == dataset_id(dataset)
    assert staged.name.startswith("my-digits-")
    assert verify_dataset(staged) == verify_dataset(source)


def test_missing_path_fails_clearly_and_leaves_nothing(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    data_root = tmp_path / "data"
    assert main(["--dataset", f"file://{tmp_path}/nope", "--data-root", str(data_root)]) == 2
    assert f"dataset 'file://{tmp_path}/nope': no such directory" in capsys.readouterr().err
    assert not data_root.exists() or not any(data_root.iterdir())


def test_folder_without_metadata_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "x.csv").write_text("1,2\n")
    assert main(["--dataset", str(tmp_path / "raw"), "--data-root", str(tmp_path / "d")]) == 2
    assert "not a sublimate dataset (metadata.json is missing" in capsys.readouterr().err
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())


def test_unknown_name_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--dataset", "mnist", "--data-root", str(tmp_path)]) == 2
    assert "'mnist' is neither a built-in dataset (digits, mnist1d)" in capsys.readouterr().err
