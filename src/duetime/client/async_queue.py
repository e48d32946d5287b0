"""``AsyncQueue``, the asyncio twin of ``Queue`` (``queue``): the same methods, the same
arguments and the same plans of ``QueueCore``, awaited on an asyncio Redis client; and
``AsyncTaskHandle``, the twin of ``TaskHandle``. Every public method of ``AsyncQueue``
is written here; what each does is said on ``Queue``'s.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Generic, Self, TypeVar, Unpack

from duetime import validation
from duetime.checker import Violation
from duetime.client.bulk import BulkOutcome
from duetime.client.coalescing import TaskCoalescer
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
from duetime.client.queue import coalesced
from duetime.client.searching import DEFAULT_BUDGET, DEFAULT_LIMIT, SearchPage, TaskSearch
from duetime.clock import Clock
from duetime.cron import CronJob
from duetime.flow import KeyLimits, Limits
from duetime.hooks import Hooks
from duetime.keyed import Scheduled
from duetime.settings import DEFAULT_SETTINGS, Settings
from duetime.states import HistoryOutcome
from duetime.store.plans.flow_control import FlowState
from duetime.store.redis.runner import AsyncRunner, RedisSpec

T = TypeVar("T")


# Long: the whole public surface of the asyncio client, one short method per call.
class AsyncQueue:
    """The asyncio twin of ``Queue``: same arguments, same plans, awaited."""

    core: QueueCore
    runner: AsyncRunner

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
        self._use(core, AsyncRunner(redis, settings), owns_runner=True)

    @classmethod
    def lent(cls, core: QueueCore, runner: AsyncRunner) -> Self:
        """As ``Queue.lent``, for async handlers, on the worker's own runner."""
        queue = cls.__new__(cls)
        queue._use(core, runner, owns_runner=False)
        return queue

    def _use(self, core: QueueCore, runner: AsyncRunner, owns_runner: bool) -> None:
        self.core, self.runner, self._owns_runner = core, runner, owns_runner
        self.name = core.queue.name
        self._coalescer: TaskCoalescer[PreparedTask, str] | None = None
        if coalesced(core):
            run, producing = runner.run, core.producing  # not self: a cycle would outlive a drop
            self._coalescer = TaskCoalescer(
                lambda item: run(producing.schedule_one_plan(item)),
                lambda items: run(producing.schedule_together_plan(items)),
            )

    def task(self, handler: Callable[[T], object]) -> AsyncTaskHandle[T]:
        """As ``Queue.task``: ``await queue.task(send_email).schedule_in(60, email)``."""
        return AsyncTaskHandle(self, handler_name(handler))

    # --- scheduling ------------------------------------------------------------------

    async def schedule_task(self, at: Timestamp, data: Any, **options: Unpack[TaskOptions]) -> str:
        if at is None:
            validation.timestamp_ms(at)  # the error speaks of the run-at, not of a delay
        prepared = self.core.preparing.prepare_call("schedule_task", data, at, None, options)
        return await self._schedule(prepared)

    async def schedule_in(self, delay: Duration, data: Any, **options: Unpack[TaskOptions]) -> str:
        prepared = self.core.preparing.prepare_call("schedule_in", data, None, delay, options)
        return await self._schedule(prepared)

    def _schedule(self, item: PreparedTask) -> Awaitable[str]:
        # Not a coroutine itself: it hands over the one to await (a layer less per call).
        if item[KEYED] is not None:
            return self.runner.run(self.core.keyed.keyed_id_plan(item))
        if self._coalescer is None:
            return self.runner.run(self.core.producing.schedule_one_plan(item))
        return self._coalescer.submit(item)

    async def schedule_keyed(self, data: Any, **options: Unpack[KeyedCallOptions]) -> Scheduled:
        item = self.core.preparing.prepare_keyed(data, options)
        return await self.runner.run(self.core.keyed.schedule_keyed_plan(item))

    async def schedule_now(self, data: Any, **options: Unpack[TaskOptions]) -> str:
        return await self.schedule_in(0, data, **options)

    async def schedule_many(self, jobs: Iterable[Job | tuple[Timestamp, Any]]) -> list[str]:
        prepared = self.core.preparing.prepare_all(jobs)
        return await self.runner.run(self.core.producing.schedule_plan(prepared))

    # --- changing tasks and the queue -------------------------------------------------

    async def cancel(self, task_id: str) -> bool:
        return await self.runner.run(self.core.control.cancel_plan(task_id))

    async def reschedule(self, task_id: str, at: Timestamp) -> None:
        await self.runner.run(self.core.control.reschedule_plan(task_id, at))

    async def reschedule_in(self, task_id: str, delay: Duration) -> None:
        await self.runner.run(self.core.control.reschedule_in_plan(task_id, delay))

    # --- reading ---------------------------------------------------------------------

    async def status(self, task_id: str) -> TaskStatus | None:
        return await self.runner.run(self.core.inspection.status_plan(task_id))

    async def result(self, task_id: str, timeout: float | None = None) -> Any:
        return await self.runner.run(self.core.inspection.result_plan(task_id, timeout))

    async def stats(self) -> QueueStats:
        return await self.runner.run(self.core.inspection.stats_plan())

    async def tasks(self, state: str, limit: int = 50, offset: int = 0) -> list[TaskSummary]:
        return await self.runner.run(self.core.inspection.tasks_plan(state, limit, offset))

    async def throughput(self, minutes: int = 60) -> list[MinuteFigures]:
        return await self.runner.run(self.core.inspection.throughput_plan(minutes))

    # --- limits ----------------------------------------------------------------------

    async def set_limits(self, limits: Limits) -> None:
        await self.runner.run(self.core.limits.set_limits_plan(limits))

    async def set_queue_limits(self, limits: Limits) -> None:
        await self.runner.run(self.core.limits.set_queue_limits_plan(limits))

    async def set_key_limits(self, key: str, limits: KeyLimits | None) -> None:
        await self.runner.run(self.core.limits.set_key_limits_plan(key, limits))

    async def limits(self) -> Limits | None:
        return await self.runner.run(self.core.limits.limits_plan())

    async def flow(self, most_keys: int = 50) -> FlowState:
        return await self.runner.run(self.core.limits.flow_plan(most_keys))

    # --- pausing ---------------------------------------------------------------------

    async def pause(self) -> bool:
        return await self.runner.run(self.core.control.pause_plan(True))

    async def resume(self) -> bool:
        return await self.runner.run(self.core.control.pause_plan(False))

    async def is_paused(self) -> bool:
        return await self.runner.run(self.core.control.paused_plan())

    async def run_now(self, task_id: str) -> None:
        await self.runner.run(self.core.control.run_now_plan(task_id))

    # --- dead letters and invariants -------------------------------------------------

    async def dead_tasks(self, limit: int = 100, offset: int = 0) -> list[DeadTask]:
        return await self.runner.run(self.core.inspection.dead_plan(limit, offset))

    async def requeue_dead(self, task_ids: TaskIds = None) -> int:
        return await self.runner.run(self.core.control.requeue_plan(task_ids))

    async def purge_dead(self, task_ids: TaskIds = None) -> int:
        return await self.runner.run(self.core.control.purge_plan(task_ids))

    async def check(self) -> list[Violation]:
        return await self.runner.run(self.core.inspection.check_plan())

    # --- search and bulk actions -----------------------------------------------------

    async def search(
        self,
        criteria: TaskSearch,
        *,
        cursor: str | None = None,
        budget: int = DEFAULT_BUDGET,
        limit: int = DEFAULT_LIMIT,
    ) -> SearchPage:
        plan = self.core.search.search_plan(criteria, cursor, budget, limit)
        return await self.runner.run(plan)

    async def cancel_many(self, task_ids: TaskIds, *, stop_running: bool = True) -> BulkOutcome:
        return await self.runner.run(self.core.bulk.cancel_many_plan(task_ids, stop_running))

    async def reschedule_many(self, task_ids: TaskIds, at: Timestamp) -> BulkOutcome:
        return await self.runner.run(self.core.bulk.reschedule_many_plan(task_ids, at))

    async def reschedule_many_in(self, task_ids: TaskIds, delay: Duration) -> BulkOutcome:
        return await self.runner.run(self.core.bulk.reschedule_many_in_plan(task_ids, delay))

    async def run_now_many(self, task_ids: TaskIds) -> BulkOutcome:
        return await self.runner.run(self.core.bulk.run_now_many_plan(task_ids))

    async def requeue_many(self, task_ids: TaskIds) -> BulkOutcome:
        return await self.runner.run(self.core.bulk.requeue_many_plan(task_ids))

    async def purge_many(self, task_ids: TaskIds) -> BulkOutcome:
        return await self.runner.run(self.core.bulk.purge_many_plan(task_ids))

    # --- cron jobs -------------------------------------------------------------------

    def cron_job(self, name: str, expression: str | None, data: Any, **options: Any) -> CronJob:
        return self.core.cron.cron_job(name, expression, data, **options)

    async def add_cron(self, name: str, expression: str | None, data: Any, **options: Any) -> str:
        job = self.core.cron.cron_job(name, expression, data, **options)
        return (await self.runner.run(self.core.cron.declare_cron_plan([job])))[name]

    async def add_crons(self, jobs: Sequence[CronJob]) -> dict[str, int]:
        return await self.runner.run(self.core.cron.add_crons_plan(jobs))

    async def backfill_cron(
        self, name: str, start: Timestamp, end: Timestamp | None = None, rate: float = 1.0
    ) -> CronBackfillInfo:
        plan = self.core.backfill.backfill_cron_plan(name, start, end, rate)
        return await self.runner.run(plan)

    async def sync_cron(self, jobs: Sequence[CronJob], prune: bool = True) -> dict[str, str]:
        return await self.runner.run(self.core.cron.sync_cron_plan(jobs, prune))

    async def list_cron(self, upcoming: int = 3) -> list[CronInfo]:
        return await self.runner.run(self.core.cron.list_cron_plan(upcoming))

    async def cron_info(self, name: str, upcoming: int = 3) -> CronInfo | None:
        return await self.runner.run(self.core.cron.cron_info_plan(name, upcoming))

    async def pause_cron(self, name: str) -> bool:
        return await self.runner.run(self.core.cron.pause_cron_plan(name, paused=True))

    async def resume_cron(self, name: str) -> bool:
        return await self.runner.run(self.core.cron.pause_cron_plan(name, paused=False))

    async def remove_cron(self, name: str) -> bool:
        return await self.runner.run(self.core.cron.remove_cron_plan(name))

    async def trigger_cron(self, name: str) -> str:
        return await self.runner.run(self.core.cron.trigger_cron_plan(name))

    # --- the history of finished attempts --------------------------------------------

    async def history(
        self,
        limit: int = 50,
        offset: int = 0,
        *,
        task: TaskRef | None = None,
        outcome: HistoryOutcome | str | None = None,
        task_id: str | None = None,
    ) -> list[FinishedAttempt]:
        plan = self.core.history.history_plan(limit, offset, task, outcome, task_id)
        return await self.runner.run(plan)

    async def history_size(self) -> int:
        return await self.runner.run(self.core.history.history_size_plan())

    async def set_history(self, size: int | None) -> None:
        await self.runner.run(self.core.history.set_history_plan(size))

    # --- the connection --------------------------------------------------------------

    async def close(self) -> None:
        if self._owns_runner:
            await self.runner.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class AsyncTaskHandle(Generic[T]):
    """The asyncio twin of ``TaskHandle``, made by ``AsyncQueue.task``."""

    __slots__ = ("queue", "task")

    def __init__(self, queue: AsyncQueue, task: str) -> None:
        self.queue = queue
        self.task = task

    async def schedule_task(self, at: Timestamp, data: T, **options: Unpack[HandleOptions]) -> str:
        return await self.queue.schedule_task(at, data, task=self.task, **options)

    async def schedule_in(self, delay: Duration, data: T, **options: Unpack[HandleOptions]) -> str:
        return await self.queue.schedule_in(delay, data, task=self.task, **options)

    async def schedule_now(self, data: T, **options: Unpack[HandleOptions]) -> str:
        return await self.queue.schedule_in(0, data, task=self.task, **options)

    async def schedule_many(self, items: Iterable[tuple[Timestamp, T]]) -> list[str]:
        jobs = [Job(data, at, task=self.task) for at, data in items]
        return await self.queue.schedule_many(jobs)

    def __repr__(self) -> str:
        return f"AsyncTaskHandle({self.queue.name!r}, {self.task!r})"
