"""The numbers behind the hook-fed metrics: what ``PrometheusHooks`` and ``AttemptTally``
count per (queue, task), each thread in series of its own, summed into metric families
at scrape time; and ``process_registry()``, duetime's own registry in this process.

Nothing is registered at import: the registry is made on first use, and a registry's
task metrics when the first hooks or tally counts into it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from itertools import accumulate

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from duetime.hooks import AttemptOutcome

#: Start lateness is milliseconds when all is well, so the buckets start well below one.
LATENESS_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
DURATION_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip
#: A wait flow control imposes is as long as the limits make it: milliseconds to an hour.
HELD_BUCKETS = DURATION_BUCKETS
#: The task label of the default handler (tasks scheduled without a name), and of a
#: dead task whose envelope could not be read. Neither can be a task name.
DEFAULT_TASK = "(default)"
UNKNOWN_TASK = "(unknown)"


def task_label(task: str | None) -> str:
    """The task label of a task name (None: the name could not be read)."""
    return UNKNOWN_TASK if task is None else task or DEFAULT_TASK


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

    __slots__ = (
        "duration",
        "duration_sum",
        "held",
        "held_sum",
        "lateness",
        "lateness_sum",
        "outcomes",
        "started",
    )

    def __init__(self) -> None:
        self.started = 0
        self.outcomes = dict.fromkeys(AttemptOutcome, 0)
        self.lateness = [0] * (len(LATENESS_BUCKETS) + 1)  # per bucket; the last is +Inf
        self.lateness_sum = 0.0
        self.held = [0] * (len(HELD_BUCKETS) + 1)
        self.held_sum = 0.0
        self.duration = [0] * (len(DURATION_BUCKETS) + 1)
        self.duration_sum = 0.0


class _Total:
    """The sum of a (queue, task)'s series over threads, for one scrape."""

    def __init__(self) -> None:
        self.started = 0
        self.outcomes = dict.fromkeys(AttemptOutcome, 0)
        self.lateness = [0] * (len(LATENESS_BUCKETS) + 1)
        self.lateness_sum = 0.0
        self.held = [0] * (len(HELD_BUCKETS) + 1)
        self.held_sum = 0.0
        self.duration = [0] * (len(DURATION_BUCKETS) + 1)
        self.duration_sum = 0.0

    def add(self, series: _Series) -> None:
        self.started += series.started
        for outcome, count in list(series.outcomes.items()):
            self.outcomes[outcome] += count
        self.lateness = [a + b for a, b in zip(self.lateness, list(series.lateness), strict=True)]
        self.lateness_sum += series.lateness_sum
        self.held = [a + b for a, b in zip(self.held, list(series.held), strict=True)]
        self.held_sum += series.held_sum
        self.duration = [a + b for a, b in zip(self.duration, list(series.duration), strict=True)]
        self.duration_sum += series.duration_sum


class TaskMetrics(Collector):
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
                self.series.setdefault((queue, task_label(task)), []).append(series)
        return series

    def count_dead_unstarted(self, queue: str, task: str | None) -> None:
        """A task sent to dead without its handler run (``task`` None: unreadable)."""
        key = (queue, task_label(task))
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
            families.held.add_metric(labels, _cumulative(HELD_BUCKETS, total.held), total.held_sum)
            families.duration.add_metric(
                labels, _cumulative(DURATION_BUCKETS, total.duration), total.duration_sum
            )
        return families.all()


class _TaskFamilies:
    """The metric families of the hook-fed metrics, for one scrape."""

    # Long: one family per metric, each with its help text; no logic.
    def __init__(self) -> None:
        by_task = ["queue", "task"]
        self.scheduled = CounterMetricFamily(
            "duetime_tasks_scheduled",
            "Tasks stored by schedule calls of this process "
            "(a Queue given PrometheusHooks); an id already live counts again",
            labels=by_task,
        )
        self.started = CounterMetricFamily(
            "duetime_tasks_started", "Attempts whose handler started", labels=by_task
        )
        self.succeeded = CounterMetricFamily(
            "duetime_tasks_succeeded", "Attempts whose handler returned", labels=by_task
        )
        self.failed = CounterMetricFamily(
            "duetime_tasks_failed",
            "Attempts whose handler raised or timed out; outcome: "
            "retry (another attempt follows) or dead (none is left)",
            labels=[*by_task, "outcome"],
        )
        self.fenced = CounterMetricFamily(
            "duetime_tasks_fenced",
            "Attempts that ended after their lease was gone: their "
            "outcome was dropped, another attempt owns the task",
            labels=by_task,
        )
        self.interrupted = CounterMetricFamily(
            "duetime_tasks_interrupted",
            "Attempts cut off by the worker's shutdown; the task was handed back",
            labels=by_task,
        )
        self.snoozed = CounterMetricFamily(
            "duetime_tasks_snoozed",
            "Attempts whose handler asked to run again later (Snooze): no attempt spent",
            labels=by_task,
        )
        self.cancelled = CounterMetricFamily(
            "duetime_tasks_cancelled_running",
            "Attempts whose task was cancelled while they ran: the task ended as cancelled",
            labels=by_task,
        )
        self.dead_unstarted = CounterMetricFamily(
            "duetime_tasks_dead_unstarted",
            "Tasks sent to dead without running: an "
            "unreadable envelope, no handler of that name, or no attempt left after a lost "
            "lease",
            labels=by_task,
        )
        self.lateness = HistogramMetricFamily(
            "duetime_task_lateness_seconds",
            "How long after it was due each attempt started (server clock): the queue's "
            "own delay, not a wait its limits imposed (see duetime_task_held_seconds)",
            labels=by_task,
        )
        self.held = HistogramMetricFamily(
            "duetime_task_held_seconds",
            "How long flow control's limits (a rate, a cap, a concurrency limit, a "
            "snooze of its key) held each attempt after it was due, before it could start",
            labels=by_task,
        )
        self.duration = HistogramMetricFamily(
            "duetime_task_duration_seconds",
            "How long each attempt's handler ran",
            labels=by_task,
        )

    def add_outcome(self, labels: list[str], outcome: AttemptOutcome, count: int) -> None:
        if outcome in (AttemptOutcome.RETRY, AttemptOutcome.DEAD):
            self.failed.add_metric([*labels, outcome.value], count)
        else:
            family = {
                AttemptOutcome.SUCCEEDED: self.succeeded,
                AttemptOutcome.FENCED: self.fenced,
                AttemptOutcome.INTERRUPTED: self.interrupted,
                AttemptOutcome.SNOOZED: self.snoozed,
                AttemptOutcome.CANCELLED: self.cancelled,
            }[outcome]
            family.add_metric(labels, count)

    def all(self) -> list[Metric]:
        return [
            self.scheduled,
            self.started,
            self.succeeded,
            self.failed,
            self.fenced,
            self.interrupted,
            self.snoozed,
            self.cancelled,
            self.dead_unstarted,
            self.lateness,
            self.held,
            self.duration,
        ]


_metrics_of: weakref.WeakKeyDictionary[CollectorRegistry, TaskMetrics] = weakref.WeakKeyDictionary()


def task_metrics(registry: CollectorRegistry) -> TaskMetrics:
    """The task metrics of ``registry``, made and registered there on first use."""
    with _registry_lock:
        metrics = _metrics_of.get(registry)
        if metrics is None:
            metrics = _metrics_of[registry] = TaskMetrics()
            registry.register(metrics)
        return metrics
