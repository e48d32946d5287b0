"""``Queue``, the client API on a synchronous connection: schedule, cancel, reschedule,
inspect and wait for tasks, search them and act on many at once, declare cron jobs,
read the history, and make typed handles of handlers (``task``, a ``TaskHandle``).
Every public method of ``Queue`` is written here; ``AsyncQueue`` (``async_queue``) is
its asyncio twin.

``QueueCore`` validates input and builds plans; ``Queue`` runs them on a synchronous
Redis client (``AsyncQueue`` on an asyncio one), so both behave the same by
construction. Every input is checked before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Generic, Self, TypeVar, Unpack

from duetime import validation
from duetime.checker import Violation
from duetime.client.bulk import BulkOutcome
from duetime.client.coalescing import ThreadCoalescer
from duetime.client.core import QueueCore
from duetime.client.models import (
    CronBackfillInfo,
    CronInfo,
    DeadTask,
    Duration,
    FinishedAttempt,
    HandleOptions,
    Job,
    KeyedCallOptions,
    MinuteFigures,
    QueueStats,
    TaskIds,
    TaskOptions,
    TaskRef,
    TaskStatus,
    TaskSummary,
    Timestamp,
)
from duetime.client.preparing import KEYED, PreparedTask, handler_name
from duetime.client.searching import DEFAULT_BUDGET, DEFAULT_LIMIT, SearchPage, TaskSearch
from duetime.clock import Clock
from duetime.cron import CronJob
from duetime.flow import KeyLimits, Limits
from duetime.hooks import Hooks
from duetime.keyed import Scheduled
from duetime.settings import DEFAULT_SETTINGS, Settings
from duetime.states import HistoryOutcome
from duetime.store.plans.flow_control import FlowState
from duetime.store.redis.bridge import LoopRunner
from duetime.store.redis.runner import RedisSpec, SyncRunner

T = TypeVar("T")


def coalesced(core: QueueCore) -> bool:
    """Whether single schedule calls share round trips (``coalescing``). Durable ones do
    not: a durable round trip lasts up to ``durable_timeout`` while replicas lag, and the
    calls queued behind it would wait that long before their own wait began. Each goes at
    once instead (on a connection of its own while another is busy), so each waits for its
    own confirmation only, at most ``durable_timeout``, as separate clients do."""
    return core.queue.settings.coalesce_schedules and core.queue.durability is None


# Long: the whole public surface of the synchronous client, one short method per call.
class Queue:
    """A queue on a synchronous connection.

    ``redis`` is a URL, a ``redis.Redis`` client (its address is reused), or None for
    $DUETIME_REDIS_URL or else the embedded server. ``durable=True`` makes schedule calls
    wait for replicas to confirm them (see ``Settings.durable_replicas``). ``shards``
    spreads the queue over that many hash tags, which Redis Cluster places on different
    masters; give workers and dispatchers the same count (docs/deployment.md).
    ``hooks`` (duetime.Hooks) hear about every task this object schedules.
    """

    core: QueueCore
    runner: SyncRunner | LoopRunner

    def __init__(
        self,
        name: str,
        redis: RedisSpec = None,
        *,
        settings: Settings = DEFAULT_SETTINGS,
        clock: Clock | None = None,
        result_ttl: float | None = None,
        durable: bool | None = None,
        shards: int = 1,
        hooks: Iterable[Hooks] = (),
    ) -> None:
        core = QueueCore(name, settings, clock, result_ttl, durable, shards, hooks)
        self._use(core, SyncRunner(redis, settings), owns_runner=True)

    @classmethod
    def lent(cls, core: QueueCore, runner: LoopRunner) -> Self:
        """A queue on a worker's connection, lent to its plain-function handlers
        (``current_task().queue``); ``close()`` leaves the connection to the worker."""
        queue = cls.__new__(cls)
        queue._use(core, runner, owns_runner=False)
        return queue

    def _use(self, core: QueueCore, runner: SyncRunner | LoopRunner, owns_runner: bool) -> None:
        self.core, self.runner, self._owns_runner = core, runner, owns_runner
        self.name = core.queue.name
        self._coalescer: ThreadCoalescer[PreparedTask, str] | None = None
        if coalesced(core):
            run, producing = runner.run, core.producing  # not self: a cycle would outlive a drop
            self._coalescer = ThreadCoalescer(
                lambda item: run(producing.schedule_one_plan(item)),
                lambda items: run(producing.schedule_together_plan(items)),
            )

    def task(self, handler: Callable[[T], object]) -> TaskHandle[T]:
        """The schedule calls of ``handler`` (registered with ``@app.task``), ``data``
        typed as its parameter: ``queue.task(send_email).schedule_in(60, email)``."""
        return TaskHandle(self, handler_name(handler))

    # --- scheduling ------------------------------------------------------------------

    def schedule_task(self, at: Timestamp, data: Any, **options: Unpack[TaskOptions]) -> str:
        """Run ``data`` at ``at`` (epoch seconds or aware datetime); returns the task id.
        With an ``id`` that is already live, nothing changes and that id is returned."""
        if at is None:
            validation.timestamp_ms(at)  # the error speaks of the run-at, not of a delay
        item = self.core.preparing.prepare_call("schedule_task", data, at, None, options)
        return self._schedule(item)

    def schedule_in(self, delay: Duration, data: Any, **options: Unpack[TaskOptions]) -> str:
        """Run ``data`` ``delay`` seconds (or a ``timedelta``) from now, by the server's
        clock; 0 means right now."""
        item = self.core.preparing.prepare_call("schedule_in", data, None, delay, options)
        return self._schedule(item)

    def _schedule(self, item: PreparedTask) -> str:
        if item[KEYED] is not None:
            return self.runner.run(self.core.keyed.keyed_id_plan(item))
        if self._coalescer is None:
            return self.runner.run(self.core.producing.schedule_one_plan(item))
        return self._coalescer.submit(item)

    def schedule_keyed(self, data: Any, **options: Unpack[KeyedCallOptions]) -> Scheduled:
        """With a debounce, throttle or unique key: says what happened (a Scheduled)."""
        item = self.core.preparing.prepare_keyed(data, options)
        return self.runner.run(self.core.keyed.schedule_keyed_plan(item))

    def schedule_now(self, data: Any, **options: Unpack[TaskOptions]) -> str:
        return self.schedule_in(0, data, **options)

    def schedule_many(self, jobs: Iterable[Job | tuple[Timestamp, Any]]) -> list[str]:
        """Schedule many tasks, one round trip per 1,000. All are validated first."""
        prepared = self.core.preparing.prepare_all(jobs)
        return self.runner.run(self.core.producing.schedule_plan(prepared))

    # --- changing tasks and the queue -------------------------------------------------

    def cancel(self, task_id: str) -> bool:
        """Remove a waiting or dead task; False if no live task has this id."""
        return self.runner.run(self.core.control.cancel_plan(task_id))

    def reschedule(self, task_id: str, at: Timestamp) -> None:
        self.runner.run(self.core.control.reschedule_plan(task_id, at))

    def reschedule_in(self, task_id: str, delay: Duration) -> None:
        """Move a waiting task to ``delay`` from now (server clock)."""
        self.runner.run(self.core.control.reschedule_in_plan(task_id, delay))

    # --- reading ---------------------------------------------------------------------

    def status(self, task_id: str) -> TaskStatus | None:
        return self.runner.run(self.core.inspection.status_plan(task_id))

    def result(self, task_id: str, timeout: float | None = None) -> Any:
        """Wait for the stored result of a task scheduled with ``result_ttl``."""
        return self.runner.run(self.core.inspection.result_plan(task_id, timeout))

    def stats(self) -> QueueStats:
        return self.runner.run(self.core.inspection.stats_plan())

    def tasks(self, state: str, limit: int = 50, offset: int = 0) -> list[TaskSummary]:
        """Tasks in one state (scheduled, ready, running or dead), in serving order."""
        return self.runner.run(self.core.inspection.tasks_plan(state, limit, offset))

    def throughput(self, minutes: int = 60) -> list[MinuteFigures]:
        """Per-minute figures of the last ``minutes`` (at most 60), oldest first."""
        return self.runner.run(self.core.inspection.throughput_plan(minutes))

    # --- pausing ---------------------------------------------------------------------

    def pause(self) -> bool:
        """Workers stop claiming from this queue (running tasks finish); scheduling and
        promotion go on. True when it was not paused already."""
        return self.runner.run(self.core.control.pause_plan(True))

    def resume(self) -> bool:
        """Workers claim again, at once. True when it was paused."""
        return self.runner.run(self.core.control.pause_plan(False))

    def is_paused(self) -> bool:
        return self.runner.run(self.core.control.paused_plan())

    def run_now(self, task_id: str) -> None:
        """Make a scheduled task due now (TaskStateError if it is not waiting)."""
        self.runner.run(self.core.control.run_now_plan(task_id))

    # --- limits ----------------------------------------------------------------------

    def set_limits(self, limits: Limits) -> None:
        """Make the queue's limits exactly ``limits`` (see docs/flow.md)."""
        self.runner.run(self.core.limits.set_limits_plan(limits))

    def set_queue_limits(self, limits: Limits) -> None:
        """Set the cap, rate and each key's limits at run time, keeping named keys'."""
        self.runner.run(self.core.limits.set_queue_limits_plan(limits))

    def set_key_limits(self, key: str, limits: KeyLimits | None) -> None:
        """Set one limit key's own limits, or drop them (None), at run time."""
        self.runner.run(self.core.limits.set_key_limits_plan(key, limits))

    def limits(self) -> Limits | None:
        return self.runner.run(self.core.limits.limits_plan())

    def flow(self, most_keys: int = 50) -> FlowState:
        """What holds the due tasks: per limit key, waiting, running, throttled until."""
        return self.runner.run(self.core.limits.flow_plan(most_keys))

    # --- dead letters and invariants -------------------------------------------------

    def dead_tasks(self, limit: int = 100, offset: int = 0) -> list[DeadTask]:
        return self.runner.run(self.core.inspection.dead_plan(limit, offset))

    def requeue_dead(self, task_ids: TaskIds = None) -> int:
        return self.runner.run(self.core.control.requeue_plan(task_ids))

    def purge_dead(self, task_ids: TaskIds = None) -> int:
        return self.runner.run(self.core.control.purge_plan(task_ids))

    def check(self) -> list[Violation]:
        """Verify the invariants on the live server; an empty list means all hold."""
        return self.runner.run(self.core.inspection.check_plan())

    # --- search and bulk actions -----------------------------------------------------

    def search(
        self,
        criteria: TaskSearch,
        *,
        cursor: str | None = None,
        budget: int = DEFAULT_BUDGET,
        limit: int = DEFAULT_LIMIT,
    ) -> SearchPage:
        """Tasks that meet ``criteria``, looking at up to ``budget`` entries from
        ``cursor`` (None: the start); go on with the page's ``cursor``."""
        return self.runner.run(self.core.search.search_plan(criteria, cursor, budget, limit))

    def cancel_many(self, task_ids: TaskIds, *, stop_running: bool = True) -> BulkOutcome:
        """Cancel each task that has not started, and ask the workers of running ones to
        stop them (``stop_running`` False: running ones are skipped); dead ones are
        skipped."""
        return self.runner.run(self.core.bulk.cancel_many_plan(task_ids, stop_running))

    def reschedule_many(self, task_ids: TaskIds, at: Timestamp) -> BulkOutcome:
        """Give each waiting task the run-at ``at``; running and dead ones are skipped."""
        return self.runner.run(self.core.bulk.reschedule_many_plan(task_ids, at))

    def reschedule_many_in(self, task_ids: TaskIds, delay: Duration) -> BulkOutcome:
        """Move each waiting task to ``delay`` from now (server clock)."""
        return self.runner.run(self.core.bulk.reschedule_many_in_plan(task_ids, delay))

    def run_now_many(self, task_ids: TaskIds) -> BulkOutcome:
        """Make each scheduled task due now; others are skipped."""
        return self.runner.run(self.core.bulk.run_now_many_plan(task_ids))

    def requeue_many(self, task_ids: TaskIds) -> BulkOutcome:
        """``requeue_dead`` of the ids given, with the ids that were not dead skipped."""
        return self.runner.run(self.core.bulk.requeue_many_plan(task_ids))

    def purge_many(self, task_ids: TaskIds) -> BulkOutcome:
        """``purge_dead`` of the ids given, with the ids that were not dead skipped."""
        return self.runner.run(self.core.bulk.purge_many_plan(task_ids))

    # --- cron jobs -------------------------------------------------------------------

    def cron_job(self, name: str, expression: str | None, data: Any, **options: Any) -> CronJob:
        """A validated cron definition for ``sync_cron`` or ``add_crons``."""
        return self.core.cron.cron_job(name, expression, data, **options)

    def add_cron(self, name: str, expression: str | None, data: Any, **options: Any) -> str:
        """Create or update a recurring job; returns created, updated or unchanged.
        Options: tz, task, missed, overlap, every, jitter... (see docs/cron.md)."""
        job = self.core.cron.cron_job(name, expression, data, **options)
        return self.runner.run(self.core.cron.declare_cron_plan([job]))[name]

    def add_crons(self, jobs: Sequence[CronJob]) -> dict[str, int]:
        """Create or update many jobs (``cron_job``); returns counts by outcome."""
        return self.runner.run(self.core.cron.add_crons_plan(jobs))

    def backfill_cron(
        self, name: str, start: Timestamp, end: Timestamp | None = None, rate: float = 1.0
    ) -> CronBackfillInfo:
        """Run the job's ticks from ``start`` to ``end`` (None: now) that have not run, at
        most ``rate`` a second; says how many of them had run already (docs/cron.md)."""
        return self.runner.run(self.core.backfill.backfill_cron_plan(name, start, end, rate))

    def sync_cron(self, jobs: Sequence[CronJob], prune: bool = True) -> dict[str, str]:
        """Make the queue's cron jobs exactly ``jobs`` (declared in code); with ``prune``,
        jobs no longer declared are removed. Returns name -> what happened."""
        return self.runner.run(self.core.cron.sync_cron_plan(jobs, prune))

    def list_cron(self, upcoming: int = 3) -> list[CronInfo]:
        return self.runner.run(self.core.cron.list_cron_plan(upcoming))

    def cron_info(self, name: str, upcoming: int = 3) -> CronInfo | None:
        """One job as ``list_cron`` shows it (read alone); None when there is none."""
        return self.runner.run(self.core.cron.cron_info_plan(name, upcoming))

    def pause_cron(self, name: str) -> bool:
        """Stop firing the job; False when it was paused already."""
        return self.runner.run(self.core.cron.pause_cron_plan(name, paused=True))

    def resume_cron(self, name: str) -> bool:
        """Resume from the next tick after now (ticks while paused are not run); False
        when it was not paused."""
        return self.runner.run(self.core.cron.pause_cron_plan(name, paused=False))

    def remove_cron(self, name: str) -> bool:
        return self.runner.run(self.core.cron.remove_cron_plan(name))

    def trigger_cron(self, name: str) -> str:
        """Run a cron job once now, outside its schedule; returns the task id."""
        return self.runner.run(self.core.cron.trigger_cron_plan(name))

    # --- the history of finished attempts (docs/api.md#history) ------------------------

    def history(
        self,
        limit: int = 50,
        offset: int = 0,
        *,
        task: TaskRef | None = None,
        outcome: HistoryOutcome | str | None = None,
        task_id: str | None = None,
    ) -> list[FinishedAttempt]:
        """Finished attempts, newest first: of one handler (``task``), with one
        ``outcome``, or of one task (``task_id``), as the history still keeps them."""
        plan = self.core.history.history_plan(limit, offset, task, outcome, task_id)
        return self.runner.run(plan)

    def history_size(self) -> int:
        """How many finished attempts the history keeps (per shard; 0: none)."""
        return self.runner.run(self.core.history.history_size_plan())

    def set_history(self, size: int | None) -> None:
        """Keep the last ``size`` finished attempts (per shard), trimming at once: 0
        keeps none (and deletes what is kept), None restores the default (1,000)."""
        self.runner.run(self.core.history.set_history_plan(size))

    # --- the connection --------------------------------------------------------------

    def close(self) -> None:
        if self._owns_runner:
            self.runner.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class TaskHandle(Generic[T]):
    """Schedules tasks of the handler named ``task`` on ``queue``, ``data`` typed as the
    handler's parameter (``T``), checked by a type checker; made by ``Queue.task``, the
    handler itself left as it was. The calls are ``Queue``'s, with ``task`` given."""

    __slots__ = ("queue", "task")

    def __init__(self, queue: Queue, task: str) -> None:
        self.queue = queue
        self.task = task

    def schedule_task(self, at: Timestamp, data: T, **options: Unpack[HandleOptions]) -> str:
        return self.queue.schedule_task(at, data, task=self.task, **options)

    def schedule_in(self, delay: Duration, data: T, **options: Unpack[HandleOptions]) -> str:
        return self.queue.schedule_in(delay, data, task=self.task, **options)

    def schedule_now(self, data: T, **options: Unpack[HandleOptions]) -> str:
        return self.queue.schedule_in(0, data, task=self.task, **options)

    def schedule_many(self, items: Iterable[tuple[Timestamp, T]]) -> list[str]:
        """One task per ``(at, data)``, in one round trip per 1,000; all checked first."""
        return self.queue.schedule_many([Job(data, at, task=self.task) for at, data in items])

    def __repr__(self) -> str:
        return f"TaskHandle({self.queue.name!r}, {self.task!r})"
