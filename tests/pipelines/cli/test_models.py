"""`sublimate models ls|show|promote|rollback|history`, run as the real CLI in a child process."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from sublimate.components.model.registry import Registry
from tests.conftest import run_cli
from tests.s3_server import S3Server


def local_registry(home: Path) -> Path:
    """Where `sublimate run` leaves /mnt/sublimate/registry on the local shared volume."""
    return home / "volumes" / "sublimate-data" / "registry"


def publish(registry: Registry, folder: Path, accuracy: float) -> str:
    folder.mkdir(parents=True)
    (folder / "model.pt").write_bytes(os.urandom(2048))
    (folder / "metrics.json").write_text(json.dumps({"accuracy": accuracy, "loss": 0.3,
                                                     "seconds": 1.5}))
    return registry.publish(folder, {"metric": "accuracy", "workflow": {"name": "wf-a"},
                                     "dataset": {"url": "s3://data/digits"}}).id


def one_line_error(result, *expected: str) -> None:
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for text in expected:
        assert text in lines[0], (text, lines[0])


def test_ls_promote_show_rollback_on_the_local_volume(home: Path, tmp_path: Path) -> None:
    registry = Registry(local_registry(home))
    empty = run_cli("models", "ls", home=home)
    assert empty.returncode == 0 and "no versions" in empty.stdout, empty.stderr
    first = publish(registry, tmp_path / "a", 0.91)
    second = publish(registry, tmp_path / "b", 0.95)

    listed = run_cli("models", "ls", home=home)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["VERSION", "CREATED", "METRICS"]
    assert first in lines[1] and "accuracy=0.91" in lines[1] and "seconds" not in lines[1]
    assert second in lines[2] and not lines[1].startswith("*")

    promoted = run_cli("models", "promote", first[:-2], "--reason", "first one", home=home)
    assert promoted.returncode == 0 and f"{first} is now the champion" in promoted.stdout, \
        promoted.stderr  # a unique prefix names it
    assert run_cli("models", "promote", second, home=home).returncode == 0
    again = run_cli("models", "promote", second, home=home)
    assert "already the champion" in again.stdout

    wide = run_cli("models", "ls", "-o", "wide", home=home).stdout.splitlines()
    assert wide[0].split()[-4:] == ["WORKFLOW", "DATASET", "SIZE", "FILES"]
    assert wide[2].startswith("*") and "wf-a" in wide[2] and "s3://data/digits" in wide[2]

    shown = run_cli("models", "show", "champion", home=home)
    assert shown.returncode == 0, shown.stderr
    assert f"version:  {second}  (champion)" in shown.stdout and "model.pt" in shown.stdout
    as_json = json.loads(run_cli("models", "show", first, "-o", "json", home=home).stdout)
    assert as_json["id"] == first and as_json["champion"] is False
    assert as_json["lineage"]["workflow"] == {"name": "wf-a"}

    rolled = run_cli("models", "rollback", "--reason", "b misbehaves", home=home)
    assert rolled.returncode == 0 and f"{first} is the champion" in rolled.stdout, rolled.stderr
    versions = json.loads(run_cli("models", "ls", "-o", "json", home=home).stdout)
    assert [(v["id"], v["champion"]) for v in versions] == [(first, True), (second, False)]
    history = json.loads(run_cli("models", "history", "-o", "json", home=home).stdout)
    assert [(e["action"], e["version"], e["reason"]) for e in history] == [
        ("promote", first, "first one"), ("promote", second, "promoted by hand"),
        ("rollback", first, "b misbehaves")]
    assert Registry(local_registry(home)).champion().id == first  # type: ignore[union-attr]


def test_refusals_are_one_line_naming_what_to_fix(home: Path, tmp_path: Path) -> None:
    registry = local_registry(home)
    one_line_error(run_cli("models", "rollback", home=home), str(registry),
                   "no champion to roll back from")
    one_line_error(run_cli("models", "show", "champion", home=home), "no champion yet")
    missing = "20200101T000000Z-deadbeef"
    one_line_error(run_cli("models", "promote", missing, home=home), missing, str(registry),
                   "sublimate models ls")
    publish(Registry(registry), tmp_path / "a", 0.9)
    publish(Registry(registry), tmp_path / "b", 0.9)
    one_line_error(run_cli("models", "promote", "20", home=home), "matches 2 versions")
    one_line_error(run_cli("models", "promote", "nonsense", home=home), "no version 'nonsense'")
    usage = run_cli("models", "promote", home=home)
    assert usage.returncode == 2 and "VERSION" in usage.stderr


def test_registry_on_s3_by_flag_and_environment(home: Path, tmp_path: Path,
                                                s3_env: S3Server) -> None:
    bucket = f"models-{uuid.uuid4().hex[:12]}"
    s3_env.filesystem().mkdir(bucket)
    url = f"s3://{bucket}/registry"
    version = publish(Registry(url), tmp_path / "a", 0.97)

    by_flag = run_cli("models", "promote", version, "--registry", url, home=home)
    assert by_flag.returncode == 0, by_flag.stderr
    by_env = run_cli("models", "ls", home=home, env={"SUBLIMATE_REGISTRY": url})
    assert by_env.returncode == 0 and by_env.stdout.splitlines()[1].startswith(f"*  {version}")
    assert s3_env.env()["AWS_SECRET_ACCESS_KEY"] not in by_env.stdout + by_env.stderr

    one_line_error(run_cli("models", "ls", "--registry", "s3://no-such-bucket-zz/r", home=home),
                   "s3://no-such-bucket-zz/r", "bucket 'no-such-bucket-zz' does not exist",
                   "create the bucket")
