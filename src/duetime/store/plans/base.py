"""What every group of plans of one queue shares: the queue's state (its keys, the
server clock its "now" comes from, sampled with TIME, and the generation of delayed
buckets its plans last heard of), and the one plain base a group starts from, which
holds it. Each group (producer, dispatcher, worker, ...) is given the same state;
``operations`` makes the groups of one queue around one state."""

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


class QueueState:
    """The state the plans of one queue (or of one shard of a sharded queue) share."""

    __slots__ = ("clock", "generation", "keys")

    def __init__(self, keys: QueueKeys, clock: Clock) -> None:
        self.keys = keys
        self.clock = clock
        #: The generation of delayed buckets new tasks go to, as last heard from the
        #: server (None: not yet asked). See schedule_tasks.lua.
        self.generation: int | None = None

    def now(self) -> Plan[int]:
        return (yield from current_time(self.clock, self.keys.tasks))

    def refresh_clock(self) -> Plan[None]:
        """Resample the server clock if it is due, so hot paths need not."""
        if self.clock.wants_sample():
            yield from sample_clock(self.clock, self.keys.tasks)


class QueuePlans:
    """A group of plans of one queue: the state it shares with the queue's other groups,
    and the keys of that state (read by nearly every plan)."""

    def __init__(self, state: QueueState) -> None:
        self.state = state
        self.keys = state.keys
