"""Prometheus metrics: what this process saw happen to tasks, and what Redis says of
its queues.

This module owns:
- ``PrometheusHooks``, an ordinary ``Hooks``: attempts started and how they ended,
  start lateness and run time, tasks scheduled; per process, by queue and task name;
- ``QueueCollector``, which reads ``Queue.stats()`` of each queue at scrape time (depth
  by state, paused, promotion and claim lag, workers alive, and the queue's counters
  kept in Redis, which are the same whichever process exports them);
- ``CronCollector``, the cron ticks this process's dispatchers fired, skipped, held
  back and found missed;
- the endpoint: ``export()``, called by ``Worker.run`` and ``Dispatcher.run`` when
  ``Settings.metrics_port`` is set, serves one HTTP endpoint per process, shared by
  its daemons, started by the first and stopped after the last.

Nothing is registered at import: the metrics live in ``process_registry()``, a registry
of duetime's own (never ``prometheus_client.REGISTRY``), made on first use. Redis is
read through the public ``Queue`` API only, one synchronous ``Queue`` per queue, on the
scrape's thread. The per-attempt path takes no lock and allocates nothing once a task
has been seen: it is on the worker's hot path (docs/metrics.md, "What it costs").
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import weakref
from bisect import bisect_left, bisect_right
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from duetime.client import Queue, QueueStats
from duetime.errors import ConfigurationError
from duetime.hooks import (
    AttemptInfo,
    AttemptOutcome,
    AttemptResult,
    DeadTaskInfo,
    HookChain,
    Hooks,
    ScheduledTask,
)
from duetime.settings import DEFAULT_SETTINGS, Settings
from duetime.store.runner import RedisSpec

if TYPE_CHECKING:
    from duetime.dispatcher import QueueDispatcher

log = logging.getLogger("duetime.metrics")
_V = TypeVar("_V")

#: Where the endpoint listens unless $DUETIME_METRICS_ADDRESS says otherwise: the
#: endpoint has no authentication and names queues, tasks and cron jobs, so it is not
#: offered to the network unless asked (0.0.0.0 in a container, say).
DEFAULT_ADDRESS = "127.0.0.1"
ADDRESS_VARIABLE = "DUETIME_METRICS_ADDRESS"
#: Start lateness is milliseconds when all is well, so the buckets start well below one.
LATENESS_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
DURATION_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip
#: The task label of the default handler (tasks scheduled without a name), and of a
#: dead task whose envelope could not be read. Neither can be a task name.
DEFAULT_TASK = "(default)"
UNKNOWN_TASK = "(unknown)"
#: The counters the Lua scripts keep in a queue's stats hash; each is exported from the
#: start (0 until it happens), so that increase() sees its first event.
QUEUE_EVENTS = (
    "scheduled", "promoted", "completed", "failed", "retried", "dead", "fenced",
    "cancelled", "requeued", "expired_leases", "reaped_workers", "reaped_tasks",
    "handed_back", "cron_fired", "cron_skipped", "dropped_unknown",
)  # fmt: skip
CRON_OUTCOMES = ("fired", "skipped", "delayed", "missed")
#: A scrape should answer within Prometheus's scrape timeout (10 s by default) even
#: when Redis does not: the scrape's own clients give up sooner than the daemons'.
SCRAPE_SOCKET_TIMEOUT = 2.0
#: Closing the endpoint: how often it is woken up to see the request, and for how long.
POLL_INTERVAL = 0.05
CLOSE_WITHIN = 2.0


def _task_label(task: str | None) -> str:
    return UNKNOWN_TASK if task is None else task or DEFAULT_TASK


# --- the registry and the hook-fed metrics -------------------------------------------

_registry_lock = threading.Lock()
_registry: CollectorRegistry | None = None


def process_registry() -> CollectorRegistry:
    """duetime's own registry in this process: what the endpoint serves, and where
    ``PrometheusHooks()`` counts unless given another. Serve it from an app's own
    endpoint with ``prometheus_client.make_wsgi_app(process_registry())``, say."""
    global _registry
    with _registry_lock:
        if _registry is None:
            _registry = CollectorRegistry()
        return _registry


def _cumulative(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    edges = [*(repr(float(bound)) for bound in bounds), "+Inf"]  # as prometheus_client does
    return list(zip(edges, accumulate(counts), strict=True))


class _Series:
    """What the hooks counted for one (queue, task) on one thread, as plain numbers.
    Only its thread writes it, so it needs no lock (prometheus_client's own metrics take
    a lock per bucket walked, too dear on the path of every attempt); a scrape reads it
    from another thread, one number at a time."""

    __slots__ = ("duration", "duration_sum", "lateness", "lateness_sum", "outcomes", "started")

    def __init__(self) -> None:
        self.started = 0
        self.outcomes = dict.fromkeys(AttemptOutcome, 0)
        self.lateness = [0] * (len(LATENESS_BUCKETS) + 1)  # per bucket; the last is +Inf
        self.lateness_sum = 0.0
        self.duration = [0] * (len(DURATION_BUCKETS) + 1)
        self.duration_sum = 0.0


class _Total:
    """The sum of a (queue, task)'s series over threads, for one scrape."""

    def __init__(self) -> None:
        self.started = 0
        self.outcomes = dict.fromkeys(AttemptOutcome, 0)
        self.lateness = [0] * (len(LATENESS_BUCKETS) + 1)
        self.lateness_sum = 0.0
        self.duration = [0] * (len(DURATION_BUCKETS) + 1)
        self.duration_sum = 0.0

    def add(self, series: _Series) -> None:
        self.started += series.started
        for outcome, count in list(series.outcomes.items()):
            self.outcomes[outcome] += count
        self.lateness = [a + b for a, b in zip(self.lateness, list(series.lateness), strict=True)]
        self.lateness_sum += series.lateness_sum
        self.duration = [a + b for a, b in zip(self.duration, list(series.duration), strict=True)]
        self.duration_sum += series.duration_sum


class _TaskMetrics(Collector):
    """The hook-fed metrics of one registry, turned into metric families at scrape time.
    Attempts are counted in per-thread series (see _Series); schedule calls, from any
    thread, under a lock. Made once per registry: every PrometheusHooks on a registry
    counts into the same one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.series: dict[tuple[str, str], list[_Series]] = {}  # one per counting thread
        self.scheduled: dict[tuple[str, str], int] = {}
        self.dead_unstarted: dict[tuple[str, str], int] = {}
        self._local = threading.local()

    def mine(self, queue: str, task: str) -> _Series:
        """This thread's series of (queue, task)."""
        try:
            mine: dict[tuple[str, str], _Series] = self._local.series
        except AttributeError:
            mine = self._local.series = {}
        series = mine.get((queue, task))
        if series is None:
            series = mine[queue, task] = _Series()
            with self.lock:  # every series of the task shows from now on, at 0
                self.series.setdefault((queue, _task_label(task)), []).append(series)
        return series

    def count_dead_unstarted(self, queue: str, task: str | None) -> None:
        """A task sent to dead without its handler run (``task`` None: unreadable)."""
        key = (queue, _task_label(task))
        with self.lock:
            self.dead_unstarted[key] = self.dead_unstarted.get(key, 0) + 1

    def describe(self) -> Iterable[Metric]:
        return _TaskFamilies().all()

    def collect(self) -> Iterable[Metric]:
        with self.lock:
            scheduled = sorted(self.scheduled.items())
            dead_unstarted = sorted(self.dead_unstarted.items())
            every = sorted((key, list(threads)) for key, threads in self.series.items())
        families = _TaskFamilies()
        for key, count in scheduled:
            families.scheduled.add_metric(key, count)
        for key, count in dead_unstarted:
            families.dead_unstarted.add_metric(key, count)
        for key, threads in every:
            total = _Total()
            for series in threads:
                total.add(series)
            labels = list(key)
            families.started.add_metric(labels, total.started)
            for outcome, count in total.outcomes.items():
                families.add_outcome(labels, outcome, count)
            families.lateness.add_metric(
                labels, _cumulative(LATENESS_BUCKETS, total.lateness), total.lateness_sum
            )
            families.duration.add_metric(
                labels, _cumulative(DURATION_BUCKETS, total.duration), total.duration_sum
            )
        return families.all()


class _TaskFamilies:
    """The metric families of the hook-fed metrics, for one scrape."""

    def __init__(self) -> None:
        by_task = ["queue", "task"]
        self.scheduled = CounterMetricFamily(
            "duetime_tasks_scheduled", "Tasks stored by schedule calls of this process "
            "(a Queue given PrometheusHooks); an id already live counts again",
            labels=by_task,
        )  # fmt: skip
        self.started = CounterMetricFamily(
            "duetime_tasks_started", "Attempts whose handler started", labels=by_task
        )
        self.succeeded = CounterMetricFamily(
            "duetime_tasks_succeeded", "Attempts whose handler returned", labels=by_task
        )
        self.failed = CounterMetricFamily(
            "duetime_tasks_failed", "Attempts whose handler raised or timed out; outcome: "
            "retry (another attempt follows) or dead (none is left)",
            labels=[*by_task, "outcome"],
        )  # fmt: skip
        self.fenced = CounterMetricFamily(
            "duetime_tasks_fenced", "Attempts that ended after their lease was gone: their "
            "outcome was dropped, another attempt owns the task",
            labels=by_task,
        )  # fmt: skip
        self.interrupted = CounterMetricFamily(
            "duetime_tasks_interrupted",
            "Attempts cut off by the worker's shutdown; the task was handed back",
            labels=by_task,
        )
        self.dead_unstarted = CounterMetricFamily(
            "duetime_tasks_dead_unstarted", "Tasks sent to dead without running: an "
            "unreadable envelope, no handler of that name, or no attempt left after a lost "
            "lease",
            labels=by_task,
        )  # fmt: skip
        self.lateness = HistogramMetricFamily(
            "duetime_task_lateness_seconds",
            "How long after its run-at each attempt started (server clock)",
            labels=by_task,
        )
        self.duration = HistogramMetricFamily(
            "duetime_task_duration_seconds", "How long each attempt's handler ran",
            labels=by_task,
        )  # fmt: skip

    def add_outcome(self, labels: list[str], outcome: AttemptOutcome, count: int) -> None:
        if outcome in (AttemptOutcome.RETRY, AttemptOutcome.DEAD):
            self.failed.add_metric([*labels, outcome.value], count)
        else:
            family = {
                AttemptOutcome.SUCCEEDED: self.succeeded,
                AttemptOutcome.FENCED: self.fenced,
                AttemptOutcome.INTERRUPTED: self.interrupted,
            }[outcome]
            family.add_metric(labels, count)

    def all(self) -> list[Metric]:
        return [self.scheduled, self.started, self.succeeded, self.failed, self.fenced,
                self.interrupted, self.dead_unstarted, self.lateness, self.duration]  # fmt: skip


_metrics_of: weakref.WeakKeyDictionary[CollectorRegistry, _TaskMetrics] = (
    weakref.WeakKeyDictionary()
)


def _task_metrics(registry: CollectorRegistry) -> _TaskMetrics:
    with _registry_lock:
        metrics = _metrics_of.get(registry)
        if metrics is None:
            metrics = _metrics_of[registry] = _TaskMetrics()
            registry.register(metrics)
        return metrics


class PrometheusHooks(Hooks):
    """Counts what the hooks report, into ``registry`` (default: ``process_registry()``,
    which the endpoint serves). Add it to an ``App`` for attempts and to a ``Queue`` for
    schedule calls (a worker with ``Settings.metrics_port`` counts the same series
    itself, with an AttemptTally, unless its app brought one of these on that registry).
    Several on one registry share its metrics, so each event must reach only one of them.

    Counts are what attempts reported: an outcome that Redis refused afterwards (the
    lease ran out meanwhile) still counts as reported. The queue's counters in Redis
    (``duetime_queue_events_total``) are the recorded truth. Attempts are counted
    without a lock, each thread in series of its own; schedule calls, which may come
    from any thread, under the registry's lock."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else process_registry()
        self._metrics = _task_metrics(self.registry)
        self._mine = self._metrics.mine  # bound once: called twice per attempt

    def on_schedule(self, queue: str, tasks: Sequence[ScheduledTask]) -> None:
        counts = Tally(_task_label(task.task) for task in tasks)
        scheduled = self._metrics.scheduled
        with self._metrics.lock:
            for task, count in counts.items():
                scheduled[queue, task] = scheduled.get((queue, task), 0) + count

    def before_attempt(self, attempt: AttemptInfo) -> None:
        series = self._mine(attempt.queue, attempt.task)
        series.started += 1
        lateness = attempt.started_at - max(attempt.run_at, attempt.due_at)  # .lateness, inlined
        series.lateness[bisect_left(LATENESS_BUCKETS, lateness)] += 1  # le is inclusive
        series.lateness_sum += lateness

    def after_attempt(self, attempt: AttemptInfo, result: AttemptResult) -> None:
        series = self._mine(attempt.queue, attempt.task)
        series.outcomes[result.outcome] += 1
        duration = result.duration
        series.duration[bisect_left(DURATION_BUCKETS, duration)] += 1
        series.duration_sum += duration

    def on_dead(self, dead: DeadTaskInfo) -> None:
        if dead.attempt is None:  # a dead attempt was counted by after_attempt
            self._metrics.count_dead_unstarted(dead.queue, dead.task)


def builtin_tally(chain: HookChain, queue: str) -> AttemptTally | None:
    """What a worker with ``Settings.metrics_port`` counts its attempts into: a tally on
    ``process_registry()``, or None when the app brought a PrometheusHooks on that
    registry already (its hooks count each attempt, and must be the only ones)."""
    own = process_registry()
    if any(isinstance(hook, PrometheusHooks) and hook.registry is own for hook in chain.hooks):
        return None
    return AttemptTally(_task_metrics(own), queue)


class AttemptTally:
    """The built-in metrics of one worker: what PrometheusHooks counts, taken in bulk.

    Two hook calls per attempt, each with an AttemptInfo and an AttemptResult to build,
    cost a no-op task's worker about a tenth of its time. The worker instead appends
    plain numbers to these lists as attempts start and end (on its event loop, which
    alone touches them), and calls ``flush`` now and then (with each batch of acks, and
    at each heartbeat): a batch is counted with a few C-level passes (a sort for each
    histogram), not a Python call per attempt. A scrape sees an attempt once the next
    flush has run: within a heartbeat interval."""

    __slots__ = ("_metrics", "_queue", "ended", "ended_tasks", "started", "started_tasks")

    def __init__(self, metrics: _TaskMetrics, queue: str) -> None:
        self._metrics = metrics
        self._queue = queue
        # Parallel lists: task name, and lateness (seconds after its run-at) at the start.
        self.started_tasks: list[str] = []
        self.started: list[float] = []
        # Task name, and (how it ended, seconds the handler ran) at the end.
        self.ended_tasks: list[str] = []
        self.ended: list[tuple[AttemptOutcome, float]] = []

    def dead_unstarted(self, task: str | None) -> None:
        """A task sent to dead without its handler run (few: counted at once)."""
        self._metrics.count_dead_unstarted(self._queue, task)

    def flush(self) -> None:
        """Count what was appended since the last flush into this thread's series."""
        if self.started:
            tasks, values = self.started_tasks, self.started
            self.started_tasks, self.started = [], []
            for task, latenesses in _by_task(tasks, values).items():
                series = self._metrics.mine(self._queue, task)
                series.started += len(latenesses)
                series.lateness_sum += sum(latenesses)
                _add_to_buckets(series.lateness, LATENESS_BUCKETS, latenesses)
        if self.ended:
            tasks, ends = self.ended_tasks, self.ended
            self.ended_tasks, self.ended = [], []
            for task, results in _by_task(tasks, ends).items():
                series = self._metrics.mine(self._queue, task)
                outcomes, durations = zip(*results, strict=True)
                for outcome, count in Tally(outcomes).items():
                    series.outcomes[outcome] += count
                series.duration_sum += sum(durations)
                _add_to_buckets(series.duration, DURATION_BUCKETS, list(durations))


def _by_task(tasks: list[str], values: list[_V]) -> dict[str, list[_V]]:
    """``values`` grouped by the task of the same position; a worker mostly runs one
    task name, found at C speed by list.count."""
    if tasks.count(tasks[0]) == len(tasks):
        return {tasks[0]: values}
    grouped: dict[str, list[_V]] = {}
    for task, value in zip(tasks, values, strict=True):
        grouped.setdefault(task, []).append(value)
    return grouped


def _add_to_buckets(counts: list[int], bounds: tuple[float, ...], values: list[float]) -> None:
    """Add each value to the count of its bucket (the first bound >= it, as bisect_left
    finds it one value at a time; the last count is +Inf), a whole batch at once."""
    values.sort()
    below = 0
    for i, bound in enumerate(bounds):
        upto = bisect_right(values, bound)  # values <= bound: le is inclusive
        counts[i] += upto - below
        below = upto
    counts[-1] += len(values) - below


# --- queue figures, read from Redis at scrape time -------------------------------------


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
            "duetime_queue_paused", "1 while the queue is paused (workers claim nothing)",
            labels=["queue"],
        )  # fmt: skip
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
            "Registered workers by state: alive (heartbeat younger than worker_ttl) or "
            "silent (older: killed or stuck, until a dispatcher reaps it)",
            labels=["queue", "state"],
        )
        self.events = CounterMetricFamily(
            "duetime_queue_events",
            "What happened to the queue's tasks, counted in Redis by the scripts: the same "
            "value from every process that exports it (aggregate with max, not sum)",
            labels=["queue", "event"],
        )

    def all(self) -> list[Metric]:
        return [self.up, self.tasks, self.paused, self.promotion_lag, self.claim_lag,
                self.workers, self.events]  # fmt: skip

    def add(self, name: str, stats: QueueStats, worker_ttl: float) -> None:
        self.up.add_metric([name], 1)
        for state in ("scheduled", "ready", "running", "dead"):
            self.tasks.add_metric([name, state], getattr(stats, state))
        self.paused.add_metric([name], int(stats.paused))
        self.promotion_lag.add_metric([name], stats.oldest_due_age)
        self.claim_lag.add_metric([name], stats.oldest_ready_age)
        alive = sum(1 for age in stats.workers.values() if age < worker_ttl)
        self.workers.add_metric([name, "alive"], alive)
        self.workers.add_metric([name, "silent"], len(stats.workers) - alive)
        counters = dict.fromkeys(QUEUE_EVENTS, 0) | stats.counters
        for event, value in sorted(counters.items()):
            if value >= 0:  # -1: not a number in Redis (edited by hand); the checker says so
                self.events.add_metric([name, event], value)


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
                stats = self._read(source)
                if stats is None:
                    families.up.add_metric([source.name], 0)
                else:
                    families.add(source.name, stats, source.settings.worker_ttl)
        return families.all()

    @staticmethod
    def _read(source: _Source) -> QueueStats | None:
        try:
            if source.queue is None:
                source.queue = Queue(  # it only reads: never durable (see Durability)
                    source.name, source.redis, settings=source.settings, shards=source.shards,
                    durable=False,
                )  # fmt: skip
            stats = source.queue.stats()
        except Exception as error:  # whatever it is, the scrape must answer
            level = logging.DEBUG if source.down else logging.WARNING
            source.down = True
            log.log(
                level, "metrics: cannot read queue %s (%s); exporting duetime_queue_up 0 "
                "until it can be read", source.name, error,
            )  # fmt: skip
            return None
        if source.down:
            source.down = False
            log.info("metrics: queue %s can be read again", source.name)
        return stats


# --- cron ticks seen by this process's dispatchers ------------------------------------


class CronCollector(Collector):
    """The cron ticks this process's dispatchers fired, skipped (overlap="skip"), held
    back (overlap="delay") and found missed, by queue and job, from each dispatcher's
    ``cron_ticks``. Per process: with several dispatchers, sum over them."""

    def __init__(self) -> None:
        self._dispatchers: list[QueueDispatcher] = []
        self._lock = threading.Lock()

    def add(self, dispatchers: Iterable[QueueDispatcher]) -> None:
        with self._lock:
            self._dispatchers.extend(dispatchers)

    def remove(self, dispatchers: Iterable[QueueDispatcher]) -> None:
        with self._lock:
            for dispatcher in dispatchers:
                if dispatcher in self._dispatchers:
                    self._dispatchers.remove(dispatcher)

    @staticmethod
    def _family() -> CounterMetricFamily:
        return CounterMetricFamily(
            "duetime_cron_ticks",
            "Cron ticks this process's dispatchers handled: fired (enqueued, catch-ups "
            "included), skipped (overlap=skip, the previous run still live), delayed "
            "(held for overlap=delay), missed (due while no dispatcher fired them)",
            labels=["queue", "job", "outcome"],
        )

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        totals: dict[tuple[str, str], dict[str, int]] = {}
        with self._lock:
            dispatchers = list(self._dispatchers)
        for dispatcher in dispatchers:
            # A shard's name is "<queue>#<n>" (store.keys.shard_tag); "#" is not allowed
            # in a queue name. The copy is atomic: the loop thread may add meanwhile.
            queue = dispatcher.queue.partition("#")[0]
            for (job, outcome), count in dispatcher.cron_ticks.copy().items():
                outcomes = totals.setdefault((queue, job), dict.fromkeys(CRON_OUTCOMES, 0))
                outcomes[outcome] = outcomes.get(outcome, 0) + count
        family = self._family()
        for (queue, job), outcomes in sorted(totals.items()):
            for outcome, count in outcomes.items():
                family.add_metric([queue, job, outcome], count)
        return [family]


# --- the endpoint ----------------------------------------------------------------------


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in flight never holds the process's exit


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # a request every scrape interval is not news


class MetricsServer:
    """An HTTP endpoint serving ``registry`` from a thread of its own. ``port`` 0 takes a
    free port (see ``.port``). Raises ConfigurationError when it cannot listen."""

    def __init__(self, registry: CollectorRegistry, port: int, address: str = DEFAULT_ADDRESS):
        server = _Server6 if ":" in address else _Server
        try:
            self._httpd = make_server(
                address, port, make_wsgi_app(registry), server, handler_class=_QuietHandler
            )
        except OSError as error:
            raise ConfigurationError(
                f"cannot serve metrics on {address}:{port}: {error.strerror or error}. Give "
                "each process a free port (Settings.metrics_port, $DUETIME_METRICS_PORT, "
                f"--metrics-port) or an address of this host (${ADDRESS_VARIABLE})"
            ) from None
        self.address = address
        # No poll interval: the thread sleeps until a request comes (a thread that wakes
        # on a timer takes the GIL from a busy worker each time); close() sends one.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": None},
            name="duetime-metrics", daemon=True,
        )  # fmt: skip
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._httpd.server_port)

    def close(self) -> None:
        stopping = threading.Thread(target=self._httpd.shutdown, daemon=True)
        stopping.start()
        # serve_forever looks at the shutdown request only once a request woke it up.
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.address, self.address)
        deadline = time.monotonic() + CLOSE_WITHIN
        while stopping.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection((host, self.port), timeout=POLL_INTERVAL).close()
            stopping.join(POLL_INTERVAL)
        self._httpd.server_close()
        self._thread.join(timeout=POLL_INTERVAL)


class MetricsEndpoint:
    """The queue and cron collectors of some daemons on a registry, and the HTTP endpoint
    serving it once ``start()``-ed. One per process serves the daemons (``export``);
    more may be made, each on its own registry (default: a fresh one)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.queues = QueueCollector()
        self.cron = CronCollector()
        self.server: MetricsServer | None = None
        self.registry.register(self.queues)
        self.registry.register(self.cron)

    def start(self, port: int, address: str = DEFAULT_ADDRESS) -> MetricsEndpoint:
        """Listen on ``address``:``port``; raises ConfigurationError when it cannot."""
        self.server = MetricsServer(self.registry, port, address)
        return self

    @property
    def port(self) -> int | None:
        return None if self.server is None else self.server.port

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        self.registry.unregister(self.queues)
        self.registry.unregister(self.cron)
        self.queues.close()


@dataclass(slots=True)
class _Exported:
    endpoint: MetricsEndpoint
    port: int  # the port asked for
    users: int = 0


_process_lock = threading.Lock()
_process: _Exported | None = None


def export(
    settings: Settings,
    redis: RedisSpec,
    queues: Sequence[str],
    shards: int = 1,
    dispatchers: Sequence[QueueDispatcher] = (),
) -> Callable[[], None]:
    """Export a daemon's queues (and its dispatchers' cron ticks) on this process's
    endpoint, on ``settings.metrics_port``: the first daemon starts it, the others share
    it. Returns the function that takes them back; after the last, the endpoint stops.
    An endpoint that cannot listen (the port is taken) is logged, never fatal: the
    daemon's work matters more than its metrics."""
    global _process
    with _process_lock:
        exported = _process
        if exported is None:
            exported = _Exported(MetricsEndpoint(process_registry()), settings.metrics_port)
            _process = exported
            address = os.environ.get(ADDRESS_VARIABLE) or DEFAULT_ADDRESS
            try:
                exported.endpoint.start(settings.metrics_port, address)
                log.info("serving metrics on http://%s:%d/metrics", address,
                         settings.metrics_port)  # fmt: skip
            except ConfigurationError as error:
                log.error("%s; this process exports no metrics", error)
        elif settings.metrics_port != exported.port:
            log.warning(
                "metrics are served on port %d already (one endpoint per process); "
                "metrics_port %d is ignored", exported.port, settings.metrics_port,
            )  # fmt: skip
        exported.users += 1
    endpoint = exported.endpoint
    for queue in queues:
        endpoint.queues.add(queue, redis, settings=settings, shards=shards)
    endpoint.cron.add(dispatchers)
    released = threading.Event()

    def unexport() -> None:
        global _process
        if released.is_set():
            return
        released.set()
        endpoint.cron.remove(dispatchers)
        for queue in queues:
            endpoint.queues.remove(queue)
        with _process_lock:
            exported.users -= 1
            if exported.users == 0:
                # Closed under the lock: a daemon starting now must find the port free.
                endpoint.close()
                _process = None

    return unexport
