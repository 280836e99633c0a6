"""`sublimate data push/ls`, through the installed `sublimate` command in a child process.

Nothing here builds a parser of its own or calls the handlers directly: a `data` command that
the real CLI stopped registering, a handler wired to the wrong function, an exit code or a
message lost on the way out, or a broken console-script entry point all fail these tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from sublimate.components.data.datasets import build_builtin, verify_dataset
from sublimate.pipelines.cli.common import EXIT_USAGE
from tests.s3_server import SECRET_KEY, S3Server

# The console script `pip install -e .` puts next to this interpreter ([project.scripts]).
SUBLIMATE = Path(sys.executable).with_name("sublimate")


def sublimate(*argv: str, home: Path) -> subprocess.CompletedProcess[str]:
    """`sublimate ARGV` as a user types it, in this environment (AWS_* settings included)."""
    assert SUBLIMATE.is_file(), f"{SUBLIMATE} is missing: the package is not installed " \
                                "(pip install -e .)"
    return subprocess.run([str(SUBLIMATE), *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SUBLIMATE_HOME": str(home)}, check=False)


def test_push_a_builtin_to_a_folder_url_and_list_it(tmp_path: Path) -> None:
    pushed = sublimate("data", "push", "digits", f"file://{tmp_path}/pub/digits", home=tmp_path)
    assert pushed.returncode == 0, pushed.stderr
    assert "pushed 4 files" in pushed.stdout
    verify_dataset(tmp_path / "pub" / "digits")
    listed = sublimate("data", "ls", f"file://{tmp_path}/pub/digits", home=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "metadata.json" in listed.stdout and "digits: test=359, train=1438" in listed.stdout


def test_push_of_a_folder_that_is_not_a_dataset_is_refused(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    refused = sublimate("data", "push", str(tmp_path / "raw"), f"file://{tmp_path}/out",
                        home=tmp_path)
    assert refused.returncode == EXIT_USAGE
    assert refused.stderr.startswith("error: ") and \
        "incomplete: metadata.json is missing" in refused.stderr
    unknown = sublimate("data", "push", "nope", f"file://{tmp_path}/out", home=tmp_path)
    assert unknown.returncode == EXIT_USAGE
    assert "error: 'nope' is neither a built-in dataset" in unknown.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_push_requires_both_arguments(tmp_path: Path) -> None:
    missing = sublimate("data", "push", "digits", home=tmp_path)
    assert missing.returncode == 2  # argparse's usage error
    assert "usage: sublimate data push" in missing.stderr
    assert "the following arguments are required: URL" in missing.stderr


def test_push_to_s3_creates_the_bucket_on_request(s3_env: S3Server, tmp_path: Path) -> None:
    bucket = f"cli-{uuid.uuid4().hex[:10]}"
    refused = sublimate("data", "push", "digits", f"s3://{bucket}/digits", home=tmp_path)
    assert refused.returncode == EXIT_USAGE
    assert f"bucket '{bucket}' does not exist" in refused.stderr
    source = build_builtin("digits", tmp_path / "mine")
    pushed = sublimate("data", "push", str(source), f"s3://{bucket}/digits", "--create-bucket",
                       home=tmp_path)
    assert pushed.returncode == 0, pushed.stderr
    listed = sublimate("data", "ls", f"s3://{bucket}/digits", home=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "digits: test=359, train=1438" in listed.stdout
    for completed in (refused, pushed, listed):
        assert SECRET_KEY not in completed.stdout + completed.stderr
    fs = s3_env.filesystem()
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{bucket}/digits")) == sorted(
        p.name for p in source.iterdir())


def test_refused_credentials_are_one_clear_error(s3_env: S3Server, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-right-one")
    refused = sublimate("data", "push", "digits", "s3://anything/digits", home=tmp_path)
    assert refused.returncode == EXIT_USAGE
    assert refused.stderr.startswith(
        "error: dataset 's3://anything/digits': credentials refused"), refused.stderr
    assert "not-the-right-one" not in refused.stdout + refused.stderr
    assert "Traceback" not in refused.stderr  # one line, not a stack
