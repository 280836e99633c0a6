from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .argo_api import Server


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Start `sublimate server` processes over ``tmp_path/home``; all stopped at the end."""
    servers: list[Server] = []

    def starter(*flags: str) -> Server:
        servers.append(Server(tmp_path / "home", *flags))
        return servers[-1]

    yield starter
    for server in servers:
        server.stop()
