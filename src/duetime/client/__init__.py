"""The client side of duetime: ``Queue`` and ``AsyncQueue`` (schedule, cancel,
reschedule, inspect, search and wait for tasks, and act on many at once), the records
they hand in and back, the choosing of dead tasks by filters, and the coalescing of
single schedule calls.

Where things live: ``queue`` (``Queue`` and ``TaskHandle``, the typed schedule calls
of one handler) and ``async_queue`` (``AsyncQueue``, ``AsyncTaskHandle``), every
public method written out in each; ``core.QueueCore``, which holds one of each group
of plans, made around the queue's ``shards``: ``preparing`` (checking a call),
``producing`` and ``keyed`` (writing tasks), ``inspection``, ``control``,
``searching``, ``bulk``, ``limiting``, ``cron``, ``backfill`` and ``history``;
``models`` (the public records), ``ids`` (task ids), ``prepared`` (a task checked and
ready to write), ``reports`` (records read from the store's replies), ``registry``
(the queues a server knows), ``selection`` and ``matching`` (choosing dead tasks by
filters, and tasks by a search for a bulk action) and ``coalescing``.
"""

from duetime.client.async_queue import AsyncQueue, AsyncTaskHandle
from duetime.client.bulk import BulkOutcome
from duetime.client.coalescing import MOST_PER_ROUND_TRIP, TaskCoalescer, ThreadCoalescer
from duetime.client.core import QueueCore
from duetime.client.ids import new_task_id, new_task_ids
from duetime.client.matching import (
    NOT_STARTED,
    MatchSelection,
    select_matching,
    select_matching_async,
)
from duetime.client.models import (
    LISTED_STATES,
    CronBackfillInfo,
    CronInfo,
    CronRun,
    DeadTask,
    Duration,
    FinishedAttempt,
    GoneWorker,
    HandleOptions,
    Job,
    MinuteFigures,
    QueueStats,
    TaskIds,
    TaskOptions,
    TaskRef,
    TaskStatus,
    TaskSummary,
    Timestamp,
)
from duetime.client.queue import Queue, TaskHandle
from duetime.client.registry import known_queues
from duetime.client.searching import WAITING, SearchPage, TaskSearch
from duetime.client.selection import (
    BATCH_SIZE,
    DeadFilter,
    DeadSelection,
    dead_matching,
    dead_matching_async,
    in_batches,
    in_batches_async,
    select_dead,
    select_dead_async,
)

__all__ = [
    "BATCH_SIZE",
    "LISTED_STATES",
    "MOST_PER_ROUND_TRIP",
    "NOT_STARTED",
    "WAITING",
    "AsyncQueue",
    "AsyncTaskHandle",
    "BulkOutcome",
    "CronBackfillInfo",
    "CronInfo",
    "CronRun",
    "DeadFilter",
    "DeadSelection",
    "DeadTask",
    "Duration",
    "FinishedAttempt",
    "GoneWorker",
    "HandleOptions",
    "Job",
    "MatchSelection",
    "MinuteFigures",
    "Queue",
    "QueueCore",
    "QueueStats",
    "SearchPage",
    "TaskCoalescer",
    "TaskHandle",
    "TaskIds",
    "TaskOptions",
    "TaskRef",
    "TaskSearch",
    "TaskStatus",
    "TaskSummary",
    "ThreadCoalescer",
    "Timestamp",
    "dead_matching",
    "dead_matching_async",
    "in_batches",
    "in_batches_async",
    "known_queues",
    "new_task_id",
    "new_task_ids",
    "select_dead",
    "select_dead_async",
    "select_matching",
    "select_matching_async",
]
