"""The gloo process group between replica groups, made to fail fast on every survivor.

torchft's :class:`~torchft.process_group.ProcessGroupGloo` is reconfigured for every new quorum.
Two of its waits outlast a dead peer by the whole collective timeout (30 s by default under
per-step recovery), and this subclass bounds both:

* **A peer that dies inside a collective.** Only the dead node's two ring neighbours see their
  connections reset. The others wait in ``recv`` for the neighbours' data. gloo's ``abort()``
  does nothing in torch 2.13 (``Backend::abort`` is empty for gloo), and torchft closes the old
  group only at the next reconfiguration. That needs a quorum, and the Lighthouse refuses a
  quorum of half or fewer of the heartbeating groups (a group stuck in gloo still heartbeats from
  torchft's Rust thread). So from 5 nodes up, the neighbours cannot form one, and every other
  survivor waited out the timeout (``docs/scale.md``). :meth:`close_after_error` drops the
  failed group at once. Its connections close, the neighbours' neighbours fail in turn, and the
  failure crosses the ring in milliseconds.
* **A peer that dies between the quorum and the connection.** Building the group waits in the
  store for every member's address, by default for the collective timeout. A live member
  publishes its address within milliseconds of the quorum (every group gets the quorum at the
  same moment, and connects from torchft's quorum thread, not the training loop). So the group
  is built within ``connect_seconds``, and the collectives are then given the full timeout. The
  quorum's store itself is reached with a plain connection first: torchft's store client would
  retry a store that is gone for the timeout, twice. The first group a process builds at a
  job's start gets the full timeout: every node is there but may be slow (6 nodes of 3 jobs on
  2 cores took over 5 s, and every node dropped its first step). A replacement's first group is
  bound like any later one (``bound_first``): it joins live peers, whose own builds are bound
  already, and a peer killed as it joined held every survivor of a job that needs the
  replacement (``nodes=4:4``) for the whole timeout.

torchft's ``ProcessGroupBabyGloo`` (the group in a subprocess that is killed on error) would
also unblock the survivors, but at the cost of copying every gradient through shared memory
to another process on every step.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

import torch
from torchft.process_group import ProcessGroupGloo

# How long building a new quorum's group may take before the step is dropped (and the next
# quorum leaves the missing group out).
CONNECT_SECONDS = 5.0


class FailFastGloo(ProcessGroupGloo):
    """torchft's reconfigurable gloo group, built within ``connect_seconds`` and closed as soon
    as one of its collectives fails (see the module's docstring)."""

    _timeout: timedelta  # torchft's: what it builds the store client and the group with

    def __init__(self, timeout: timedelta, connect_seconds: float = CONNECT_SECONDS, *,
                 bound_first: bool = False) -> None:
        if connect_seconds <= 0:
            raise ValueError(f"connect_seconds must be above 0, not {connect_seconds}")
        super().__init__(timeout=timeout)
        self.connect_seconds = connect_seconds
        self.bound_first = bound_first  # a replacement's: its first group is bound too
        self.closed_after_errors = 0  # groups dropped because a collective failed
        self.built = 0  # groups built so far

    def configure(self, store_addr: str, *args: Any, **kwargs: Any) -> None:
        address = store_addr.partition("/")[0]  # host:port/prefix
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)),
                                     timeout=self.connect_seconds).close()
        except OSError as exc:
            raise RuntimeError(f"the quorum's store at {address} does not answer ({exc}): "
                               "the group serving it is gone") from exc
        # torchft builds the store client and the group with self._timeout: the connection
        # phase gets the short bound (the full timeout for the first group: see the module's
        # docstring), the collectives the full timeout afterwards.
        collective_timeout: timedelta = self._timeout
        if self.built or self.bound_first:
            self._timeout = min(collective_timeout, timedelta(seconds=self.connect_seconds))
        try:
            super().configure(store_addr, *args, **kwargs)
        finally:
            self._timeout = collective_timeout
        self.built += 1
        self.parent._get_backend(torch.device("cpu"))._set_default_timeout(collective_timeout)

    def close_after_error(self) -> None:
        """Drop the group whose collective failed. The last reference to gloo's backend goes
        with it, and its destructor closes every connection, which fails the peers' waits on
        them. The next quorum builds a new group (a failed step always brings one: torchft
        reports the commit failure to the Lighthouse, which gives the quorum a new id)."""
        if self._pg is not None:
            self.closed_after_errors += 1
            self.abort()
