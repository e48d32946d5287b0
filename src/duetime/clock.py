"""The one clock every dispatcher and worker shares: the Redis server's TIME.

Hosts' own clocks may disagree; the server's does not. A ``ServerClock`` samples
TIME now and then and extrapolates with the local monotonic clock, anchoring each
sample at the moment its reply arrived, so the estimate trails the server by at
most the time the reply took to travel back and is never ahead of it (never
early). Tests inject a ``ManualClock`` to drive time against a real server.
"""

from __future__ import annotations

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

    def seconds_until(self, server_ms: int) -> float:
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

    def seconds_until(self, server_ms: int) -> float:
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

    def seconds_until(self, server_ms: int) -> float:
        return (server_ms - self._now_ms) / 1000.0

    def set(self, now_ms: int) -> None:
        self._now_ms = now_ms

    def advance(self, seconds: float) -> None:
        self._now_ms += round(seconds * 1000)
