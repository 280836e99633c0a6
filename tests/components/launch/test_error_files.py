"""A replica's error file read while torchrun writes it, or left half written by a node killed
mid-write: the job's status is still answered (TorchX's own reader raised ``JSONDecodeError``
out of ``describe``, which ended the launcher and failed a job that recovery would have carried
on: a CI run saw it when node 0 of an elastic job was killed)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from torchx import specs
from torchx.runner import Runner

from sublimate.components.launch.local_cwd_scheduler import create_local_cwd_scheduler
from sublimate.components.launch.netns_scheduler import create_scheduler as create_netns
from tests.components.launch.test_netns_scheduler import missing_prerequisite
from tests.conftest import require

# The worker writes what a node killed mid-write leaves: the first bytes of torchrun's JSON.
HALF_WRITTEN = '{"message": {"message": "RuntimeError: lo'
WORKER = f"""
import os, sys
with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
    f.write({HALF_WRITTEN!r})
sys.exit(1)
"""


@pytest.mark.parametrize("scheduler", ["local_cwd", "local_netns"])
def test_a_half_written_error_file_is_passed_on_not_raised(scheduler: str,
                                                           tmp_path: Path) -> None:
    if scheduler == "local_netns":
        reason = missing_prerequisite()
        require(reason is None, f"{reason} (CI runs these tests as root)")
    role = specs.Role("node", image="", entrypoint=sys.executable, args=["-c", WORKER],
                      num_replicas=1, env={"TORCHELASTIC_ERROR_FILE": str(tmp_path / "error.json")})
    with Runner("torchx", {"local_cwd": create_local_cwd_scheduler,
                           "local_netns": create_netns}) as runner:
        handle = runner.run(specs.AppDef("half-written", roles=[role]), scheduler,
                            cfg={"log_dir": str(tmp_path / "logs")})
        end = time.monotonic() + 60
        status = runner.status(handle)
        while status is not None and not status.is_terminal() and time.monotonic() < end:
            time.sleep(0.05)
            status = runner.status(handle)
    assert status is not None and status.state == specs.AppState.FAILED
    assert status.structured_error_msg == HALF_WRITTEN
