"""Figures of queues for metrics, read from Redis at scrape time: ``QueueCollector``
reads ``Queue.stats()`` of each queue (depth by state, paused, promotion and claim lag,
workers alive, and the queue's counters kept in Redis, which are the same whichever
process exports them).

Redis is read through the public ``Queue`` API only, one synchronous ``Queue`` per
queue, on the scrape's thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from duetime.client import Queue, QueueStats
from duetime.client.reports import recently_gone
from duetime.settings import DEFAULT_SETTINGS, Settings
from duetime.states import WorkerState, worker_state
from duetime.store.redis.runner import RedisSpec

log = logging.getLogger("duetime.metrics")

#: The counters the Lua scripts keep in a queue's stats hash; each is exported from the
#: start (0 until it happens), so that increase() sees its first event.
QUEUE_EVENTS = (
    "scheduled", "promoted", "completed", "failed", "retried", "dead", "fenced",
    "cancelled", "requeued", "expired_leases", "reaped_workers", "reaped_tasks",
    "handed_back", "cron_fired", "cron_skipped", "dropped_unknown", "snoozed",
    "cron_skipped_outside_window", "cron_paused_after_failures", "cron_backfilled",
    "debounced", "throttle_dropped", "throttle_folded", "unique_hits",
)  # fmt: skip
#: A scrape should answer within Prometheus's scrape timeout (10 s by default) even
#: when Redis does not: the scrape's own clients give up sooner than the daemons'.
SCRAPE_SOCKET_TIMEOUT = 2.0


@dataclass(slots=True)
class _Source:
    """One exported queue: how to reach it, and its client once made."""

    name: str
    redis: RedisSpec
    settings: Settings
    shards: int
    users: int = 1
    queue: Queue | None = None
    down: bool = False  # the last read failed (said once in the log, until it works)


class _QueueFamilies:
    """The metric families of one scrape of the queues."""

    # Long: one family per metric, each with its help text; no logic.
    def __init__(self) -> None:
        self.up = GaugeMetricFamily(
            "duetime_queue_up",
            "1 when this scrape read the queue's figures from Redis; 0 when it could not "
            "(the queue's other duetime_queue_* series are then absent)",
            labels=["queue"],
        )
        self.tasks = GaugeMetricFamily(
            "duetime_queue_tasks",
            "Tasks in the queue by state: scheduled (waiting for their run-at or a retry), "
            "ready (due, not claimed), running (leased by a worker), dead",
            labels=["queue", "state"],
        )
        self.paused = GaugeMetricFamily(
            "duetime_queue_paused",
            "1 while the queue is paused (workers claim nothing)",
            labels=["queue"],
        )
        self.promotion_lag = GaugeMetricFamily(
            "duetime_queue_promotion_lag_seconds",
            "How long the oldest due task has waited to be promoted to ready (0: none is "
            "due); grows when no dispatcher serves the queue",
            labels=["queue"],
        )
        self.claim_lag = GaugeMetricFamily(
            "duetime_queue_claim_lag_seconds",
            "How long past its run-at the oldest ready task has waited for a worker (0: "
            "none is ready); grows when workers are busy, absent or the queue is paused",
            labels=["queue"],
        )
        self.workers = GaugeMetricFamily(
            "duetime_queue_workers",
            "Workers by state: alive (heartbeat within 2 heartbeat intervals), late (a "
            "heartbeat overdue), silent (3 overdue: stopped, frozen or cut off, until a "
            "dispatcher reaps it at worker_ttl), gone (reaped in the last hour)",
            labels=["queue", "state"],
        )
        self.flow_waiting = GaugeMetricFamily(
            "duetime_queue_flow_waiting",
            "Of the ready tasks of a queue under flow control, those waiting for their turn "
            "or a limit (its cap or rate, their limit key's concurrency or rate)",
            labels=["queue"],
        )
        self.flow_throttled = GaugeMetricFamily(
            "duetime_queue_flow_throttled",
            "Limit keys (and the queue itself) waiting for a rate limit to let their next "
            "task start",
            labels=["queue"],
        )
        self.flow_oldest_held = GaugeMetricFamily(
            "duetime_queue_flow_oldest_held_seconds",
            "Of a queue under flow control, how long the oldest task a limit holds (its "
            "key's concurrency or rate, the queue's cap or rate) has waited since it was "
            "due, over the first 50 limit keys with work: a wait asked for, not lateness",
            labels=["queue"],
        )
        self.events = CounterMetricFamily(
            "duetime_queue_events",
            "What happened to the queue's tasks, counted in Redis by the scripts: the same "
            "value from every process that exports it (aggregate with max, not sum)",
            labels=["queue", "event"],
        )

    def all(self) -> list[Metric]:
        return [
            self.up,
            self.tasks,
            self.paused,
            self.promotion_lag,
            self.claim_lag,
            self.workers,
            self.flow_waiting,
            self.flow_throttled,
            self.flow_oldest_held,
            self.events,
        ]

    def add(self, name: str, stats: QueueStats, oldest_held: float, settings: Settings) -> None:
        self.up.add_metric([name], 1)
        for state in ("scheduled", "ready", "running", "dead"):
            self.tasks.add_metric([name, state], getattr(stats, state))
        self.paused.add_metric([name], int(stats.paused))
        self.promotion_lag.add_metric([name], stats.oldest_due_age)
        self.claim_lag.add_metric([name], stats.oldest_ready_age)
        if stats.flow_control:
            self.flow_waiting.add_metric([name], stats.waiting)
            self.flow_throttled.add_metric([name], stats.throttled)
            self.flow_oldest_held.add_metric([name], oldest_held)
        states = [
            worker_state(age, settings.heartbeat_interval, settings.worker_ttl)
            for age in stats.workers.values()
        ]
        for state in (WorkerState.ALIVE, WorkerState.LATE, WorkerState.SILENT):
            self.workers.add_metric([name, state], states.count(state))
        gone = recently_gone(stats, time.time())
        self.workers.add_metric([name, WorkerState.GONE], len({g.id for g in gone}))
        counters = dict.fromkeys(QUEUE_EVENTS, 0) | stats.counters
        for event, value in sorted(counters.items()):
            if value >= 0:  # -1: not a number in Redis (edited by hand); the checker says so
                self.events.add_metric([name, event], value)


def oldest_held_age(queue: Queue, most_keys: int = 50) -> float:
    """Seconds the oldest task a limit holds has waited since it was due, over the first
    ``most_keys`` limit keys with work (0 when none is held), by this process's clock."""
    state = queue.flow(most_keys)
    held = [state.held_since_ms(group) for group in state.groups]
    since = min((ms for ms in held if ms is not None), default=None)
    return 0.0 if since is None else max(0.0, time.time() - since / 1000)


class QueueCollector(Collector):
    """Figures of queues, read from Redis at each scrape through a synchronous
    ``Queue`` of its own per queue (made on the first scrape, on the scrape's thread).
    A queue that cannot be read exports ``duetime_queue_up 0`` and is logged once (until
    it can be read again); the scrape itself never fails."""

    def __init__(self) -> None:
        self._sources: dict[str, _Source] = {}
        self._lock = threading.Lock()  # guards _sources; held briefly
        self._scraping = threading.Lock()  # one scrape at a time uses the clients

    def add(
        self,
        queue: str,
        redis: RedisSpec = None,
        *,
        settings: Settings = DEFAULT_SETTINGS,
        shards: int = 1,
    ) -> None:
        """Export ``queue`` (counted: exported until removed as often as added). The
        first addition's server, settings and shard count are used."""
        with self._lock:
            source = self._sources.get(queue)
            if source is not None:
                source.users += 1
                return
            timeout = min(settings.socket_timeout, SCRAPE_SOCKET_TIMEOUT)
            self._sources[queue] = _Source(
                queue, redis, settings.replace(socket_timeout=timeout), shards
            )

    def remove(self, queue: str) -> None:
        """Undo one ``add``; the last one closes the queue's client (after a scrape in
        flight, so it may wait for one)."""
        with self._lock:
            source = self._sources.get(queue)
            if source is None:
                return
            source.users -= 1
            if source.users > 0:
                return
            del self._sources[queue]
        with self._scraping:
            if source.queue is not None:
                source.queue.close()
                source.queue = None

    def close(self) -> None:
        with self._lock:
            names = list(self._sources)
        for name in names:
            while name in self._sources:
                self.remove(name)

    def describe(self) -> Iterable[Metric]:
        # The names, without reading Redis (a registry asks when the collector joins).
        return _QueueFamilies().all()

    def collect(self) -> Iterable[Metric]:
        families = _QueueFamilies()
        with self._scraping:
            with self._lock:
                sources = list(self._sources.values())
            for source in sources:
                read = self._read(source)
                if read is None:
                    families.up.add_metric([source.name], 0)
                else:
                    families.add(source.name, *read, source.settings)
        return families.all()

    @staticmethod
    def _read(source: _Source) -> tuple[QueueStats, float] | None:
        try:
            if source.queue is None:
                source.queue = Queue(  # it only reads: never durable (see Durability)
                    source.name,
                    source.redis,
                    settings=source.settings,
                    shards=source.shards,
                    durable=False,
                )
            stats = source.queue.stats()
            oldest_held = oldest_held_age(source.queue) if stats.flow_control else 0.0
        except Exception as error:  # whatever it is, the scrape must answer
            level = logging.DEBUG if source.down else logging.WARNING
            source.down = True
            log.log(
                level,
                "metrics: cannot read queue %s (%s); exporting duetime_queue_up 0 "
                "until it can be read",
                source.name,
                error,
            )
            return None
        if source.down:
            source.down = False
            log.info("metrics: queue %s can be read again", source.name)
        return stats, oldest_held
