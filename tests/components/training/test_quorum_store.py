"""The quorum's store, reached before a group reconfigures on it (``fault_tolerance``)."""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import pytest
import torch
from torch.distributed import TCPStore

from sublimate.components.training.fault_tolerance import (
    STORE_CONNECT_SECONDS,
    _fail_fast_on_a_gone_store,
)


def _gloo() -> object:
    from torchft.process_group import ProcessGroupGloo

    # The collective timeout torchft's store client would wait, twice, for a store that is gone.
    process_group = ProcessGroupGloo(timeout=timedelta(seconds=120))
    _fail_fast_on_a_gone_store(process_group)
    return process_group


def test_a_store_whose_group_is_gone_fails_the_reconfiguration_at_once() -> None:
    with socket.socket() as closed:  # a port nothing listens on: the store's node is gone
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    process_group = _gloo()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=f"the quorum's store at 127.0.0.1:{port} does not "
                                           "answer"):
        process_group.configure(f"127.0.0.1:{port}/torchft/1/0", "node0", 0, 1)
    # Refused, not waited for: well within the check's own bound, let alone the 2 x 120 s.
    assert time.monotonic() - started < STORE_CONNECT_SECONDS


def test_a_live_store_is_configured_on_as_before() -> None:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=30))
    process_group = _gloo()
    process_group.configure(f"127.0.0.1:{store.port}/torchft/1/0", "node0", 0, 1)
    tensor = torch.tensor([3.0])
    process_group.allreduce([tensor], torch.distributed.AllreduceOptions()).wait()
    assert tensor.item() == 3.0
