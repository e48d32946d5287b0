"""Following a Sentinel failover as it happens, so that no write lands on a master that
Sentinel is replacing or has replaced.

redis-py's Sentinel pool asks the sentinels for the master only when it opens a
connection, and drops a connection only on an error or a READONLY reply. In a planned
failover (``SENTINEL FAILOVER``) the old master goes on answering as a master until
Sentinel reconfigures it, seconds after the switch, and the writes it takes meanwhile
are thrown away when it resynchronises as a replica: a producer writing all along lost
most of its acknowledged schedules in one such failover.

A ``FailoverWatcher`` listens to every sentinel of the URL, and asks each for the
master (``SENTINEL MASTER``) every second in case an event was missed:

- when the sentinel leading a failover says it is promoting a replica
  (``+failover-state-send-slaveof-noone``), every send to the master is held: the old
  master's data may no longer be what survives;
- when a newer configuration names another master (``+switch-master``, or a higher
  config epoch in an answer), each connection opened before is dropped at its next send
  with a ConnectionError, which redis-py and the runners already retry on a new
  connection, and new connections go to that master; held sends go out; and the socket
  of each connection opened before is shut down at once, so that a call waiting on the
  old master (a worker's BLMOVE, a dispatcher's BLPOP, a cancel subscription) fails
  now and is retried there, rather than waiting out its block on a master that is
  being demoted (it goes on answering as a master for seconds);
- when that sentinel aborts the failover, or reports none in progress, held sends go out
  to the old master, which is still the master.

A send is held at most ``hold`` seconds from the start of the pause (the socket timeout),
then fails as a connection error: never silently. One watcher serves every client of the
same sentinels and service in a process; its threads start on first use (and again in a
forked child) and stop when the last client closes. The redis-py classes that ask it are
in ``watched``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import weakref
from typing import Any, Protocol

import redis

log = logging.getLogger("duetime.failover")

#: How often each sentinel is asked for the master, beside its events.
ASK_EVERY = 1.0
#: An answer older than this is not trusted to name the master.
FRESH_FOR = 3.0
#: A hold lasting longer than this is lifted even without word from the sentinel leading
#: the failover (which would then be unreachable): Sentinel promotes within seconds.
LONGEST_HOLD = 30.0
#: Event channels: the leader starting the promotion, any sentinel naming a new master,
#: and the leader giving up.
CHANNELS = ("+failover-state-send-slaveof-noone", "+switch-master", "-failover-abort-*")

Address = tuple[str, int]


class Followed(Protocol):
    """A connection that follows the watcher's master (``watched``)."""

    def interrupt_if_opened_before(self, epoch: int) -> None:
        """Shut its socket down if it was opened before ``epoch``."""


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def event_service(channel: str, data: str) -> str:
    """The service an event is about: ``<type> <name> <ip> <port> [@ <master> <ip> <port>]``,
    or ``<master> <old ip> <old port> <new ip> <new port>`` for ``+switch-master``."""
    words = data.split()
    if "@" in words:
        return words[words.index("@") + 1] if words.index("@") + 1 < len(words) else ""
    if channel == "+switch-master":
        return words[0] if words else ""
    return words[1] if len(words) > 1 else ""


class FailoverWatcher:
    """What the sentinels last said of one service's master, for its connections."""

    def __init__(
        self, sentinels: list[Address], service: str, kwargs: dict[str, Any], hold: float
    ) -> None:
        self.service = service
        self.hold = hold
        self._sentinels = list(sentinels)
        self._kwargs = kwargs
        self._lock = threading.Lock()
        self._users = 0
        self._reset()

    def _reset(self) -> None:
        """No threads, nothing known: at the start, and in a forked child."""
        #: Bumped each time another master is named: a connection opened under an older
        #: value may be on a replaced master.
        self.epoch = 0
        #: True while sends are held (read without the lock on every send).
        self.holding = False
        #: When (time.monotonic) sends were last released or moved to a new master.
        self.interrupted_at = 0.0
        self._master: Address | None = None
        self._config_epoch = -1
        self._confirmed_at = 0.0
        self._held_since = 0.0
        self._held_by: Address | None = None
        self._released = threading.Event()
        self._released.set()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._stopped = threading.Event()
        self._running = False
        #: Connections opened in this process, to interrupt when another master is named.
        self._connections: weakref.WeakSet[Followed] = weakref.WeakSet()

    # --- users ------------------------------------------------------------------------

    def use(self) -> None:
        with self._lock:
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users > 0:
                return
            self._stopped.set()
            self._running = False
        _forget(self)

    def _ensure_running(self) -> None:
        if self._running:
            return
        with self._lock:
            if self._running or self._users <= 0:
                return
            self._running = True
            self._stopped = threading.Event()
            for address in self._sentinels:
                threading.Thread(
                    target=self._follow, args=(address, self._stopped), daemon=True,
                    name=f"duetime-sentinel-{address[0]}:{address[1]}",
                ).start()  # fmt: skip

    # --- what connections ask -----------------------------------------------------------

    def opened(self, connection: Followed) -> None:
        """``connection`` has just connected in this process: it is interrupted if another
        master is named while it is open."""
        with self._lock:
            self._connections.add(connection)

    def _interrupt_left_behind(self) -> None:
        """Shut down the sockets of the connections opened before the newest switch: one
        in a call fails it (redis-py retries it on a new connection, to the new master),
        an idle one would be dropped at its next use anyway."""
        with self._lock:
            connections, epoch = list(self._connections), self.epoch
        for connection in connections:
            connection.interrupt_if_opened_before(epoch)

    def master(self) -> Address | None:
        """The master named by the newest configuration heard, if heard lately."""
        self._ensure_running()
        if self._master is not None and time.monotonic() - self._confirmed_at < FRESH_FOR:
            return self._master
        return None

    def before_send(self) -> None:
        """Held while a failover is promoting a replica, at most ``hold`` seconds from the
        start of the pause; a ConnectionError then."""
        self._ensure_running()
        if self.holding:
            remaining = self._held_since + self.hold - time.monotonic()
            if not self._released.wait(max(0.0, remaining)):
                raise self._still_held()

    async def before_send_async(self) -> None:
        self._ensure_running()
        if not self.holding:
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if not self.holding:
                return
            self._waiters.append((loop, waiter))
            remaining = self._held_since + self.hold - time.monotonic()
        try:
            async with asyncio.timeout(max(0.0, remaining)):
                await waiter
        except TimeoutError:
            raise self._still_held() from None
        finally:
            with self._lock:
                if (loop, waiter) in self._waiters:
                    self._waiters.remove((loop, waiter))

    def _still_held(self) -> redis.ConnectionError:
        return redis.ConnectionError(
            f"Sentinel is replacing the master of {self.service!r} and has not named the "
            f"new one within {self.hold:g}s; writes are held meanwhile so that none is lost "
            "on the old master"
        )

    # --- what the sentinels say ---------------------------------------------------------

    def _hold(self, by: Address) -> None:
        with self._lock:
            if self.holding:
                return
            self._held_since, self._held_by = time.monotonic(), by
            self._released.clear()
            self.holding = True
        log.warning(
            "Sentinel %s:%d is promoting a replica of %r: writes held until the new "
            "master is named", by[0], by[1], self.service,
        )  # fmt: skip

    def _release(self) -> None:
        with self._lock:
            if not self.holding:
                return
            self.holding = False
            self.interrupted_at = time.monotonic()
            self._released.set()
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            with contextlib.suppress(RuntimeError):  # its loop has closed
                loop.call_soon_threadsafe(_wake, waiter)

    def _learn(self, address: Address, config_epoch: int, failing_over: bool, by: Address) -> None:
        """An answer to SENTINEL MASTER from sentinel ``by``. The sentinel leading a
        failover raises the config epoch before it changes the address, so its answers
        are not learned from until the failover ends."""
        switched = False
        with self._lock:
            if not failing_over and (config_epoch > self._config_epoch or self._master is None):
                switched = self._master is not None and address != self._master
                self._master, self._config_epoch = address, config_epoch
                if switched:
                    self.epoch += 1
                    self.interrupted_at = time.monotonic()
            if address == self._master and config_epoch == self._config_epoch:
                self._confirmed_at = time.monotonic()
        if switched:
            log.warning(
                "Sentinel names %s:%d the master of %r: connections to the old one are "
                "dropped", address[0], address[1], self.service,
            )  # fmt: skip
            self._release()
            self._interrupt_left_behind()
        elif self.holding and (
            (self._held_by == by and not failing_over)
            or time.monotonic() - self._held_since > LONGEST_HOLD
        ):
            self._release()

    def _on_event(self, channel: str, data: str, by: Address, commands: Any) -> None:
        if event_service(channel, data) != self.service:
            return
        if channel == "+failover-state-send-slaveof-noone":
            self._hold(by)
            return
        if channel.startswith("-failover-abort") and self._held_by == by:
            log.warning("Sentinel %s:%d gave up the failover of %r", by[0], by[1], self.service)
            self._release()
        self._ask(commands, by)

    def _ask(self, commands: Any, by: Address) -> None:
        state: dict[str, Any] = commands.sentinel_master(self.service)
        flags = state.get("flags", "")
        flags = flags.split(",") if isinstance(flags, str) else flags
        self._learn(
            (_text(state["ip"]), int(state["port"])),
            int(state.get("config-epoch", 0)),
            "failover_in_progress" in flags,
            by,
        )

    def _follow(self, address: Address, stopped: threading.Event) -> None:
        """One sentinel's events and answers, until the watcher stops."""
        pause = 0.1
        while not stopped.is_set():
            commands = redis.Redis(host=address[0], port=address[1], **self._kwargs)
            listener = commands.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
            try:
                listener.psubscribe(*CHANNELS)
                self._ask(commands, address)  # what happened while not listening
                pause = 0.1
                next_ask = time.monotonic() + ASK_EVERY
                while not stopped.is_set():
                    message = listener.get_message(timeout=max(0.0, next_ask - time.monotonic()))
                    if message is not None and message["type"] == "pmessage":
                        self._on_event(
                            _text(message["channel"]), _text(message["data"]), address, commands
                        )
                    if time.monotonic() >= next_ask:
                        self._ask(commands, address)
                        next_ask = time.monotonic() + ASK_EVERY
            except (redis.RedisError, OSError, KeyError, ValueError, TypeError) as error:
                log.debug("sentinel %s:%d: %s", address[0], address[1], error)
                stopped.wait(pause)
                pause = min(pause * 2, 2.0)
            finally:
                listener.close()
                commands.close()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


# --- one watcher per sentinels and service in a process ----------------------------------

_watchers: dict[tuple[Any, ...], FailoverWatcher] = {}
_watchers_lock = threading.Lock()


def watcher_for(
    sentinels: list[Address], service: str, kwargs: dict[str, Any], hold: float
) -> FailoverWatcher:
    """The process's watcher of ``service`` on these sentinels, with one more user."""
    key = (tuple(sentinels), service, repr(sorted(kwargs.items())), hold)
    with _watchers_lock:
        watcher = _watchers.get(key)
        if watcher is None:
            watcher = _watchers[key] = FailoverWatcher(sentinels, service, kwargs, hold)
        watcher.use()
    return watcher


def _forget(watcher: FailoverWatcher) -> None:
    with _watchers_lock:
        for key, known in list(_watchers.items()):
            if known is watcher and watcher._users <= 0:
                del _watchers[key]


def _after_fork_in_child() -> None:
    # The parent's threads do not exist here: start again, knowing nothing.
    for watcher in list(_watchers.values()):
        watcher._lock = threading.Lock()
        watcher._reset()


os.register_at_fork(after_in_child=_after_fork_in_child)
