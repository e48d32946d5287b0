"""Every step duetime takes on Redis, written once.

Each operation is a *plan*: a generator that yields requests (a command, a script
call or a batch; see ``requests``) and receives their replies. ``runner.SyncRunner``
and ``runner.AsyncRunner`` execute the same plans, so the asyncio client and the
synchronous one share all logic. Plans never sleep and never touch a socket.

The plans of one queue are written in groups, one module per role (``producing``,
``dispatching``, ``working``, ``cron_jobs``, ``operating``, ``snapshot``,
``server_checks``, ``flow_control``, ``searching``, ``keyed``, ``history``), each given
the queue's state (``base.QueueState``); ``QueueOperations`` holds them, one attribute
per group (``operations.producer``, ``operations.worker``, ...). Also here: the queues
of a sharded layout, and the registry of queues (noted by the dispatchers that serve
them and by clients after their first write).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from duetime import validation
from duetime.clock import Clock, ServerClock
from duetime.store.plans.base import QueueState
from duetime.store.plans.cron_jobs import CronPlans
from duetime.store.plans.dispatching import DispatcherPlans
from duetime.store.plans.flow_control import FlowPlans
from duetime.store.plans.history import HistoryPlans
from duetime.store.plans.keyed import KeyedPlans
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.layout import QUEUE_REGISTRY, QueueLayout
from duetime.store.plans.operating import OperatorPlans
from duetime.store.plans.producing import ProducerPlans
from duetime.store.plans.replies import as_text
from duetime.store.plans.requests import Command, Plan
from duetime.store.plans.searching import SearchPlans
from duetime.store.plans.server_checks import ServerCheckPlans
from duetime.store.plans.snapshot import SnapshotPlans
from duetime.store.plans.working import WorkerPlans


class QueueOperations:
    """The plans of one queue (or of one shard of a sharded queue): each group, by its
    role, made around the one state they share (keys, clock, delayed buckets)."""

    __slots__ = (
        "clock",
        "cron",
        "dispatcher",
        "flow",
        "history",
        "keyed",
        "keys",
        "operator",
        "producer",
        "search",
        "server",
        "snapshot",
        "state",
        "worker",
    )

    def __init__(self, keys: QueueKeys, clock: Clock) -> None:
        self.keys, self.clock = keys, clock
        self.state = state = QueueState(keys, clock)
        self.producer = ProducerPlans(state)
        self.search = SearchPlans(state, self.producer)
        self.dispatcher = DispatcherPlans(state)
        self.worker = WorkerPlans(state)
        self.cron = CronPlans(state)
        self.operator = OperatorPlans(state)
        self.snapshot = SnapshotPlans(state)
        self.server = ServerCheckPlans(state)
        self.flow = FlowPlans(state)
        self.keyed = KeyedPlans(state)
        self.history = HistoryPlans(state)


def shard_operations(
    layout: QueueLayout, clock: Clock | None, resync_interval: float
) -> list[QueueOperations]:
    """The operations of each shard of a queue. With a clock given they all follow it;
    otherwise each follows a clock of its own: on a cluster, shards live on different
    masters, and a shard's "now" is the TIME of the server that holds it."""
    return [QueueOperations(keys, clock or ServerClock(resync_interval)) for keys in layout.shards]


@dataclass(frozen=True, slots=True)
class RegisteredQueue:
    name: str
    shards: int
    seen_ms: int  # when a dispatcher last started for it (server clock); 0: none yet


def register_queues(layouts: Sequence[QueueLayout]) -> Plan[None]:
    """Note the queues a dispatcher serves, so that they can be listed."""
    seconds, micros = yield Command(("TIME",), route=QUEUE_REGISTRY)
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    fields = [part for layout in layouts for part in (layout.queue, f"{layout.count} {now_ms}")]
    yield Command(("HSET", QUEUE_REGISTRY, *fields))


def note_queue(layout: QueueLayout) -> Plan[None]:
    """Note a queue a client has written to, unless a dispatcher (or another client)
    noted it already: listed from its first task, with no dispatcher seen yet (0). Any
    failure is left alone (an ACL line from before this command was granted, the server
    gone): listing is a courtesy, and the write it follows is done."""
    yield Command(
        ("HSETNX", QUEUE_REGISTRY, layout.queue, f"{layout.count} 0"), failure_as_reply=True
    )


def registered_queues() -> Plan[list[RegisteredQueue]]:
    """The queues clients and dispatchers noted, by name; an entry written by hand that
    does not parse is left out."""
    reply = yield Command(("HGETALL", QUEUE_REGISTRY))
    if isinstance(reply, list):  # some clients leave HGETALL as a flat list
        reply = dict(zip(reply[::2], reply[1::2], strict=True))
    found = []
    for name, value in reply.items():
        shards, _, seen = as_text(value).partition(" ")
        if validation.is_whole(shards) and validation.is_whole(seen):
            found.append(RegisteredQueue(as_text(name), int(shards), int(seen)))
    return sorted(found, key=lambda queue: queue.name)
