"""The one clock every dispatcher and worker shares: the Redis server's TIME.

Hosts' own clocks may disagree; the server's does not. A ``ServerClock`` samples
TIME now and then and extrapolates with the local monotonic clock, anchoring each
sample at the moment its reply arrived, so the estimate trails the server by at
most the time the reply took to travel back and is never ahead of it (never
early). Tests inject a ``ManualClock`` to drive time against a real server.

It also owns waiting for a moment precisely: ``wait_until`` sleeps until the clock
reads a given server time, to within tens of microseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int | None:
        """The server time estimate in ms, or None when a fresh TIME sample is needed."""

    def wants_sample(self) -> bool:
        """True when a TIME sample would be welcome (taken where it costs no latency)."""

    def observe(self, server_ms: float, round_trip: float) -> None:
        """Record a TIME reply that took ``round_trip`` seconds to come back."""

    def seconds_until(self, server_ms: float) -> float:
        """Seconds from now until the server clock reads ``server_ms`` (for sleeping)."""


class ServerClock:
    """Server time, sampled every ``resync_interval`` seconds."""

    # A sample whose round trip exceeds this is distrusted when a better one is recent.
    _SLOW_ROUND_TRIP = 0.005

    def __init__(self, resync_interval: float = 5.0) -> None:
        self._resync_interval = resync_interval
        self._offset_ms: float | None = None
        self._synced_at = 0.0
        self._lock = threading.Lock()

    def now_ms(self) -> int | None:
        local = time.monotonic()
        offset = self._offset_ms
        # Daemons resample every resync_interval off their hot path (wants_sample);
        # the estimate is only refused, forcing a sample inline, well past that.
        if offset is None or local - self._synced_at > 4 * self._resync_interval:
            return None
        return int(local * 1000.0 + offset)

    def wants_sample(self) -> bool:
        return time.monotonic() - self._synced_at > self._resync_interval

    def seconds_until(self, server_ms: float) -> float:
        # Sub-millisecond precision, and a slightly stale offset is fine for a sleep.
        offset = self._offset_ms or 0.0
        return (server_ms - (time.monotonic() * 1000.0 + offset)) / 1000.0

    def observe(self, server_ms: float, round_trip: float) -> None:
        local = time.monotonic()
        offset = server_ms - local * 1000.0
        with self._lock:
            current = self._offset_ms
            stale = local - self._synced_at > 2 * self._resync_interval
            # A slow reply gives a worse (more trailing) estimate: keep the current one
            # unless the new one is better or the current one is getting old. A refused
            # sample leaves wants_sample() true, so the next quiet moment tries again.
            if current is None or stale or round_trip <= self._SLOW_ROUND_TRIP or offset > current:
                self._offset_ms = offset
                self._synced_at = local


class ManualClock:
    """A clock a test sets and advances; never asks the server."""

    def __init__(self, now_ms: int) -> None:
        self._now_ms = now_ms

    def now_ms(self) -> int:
        return self._now_ms

    def observe(self, server_ms: float, round_trip: float) -> None:
        del server_ms, round_trip  # a manual clock ignores the server

    def wants_sample(self) -> bool:
        return False

    def seconds_until(self, server_ms: float) -> float:
        return (server_ms - self._now_ms) / 1000.0

    def set(self, now_ms: int) -> None:
        self._now_ms = now_ms

    def advance(self, seconds: float) -> None:
        self._now_ms += round(seconds * 1000)


class _PreciseTimer:
    """One thread that wakes asyncio waiters at monotonic deadlines.

    asyncio's timers ride on epoll, whose timeout is in whole milliseconds, so
    ``asyncio.sleep`` wakes up to a millisecond late; a condition wait takes a
    nanosecond timeout. One thread (started on first use) serves every waiter of
    the process, however many are waiting."""

    def __init__(self) -> None:
        self._waiters: list[tuple[float, int, asyncio.AbstractEventLoop, asyncio.Future[None]]]
        self._waiters = []
        self._order = itertools.count()  # ties on the deadline never compare futures
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    async def sleep_until(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._changed:
            heapq.heappush(self._waiters, (deadline, next(self._order), loop, future))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="duetime-timer", daemon=True)
                self._thread.start()
            self._changed.notify()
        await future

    def _run(self) -> None:
        with self._changed:
            while True:
                if not self._waiters:
                    self._changed.wait()
                    continue
                remaining = self._waiters[0][0] - time.monotonic()
                if remaining > 0:
                    self._changed.wait(remaining)
                    continue
                _, _, loop, future = heapq.heappop(self._waiters)
                with contextlib.suppress(RuntimeError):  # that loop has closed
                    loop.call_soon_threadsafe(_wake, future)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():  # a cancelled waiter is simply not woken
        future.set_result(None)


_TIMER = _PreciseTimer()

#: Longest single sleep while waiting for a clock; a driven clock (ManualClock) is
#: looked at again this often until it reaches the moment.
_WAIT_STEP = 0.05


async def sleep_precisely(seconds: float) -> None:
    """Sleep ``seconds`` to within tens of microseconds, without blocking the event loop
    (``asyncio.sleep`` may wake a millisecond late)."""
    if seconds > 0:
        await _TIMER.sleep_until(time.monotonic() + seconds)


async def wait_until(clock: Clock, server_ms: float) -> None:
    """Sleep until ``clock`` reads ``server_ms``: precisely, and never before."""
    while (remaining := clock.seconds_until(server_ms)) > 0:
        await _TIMER.sleep_until(time.monotonic() + min(remaining, _WAIT_STEP))
