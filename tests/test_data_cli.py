"""`sublimate data push/ls`, on a parser built here as the main CLI builds its own."""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path

import pytest

from sublimate.components.datasets import build_builtin, verify_dataset
from sublimate.pipelines.cli import UsageError
from sublimate.pipelines.cli.data import add_data_commands
from tests.s3_server import SECRET_KEY, S3Server


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="sublimate")
    add_data_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


def test_push_a_builtin_to_a_folder_url_and_list_it(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    assert _cli("data", "push", "digits", f"file://{tmp_path}/pub/digits") == 0
    assert "pushed 4 files" in capsys.readouterr().out
    verify_dataset(tmp_path / "pub" / "digits")
    assert _cli("data", "ls", f"file://{tmp_path}/pub/digits") == 0
    out = capsys.readouterr().out
    assert "metadata.json" in out and "digits: test=359, train=1438" in out


def test_push_of_a_folder_that_is_not_a_dataset_is_refused(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    with pytest.raises(UsageError, match=r"incomplete: metadata.json is missing"):
        _cli("data", "push", str(tmp_path / "raw"), f"file://{tmp_path}/out")
    with pytest.raises(UsageError, match=r"'nope' is neither a built-in dataset"):
        _cli("data", "push", "nope", f"file://{tmp_path}/out")


def test_push_requires_both_arguments() -> None:
    with pytest.raises(SystemExit):
        _cli("data", "push", "digits")


def test_push_to_s3_creates_the_bucket_on_request(s3_env: S3Server, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    bucket = f"cli-{uuid.uuid4().hex[:10]}"
    with pytest.raises(UsageError, match=rf"bucket '{bucket}' does not exist"):
        _cli("data", "push", "digits", f"s3://{bucket}/digits")
    source = build_builtin("digits", tmp_path / "mine")
    assert _cli("data", "push", str(source), f"s3://{bucket}/digits", "--create-bucket") == 0
    assert _cli("data", "ls", f"s3://{bucket}/digits") == 0
    out = capsys.readouterr().out
    assert "digits: test=359, train=1438" in out and SECRET_KEY not in out
    fs = s3_env.filesystem()
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{bucket}/digits")) == sorted(
        p.name for p in source.iterdir())


def test_refused_credentials_are_one_clear_error(s3_env: S3Server,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-right-one")
    with pytest.raises(UsageError) as raised:
        _cli("data", "push", "digits", "s3://anything/digits")
    message = str(raised.value)
    assert message.startswith("dataset 's3://anything/digits': credentials refused")
    assert "not-the-right-one" not in message
