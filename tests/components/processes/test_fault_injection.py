"""The workers' fault injection must fail a node the way a real failure does, and no other way:
a process killed in a step's all-reduce was in that step's collective, and its peers' collective
fails for it."""

from __future__ import annotations

import signal

import pytest
import torch

from sublimate.components.paradigms.sync_sgd import SyncSGD
from sublimate.components.processes import fault_injection


class _RecordingManager:
    """torchft's Manager as far as the injection uses it: what it was asked, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def wait_quorum(self) -> None:
        self.calls.append("wait_quorum")

    def allreduce(self, tensor: torch.Tensor) -> None:
        self.calls.append("allreduce")


def test_a_node_killed_in_the_all_reduce_is_in_its_quorum_and_sends_nothing(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # In the step's quorum, the peers' all-reduce waits for this process's share. Sending it
    # first let that all-reduce complete before the kill landed when the peers were already in
    # it (CI run 28: no peer dropped the step); a share of another size aborts the peer
    # that receives it (gloo: "Received data size doesn't match expected size").
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    model[0].bias.requires_grad_(False)  # not all-reduced: not trainable
    manager = _RecordingManager()
    monkeypatch.setattr(fault_injection.os, "kill",
                        lambda pid, sig: manager.calls.append(f"kill {sig}"))
    paradigm = SyncSGD(model, torch.optim.SGD(model.parameters(), lr=0.1), {})
    fault_injection.kill_in_allreduce(manager, paradigm.averaged_parameters(), slot=1, step=40)
    assert manager.calls == ["wait_quorum", f"kill {signal.SIGKILL}"]
    assert capsys.readouterr().out == ("fault injection: killing slot 1 during the all-reduce of "
                                       f"step 40 ({7 * 5 + 5 * 3 + 3} values that it will not "
                                       "send)\n")
