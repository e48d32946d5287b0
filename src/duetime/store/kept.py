"""A connection kept for script calls, taken once from the client's pool.

A script call through redis-py's client costs the caller several times the CPU of the
call itself (measured on redis-py 7 and 8: about 100 µs a call against 35 to 50 µs on a
connection of its own): most of it goes into taking a connection from the pool and
giving it back (a liveness check with a system call each time) and into the client's
wrapping (retries, events, observability). The runners send script calls on this one
connection when it is free, and through the client otherwise, so callers in other
threads or coroutines never wait for it. Several calls of one request (a large
``schedule_many``) go out one by one as they are made, their replies read after the
last: the server runs one while the caller makes the next, where a pipeline is sent
only once it is whole.

Behaviour is the client's: the connection is made by the pool with the same settings
(timeouts, TLS, Sentinel's resolution of the master), and checks its own health before
a send after being idle. On a connection error or timeout the call is sent again
through the client, which reconnects and retries as it always does; a call cut off any
other way (an interrupt, a cancellation) leaves the connection closed, never with a
reply unread. Such a connection, and one refused NOSCRIPT, is given back to the pool and
the next call takes one from it, which connects the pool's way: a Sentinel pool asks for
the master again, where a connection reconnecting by itself goes back to the address it
had (after a failover, a demoted master that still answers; NOSCRIPT too because
Sentinel may not yet name the new master when the old one comes back). A forked child
and a new event loop take a connection of their own. Not used on a cluster, whose client
routes every call itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import redis
import redis.asyncio

#: What a kept connection answers when it could not send the call: send it otherwise.
NOT_SENT: Any = object()

_RESEND = (redis.ConnectionError, redis.TimeoutError)


def _left_behind(pool: Any, connection: Any) -> bool:
    """True when Sentinel has named another master since ``connection`` connected.

    The pool drops such a connection when it is given back; a kept one is not given back
    after each call, and a demoted master still answers (NOSCRIPT before READONLY for a
    script it lost in a restart, stale data for a read-only one), so it is let go here."""
    master = getattr(pool, "master_address", None)
    return (
        master is not None
        and getattr(pool, "is_master", False)
        and (connection.host, connection.port) != master
    )


def _reply_or_refusal(read: Any) -> Any:
    """The next reply; a refusal (read whole: the connection is fine) as its exception."""
    try:
        return read()
    except redis.ResponseError as refusal:
        return refusal


def _refused_script(replies: list[Any]) -> bool:
    """A NOSCRIPT refusal among the replies: the connection is let go, as it may be on a
    master Sentinel no longer names (see above)."""
    return any(isinstance(reply, redis.exceptions.NoScriptError) for reply in replies)


def _checked(replies: list[Any], raise_on_error: bool) -> list[Any]:
    """``replies``, or the first refusal among them raised with ``raise_on_error``."""
    if raise_on_error:
        for reply in replies:
            if isinstance(reply, redis.ResponseError):
                raise reply
    return replies


class KeptConnection:
    """One connection of a synchronous client's pool, for one caller at a time."""

    def __init__(self, client: redis.Redis) -> None:
        self._pool = client.connection_pool
        self._lock = threading.Lock()
        self._connection: Any = None
        self._pid = os.getpid()

    def call(self, arguments: Sequence[Any]) -> Any:
        """The reply to one command, or NOT_SENT when the connection is busy or failed."""
        replies = self.call_many((arguments,), raise_on_error=True)
        return replies if replies is NOT_SENT else replies[0]

    def call_many(self, commands: Iterable[Sequence[Any]], raise_on_error: bool = False) -> Any:
        """The replies to commands sent as ``commands`` makes them (a refusal as its
        exception, or raised with ``raise_on_error``), or NOT_SENT when the connection is
        busy or failed: then send them otherwise (some may have run)."""
        if not self._lock.acquire(blocking=False):
            return NOT_SENT
        try:
            if self._pid != os.getpid():  # a forked child: the parent's socket is not ours
                self._connection, self._pid = None, os.getpid()
            if self._connection is not None and _left_behind(self._pool, self._connection):
                self._let_go()
            if self._connection is None:
                self._connection = self._pool.get_connection()
            connection = self._connection
            try:
                sent = 0
                for arguments in commands:
                    connection.send_packed_command(connection.pack_command(*arguments))
                    sent += 1
                replies = [_reply_or_refusal(connection.read_response) for _ in range(sent)]
            except _RESEND:
                self._let_go()
                return NOT_SENT
            except BaseException:
                self._let_go()  # a reply may be left unread
                raise
            if _refused_script(replies):
                self._let_go()
            return _checked(replies, raise_on_error)
        finally:
            self._lock.release()

    def _let_go(self) -> None:
        connection, self._connection = self._connection, None
        connection.disconnect()
        self._pool.release(connection)

    def close(self) -> None:
        with self._lock:
            if self._connection is not None and self._pid == os.getpid():
                self._let_go()
            self._connection = None


class AsyncKeptConnection:
    """One connection of an asyncio client's pool, for one coroutine at a time."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._pool = client.connection_pool
        self._connection: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._busy = False

    async def call(self, arguments: Sequence[Any]) -> Any:
        """The reply to one command, or NOT_SENT when the connection is busy or failed."""
        replies = await self.call_many((arguments,), raise_on_error=True)
        return replies if replies is NOT_SENT else replies[0]

    async def call_many(
        self, commands: Iterable[Sequence[Any]], raise_on_error: bool = False
    ) -> Any:
        """As ``KeptConnection.call_many``."""
        if self._busy:
            return NOT_SENT
        self._busy = True
        try:
            loop = asyncio.get_running_loop()
            if self._loop is not loop:
                # A connection belongs to the loop it was made in; one left by a loop
                # that closed is let go (its transport went with that loop).
                self._connection, self._loop = None, loop
            if self._connection is not None and _left_behind(self._pool, self._connection):
                await self._let_go()
            if self._connection is None:
                self._connection = await self._pool.get_connection()  # type: ignore[no-untyped-call]
            connection = self._connection
            try:
                sent = 0
                for arguments in commands:
                    await connection.send_packed_command(connection.pack_command(*arguments))
                    sent += 1
                replies = []
                for _ in range(sent):
                    try:
                        replies.append(await connection.read_response())
                    except redis.ResponseError as refusal:
                        replies.append(refusal)
            except _RESEND:
                await self._let_go()
                return NOT_SENT
            except BaseException:
                await self._let_go()  # a reply may be left unread
                raise
            if _refused_script(replies):
                await self._let_go()
            return _checked(replies, raise_on_error)
        finally:
            self._busy = False

    async def _let_go(self) -> None:
        connection, self._connection = self._connection, None
        with contextlib.suppress(Exception):  # shielded: a cancellation lets go too
            await asyncio.shield(self._give_back(connection))

    async def _give_back(self, connection: Any) -> None:
        await connection.disconnect(nowait=True)
        await self._pool.release(connection)

    async def close(self) -> None:
        if self._connection is not None and self._loop is asyncio.get_running_loop():
            await self._let_go()
        self._connection = None
