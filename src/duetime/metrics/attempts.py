"""The metrics of task attempts as this process saw them: ``PrometheusHooks``, an
ordinary ``Hooks`` (attempts started and how they ended, start lateness and run time,
tasks scheduled; per process, by queue and task name), and ``AttemptTally``, the same
series counted in bulk by a worker with ``Settings.metrics_port``.

The per-attempt path takes no lock and allocates nothing once a task has been seen: it
is on the worker's hot path (docs/metrics.md, "What it costs").
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter as Tally
from collections.abc import Sequence
from typing import TypeVar

from prometheus_client import CollectorRegistry

from duetime.hooks import (
    AttemptInfo,
    AttemptOutcome,
    AttemptResult,
    DeadTaskInfo,
    HookChain,
    Hooks,
    ScheduledTask,
)
from duetime.metrics.series import (
    DURATION_BUCKETS,
    HELD_BUCKETS,
    LATENESS_BUCKETS,
    TaskMetrics,
    process_registry,
    task_label,
    task_metrics,
)

_V = TypeVar("_V")


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
        self._metrics = task_metrics(self.registry)
        self._mine = self._metrics.mine  # bound once: called twice per attempt

    def on_schedule(self, queue: str, tasks: Sequence[ScheduledTask]) -> None:
        counts = Tally(task_label(task.task) for task in tasks)
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
        if held := attempt.held:
            series.held[bisect_left(HELD_BUCKETS, held)] += 1
            series.held_sum += held
        else:
            series.held[0] += 1

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
    return AttemptTally(task_metrics(own), queue)


class AttemptTally:
    """The built-in metrics of one worker: what PrometheusHooks counts, taken in bulk.

    Two hook calls per attempt, each with an AttemptInfo and an AttemptResult to build,
    cost a no-op task's worker about a tenth of its time. The worker instead appends
    plain numbers to these lists as attempts start and end (on its event loop, which
    alone touches them), and calls ``flush`` now and then (with each batch of acks, and
    at each heartbeat): a batch is counted with a few C-level passes (a sort for each
    histogram), not a Python call per attempt. A scrape sees an attempt once the next
    flush has run: within a heartbeat interval."""

    __slots__ = (
        "_metrics",
        "_queue",
        "ended",
        "ended_tasks",
        "held",
        "started",
        "started_tasks",
    )

    def __init__(self, metrics: TaskMetrics, queue: str) -> None:
        self._metrics = metrics
        self._queue = queue
        # Parallel lists: task name, and lateness (seconds after its run-at) at the start.
        self.started_tasks: list[str] = []
        self.started: list[float] = []
        # (task name, seconds flow control's limits held it) of the starts that were held.
        self.held: list[tuple[str, float]] = []
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
            held, self.held = self.held, []
            held_by_task = (
                _by_task([task for task, _ in held], [wait for _, wait in held]) if held else {}
            )
            for task, latenesses in _by_task(tasks, values).items():
                series = self._metrics.mine(self._queue, task)
                series.started += len(latenesses)
                series.lateness_sum += sum(latenesses)
                _add_to_buckets(series.lateness, LATENESS_BUCKETS, latenesses)
                waits = held_by_task.get(task, [])
                series.held[0] += len(latenesses) - len(waits)  # not held: 0, the first bucket
                series.held_sum += sum(waits)
                _add_to_buckets(series.held, HELD_BUCKETS, waits)
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
