"""The workers' fault injection must fail a node the way a real failure does, and no other way:
a process killed in a step's all-reduce was in that step's collective, with the step's payload."""

from __future__ import annotations

import signal

import pytest
import torch

from sublimate.components.paradigms.sync_sgd import SyncSGD
from sublimate.components.processes import fault_injection


class _RecordingManager:
    """torchft's Manager as far as the injection uses it: what it was asked to all-reduce."""

    def __init__(self) -> None:
        self.payloads: list[torch.Tensor] = []

    def allreduce(self, tensor: torch.Tensor) -> None:
        self.payloads.append(tensor)


def test_a_node_killed_in_the_all_reduce_sends_the_steps_own_payload(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The peers all-reduce the flat gradient of the trainable parameters (sync_sgd's
    # average_gradients). A payload of another length is a collective mismatch: gloo aborts the
    # peer that receives it ("Received data size doesn't match expected size") instead of
    # failing its step, and a run that should lose one node lost two (CI, twice).
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    model[0].bias.requires_grad_(False)  # not all-reduced: not trainable
    kills: list[tuple[int, int]] = []
    monkeypatch.setattr(fault_injection.os, "kill", lambda pid, sig: kills.append((pid, sig)))
    manager = _RecordingManager()
    paradigm = SyncSGD(model, torch.optim.SGD(model.parameters(), lr=0.1), {})
    fault_injection.kill_in_allreduce(manager, paradigm.averaged_parameters(), slot=1, step=40)
    (payload,) = manager.payloads
    assert payload.numel() == 7 * 5 + 5 * 3 + 3
    assert payload.dtype == torch.float32
    assert [sig for _, sig in kills] == [signal.SIGKILL]
