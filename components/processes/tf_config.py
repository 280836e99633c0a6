"""``TF_CONFIG`` for TensorFlow code run by sublimate's train step (``--framework tensorflow``).

TensorFlow's ``MultiWorkerMirroredStrategy`` (and ``tf.distribute`` at large) learns its cluster
from the ``TF_CONFIG`` environment variable::

    {"cluster": {"worker": ["10.0.0.5:40211", "10.0.0.6:38517"]},
     "task": {"type": "worker", "index": 0}}

Every worker must list the same addresses, in rank order, and each must later listen on its own.
sublimate starts the user's code under ``torchrun`` (one process per node, or several), which
gives every process ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` but knows
nothing of TensorFlow's ports. :func:`exchange` fills the gap, once per process, before the
user's code runs:

1. **Address.** The address the other nodes reach this process at: ``SUBLIMATE_NODE_ADDR`` when
   set (nodes in separate network namespaces set it), else the local address the kernel routes
   from towards ``MASTER_ADDR`` (a UDP ``connect``, which sends nothing): a pod's own IP on a
   cluster, ``127.0.0.1`` for the simulated nodes of ``sublimate run``, all on loopback.
2. **Port.** A free port, picked by the kernel (``bind`` to port 0 on the wildcard address, so
   it is free on every interface, as TensorFlow's gRPC server needs) and **kept bound** by the
   returned :class:`Reservation`: no other process can take it while the caller prepares.
3. **Exchange.** ``host:port`` is published in torch's c10d store at ``MASTER_ADDR:MASTER_PORT``
   (the torchrun agent's store; with ``TORCHELASTIC_USE_AGENT_STORE`` unset, rank 0 hosts it, as
   ``init_process_group`` would), under keys of this module's own (per restart attempt), and
   every rank reads every other's. No process group is created, no collective backend opened.
4. **Release.** The store connection is closed before :func:`exchange` returns (rank 0, when it
   hosts the store, waits until every rank has read the addresses first); nothing lingers. The
   port stays held until :meth:`Reservation.release`.

The race, and the window that remains: the port must be free when TensorFlow binds it, which
happens inside the user's code (the strategy's constructor), long after this module has run and
out of its reach. The reservation socket is bound without ``SO_REUSEADDR`` and never listens, so
while it is held no other socket can bind the port. It cannot stay held through TensorFlow's
bind: TensorFlow's gRPC server (which listens on ``*:port``, IPv4 and IPv6) fails with
``UnknownError: Could not start gRPC server`` on a port bound by another socket, even one that
sets ``SO_REUSEPORT`` (checked with TensorFlow 2.21). So the caller releases it **immediately
before handing control to the user's code**; what remains is the time from there to the
strategy's construction (mostly importing TensorFlow: about 4 s). In that window only a process
that binds a port at random and draws this one from the ~28,000 ephemeral ports, or binds this
very number on purpose, could take it. If that happens, TensorFlow fails at start with the error
above, and torchrun's restart (``max-restarts``) picks new ports: every attempt exchanges afresh.

This module imports neither TensorFlow (the user's code does) nor torch at import time (torch is
imported by :func:`exchange`, which needs its ``TCPStore``).

Usage, in the process torchrun started (the entry-point shim)::

    from sublimate.components.processes import tf_config

    reservation = tf_config.exchange()           # every rank, collectively
    os.environ["TF_CONFIG"] = reservation.tf_config
    reservation.release()                        # last thing before the user's code
    runpy.run_path(script, run_name="__main__")  # the user's code builds its strategy

or in one call, when the short window from here to the user's code does not matter:
``os.environ["TF_CONFIG"] = tf_config.tf_config()``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed import Store

# The variable that, when set, is this node's address as the other nodes reach it.
NODE_ADDR_ENV = "SUBLIMATE_NODE_ADDR"
# Where this module's keys live in the c10d store (suffixed with the restart attempt).
KEY_PREFIX = "sublimate/tf_config"
# Seconds to wait for every rank to publish its address (and, on a rank-0-hosted store, for
# every rank to have read them) before giving up with the ranks that are missing.
DEFAULT_TIMEOUT = 300.0
# The environment variables torchrun sets that the exchange needs.
REQUIRED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class TFConfigError(RuntimeError):
    """The exchange could not be done: not under torchrun, or a rank never published."""


@dataclass
class Reservation:
    """This process's place in the TensorFlow cluster, with its port still bound.

    Attributes:
        tf_config: the ``TF_CONFIG`` JSON for this process
        rank: this process's index among the workers (torchrun's ``RANK``)
        workers: every worker's ``host:port``, in rank order
        address: this process's host, as published
        port: this process's port, held by the reservation until :meth:`release`
    """

    tf_config: str
    rank: int
    workers: list[str]
    address: str
    port: int
    _socket: socket.socket | None = field(default=None, repr=False)

    @property
    def held(self) -> bool:
        """Whether the port is still bound by this reservation."""
        return self._socket is not None

    def release(self) -> None:
        """Unbind the port, for TensorFlow to bind; call it right before the user's code runs.

        Idempotent. The socket never listened or connected, so closing it leaves no
        ``TIME_WAIT`` behind: the port is free at once.
        """
        sock, self._socket = self._socket, None
        if sock is not None:
            sock.close()

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


def tf_config(env: Mapping[str, str] | None = None, *, timeout: float = DEFAULT_TIMEOUT) -> str:
    """The ``TF_CONFIG`` JSON for this torchrun process, its port already released.

    Collective: every rank of the job must call it (or :func:`exchange`). A convenience over
    :func:`exchange` for callers that do not need to hold the port until the last moment.

    Args:
        env: the environment to read torchrun's variables and ``SUBLIMATE_NODE_ADDR`` from
            (default: ``os.environ``)
        timeout: seconds to wait for the other ranks

    Raises:
        TFConfigError: a variable torchrun sets is missing or malformed, or a rank did not
            publish its address within ``timeout``
    """
    with exchange(env, timeout=timeout) as reservation:
        return reservation.tf_config


def exchange(env: Mapping[str, str] | None = None, *,
             timeout: float = DEFAULT_TIMEOUT) -> Reservation:
    """Reserve a port, exchange ``host:port`` with every rank, and build ``TF_CONFIG``.

    Collective: every rank of the torchrun job must call it once per attempt. Returns with
    the store connection closed and this process's port still bound: set ``TF_CONFIG``, then
    :meth:`Reservation.release` immediately before the user's code starts TensorFlow.

    Args:
        env: the environment to read ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
            ``MASTER_PORT`` (and ``TORCHELASTIC_USE_AGENT_STORE``,
            ``TORCHELASTIC_RESTART_COUNT``, ``SUBLIMATE_NODE_ADDR``) from (default:
            ``os.environ``)
        timeout: seconds to wait for the other ranks to publish (and read)

    Raises:
        TFConfigError: a variable torchrun sets is missing or malformed, or a rank did not
            publish its address within ``timeout``
    """
    env = os.environ if env is None else env
    rank, world_size, master_addr, master_port = _torchrun_vars(env)
    address = node_address(env, master_addr, master_port)
    sock = reserve_port()
    try:
        port = sock.getsockname()[1]
        me = join_host_port(address, port)
        workers = [me] if world_size == 1 else _exchange(
            env, rank, world_size, master_addr, master_port, me, timeout)
    except BaseException:
        sock.close()
        raise
    config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}
    return Reservation(tf_config=json.dumps(config), rank=rank, workers=workers,
                       address=address, port=port, _socket=sock)


def node_address(env: Mapping[str, str], master_addr: str, master_port: int = 29500) -> str:
    """The address the other nodes reach this process at.

    ``SUBLIMATE_NODE_ADDR`` when set; else the local address of the route towards
    ``master_addr`` (IPv4 preferred), which is a loopback address when the master is on
    loopback (the simulated nodes of ``sublimate run``); ``127.0.0.1`` if no route is found.
    """
    explicit = env.get(NODE_ADDR_ENV, "").strip()
    if explicit:
        return explicit
    try:
        infos = socket.getaddrinfo(master_addr, master_port, type=socket.SOCK_DGRAM)
    except OSError:
        return "127.0.0.1"
    # IPv4 first: "localhost" may resolve to ::1 first, and an IPv4 listener is the common case.
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.connect(sockaddr)  # UDP: chooses the route and source, sends nothing
                return str(probe.getsockname()[0])
        except OSError:
            continue
    return "127.0.0.1"


def reserve_port() -> socket.socket:
    """A TCP socket bound to a free port on every interface, not listening.

    Dual-stack (``[::]`` with ``IPV6_V6ONLY`` off) where the host has IPv6, so the port is free
    for IPv4 and IPv6 listeners alike; else ``0.0.0.0``. No ``SO_REUSEADDR``: while the socket
    is open, no other socket can bind the port.
    """
    if socket.has_ipv6:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::", 0))
            return sock
        except OSError:  # IPv6 disabled in this network namespace
            sock.close()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("0.0.0.0", 0))
    return sock


def join_host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 literal in brackets (``[fd00::5]:40211``) as gRPC expects."""
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:  # a host name
        pass
    return f"{host}:{port}"


def _torchrun_vars(env: Mapping[str, str]) -> tuple[int, int, str, int]:
    """``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, checked."""
    missing = [name for name in REQUIRED if not env.get(name)]
    if missing:
        raise TFConfigError(
            f"tf_config: {', '.join(missing)} not set: TF_CONFIG is built inside a process "
            "started by torchrun (sublimate's train step with framework=tensorflow)")
    try:
        rank, world_size, port = (int(env["RANK"]), int(env["WORLD_SIZE"]),
                                  int(env["MASTER_PORT"]))
    except ValueError as error:
        raise TFConfigError(f"tf_config: malformed torchrun variable: {error}") from None
    if not 0 <= rank < world_size:
        raise TFConfigError(f"tf_config: RANK={rank} is not in 0..WORLD_SIZE-1={world_size - 1}")
    return rank, world_size, env["MASTER_ADDR"], port


def _exchange(env: Mapping[str, str], rank: int, world_size: int, master_addr: str,
              master_port: int, me: str, timeout: float) -> list[str]:
    """Publish ``me`` in the c10d store, read every rank's address, and close the store."""
    store = _connect(env, rank, world_size, master_addr, master_port, timeout)
    try:
        store.set(f"addr/{rank}", me)
        keys = [f"addr/{r}" for r in range(world_size)]
        _wait(store, keys, "publish its address")
        workers = [store.get(key).decode() for key in keys]
        # The last reader says so; a rank-0-hosted store must outlive every read.
        if store.add("read", 1) == world_size:
            store.set("all_read", "1")
        if rank == 0 and not _agent_store(env):
            _wait(store, ["all_read"], "read the addresses")
        return workers
    finally:
        del store  # the client's (or rank 0's server's) socket closes with the last reference


def _connect(env: Mapping[str, str], rank: int, world_size: int, master_addr: str,
             master_port: int, timeout: float) -> Store:
    """This module's namespace in the job's c10d store, as ``init_process_group`` reaches it.

    Under torchrun (``TORCHELASTIC_USE_AGENT_STORE=True``) the agent of node 0 hosts the store
    and every rank is a client; otherwise rank 0 hosts a multi-tenant store, which a later
    ``init_process_group`` in the same process would share.
    """
    from torch.distributed import PrefixStore, TCPStore

    limit = timedelta(seconds=timeout)
    try:
        if _agent_store(env):
            base = TCPStore(master_addr, master_port, world_size, False, timeout=limit)
        else:
            base = TCPStore(master_addr, master_port, world_size, rank == 0, timeout=limit,
                            multi_tenant=True)
    except (RuntimeError, ValueError) as error:  # DistNetworkError, DistStoreError
        raise TFConfigError(f"tf_config: cannot reach torchrun's store at "
                            f"{master_addr}:{master_port}: {error}") from None
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return PrefixStore(f"{KEY_PREFIX}/attempt_{attempt}", base)


def _agent_store(env: Mapping[str, str]) -> bool:
    """Whether torchrun's agent hosts the store (torch's own test, on ``env``)."""
    return env.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)


def _wait(store: Any, keys: list[str], what: str) -> None:
    """``store.wait(keys)``; on timeout, name the ranks that did not ``what``."""
    try:
        store.wait(keys)
    except RuntimeError as error:  # DistStoreError on timeout, DistNetworkError if it went away
        missing = [key for key in keys if not _has(store, key)]
        raise TFConfigError(f"tf_config: timed out waiting for the other ranks to {what} "
                            f"(missing: {', '.join(missing) or 'none'}): {error}") from None


def _has(store: Any, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except RuntimeError:
        return False
