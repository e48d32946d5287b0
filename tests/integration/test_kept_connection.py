"""Script calls go out on a connection the runner keeps (see duetime.store.redis.kept), and
behave as through the client: a dropped connection is reconnected and the call sent
again, a call cut off midway never leaves a reply for the next one to read, a forked
child uses a connection of its own."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.sentinel

from duetime import AsyncQueue, Queue, Settings
from duetime.errors import NotDurableError
from duetime.store.plans.keys import QueueKeys
from duetime.store.redis.kept import NOT_SENT, AsyncKeptConnection, KeptConnection
from tests.helpers import scheduled_count
from tests.servers import Server, command


def client_ids(raw: redis.Redis) -> set[int]:
    return {int(client["id"]) for client in raw.client_list()}


def test_script_calls_share_one_connection_and_come_back_after_it_drops(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_in(60, {"n": 0})
        before = client_ids(raw)
        for n in range(1, 50):
            queue.schedule_in(60, {"n": n})
        assert client_ids(raw) == before  # no connection taken per call
        # Every connection of this client dropped by the server: the next calls reconnect
        # and are sent again, as redis-py sends again after a dropped connection.
        for client in raw.client_list():
            if int(client["id"]) != int(raw.client_id()):
                raw.client_kill_filter(_id=client["id"])
        ids = [queue.schedule_in(60, {"n": n}) for n in range(50, 60)]
        assert all(queue.status(task_id) is not None for task_id in ids)
        assert scheduled_count(raw, keys) == 60
        assert queue.check() == []


def test_a_call_cut_off_midway_leaves_no_reply_for_the_next(
    redis_url: str, raw: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt between the send and the read (Ctrl-C, an exception from a signal
    handler) must not leave the reply on the connection: the next call would read it as
    its own."""
    real_read = redis.connection.Connection.read_response
    interrupt = {"armed": True}

    def interrupted(self: Any, *args: Any, **kwargs: Any) -> Any:
        if interrupt["armed"]:
            interrupt["armed"] = False
            raise KeyboardInterrupt
        return real_read(self, *args, **kwargs)

    with Queue(queue_name, redis_url) as queue:
        queue.schedule_in(60, {"n": 0})  # the connection is made
        monkeypatch.setattr(redis.connection.Connection, "read_response", interrupted)
        with pytest.raises(KeyboardInterrupt):
            queue.status("first")
        monkeypatch.setattr(redis.connection.Connection, "read_response", real_read)
        task_id = queue.schedule_in(60, {"n": 1})
        status = queue.status(task_id)  # read its own reply, not the one left behind
        assert status is not None and status.data == {"n": 1}
        assert queue.status("first") is None


def lose_the_connection_at_send(
    number: int, connection_type: Any
) -> tuple[dict[str, int], Callable[..., Any]]:
    """A send_packed_command for ``connection_type`` whose send of script calls number
    ``number`` (from 1; other sends, such as a SCRIPT LOAD, are not counted) finds the
    connection lost, and the dict it counts in: such sends, and the most script calls
    one of them held up to the lost one."""
    real_send = connection_type.send_packed_command
    sent = {"sends": 0, "most_calls": 0}

    def send(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        packed = command if isinstance(command, bytes) else b"".join(command)
        calls = packed.count(b"\r\nEVALSHA\r\n")
        if calls:
            sent["sends"] += 1
            if sent["sends"] <= number:
                sent["most_calls"] = max(sent["most_calls"], calls)
            if sent["sends"] == number:
                raise redis.ConnectionError("lost (test)")
        return real_send(self, command, *args, **kwargs)

    return sent, send


LARGE = 5_000  # five script calls of 1,000
FUTURE = 4_000_000_000  # epoch seconds in 2096


def test_a_large_schedule_goes_out_call_by_call_and_again_after_a_drop_midway(
    redis_url: str, raw: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each call is sent as it is made (so the server runs one while the next is made);
    a connection lost after some ran sends them all again through the client: the tasks
    that ran are found as ours, none is stored twice, every id returned is stored."""
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_in(60, {"n": -1})  # the kept connection is made
        sent, send = lose_the_connection_at_send(3, redis.connection.Connection)
        monkeypatch.setattr(redis.connection.Connection, "send_packed_command", send)
        ids = queue.schedule_many([(FUTURE + n, {"n": n}) for n in range(LARGE)])
        monkeypatch.undo()
        assert sent["most_calls"] == 1  # one send a call: a pipeline sends them together
        assert len(set(ids)) == LARGE
        assert scheduled_count(raw, QueueKeys(queue_name)) == LARGE + 1
        assert [queue.status(task_id) is not None for task_id in ids[::97]] == [True] * 52
        assert queue.check() == []


def test_an_async_large_schedule_goes_out_call_by_call_and_again_after_a_drop_midway(
    redis_url: str, raw: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> list[str]:
        async with AsyncQueue(queue_name, redis_url) as queue:
            await queue.schedule_in(60, {"n": -1})
            sent, send = lose_the_connection_at_send(3, redis.asyncio.connection.Connection)
            monkeypatch.setattr(redis.asyncio.connection.Connection, "send_packed_command", send)
            ids = await queue.schedule_many([(FUTURE + n, {"n": n}) for n in range(LARGE)])
            monkeypatch.undo()
            assert sent["most_calls"] == 1
            assert await queue.check() == []
            return ids

    ids = asyncio.run(scenario())
    assert len(set(ids)) == LARGE
    assert scheduled_count(raw, QueueKeys(queue_name)) == LARGE + 1


def test_a_busy_kept_connection_sends_nothing(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    kept = KeptConnection(client)
    assert kept.call(("PING",)) == b"PONG"
    with kept._lock:  # another thread's call in flight
        assert kept.call(("PING",)) is NOT_SENT
    kept.close()
    client.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_uses_its_own_connection(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        parent = queue.schedule_in(60, {"who": "parent"})
        child = os.fork()
        if child == 0:  # pragma: no cover - the child reports through its exit status
            code = 1
            try:
                task_id = queue.schedule_in(60, {"who": "child"})
                found = queue.status(task_id)
                code = 0 if found is not None and found.data == {"who": "child"} else 2
            finally:
                os._exit(code)
        _, wait_status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(wait_status) == 0
        found = queue.status(parent)  # the parent's connection was left alone
        assert found is not None and found.data == {"who": "parent"}
        assert scheduled_count(raw, QueueKeys(queue_name)) == 2


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_mid_call_has_the_kept_connection_to_itself(redis_url: str) -> None:
    """A parent thread's call in flight at the fork does not exist in the child: the
    child neither waits for it nor reads that call's socket."""
    client = redis.Redis.from_url(redis_url)
    kept = KeptConnection(client)
    assert kept.call(("PING",)) == b"PONG"
    with kept._lock:  # another thread's call in flight
        child = os.fork()
        if child == 0:  # pragma: no cover - the child reports through its exit status
            code = 1
            try:
                code = 0 if kept.call(("ECHO", "child")) == b"child" else 2
            finally:
                os._exit(code)
        _, wait_status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0
    assert kept.call(("ECHO", "parent")) == b"parent"  # its socket was not the child's
    kept.close()
    client.close()


def test_an_async_call_cancelled_midway_leaves_no_reply_for_the_next(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    async def scenario() -> None:
        async with AsyncQueue(queue_name, redis_url) as queue:
            task_id = await queue.schedule_in(60, {"n": 1})
            # Cancel calls at every point of their round trip, many times.
            for delay in (0, 0, 0.0001, 0.0002, 0.0005, 0.001, 0.002) * 5:
                call = asyncio.ensure_future(queue.status(task_id))
                await asyncio.sleep(delay)
                call.cancel()
                await asyncio.gather(call, return_exceptions=True)
                status = await queue.status(task_id)
                assert status is not None and status.data == {"n": 1}
            assert await queue.status("other") is None

    asyncio.run(scenario())
    assert scheduled_count(raw, QueueKeys(queue_name)) == 1


def test_an_async_kept_connection_holds_the_socket_timeout_and_hands_it_back(
    redis_url: str, raw: redis.Redis
) -> None:
    """The kept asyncio connection puts the client's socket_timeout on each send and read
    itself (it sets the connection's own aside, see kept.py): a server that stops
    answering fails the call over to the client, and the connection goes back to the
    pool with its timeout, so calls through the client time out too."""

    async def scenario() -> None:
        client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=0.2)
        kept = AsyncKeptConnection(client)
        try:
            assert await kept.call(("SET", "k", "1")) == b"OK"
            raw.client_pause(10_000, all=False)  # writes wait; CLIENT UNPAUSE still runs
            try:
                assert await kept.call(("SET", "k", "2")) is NOT_SENT
                # The pool's one connection is the one the kept call gave back: without
                # its timeout this would wait for the pause to end.
                with pytest.raises(redis.TimeoutError):
                    await client.set("k", "3")
            finally:
                raw.client_unpause()
            assert await kept.call(("SET", "k", "4")) == b"OK"
            assert raw.get("k") == b"4"
        finally:
            await kept.close()
            await client.aclose()

    asyncio.run(scenario())


def test_an_async_large_schedule_longer_than_the_socket_timeout_goes_out_whole(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """The limit is on each send and each read, as redis-py puts it, not on a whole
    request: a schedule_many that takes longer than socket_timeout in all goes out on the
    kept connection to the end (cut off, it would be sent again on a new connection).
    And when the server does not have the batch script yet (only single calls ran), the
    calls it refused are sent again the same way once it is loaded: a pipeline, written
    whole, would outlast the limit and fail."""
    tasks = 100_000
    at = time.time() + 60

    async def scenario() -> list[float]:
        took = []
        settings = Settings(socket_timeout=0.25)
        async with AsyncQueue(queue_name, redis_url, settings=settings) as queue:
            await queue.schedule_in(60, {"n": 0})  # loads the single-task script only
            for first in (1, 1 + tasks):
                before = client_ids(raw)
                began = asyncio.get_running_loop().time()
                await queue.schedule_many(
                    (at + n / 1000, b"0123456789abcdef") for n in range(first, first + tasks)
                )
                took.append(asyncio.get_running_loop().time() - began)
            assert client_ids(raw) == before  # no new connection: nothing was sent again
        return took

    took = asyncio.run(scenario())
    assert min(took) > 0.25, "each request must outlast the socket timeout to mean anything"
    assert scheduled_count(raw, QueueKeys(queue_name)) == 1 + 2 * tasks


async def _schedule_many_timed(queue: AsyncQueue, first: int, tasks: int) -> float:
    """Seconds ``queue.schedule_many`` took for ``tasks`` small tasks, ids from ``first``."""
    at = time.time() + 60
    began = asyncio.get_running_loop().time()
    await queue.schedule_many(
        (at + n / 1000, b"0123456789abcdef") for n in range(first, first + tasks)
    )
    return asyncio.get_running_loop().time() - began


def test_an_async_large_schedule_while_the_kept_connection_is_busy_goes_out_whole(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """With the kept connection in use by another coroutine, a large schedule_many goes
    out call by call on another connection of the pool, each send and read within the
    socket timeout. Through the client it would be one pipeline, which redis-py writes
    whole within one socket timeout: it failed part-written ("Timeout writing to
    socket", tens of thousands of the tasks stored)."""
    tasks = 200_000
    settings = Settings(socket_timeout=0.25)

    async def scenario() -> float:
        async with AsyncQueue(queue_name, redis_url, settings=settings) as queue:
            await queue.schedule_many([(time.time() + 60, {"n": 0})] * 2)  # loads the script
            kept = queue.runner._kept
            assert isinstance(kept, AsyncKeptConnection)
            kept._busy = True  # another coroutine's call in flight
            try:
                return await _schedule_many_timed(queue, 2, tasks)
            finally:
                kept._busy = False

    took = asyncio.run(scenario())
    assert took > 0.25, "the request must outlast the socket timeout to mean anything"
    assert scheduled_count(raw, QueueKeys(queue_name)) == 2 + tasks


def test_an_async_large_durable_schedule_goes_out_whole_then_waits(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """A durable schedule_many sends its calls then WAIT on one connection, as made: a
    request longer than the socket timeout is stored whole and answered with what the
    replicas confirmed (none here), not a write timeout after part of it was stored."""
    tasks = 200_000
    settings = Settings(socket_timeout=0.6, durable_timeout=0.1)

    async def scenario() -> tuple[float, NotDurableError]:
        async with AsyncQueue(queue_name, redis_url, settings=settings, durable=True) as queue:
            with pytest.raises(NotDurableError):
                await queue.schedule_many([(time.time() + 60, {"n": 0})] * 2)  # loads it
            began = asyncio.get_running_loop().time()
            with pytest.raises(NotDurableError) as refused:
                await _schedule_many_timed(queue, 2, tasks)
            return asyncio.get_running_loop().time() - began, refused.value

    took, error = asyncio.run(scenario())
    assert took > 0.6, "the request must outlast the socket timeout to mean anything"
    assert error.confirmed == 0 and error.wanted == 1
    assert len(error.task_ids) == tasks
    assert scheduled_count(raw, QueueKeys(queue_name)) == 2 + tasks


def test_a_large_durable_schedule_goes_out_call_by_call_then_waits_on_the_same_connection(
    redis_url: str, raw: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The synchronous client sends a durable request as it sends any other on the kept
    connection, each call as it is made (the server runs one while the next is made),
    then WAIT after the last, on that connection: a WAIT elsewhere would confirm nothing
    of these writes."""
    real_send: Callable[..., Any] = redis.connection.Connection.send_packed_command
    sends: list[tuple[int, int, int]] = []  # connection, EVALSHAs, WAITs of each send

    def send(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        packed = command if isinstance(command, bytes) else b"".join(command)
        calls, waits = packed.count(b"\r\nEVALSHA\r\n"), packed.count(b"\r\nWAIT\r\n")
        if calls or waits:
            sends.append((id(self), calls, waits))
        return real_send(self, command, *args, **kwargs)

    settings = Settings(durable_timeout=0.05)
    with Queue(queue_name, redis_url, settings=settings, durable=True) as queue:
        with pytest.raises(NotDurableError):  # no replica here: none confirms
            queue.schedule_many([(FUTURE, {"n": -1})] * 2)  # the script is loaded
        monkeypatch.setattr(redis.connection.Connection, "send_packed_command", send)
        with pytest.raises(NotDurableError) as refused:
            queue.schedule_many([(FUTURE + n, {"n": n}) for n in range(LARGE)])
        monkeypatch.undo()
    assert [(calls, waits) for _, calls, waits in sends] == [(1, 0)] * 5 + [(0, 1)]
    assert len({connection for connection, _, _ in sends}) == 1
    error = refused.value
    assert (error.confirmed, error.wanted, len(error.task_ids)) == (0, 1, LARGE)
    assert scheduled_count(raw, QueueKeys(queue_name)) == 2 + LARGE


class NamedMaster:
    """Stands in for Sentinel: names whichever master the test says."""

    def __init__(self, port: int) -> None:
        self.port = port

    def discover_master(self, service: str) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def discover_slaves(self, service: str) -> list[tuple[str, int]]:
        return []


def answering_port(kept: KeptConnection) -> int:
    reply = kept.call(("CONFIG", "GET", "port"))
    return int(reply[b"port"] if isinstance(reply, dict) else reply[1])


def test_the_kept_connection_follows_sentinel_to_a_new_master(server: Server) -> None:
    """After a failover, a restarted old master (scripts gone, now a replica) still answers
    on a connection kept to it: NOSCRIPT before READONLY, where the client's own
    connections have moved on and load the script on the new master. The kept connection
    moves on when the pool learns of the new master, or at a NOSCRIPT."""
    old, new = Server(server.kind, server.executable), Server(server.kind, server.executable)
    old.start()
    new.start()
    sentinel = NamedMaster(old.port)
    pool = redis.sentinel.SentinelConnectionPool("mymaster", sentinel)  # type: ignore[no-untyped-call]
    kept = KeptConnection(redis.Redis(connection_pool=pool))
    try:
        assert answering_port(kept) == old.port
        sentinel.port = new.port
        assert answering_port(kept) == old.port  # nothing has asked Sentinel yet
        # As a reconnect of any of the client's connections does:
        pool.get_master_address()  # type: ignore[no-untyped-call]
        assert answering_port(kept) == new.port
        # Back to `old` (now empty of scripts) unseen by the pool: a NOSCRIPT lets it go.
        sentinel.port = old.port
        command(old.client(), "SCRIPT", "FLUSH")
        with pytest.raises(redis.exceptions.NoScriptError):
            kept.call(("EVALSHA", "0" * 40, 0))
        assert answering_port(kept) == old.port  # the next call asked Sentinel again
    finally:
        kept.close()
        old.stop()
        new.stop()
