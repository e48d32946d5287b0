"""What every plan of one queue builds on: the queue's keys, the server clock its "now"
comes from (sampled with TIME), and what its plans last heard of the delayed buckets.
Each group of plans (producer, dispatcher, worker, ...) is a subclass; ``operations``
joins them into ``QueueOperations``."""

from __future__ import annotations

import time

from duetime.clock import Clock
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.requests import Command, Plan


def sample_clock(clock: Clock, route: str) -> Plan[None]:
    """Take one TIME sample for the clock, from the server that holds ``route``."""
    sent = time.monotonic()
    seconds, micros = yield Command(("TIME",), route=route)
    # Microseconds kept: flooring here and again in now_ms() made the estimate trail by ~1 ms.
    clock.observe(int(seconds) * 1000 + int(micros) / 1000, time.monotonic() - sent)


def current_time(clock: Clock, route: str) -> Plan[int]:
    """The server time in ms, sampling TIME only when the clock asks for it."""
    now = clock.now_ms()
    while now is None:
        yield from sample_clock(clock, route)
        now = clock.now_ms()
    return now


class QueueBase:
    """The state the plans of one queue (or of one shard of a sharded queue) share."""

    def __init__(self, keys: QueueKeys, clock: Clock) -> None:
        self.keys = keys
        self.clock = clock
        #: The generation of delayed buckets new tasks go to, as last heard from the
        #: server (None: not yet asked). See schedule_tasks.lua.
        self.generation: int | None = None
        #: The earliest delayed buckets, with their earliest run-at, as the last promotion
        #: saw them: the next one passes the keys of those due.
        self._earliest_buckets: list[tuple[str, float]] = []
        #: The keys every schedule call names first (its delayed buckets follow).
        self._schedule_keys = (
            keys.tasks,
            keys.scheduled,
            keys.ready,
            keys.wake,
            keys.stats,
            keys.delayed,
            keys.delayed_layout,
            keys.limits,
            keys.flow_records,
            keys.due,
            keys.turns,
            keys.throttled,
            keys.rate_state,
            keys.running,
            keys.leases,
            keys.flow_holds,
        )

    def now(self) -> Plan[int]:
        return (yield from current_time(self.clock, self.keys.tasks))

    def refresh_clock(self) -> Plan[None]:
        """Resample the server clock if it is due, so hot paths need not."""
        if self.clock.wants_sample():
            yield from sample_clock(self.clock, self.keys.tasks)
