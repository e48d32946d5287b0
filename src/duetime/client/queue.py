"""``Queue`` and ``AsyncQueue``, the client API: schedule, cancel, reschedule, inspect and
wait for tasks, and make typed handles of handlers (``task``); the history's methods
come from ``history``.

``QueueCore`` validates input and builds plans; ``Queue`` runs them on a
synchronous Redis client and ``AsyncQueue`` on an asyncio one, so both behave the
same by construction. Every input is checked before anything is written.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Self, TypeVar, Unpack

from duetime import validation
from duetime.checker import Violation
from duetime.client.coalescing import TaskCoalescer, ThreadCoalescer
from duetime.client.core import QueueCore
from duetime.client.cron_methods import AsyncCronMethods, CronMethods
from duetime.client.handles import AsyncTaskHandle, TaskHandle
from duetime.client.history import AsyncQueueHistory, QueueHistory
from duetime.client.models import (
    DeadTask,
    Duration,
    Job,
    KeyedCallOptions,
    MinuteFigures,
    QueueStats,
    TaskIds,
    TaskOptions,
    TaskStatus,
    TaskSummary,
    Timestamp,
)
from duetime.client.prepared import KEYED, PreparedTask
from duetime.client.preparing import handler_name
from duetime.client.search_methods import AsyncSearchMethods, SearchMethods
from duetime.clock import Clock
from duetime.flow import KeyLimits, Limits
from duetime.hooks import Hooks
from duetime.keyed import Scheduled
from duetime.settings import DEFAULT_SETTINGS, Settings
from duetime.store.plans.flow_control import FlowState
from duetime.store.redis.bridge import LoopRunner
from duetime.store.redis.runner import AsyncRunner, RedisSpec, SyncRunner

T = TypeVar("T")


def coalesced(core: QueueCore) -> bool:
    """Whether single schedule calls share round trips (``coalescing``). Durable ones do
    not: a durable round trip lasts up to ``durable_timeout`` while replicas lag, and the
    calls queued behind it would wait that long before their own wait began. Each goes at
    once instead (on a connection of its own while another is busy), so each waits for its
    own confirmation only, at most ``durable_timeout``, as separate clients do."""
    return core.settings.coalesce_schedules and core.durability is None


class Queue(SearchMethods, CronMethods, QueueHistory):
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
        self.core, self.runner, self.name, self._owns_runner = core, runner, core.name, owns_runner
        self._coalescer: ThreadCoalescer[PreparedTask, str] | None = None
        if coalesced(core):
            run = runner.run  # not self: a cycle would outlive a drop
            self._coalescer = ThreadCoalescer(
                lambda item: run(core.schedule_one_plan(item)),
                lambda items: run(core.schedule_together_plan(items)),
            )

    def task(self, handler: Callable[[T], object]) -> TaskHandle[T]:
        """The schedule calls of ``handler`` (registered with ``@app.task``), ``data``
        typed as its parameter: ``queue.task(send_email).schedule_in(60, email)``."""
        return TaskHandle(self, handler_name(handler))

    def schedule_task(self, at: Timestamp, data: Any, **options: Unpack[TaskOptions]) -> str:
        """Run ``data`` at ``at`` (epoch seconds or aware datetime); returns the task id.
        With an ``id`` that is already live, nothing changes and that id is returned."""
        if at is None:
            validation.timestamp_ms(at)  # the error speaks of the run-at, not of a delay
        return self._schedule(self.core.prepare_call("schedule_task", data, at, None, options))

    def schedule_in(self, delay: Duration, data: Any, **options: Unpack[TaskOptions]) -> str:
        """Run ``data`` ``delay`` seconds (or a ``timedelta``) from now, by the server's
        clock; 0 means right now."""
        return self._schedule(self.core.prepare_call("schedule_in", data, None, delay, options))

    def _schedule(self, item: PreparedTask) -> str:
        if item[KEYED] is not None:
            return self.runner.run(self.core.keyed_id_plan(item))
        if self._coalescer is None:
            return self.runner.run(self.core.schedule_one_plan(item))
        return self._coalescer.submit(item)

    def schedule_keyed(self, data: Any, **options: Unpack[KeyedCallOptions]) -> Scheduled:
        """With a debounce, throttle or unique key: says what happened (a Scheduled)."""
        item = self.core.prepare_keyed(data, options)
        return self.runner.run(self.core.schedule_keyed_plan(item))

    def schedule_now(self, data: Any, **options: Unpack[TaskOptions]) -> str:
        return self.schedule_in(0, data, **options)

    def schedule_many(self, jobs: Iterable[Job | tuple[Timestamp, Any]]) -> list[str]:
        """Schedule many tasks, one round trip per 1,000. All are validated first."""
        return self.runner.run(self.core.schedule_plan(self.core.prepare_all(jobs)))

    def cancel(self, task_id: str) -> bool:
        """Remove a waiting or dead task; False if no live task has this id."""
        return self.runner.run(self.core.cancel_plan(task_id))

    def reschedule(self, task_id: str, at: Timestamp) -> None:
        self.runner.run(self.core.reschedule_plan(task_id, at))

    def reschedule_in(self, task_id: str, delay: Duration) -> None:
        """Move a waiting task to ``delay`` from now (server clock)."""
        self.runner.run(self.core.reschedule_in_plan(task_id, delay))

    def status(self, task_id: str) -> TaskStatus | None:
        return self.runner.run(self.core.status_plan(task_id))

    def result(self, task_id: str, timeout: float | None = None) -> Any:
        """Wait for the stored result of a task scheduled with ``result_ttl``."""
        return self.runner.run(self.core.result_plan(task_id, timeout))

    def stats(self) -> QueueStats:
        return self.runner.run(self.core.stats_plan())

    def tasks(self, state: str, limit: int = 50, offset: int = 0) -> list[TaskSummary]:
        """Tasks in one state (scheduled, ready, running or dead), in serving order."""
        return self.runner.run(self.core.tasks_plan(state, limit, offset))

    def throughput(self, minutes: int = 60) -> list[MinuteFigures]:
        """Per-minute figures of the last ``minutes`` (at most 60), oldest first."""
        return self.runner.run(self.core.throughput_plan(minutes))

    def pause(self) -> bool:
        """Workers stop claiming from this queue (running tasks finish); scheduling and
        promotion go on. True when it was not paused already."""
        return self.runner.run(self.core.pause_plan(True))

    def resume(self) -> bool:
        """Workers claim again, at once. True when it was paused."""
        return self.runner.run(self.core.pause_plan(False))

    def is_paused(self) -> bool:
        return self.runner.run(self.core.paused_plan())

    def run_now(self, task_id: str) -> None:
        """Make a scheduled task due now (TaskStateError if it is not waiting)."""
        self.runner.run(self.core.run_now_plan(task_id))

    def set_limits(self, limits: Limits) -> None:
        """Make the queue's limits exactly ``limits`` (see docs/flow.md)."""
        self.runner.run(self.core.set_limits_plan(limits))

    def set_queue_limits(self, limits: Limits) -> None:
        """Set the cap, rate and each key's limits at run time, keeping named keys'."""
        self.runner.run(self.core.set_queue_limits_plan(limits))

    def set_key_limits(self, key: str, limits: KeyLimits | None) -> None:
        """Set one limit key's own limits, or drop them (None), at run time."""
        self.runner.run(self.core.set_key_limits_plan(key, limits))

    def limits(self) -> Limits | None:
        return self.runner.run(self.core.limits_plan())

    def flow(self, most_keys: int = 50) -> FlowState:
        """What holds the due tasks: per limit key, waiting, running, throttled until."""
        return self.runner.run(self.core.flow_plan(most_keys))

    def dead_tasks(self, limit: int = 100, offset: int = 0) -> list[DeadTask]:
        return self.runner.run(self.core.dead_plan(limit, offset))

    def requeue_dead(self, task_ids: TaskIds = None) -> int:
        return self.runner.run(self.core.requeue_plan(task_ids))

    def purge_dead(self, task_ids: TaskIds = None) -> int:
        return self.runner.run(self.core.purge_plan(task_ids))

    def check(self) -> list[Violation]:
        """Verify the invariants on the live server; an empty list means all hold."""
        return self.runner.run(self.core.check_plan())

    def close(self) -> None:
        if self._owns_runner:
            self.runner.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncQueue(AsyncSearchMethods, AsyncCronMethods, AsyncQueueHistory):
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
        self.core, self.runner, self.name, self._owns_runner = core, runner, core.name, owns_runner
        self._coalescer: TaskCoalescer[PreparedTask, str] | None = None
        if coalesced(core):
            run = runner.run  # not self: a cycle would outlive a drop
            self._coalescer = TaskCoalescer(
                lambda item: run(core.schedule_one_plan(item)),
                lambda items: run(core.schedule_together_plan(items)),
            )

    def task(self, handler: Callable[[T], object]) -> AsyncTaskHandle[T]:
        """As ``Queue.task``: ``await queue.task(send_email).schedule_in(60, email)``."""
        return AsyncTaskHandle(self, handler_name(handler))

    async def schedule_task(self, at: Timestamp, data: Any, **options: Unpack[TaskOptions]) -> str:
        if at is None:
            validation.timestamp_ms(at)  # the error speaks of the run-at, not of a delay
        prepared = self.core.prepare_call("schedule_task", data, at, None, options)
        return await self._schedule(prepared)

    async def schedule_in(self, delay: Duration, data: Any, **options: Unpack[TaskOptions]) -> str:
        prepared = self.core.prepare_call("schedule_in", data, None, delay, options)
        return await self._schedule(prepared)

    def _schedule(self, item: PreparedTask) -> Awaitable[str]:
        # Not a coroutine itself: it hands over the one to await (a layer less per call).
        if item[KEYED] is not None:
            return self.runner.run(self.core.keyed_id_plan(item))
        if self._coalescer is None:
            return self.runner.run(self.core.schedule_one_plan(item))
        return self._coalescer.submit(item)

    async def schedule_keyed(self, data: Any, **options: Unpack[KeyedCallOptions]) -> Scheduled:
        item = self.core.prepare_keyed(data, options)
        return await self.runner.run(self.core.schedule_keyed_plan(item))

    async def schedule_now(self, data: Any, **options: Unpack[TaskOptions]) -> str:
        return await self.schedule_in(0, data, **options)

    async def schedule_many(self, jobs: Iterable[Job | tuple[Timestamp, Any]]) -> list[str]:
        return await self.runner.run(self.core.schedule_plan(self.core.prepare_all(jobs)))

    async def cancel(self, task_id: str) -> bool:
        return await self.runner.run(self.core.cancel_plan(task_id))

    async def reschedule(self, task_id: str, at: Timestamp) -> None:
        await self.runner.run(self.core.reschedule_plan(task_id, at))

    async def reschedule_in(self, task_id: str, delay: Duration) -> None:
        await self.runner.run(self.core.reschedule_in_plan(task_id, delay))

    async def status(self, task_id: str) -> TaskStatus | None:
        return await self.runner.run(self.core.status_plan(task_id))

    async def result(self, task_id: str, timeout: float | None = None) -> Any:
        return await self.runner.run(self.core.result_plan(task_id, timeout))

    async def stats(self) -> QueueStats:
        return await self.runner.run(self.core.stats_plan())

    async def tasks(self, state: str, limit: int = 50, offset: int = 0) -> list[TaskSummary]:
        return await self.runner.run(self.core.tasks_plan(state, limit, offset))

    async def throughput(self, minutes: int = 60) -> list[MinuteFigures]:
        return await self.runner.run(self.core.throughput_plan(minutes))

    async def set_limits(self, limits: Limits) -> None:
        await self.runner.run(self.core.set_limits_plan(limits))

    async def set_queue_limits(self, limits: Limits) -> None:
        await self.runner.run(self.core.set_queue_limits_plan(limits))

    async def set_key_limits(self, key: str, limits: KeyLimits | None) -> None:
        await self.runner.run(self.core.set_key_limits_plan(key, limits))

    async def limits(self) -> Limits | None:
        return await self.runner.run(self.core.limits_plan())

    async def flow(self, most_keys: int = 50) -> FlowState:
        return await self.runner.run(self.core.flow_plan(most_keys))

    async def pause(self) -> bool:
        return await self.runner.run(self.core.pause_plan(True))

    async def resume(self) -> bool:
        return await self.runner.run(self.core.pause_plan(False))

    async def is_paused(self) -> bool:
        return await self.runner.run(self.core.paused_plan())

    async def run_now(self, task_id: str) -> None:
        await self.runner.run(self.core.run_now_plan(task_id))

    async def dead_tasks(self, limit: int = 100, offset: int = 0) -> list[DeadTask]:
        return await self.runner.run(self.core.dead_plan(limit, offset))

    async def requeue_dead(self, task_ids: TaskIds = None) -> int:
        return await self.runner.run(self.core.requeue_plan(task_ids))

    async def purge_dead(self, task_ids: TaskIds = None) -> int:
        return await self.runner.run(self.core.purge_plan(task_ids))

    async def check(self) -> list[Violation]:
        return await self.runner.run(self.core.check_plan())

    async def close(self) -> None:
        if self._owns_runner:
            await self.runner.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
