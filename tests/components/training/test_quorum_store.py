"""The group between replica groups (``fail_fast_gloo``): the quorum's store reached before a
group reconfigures on it, and a new group built within its connect bound, not the collective
timeout."""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import pytest
import torch
from torch.distributed import TCPStore

from sublimate.components.training.fail_fast_gloo import CONNECT_SECONDS, FailFastGloo

# The collective timeout torchft's own group would wait for a store or a peer that is gone.
COLLECTIVE = timedelta(seconds=120)


def _store() -> TCPStore:
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                    timeout=timedelta(seconds=30))


def test_a_store_whose_group_is_gone_fails_the_reconfiguration_at_once() -> None:
    with socket.socket() as closed:  # a port nothing listens on: the store's node is gone
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    process_group = FailFastGloo(COLLECTIVE)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=f"the quorum's store at 127.0.0.1:{port} does not "
                                           "answer"):
        process_group.configure(f"127.0.0.1:{port}/torchft/1/0", "node0", 0, 1)
    # Refused, not waited for: well within the check's own bound, let alone the 2 x 120 s.
    assert time.monotonic() - started < CONNECT_SECONDS


def test_a_quorum_member_that_never_connects_fails_the_group_within_the_connect_bound() -> None:
    # A group of the quorum killed after the Lighthouse named it: its address never reaches
    # the store. torchft's group waited the collective timeout for it (a DiLoCo survivor sat
    # 30 s in _create_pg while two replacements formed a quorum without it).
    store = _store()
    process_group = FailFastGloo(COLLECTIVE, connect_seconds=1.0)
    process_group.configure(f"127.0.0.1:{store.port}/torchft/1/0", "node0", 0, 1)  # the first
    started = time.monotonic()
    with pytest.raises(RuntimeError):
        process_group.configure(f"127.0.0.1:{store.port}/torchft/2/0", "node0", 0, 2)
    assert time.monotonic() - started < 10  # the bound (1 s) and gloo's own retries, not 120 s


def test_a_group_built_within_the_bound_gets_the_collective_timeout() -> None:
    store = _store()
    process_group = FailFastGloo(COLLECTIVE, connect_seconds=1.0)
    process_group.configure(f"127.0.0.1:{store.port}/torchft/1/0", "node0", 0, 1)
    # the second group is the one built within the bound: its collectives get the full timeout
    process_group.configure(f"127.0.0.1:{store.port}/torchft/2/0", "node0", 0, 1)
    backend = process_group.parent._get_backend(torch.device("cpu"))
    assert backend.options._timeout == COLLECTIVE
    tensor = torch.tensor([3.0])
    process_group.allreduce([tensor], torch.distributed.AllreduceOptions()).wait()
    assert tensor.item() == 3.0


def test_closing_after_an_error_drops_the_group_once() -> None:
    store = _store()
    process_group = FailFastGloo(COLLECTIVE)
    process_group.configure(f"127.0.0.1:{store.port}/torchft/1/0", "node0", 0, 1)
    process_group.close_after_error()
    process_group.close_after_error()  # a second failed collective of the same step
    assert process_group._pg is None and process_group.closed_after_errors == 1


def test_the_connect_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="connect_seconds must be above 0"):
        FailFastGloo(COLLECTIVE, connect_seconds=0)


def test_the_first_group_waits_the_collective_timeout_for_slow_members() -> None:
    # At a job's start every member is alive but may be slow to connect (6 nodes of 3 jobs on
    # 2 cores: over 5 s, and every node dropped its first step); only later groups are bound.
    store = _store()
    process_group = FailFastGloo(timedelta(seconds=2), connect_seconds=0.25)
    started = time.monotonic()
    with pytest.raises(RuntimeError):  # the second member never comes
        process_group.configure(f"127.0.0.1:{store.port}/torchft/1/0", "node0", 0, 2)
    assert time.monotonic() - started >= 1.8  # the collective timeout, not the 0.25 s bound


def test_a_replacements_first_group_is_built_within_the_connect_bound() -> None:
    # A replacement joins live peers; one killed as it joined never publishes its address.
    # Its first group waited the whole collective timeout, and a job that needs every group
    # (nodes=4:4) stood still that long (31 s in 3 of 6 five-kill chaos runs).
    store = _store()
    process_group = FailFastGloo(timedelta(seconds=30), connect_seconds=0.25, bound_first=True)
    started = time.monotonic()
    with pytest.raises(RuntimeError):  # the second member never comes
        process_group.configure(f"127.0.0.1:{store.port}/torchft/1/0", "node0", 0, 2)
    assert time.monotonic() - started < 10  # the bound and gloo's own retries, not 30 s
