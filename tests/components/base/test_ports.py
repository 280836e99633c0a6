"""The ports a launcher chooses for servers that its job binds later (base.ports)."""

from __future__ import annotations

import socket

import pytest

from sublimate.components.base import ports


def test_a_chosen_port_is_below_the_range_outgoing_connections_take_theirs_from() -> None:
    # bind(0) and every connect() draw from the ephemeral range: a port from it, chosen seconds
    # before the job's server binds it, could be taken meanwhile (EADDRINUSE in a CI run)
    low, _ = ports.ephemeral_range()
    chosen = {ports.free_port() for _ in range(50)}
    assert all(ports.LOWEST <= port < low for port in chosen), sorted(chosen)
    assert len(chosen) > 1  # drawn at random: two launchers rarely meet on one


def test_a_port_in_use_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setattr(ports, "LOWEST", busy)
        monkeypatch.setattr(ports, "ephemeral_range", lambda: (busy + ports.TRIES, busy + 99))
        # every draw starts with the busy port where it can: it must be passed over
        monkeypatch.setattr(ports.random, "sample", lambda population, k: sorted(population)[:k])
        assert ports.free_port() == busy + 1


def test_without_room_below_the_range_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (ports.LOWEST + 3, 60999))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", ports.free_port()))  # free: it binds
