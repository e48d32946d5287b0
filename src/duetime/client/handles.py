"""Typed handles: the schedule calls of one registered handler on one queue, whose
``data`` a type checker checks against the handler's parameter. ``queue.task(fn)``
makes a ``TaskHandle`` (``Queue``) or an ``AsyncTaskHandle`` (``AsyncQueue``); the
handler itself is left as it was, callable as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Generic, TypedDict, TypeVar, Unpack

from duetime.client.models import Duration, Job, Timestamp
from duetime.keyed import Debounce, Throttle, Unique

if TYPE_CHECKING:
    from duetime.client.queue import AsyncQueue, Queue

T = TypeVar("T")


class HandleOptions(TypedDict, total=False):
    """The per-task options of a handle's schedule calls: those of ``TaskOptions`` but
    ``task``, which the handle gives."""

    id: str | None
    max_attempts: int | None
    timeout: Duration | None
    result_ttl: Duration | None
    expires: Duration | None
    priority: int
    limit_key: str | None
    cost: int
    debounce: Debounce | None
    throttle: Throttle | None
    unique: Unique | None


class TaskHandle(Generic[T]):
    """Schedules tasks of the handler named ``task`` on ``queue``, ``data`` typed as the
    handler's parameter (``T``). The calls are ``Queue``'s, with ``task`` given."""

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
