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
only once it is whole. On the asyncio client such a request goes out the same way on a
connection borrowed from the pool when the kept one is busy: redis-py's asyncio
pipeline must be written whole within one socket timeout.

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
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import redis
import redis.asyncio

from duetime.store.redis.watched import opened_before_a_switch

_pack_in_c: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _pack_in_c
except ImportError:  # an optional extra: redis-py's own packer then
    _pack_in_c = None

#: What a kept connection answers when it could not send the call: send it otherwise.
NOT_SENT: Any = object()

_RESEND = (redis.ConnectionError, redis.TimeoutError)


def _left_behind(pool: Any, connection: Any) -> bool:
    """True when Sentinel has named another master since ``connection`` connected.

    The pool drops such a connection when it is given back; a kept one is not given back
    after each call, and a demoted master still answers (NOSCRIPT before READONLY for a
    script it lost in a restart, stale data for a read-only one), so it is let go here."""
    if opened_before_a_switch(connection):
        return True
    master = getattr(pool, "master_address", None)
    return (
        master is not None
        and getattr(pool, "is_master", False)
        and (connection.host, connection.port) != master
    )


def _packed(connection: Any, arguments: Sequence[Any]) -> Any:
    """A command in the protocol. With hiredis, packed by it directly: redis-py would
    pack it with hiredis too, but first looks over every argument in Python, which costs
    a single call more than the packing (its asyncio client packs in Python alone; the
    bytes are the same, checked for text, bytes, integers and floats)."""
    if _pack_in_c is not None:
        try:
            return (_pack_in_c(tuple(arguments)),)
        except TypeError:  # a type hiredis does not take: redis-py's way
            pass
    return connection.pack_command(*arguments)


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


class KeptConnection:
    """One connection of a synchronous client's pool, for one caller at a time."""

    def __init__(self, client: redis.Redis) -> None:
        self._pool = client.connection_pool
        self._forget_the_connection()
        _kept_in_this_process.add(self)

    def _forget_the_connection(self) -> None:
        """No connection and no caller: at the start, and in a forked child, where the
        parent's socket is not ours and a thread holding the lock does not exist."""
        self._lock = threading.Lock()
        self._connection: Any = None

    def call(self, arguments: Sequence[Any]) -> Any:
        """The reply to one command (a refusal raised), or NOT_SENT when the connection is
        busy or failed. One command alone is the hot path of single schedule calls, so it
        is not put through ``call_many``'s lists."""
        if not self._lock.acquire(blocking=False):
            return NOT_SENT
        try:
            connection = self._ready()
            try:
                connection.send_packed_command(_packed(connection, arguments))
                return connection.read_response()
            except redis.exceptions.NoScriptError:
                self._let_go()
                raise
            except _RESEND:
                self._let_go()
                return NOT_SENT
            except redis.ResponseError:
                raise  # read whole: the connection is fine
            except BaseException:
                self._let_go()  # a reply may be left unread
                raise
        finally:
            self._lock.release()

    def call_many(self, commands: Iterable[Sequence[Any]]) -> Any:
        """The replies to commands sent as ``commands`` makes them (a refusal as its
        exception), or NOT_SENT when the connection is busy or failed: then send them
        otherwise (some may have run)."""
        if not self._lock.acquire(blocking=False):
            return NOT_SENT
        try:
            connection = self._ready()
            try:
                sent = 0
                for arguments in commands:
                    connection.send_packed_command(_packed(connection, arguments))
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
            return replies
        finally:
            self._lock.release()

    def _ready(self) -> Any:
        """The kept connection; taken from the pool when there is none, or when the one
        kept was left behind by a failover."""
        if self._connection is not None and _left_behind(self._pool, self._connection):
            self._let_go()
        if self._connection is None:
            self._connection = self._pool.get_connection()
        return self._connection

    def _let_go(self) -> None:
        connection, self._connection = self._connection, None
        connection.disconnect()
        self._pool.release(connection)

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._let_go()


_kept_in_this_process: weakref.WeakSet[KeptConnection] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A hook, not a pid check per call: os.getpid() is a system call on every call.
    for kept in list(_kept_in_this_process):
        kept._forget_the_connection()


os.register_at_fork(after_in_child=_after_fork_in_child)


async def _taken_from(pool: Any) -> tuple[Any, float | None]:
    """A connection of an asyncio pool with its socket_timeout set aside (``_streamed``
    applies it), and that timeout."""
    connection = await pool.get_connection()
    timeout, connection.socket_timeout = connection.socket_timeout, None
    return connection, timeout


async def _give_back(pool: Any, connection: Any, timeout: float | None, healthy: bool) -> None:
    """A connection of ``_taken_from`` back to its pool with its timeout; closed first
    unless ``healthy`` (a reply may be left unread, or it may be on a demoted master)."""
    connection.socket_timeout = timeout
    with contextlib.suppress(Exception):  # shielded: a cancellation gives it back too
        await asyncio.shield(_released(pool, connection, healthy))


async def _released(pool: Any, connection: Any, healthy: bool) -> None:
    if not healthy:
        await connection.disconnect(nowait=True)
    await pool.release(connection)


async def _streamed(
    connection: Any, limit: float | None, commands: Iterable[Sequence[Any]]
) -> list[Any]:
    """The replies to commands sent on an asyncio connection as ``commands`` makes
    them, read after the last (a refusal as its exception); each send and each read
    within ``limit``, as redis-py puts its socket_timeout, with one ``asyncio.timeout``
    moved along rather than a ``wait_for`` task per step."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(None) as deadline:
        sent = 0
        for arguments in commands:
            if limit:
                deadline.reschedule(loop.time() + limit)
            await connection.send_packed_command(_packed(connection, arguments))
            sent += 1
        replies = []
        for _ in range(sent):
            if limit:
                deadline.reschedule(loop.time() + limit)
            try:
                replies.append(await connection.read_response())
            except redis.ResponseError as refusal:
                replies.append(refusal)
    return replies


class AsyncKeptConnection:
    """One connection of an asyncio client's pool, for one coroutine at a time.

    While kept, the connection's own ``socket_timeout`` is set aside and the same limit
    is put on each send and each read here, with one ``asyncio.timeout`` per call: with
    a timeout set, redis-py's asyncio connection puts every send through
    ``asyncio.wait_for``, which on Python 3.11 makes a task and costs event-loop turns
    on every call. The limit is the pool's, restored when the connection goes back."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._pool = client.connection_pool
        self._connection: Any = None
        self._timeout: float | None = None  # the connection's socket_timeout, set aside
        self._loop: asyncio.AbstractEventLoop | None = None
        self._busy = False

    async def call(self, arguments: Sequence[Any]) -> Any:
        """The reply to one command, or NOT_SENT when the connection is busy or failed."""
        replies = await self.call_many((arguments,))
        if replies is NOT_SENT:
            return NOT_SENT
        if isinstance(reply := replies[0], redis.ResponseError):
            raise reply
        return reply

    async def call_many(self, commands: Iterable[Sequence[Any]], borrow: bool = False) -> Any:
        """As ``KeptConnection.call_many``. With ``borrow``, a busy kept connection is no
        reason to refuse: the commands go out the same way on another connection of the
        pool, taken for them and given back. Through the client they would go as one
        pipeline, which redis-py's asyncio connection writes whole within one
        socket_timeout: a request the server takes longer to read than that (a large
        schedule_many) would fail part-written."""
        if self._busy:
            return await self._on_borrowed(commands) if borrow else NOT_SENT
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
                self._connection, self._timeout = await _taken_from(self._pool)
            try:
                replies = await _streamed(self._connection, self._timeout, commands)
            except (*_RESEND, TimeoutError):
                await self._let_go()
                return NOT_SENT
            except BaseException:
                await self._let_go()  # a reply may be left unread
                raise
            if _refused_script(replies):
                await self._let_go()
            return replies
        finally:
            self._busy = False

    async def _on_borrowed(self, commands: Iterable[Sequence[Any]]) -> Any:
        """``call_many`` on a connection taken from the pool for this request only."""
        connection, timeout = await _taken_from(self._pool)
        healthy = False
        try:
            replies = await _streamed(connection, timeout, commands)
            healthy = not _refused_script(replies)
            return replies
        except (*_RESEND, TimeoutError):
            return NOT_SENT
        finally:
            await _give_back(self._pool, connection, timeout, healthy)

    async def _let_go(self) -> None:
        connection, self._connection = self._connection, None
        await _give_back(self._pool, connection, self._timeout, healthy=False)

    async def close(self) -> None:
        if self._connection is not None and self._loop is asyncio.get_running_loop():
            await self._let_go()
        self._connection = None
