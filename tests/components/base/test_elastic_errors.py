"""torchrun's error files: a failing process writes why, the launcher reads the first failure."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from sublimate.components.base.elastic_errors import (
    ERROR_FILE_ENV,
    log_dir,
    read_failures,
    recorded,
)


def _error_file(run_dir: Path, node: int, job: str = "job-1", restart: int = 0,
                local_rank: int = 0) -> Path:
    # torchrun's job folder: the job's id, "_" and 8 random characters ("_" among them)
    folder = log_dir(run_dir, str(node)) / f"{job}_a_b1c2d3" / f"attempt_{restart}" / \
        str(local_rank)
    folder.mkdir(parents=True)
    return folder / "error.json"


@pytest.fixture
def rank(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Act as rank R of node N: torchrun's variables and an error file under the run folder."""
    def become(rank: int, node: int, **where: object) -> Path:
        path = _error_file(tmp_path, node, **where)  # type: ignore[arg-type]
        for name, value in (("RANK", rank), ("GROUP_RANK", node), ("LOCAL_RANK", 0),
                            (ERROR_FILE_ENV, path)):
            monkeypatch.setenv(name, str(value))
        return path
    return become


def test_an_exception_is_written_with_its_rank_and_raised(rank, tmp_path: Path) -> None:
    path = rank(1, 1)

    @recorded
    def main() -> int:
        raise ValueError("bad shape")

    with pytest.raises(SystemExit) as exited:  # printed, and the status an uncaught one has
        main()
    assert exited.value.code == 1
    written = json.loads(path.read_text())["message"]
    # torch's own format (torchrun's report reads it), plus the rank and a precise time
    assert written["message"] == "ValueError: bad shape"
    assert "raise ValueError" in written["extraInfo"]["py_callstack"]
    assert int(written["extraInfo"]["timestamp"]) == int(float(written["extraInfo"]["time"]))
    (failure,) = read_failures(tmp_path)
    assert (failure.rank, failure.node, failure.app_id, failure.who) == (
        1, 1, "job-1", "rank 1 (node1)")


def test_an_exit_with_an_error_is_written_with_what_the_program_said(rank, tmp_path) -> None:
    """A missing argument: argparse prints its error and exits 2; that line is the message."""
    rank(0, 0)

    @recorded
    def main() -> int:
        parser = argparse.ArgumentParser(prog="train.py")
        parser.add_argument("--lr", required=True)
        parser.parse_args([])
        return 0

    with pytest.raises(SystemExit):
        main()
    (failure,) = read_failures(tmp_path)
    assert failure.message == \
        "exited with code 2: train.py: error: the following arguments are required: --lr"


def test_a_flag_the_shell_emptied_says_to_quote_the_entrypoint_args(rank, tmp_path) -> None:
    """`-p entrypoint-args="--data $SUBLIMATE_DATA_DIR"`: the user's shell emptied the
    variable, the program got `--data` alone; the message says what to change."""
    rank(0, 0)

    @recorded
    def main() -> int:
        parser = argparse.ArgumentParser(prog="train.py")
        parser.add_argument("--data")
        parser.parse_args(["--data"])
        return 0

    with pytest.raises(SystemExit):
        main()
    (failure,) = read_failures(tmp_path)
    assert failure.message.startswith(
        "exited with code 2: train.py: error: argument --data: expected one argument")
    assert failure.message.endswith("Put the value in single quotes: in double quotes your "
                                    "shell replaced the variable with nothing)")


def test_a_clean_exit_writes_nothing_and_a_failing_code_does(rank, tmp_path: Path) -> None:
    rank(0, 0)
    assert recorded(lambda: 0)() == 0
    with pytest.raises(SystemExit):
        recorded(lambda: exit(0))()
    assert read_failures(tmp_path) == []
    assert recorded(lambda: 3)() == 3
    assert read_failures(tmp_path)[0].message == "exited with code 3"


def test_the_first_failure_comes_first_whatever_the_files_order(rank, tmp_path) -> None:
    """The rank that raised, then the peer that lost its connection to it (written later, on
    node 0: the files' own order is no guide); a file of torch's own @record (whole seconds, no
    rank) after every precise time of its second."""
    for who, error in ((1, ValueError("first")), (0, RuntimeError("then"))):
        rank(who, who, job="job-2")

        @recorded
        def fails(raised: Exception = error) -> None:
            raise raised

        with pytest.raises(SystemExit):
            fails()
    torch_own = _error_file(tmp_path, 2, job="job-2")
    torch_own.write_text(json.dumps({"message": {"message": "OSError: x", "extraInfo": {
        "py_callstack": "", "timestamp": str(int(read_failures(tmp_path)[0].time))}}}))
    failures = read_failures(tmp_path, "job-2")
    assert [(f.rank, f.message) for f in failures] == [
        (1, "ValueError: first"), (0, "RuntimeError: then"), (None, "OSError: x")]
    assert failures[2].who == "local rank 0 of node2"
    assert read_failures(tmp_path, "another-job") == []
