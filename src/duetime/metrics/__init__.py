"""Prometheus metrics: what this process saw happen to tasks, and what Redis says of
its queues.

This package owns:
- ``PrometheusHooks``, an ordinary ``Hooks``: attempts started and how they ended,
  start lateness and run time, tasks scheduled; per process, by queue and task name
  (``attempts``, counting into the series of ``series``);
- ``QueueCollector``, which reads ``Queue.stats()`` of each queue at scrape time (depth
  by state, paused, promotion and claim lag, workers alive, and the queue's counters
  kept in Redis, which are the same whichever process exports them) (``queues``);
- ``CronCollector``, the cron ticks this process's dispatchers fired, skipped, held
  back and found missed (``cron``);
- the endpoint: ``export()``, called by ``Worker.run`` and ``Dispatcher.run`` when
  ``Settings.metrics_port`` is set, serves one HTTP endpoint per process, shared by
  its daemons, started by the first and stopped after the last (``endpoint``).

Nothing is registered at import: the metrics live in ``process_registry()``, a registry
of duetime's own (never ``prometheus_client.REGISTRY``), made on first use. Redis is
read through the public ``Queue`` API only, one synchronous ``Queue`` per queue, on the
scrape's thread. The per-attempt path takes no lock and allocates nothing once a task
has been seen: it is on the worker's hot path (docs/metrics.md, "What it costs").
"""

from duetime.metrics.attempts import AttemptTally, PrometheusHooks, builtin_tally
from duetime.metrics.cron import CRON_OUTCOMES, CronCollector, CronTickSource
from duetime.metrics.endpoint import (
    ADDRESS_VARIABLE,
    CLOSE_WITHIN,
    DEFAULT_ADDRESS,
    POLL_INTERVAL,
    MetricsEndpoint,
    MetricsServer,
    export,
)
from duetime.metrics.queues import QUEUE_EVENTS, SCRAPE_SOCKET_TIMEOUT, QueueCollector
from duetime.metrics.series import (
    DEFAULT_TASK,
    DURATION_BUCKETS,
    LATENESS_BUCKETS,
    UNKNOWN_TASK,
    TaskMetrics,
    process_registry,
    task_metrics,
)

__all__ = [
    "ADDRESS_VARIABLE",
    "CLOSE_WITHIN",
    "CRON_OUTCOMES",
    "DEFAULT_ADDRESS",
    "DEFAULT_TASK",
    "DURATION_BUCKETS",
    "LATENESS_BUCKETS",
    "POLL_INTERVAL",
    "QUEUE_EVENTS",
    "SCRAPE_SOCKET_TIMEOUT",
    "UNKNOWN_TASK",
    "AttemptTally",
    "CronCollector",
    "CronTickSource",
    "MetricsEndpoint",
    "MetricsServer",
    "PrometheusHooks",
    "QueueCollector",
    "TaskMetrics",
    "builtin_tally",
    "export",
    "process_registry",
    "task_metrics",
]
