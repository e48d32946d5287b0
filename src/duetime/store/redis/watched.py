"""redis-py's Sentinel classes made to ask the ``FailoverWatcher`` (``failover``): the
connections hold their sends during a promotion, refuse to send once opened before a
switch, and have their socket shut down by the watcher at the switch (a call waiting on
the old master fails at once and is retried); the pools hand out no connection opened
before a switch, and the sentinel manager names the master the watcher heard of last."""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import redis
import redis.asyncio.sentinel
import redis.sentinel

from duetime.store.redis.failover import FailoverWatcher


class _Watched:
    """Mixed into redis-py's Sentinel connections: holds sends during a promotion, and
    refuses to send on a connection opened before another master was named."""

    failover_watcher: FailoverWatcher
    _opened_in: int  # the watcher's epoch when this connection was opened

    def __init__(self, **kwargs: Any) -> None:
        self.failover_watcher = kwargs.pop("failover_watcher")
        self._opened_in = -1
        super().__init__(**kwargs)

    def interrupt_if_opened_before(self, epoch: int) -> None:
        """Called by the watcher's thread when another master is named: the socket is shut
        down (not closed: the thread using the connection closes it), which makes a
        blocked read end at once with a ConnectionError in that thread or event loop."""
        if self._opened_in != epoch:
            with contextlib.suppress(OSError, ValueError, AttributeError):  # closed meanwhile
                self._shut_down()

    def _shut_down(self) -> None:
        raise NotImplementedError


class _WatchedSync(_Watched):
    def _connect_retry(self) -> Any:
        # Read before the address is: a switch in between drops the connection, never
        # keeps one to the old master.
        if getattr(self, "_sock", None) is None:
            self._opened_in = self.failover_watcher.epoch
        connected = super()._connect_retry()  # type: ignore[misc]
        self.failover_watcher.opened(self)
        return connected

    def _shut_down(self) -> None:
        sock = getattr(self, "_sock", None)
        if sock is not None:
            # The plain socket's shutdown, never ssl.SSLSocket's, which also drops its TLS
            # state under the thread that may be reading.
            socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        watcher = self.failover_watcher
        if watcher.holding or self._opened_in != watcher.epoch:
            watcher.before_send()
            if self._opened_in != watcher.epoch and getattr(self, "_sock", None) is not None:
                self.disconnect()  # type: ignore[attr-defined]
                raise _replaced(watcher)
        if getattr(self, "_sock", None) is None:
            # Through Sentinel: redis-py's send would reconnect to the address it had.
            self.connect()  # type: ignore[attr-defined]
        super().send_packed_command(command, check_health)  # type: ignore[misc]


class _WatchedAsync(_Watched):
    async def _connect_retry(self) -> Any:
        if not self.is_connected:  # type: ignore[attr-defined]
            self._opened_in = self.failover_watcher.epoch
        connected = await super()._connect_retry()  # type: ignore[misc]
        self.failover_watcher.opened(self)
        return connected

    def _shut_down(self) -> None:
        writer = getattr(self, "_writer", None)
        if writer is not None:
            # The event loop's socket, under its TLS layer if any (asyncio's TLS is a
            # protocol over it): shut down, the loop reads an end of stream from it. The
            # transport itself belongs to its loop, which may be another thread's.
            sock = writer.transport.get_extra_info("socket")
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        watcher = self.failover_watcher
        if watcher.holding or self._opened_in != watcher.epoch:
            await watcher.before_send_async()
            if self._opened_in != watcher.epoch and self.is_connected:  # type: ignore[attr-defined]
                await self.disconnect(nowait=True)  # type: ignore[attr-defined]
                raise _replaced(watcher)
        if not self.is_connected:  # type: ignore[attr-defined]
            await self.connect()  # type: ignore[attr-defined]
        await super().send_packed_command(command, check_health)  # type: ignore[misc]


def _replaced(watcher: FailoverWatcher) -> redis.ConnectionError:
    return redis.ConnectionError(
        f"Sentinel named another master of {watcher.service!r}; reconnecting to it"
    )


class WatchedConnection(_WatchedSync, redis.sentinel.SentinelManagedConnection):
    pass


class WatchedSSLConnection(_WatchedSync, redis.sentinel.SentinelManagedSSLConnection):
    pass


class AsyncWatchedConnection(_WatchedAsync, redis.asyncio.sentinel.SentinelManagedConnection):
    pass


class AsyncWatchedSSLConnection(_WatchedAsync, redis.asyncio.sentinel.SentinelManagedSSLConnection):
    pass


def opened_before_a_switch(connection: Any) -> bool:
    """True for a watched connection opened before the watcher heard of another master."""
    watcher = getattr(connection, "failover_watcher", None)
    return watcher is not None and bool(connection._opened_in != watcher.epoch)


class WatchedPool(redis.sentinel.SentinelConnectionPool):
    """Hands out no connection opened before a switch: an idle one has nothing unread,
    so it is closed here and reopened through Sentinel, with no error for the caller."""

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        connection: Any = super().get_connection(*args, **kwargs)
        if opened_before_a_switch(connection):
            connection.disconnect()
        return connection


class AsyncWatchedPool(redis.asyncio.sentinel.SentinelConnectionPool):
    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        connection: Any = await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        if opened_before_a_switch(connection):
            await connection.disconnect()
        return connection


class WatchedSentinel(redis.sentinel.Sentinel):
    """Names the master the watcher heard of last (a sentinel that has not yet heard of
    a failover would name the old one), else asks as redis-py does."""

    failover_watcher: FailoverWatcher

    def discover_master(self, service_name: str) -> Any:
        known = self.failover_watcher.master()
        return known if known is not None else super().discover_master(service_name)  # type: ignore[no-untyped-call]


class AsyncWatchedSentinel(redis.asyncio.sentinel.Sentinel):
    failover_watcher: FailoverWatcher

    async def discover_master(self, service_name: str) -> Any:
        known = self.failover_watcher.master()
        return known if known is not None else await super().discover_master(service_name)


def watched_classes(asynchronous: bool, ssl: bool) -> tuple[Any, Any, Any]:
    """The sentinel manager, pool and connection classes for a watched master."""
    if asynchronous:
        connection: Any = AsyncWatchedSSLConnection if ssl else AsyncWatchedConnection
        return AsyncWatchedSentinel, AsyncWatchedPool, connection
    return WatchedSentinel, WatchedPool, WatchedSSLConnection if ssl else WatchedConnection
