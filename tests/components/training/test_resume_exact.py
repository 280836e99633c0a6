"""A run that is killed and resumed ends with exactly the model of a run that never stopped, for
every paradigm: the CPU path is deterministic, so anything a checkpoint forgets (optimizer
momentum, a block start, the center, the parameter server's clocks, the data position, the RNG)
shows up as a difference in the bits."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.conftest import env_flags, run_cli

# 132 steps: 132 % 8 leaves a partial BMUF/EASGD block at the end; commits every 20 steps, so
# the kill at step 30 resumes from step 20, in the middle of the block that began at step 16.
# the restart path: a killed worker resumes from the last checkpoint (per-step recovery, the
# default on two nodes, would go on without it instead)
COMMON = ("-p", "epochs=6", "-p", "checkpoint-every=20", "-p", "eval-every-epoch=false",
          "-p", "recovery=restart")
KILL_AT = "30"


def _run(home: Path, run_id: str, *params: str, env: dict[str, str] | None = None,
         ) -> tuple[int, str]:
    # the faults reach the steps only when passed (--env), as a user passes them
    result = run_cli("run", "-p", f"run-id={run_id}", *COMMON, *params, *env_flags(env),
                     home=home, timeout=420)
    return result.returncode, result.stdout + result.stderr


def _model(home: Path, run_id: str) -> dict[str, torch.Tensor]:
    path = home / "volumes" / "sublimate-data" / "runs" / run_id / "model.pt"
    return torch.load(path, weights_only=True)["state_dict"]


def _assert_same_bits(home: Path, resumed: str, clean: str) -> None:
    got, expected = _model(home, resumed), _model(home, clean)
    assert got.keys() == expected.keys()
    differing = [name for name in expected if not torch.equal(got[name], expected[name])]
    assert not differing, f"the resumed model differs from the uninterrupted one in {differing}"


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The home of an uninterrupted run of a paradigm (run id ``clean-<algorithm>``), made
    once for the module: the sync one is the oracle of two tests."""
    home = tmp_path_factory.mktemp("clean-runs") / "home"
    made: set[str] = set()

    def of(algorithm: str) -> Path:
        if algorithm not in made:
            code, log = _run(home, f"clean-{algorithm}", "-p", f"algorithm={algorithm}")
            assert code == 0, log[-3000:]
            made.add(algorithm)
        return home

    return of


@pytest.mark.parametrize("algorithm", ["sync", "bmuf", "easgd"])
def test_a_killed_worker_resumes_to_the_uninterrupted_model_bit_for_bit(
        clean_run: Callable[[str], Path], algorithm: str) -> None:
    home = clean_run(algorithm)
    code, log = _run(home, f"killed-{algorithm}", "-p", f"algorithm={algorithm}",
                     "-p", "max-restarts=1",
                     env={"SUBLIMATE_FAIL_AT_STEP": KILL_AT, "SUBLIMATE_FAIL_RANK": "1"})
    assert code == 0, log[-3000:]
    assert f"fault injection: killing rank 1 at step {KILL_AT}" in log
    assert re.search(r"resumed from checkpoint at step 20/132", log), log[-3000:]
    _assert_same_bits(home, f"killed-{algorithm}", f"clean-{algorithm}")


def test_a_kill_during_a_checkpoint_write_resumes_from_the_previous_commit(
        clean_run: Callable[[str], Path]) -> None:
    """Rank 1 dies halfway through writing its file of step 40: the step is never committed,
    the half file is never read, the run resumes from step 20 and ends bit-identical; the
    half-written file is gone once its step folder is pruned."""
    home = clean_run("sync")  # the default paradigm
    code, log = _run(home, "torn", "-p", "max-restarts=1",
                     env={"SUBLIMATE_FAIL_DURING_CHECKPOINT": "40", "SUBLIMATE_FAIL_RANK": "1"})
    assert code == 0, log[-3000:]
    assert "killing rank 1 while it writes its checkpoint of step 40" in log
    assert re.search(r"resumed from checkpoint at step 20/132", log), log[-3000:]
    _assert_same_bits(home, "torn", "clean-sync")
    checkpoints = home / "volumes" / "sublimate-data" / "runs" / "torn" / "checkpoints"
    assert sorted(path.name for path in checkpoints.iterdir() if path.is_dir()) == [
        "step-000000120", "step-000000132"]
    assert not [path for path in checkpoints.rglob(".*") if path.is_file()]


def test_an_async_run_resubmitted_after_a_kill_ends_bit_for_bit(tmp_path: Path) -> None:
    """One trainer (with two, the order of their pushes is the network's, never the same
    twice): the trainer is killed, the run fails; the same run-id resumes from the parameter
    server's checkpoint (model, optimizer, version and clocks of one moment) to the same bits."""
    home = tmp_path / "home"
    code, log = _run(home, "clean", "-p", "algorithm=async", "-p", "nodes=1")
    assert code == 0, log[-3000:]
    code, log = _run(home, "killed", "-p", "algorithm=async", "-p", "nodes=1",
                     env={"SUBLIMATE_FAIL_AT_STEP": KILL_AT, "SUBLIMATE_FAIL_RANK": "0"})
    assert code != 0 and f"killing rank 0 at step {KILL_AT}" in log, log[-3000:]
    code, log = _run(home, "killed", "-p", "algorithm=async", "-p", "nodes=1")
    assert code == 0, log[-3000:]
    resumed = re.search(r"resumed parameter server at update (\d+)", log)
    assert resumed and 0 < int(resumed.group(1)) <= int(KILL_AT), log[-3000:]
    _assert_same_bits(home, "killed", "clean")
