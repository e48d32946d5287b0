"""The cron ticks this process's dispatchers fired, skipped, held back and found
missed, for metrics: ``CronCollector`` reads them from the dispatchers through a small
protocol (``CronTickSource``), so that metrics import nothing of the dispatcher."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from duetime.store.plans.layout import queue_of_shard_tag

CRON_OUTCOMES = ("fired", "skipped", "delayed", "missed", "outside_window", "backfilled")


class CronTickSource(Protocol):
    """What CronCollector reads of a dispatcher of one queue (or shard)."""

    @property
    def queue(self) -> str:
        """The queue's name, or a shard's tag ``<queue>#<n>`` (store.layout.shard_tag)."""
        ...

    @property
    def cron_ticks(self) -> dict[tuple[str, str], int]:
        """(cron job, outcome) -> ticks; written by the dispatcher's loop, never reset."""
        ...


class CronCollector(Collector):
    """The cron ticks this process's dispatchers fired, skipped (overlap="skip"), held
    back (overlap="delay") and found missed, by queue and job, from each dispatcher's
    ``cron_ticks``. Per process: with several dispatchers, sum over them."""

    def __init__(self) -> None:
        self._dispatchers: list[CronTickSource] = []
        self._lock = threading.Lock()

    def add(self, dispatchers: Iterable[CronTickSource]) -> None:
        with self._lock:
            self._dispatchers.extend(dispatchers)

    def remove(self, dispatchers: Iterable[CronTickSource]) -> None:
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
            "(held for overlap=delay), missed (due while no dispatcher fired them), "
            "outside_window (older than the catch-up window: skipped), backfilled (ticks "
            "of a backfill enqueued)",
            labels=["queue", "job", "outcome"],
        )

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        totals: dict[tuple[str, str], dict[str, int]] = {}
        with self._lock:
            dispatchers = list(self._dispatchers)
        for dispatcher in dispatchers:
            # A shard's dispatcher counts under its queue. The copy is atomic: the loop
            # thread may add meanwhile.
            queue = queue_of_shard_tag(dispatcher.queue)
            for (job, outcome), count in dispatcher.cron_ticks.copy().items():
                outcomes = totals.setdefault((queue, job), dict.fromkeys(CRON_OUTCOMES, 0))
                outcomes[outcome] = outcomes.get(outcome, 0) + count
        family = self._family()
        for (queue, job), outcomes in sorted(totals.items()):
            for outcome, count in outcomes.items():
                family.add_metric([queue, job, outcome], count)
        return [family]
