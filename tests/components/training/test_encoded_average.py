"""``FaultTolerance.average_encoded``: diloco's int8 and top-k payloads between replica groups,
all-gathered and decoded in group order; a healing group sends zeros, a failed all-gather
leaves the tensor as it was and drops the round (the Manager hears of it, the group is closed),
and the bytes are counted as an all-gather sends them. torchft's Manager and the gloo group are
stood in for (the real ones run end to end in tests/components/launch/test_per_step_diloco.py);
the rest of ``FaultTolerance`` is the real one."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from sublimate.components.monitoring.traffic import Traffic
from sublimate.components.paradigms.outer_codecs import Int8Codec
from sublimate.components.training.fault_tolerance import FaultTolerance


class ScriptedManager:
    def __init__(self, participating: bool = True, participants: int = 2,
                 error: Exception | None = None) -> None:
        self.participating, self.participants, self.error = participating, participants, error
        self.reported: list[Exception] = []

    def errored(self) -> Exception | None:
        return self.error or (self.reported[0] if self.reported else None)

    def wait_quorum(self) -> None:
        pass

    def num_participants(self) -> int:
        return self.participants

    def is_participating(self) -> bool:
        return self.participating

    def report_error(self, error: Exception) -> None:
        self.reported.append(error)


class Done:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error

    def wait(self) -> None:
        if self.error is not None:
            raise self.error


class TwoGroups:
    """The gloo group between two replica groups, this one first: its peer's payload is
    ``peer``; ``error``: the all-gather fails (a peer lost in it)."""

    def __init__(self, peer: torch.Tensor, error: Exception | None = None) -> None:
        self.peer, self.error = peer, error
        self.sent: list[torch.Tensor] = []
        self.closed = False

    def size(self) -> int:
        return 2

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  options: Any) -> Done:
        self.sent.append(inputs[0].clone())
        outputs[0][0].copy_(inputs[0])
        outputs[0][1].copy_(self.peer)
        return Done(self.error)

    def close_after_error(self) -> None:
        self.closed = True


CODEC = Int8Codec(block=2)
MINE = torch.tensor([127.0, -3.0, 63.5, 0.5])  # scales 1 and 0.5: sent exactly
PEERS = torch.tensor([-127.0, 1.0, 0.0, 0.0])


def _groups(manager: ScriptedManager, group: TwoGroups) -> FaultTolerance:
    ft = FaultTolerance.__new__(FaultTolerance)  # no torchft: the Manager is scripted
    ft.manager, ft.process_group, ft.group_world = manager, group, 1  # type: ignore[assignment]
    ft.traffic = Traffic()
    return ft


def _average(ft: FaultTolerance) -> torch.Tensor:
    out = torch.full((4,), 9.0)
    ft.average_encoded(CODEC.encode(MINE), lambda sent: CODEC.decode(sent, 4), out)
    return out


def test_the_groups_payloads_are_decoded_and_averaged_and_counted() -> None:
    group = TwoGroups(CODEC.encode(PEERS))
    ft = _groups(ScriptedManager(), group)
    assert torch.equal(_average(ft), torch.tensor([0.0, -1.0, 31.75, 0.25]))
    assert torch.equal(group.sent[0], CODEC.encode(MINE))
    # 2 scales and 4 values, sent to the one other group
    assert ft.traffic == Traffic(payload_bytes=12, wire_bytes=12.0, collectives=1)


def test_a_healing_group_sends_zeros_and_takes_the_participants_mean() -> None:
    group = TwoGroups(CODEC.encode(PEERS))
    ft = _groups(ScriptedManager(participating=False, participants=1), group)
    assert torch.equal(_average(ft), torch.tensor([-127.0, 1.0, 0.0, 0.0]))
    assert not group.sent[0].any()


@pytest.mark.parametrize("where", ["in the all-gather", "before it"])
def test_a_failure_leaves_the_tensor_and_drops_the_round(where: str) -> None:
    lost = RuntimeError("Connection closed by peer")
    if where == "before it":  # an earlier collective of the round failed: nothing is sent
        manager, group = ScriptedManager(error=lost), TwoGroups(CODEC.encode(PEERS))
    else:
        manager, group = ScriptedManager(), TwoGroups(CODEC.encode(PEERS), error=lost)
    ft = _groups(manager, group)
    assert torch.equal(_average(ft), torch.full((4,), 9.0))
    assert manager.errored() is lost  # the commit says False
    assert group.closed == (where == "in the all-gather")  # its peers fail too, at once
    assert len(group.sent) == (1 if where == "in the all-gather" else 0)
