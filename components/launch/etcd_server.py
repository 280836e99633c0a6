"""The etcd server of a ``rendezvous=etcd-v2`` job on one machine.

torchrun's ``etcd-v2`` backend keeps the rendezvous state in an etcd server (its v2 API, through
python-etcd on the nodes) instead of node 0's TCPStore: the compare-and-set every agent does each
keep-alive then runs in etcd's own process, not in an agent starved of CPU (docs/scale.md).
On Kubernetes the user gives an etcd endpoint (``rendezvous-endpoint``); on the local schedulers
the launcher starts one, before the job's nodes, with its data in the run's folder, and stops it
and removes its data when the job ends, however it ends (:class:`EtcdServer`, a context manager
around every attempt; ``PR_SET_PDEATHSIG`` for a launcher killed outright, whose data folder the
next start in that folder removes).

Where it listens: on ``local_cwd`` loopback; on ``local_netns`` the nodes are in namespaces of
their own and reach the host only at its address on the job's bridge
(``$SUBLIMATE_HOST_ADDR``), which the scheduler chooses when it builds the cluster, after this
server must already answer. So there it listens on every address of the host's namespace, on a
port of its own; the nodes dial ``$SUBLIMATE_HOST_ADDR`` (:data:`NODE_ENDPOINT_HOST`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from sublimate.components.base.ports import free_port

BINARY = "etcd"
# The host the nodes dial (a shell expansion in their command): the launcher's host as the
# local_netns scheduler tells each node, else loopback (local_cwd sets no such variable).
NODE_ENDPOINT_HOST = "${SUBLIMATE_HOST_ADDR:-127.0.0.1}"
# etcd's own client port: what a job built before its server exists (a dry run) names.
DEFAULT_PORT = 2379
# How long etcd may take to answer after its start (it takes well under a second when idle; a
# machine busy with other jobs slows it).
START_SECONDS = 30.0
# What to install, in one line each (the nodes import python-etcd's ``etcd`` in torchrun's
# etcd-v2 backend; the launcher runs the server binary).
MISSING_BINARY = ("rendezvous etcd-v2 on one machine starts an etcd server, and no 'etcd' is on "
                  "PATH: install it (Debian: apt-get install etcd-server)")
MISSING_CLIENT = ("rendezvous etcd-v2 needs python-etcd on the nodes (torchrun's etcd-v2 "
                  "backend imports it): pip install 'sublimate[etcd]'")


class EtcdError(RuntimeError):
    """The server could not start or be used; the message is one line for the user."""


def missing_prerequisite(serve: bool) -> str | None:
    """What an etcd-v2 job lacks, in one line (None: nothing). The nodes need python-etcd:
    locally they run this interpreter, on a cluster this image. ``serve``: the launcher starts
    the server (one machine, no endpoint given), so it needs the binary."""
    if serve and shutil.which(BINARY) is None:
        return MISSING_BINARY
    if importlib.util.find_spec("etcd") is None:
        return MISSING_CLIENT
    return None


class EtcdServer:
    """One single-member etcd server with the v2 API, in ``data_dir`` (removed at the end).

    ``listen`` is the address it binds for clients (``0.0.0.0`` on ``local_netns``); its peer
    port, which a one-member cluster never uses but etcd always opens, stays on loopback.
    """

    def __init__(self, data_dir: Path, log_file: Path, listen: str = "127.0.0.1") -> None:
        self.data_dir, self.log_file, self.listen = data_dir, log_file, listen
        self.port = free_port(listen)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> EtcdServer:
        binary = shutil.which(BINARY)
        if binary is None:
            raise EtcdError(MISSING_BINARY)
        # A launcher killed outright leaves its data behind: that rendezvous is over.
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        peer = f"http://127.0.0.1:{free_port()}"
        client = f"http://{self.listen}:{self.port}"
        advertised = f"http://127.0.0.1:{self.port}" if self.listen == "0.0.0.0" else client
        with open(self.log_file, "ab") as log:
            # setpriv: SIGKILL when the launcher's thread that started it ends, however it ends.
            self.process = subprocess.Popen(
                ["setpriv", "--pdeathsig", "KILL", "--", binary, "--enable-v2=true",
                 "--name", "sublimate", "--data-dir", str(self.data_dir),
                 "--listen-client-urls", client, "--advertise-client-urls", advertised,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"sublimate={peer}", "--logger", "zap",
                 "--log-level", "warn"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        url = f"http://127.0.0.1:{self.port}/version"
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                self.stop()
                raise EtcdError(f"etcd exited with status {self.process.returncode} at its "
                                f"start; see {self.log_file}")
            with contextlib.suppress(OSError, urllib.error.URLError), \
                    urllib.request.urlopen(url, timeout=1):
                return
            time.sleep(0.05)
        self.stop()
        raise EtcdError(f"etcd did not answer within {START_SECONDS:.0f}s; see {self.log_file}")

    def stop(self) -> None:
        """End the server and remove its data (idempotent)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
