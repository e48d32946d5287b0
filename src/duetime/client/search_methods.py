"""The search and bulk methods of ``Queue`` and ``AsyncQueue``: find tasks by what they
are (``search``), and cancel, reschedule or run now many waiting tasks at once. Kept
apart from ``queue`` so that each class stays readable; the plans are ``QueueCore``'s,
so both flavours behave the same by construction."""

from __future__ import annotations

from typing import Protocol, TypeVar

from duetime.client.bulk import BulkOutcome
from duetime.client.core import QueueCore
from duetime.client.models import Duration, TaskIds, Timestamp
from duetime.client.searching import DEFAULT_BUDGET, DEFAULT_LIMIT, SearchPage, TaskSearch
from duetime.store.plans.requests import Plan

T = TypeVar("T")


class Runs(Protocol):
    """What runs a plan and answers (``SyncRunner``, or one lent by a worker)."""

    def run(self, plan: Plan[T]) -> T: ...


class RunsAsync(Protocol):
    """What runs a plan, awaited (``AsyncRunner``)."""

    async def run(self, plan: Plan[T]) -> T: ...


class HasRunner(Protocol):
    """What the methods below need of their queue (the mixins' self type)."""

    @property
    def core(self) -> QueueCore: ...

    @property
    def runner(self) -> Runs: ...


class HasAsyncRunner(Protocol):
    @property
    def core(self) -> QueueCore: ...

    @property
    def runner(self) -> RunsAsync: ...


class SearchMethods:
    """``Queue``'s search and bulk methods (it sets ``core`` and ``runner``)."""

    def search(
        self: HasRunner,
        criteria: TaskSearch,
        *,
        cursor: str | None = None,
        budget: int = DEFAULT_BUDGET,
        limit: int = DEFAULT_LIMIT,
    ) -> SearchPage:
        """Tasks that meet ``criteria``, looking at up to ``budget`` entries from
        ``cursor`` (None: the start); go on with the page's ``cursor``."""
        return self.runner.run(self.core.search_plan(criteria, cursor, budget, limit))

    def cancel_many(
        self: HasRunner, task_ids: TaskIds, *, stop_running: bool = True
    ) -> BulkOutcome:
        """Cancel each task that has not started, and ask the workers of running ones to
        stop them (``stop_running`` False: running ones are skipped); dead ones are
        skipped."""
        return self.runner.run(self.core.cancel_many_plan(task_ids, stop_running))

    def reschedule_many(self: HasRunner, task_ids: TaskIds, at: Timestamp) -> BulkOutcome:
        """Give each waiting task the run-at ``at``; running and dead ones are skipped."""
        return self.runner.run(self.core.reschedule_many_plan(task_ids, at))

    def reschedule_many_in(self: HasRunner, task_ids: TaskIds, delay: Duration) -> BulkOutcome:
        """Move each waiting task to ``delay`` from now (server clock)."""
        return self.runner.run(self.core.reschedule_many_in_plan(task_ids, delay))

    def run_now_many(self: HasRunner, task_ids: TaskIds) -> BulkOutcome:
        """Make each scheduled task due now; others are skipped."""
        return self.runner.run(self.core.run_now_many_plan(task_ids))

    def requeue_many(self: HasRunner, task_ids: TaskIds) -> BulkOutcome:
        """``requeue_dead`` of the ids given, with the ids that were not dead skipped."""
        return self.runner.run(self.core.requeue_many_plan(task_ids))

    def purge_many(self: HasRunner, task_ids: TaskIds) -> BulkOutcome:
        """``purge_dead`` of the ids given, with the ids that were not dead skipped."""
        return self.runner.run(self.core.purge_many_plan(task_ids))


class AsyncSearchMethods:
    """``AsyncQueue``'s search and bulk methods, awaited."""

    async def search(
        self: HasAsyncRunner,
        criteria: TaskSearch,
        *,
        cursor: str | None = None,
        budget: int = DEFAULT_BUDGET,
        limit: int = DEFAULT_LIMIT,
    ) -> SearchPage:
        return await self.runner.run(self.core.search_plan(criteria, cursor, budget, limit))

    async def cancel_many(
        self: HasAsyncRunner, task_ids: TaskIds, *, stop_running: bool = True
    ) -> BulkOutcome:
        return await self.runner.run(self.core.cancel_many_plan(task_ids, stop_running))

    async def reschedule_many(
        self: HasAsyncRunner, task_ids: TaskIds, at: Timestamp
    ) -> BulkOutcome:
        return await self.runner.run(self.core.reschedule_many_plan(task_ids, at))

    async def reschedule_many_in(
        self: HasAsyncRunner, task_ids: TaskIds, delay: Duration
    ) -> BulkOutcome:
        return await self.runner.run(self.core.reschedule_many_in_plan(task_ids, delay))

    async def run_now_many(self: HasAsyncRunner, task_ids: TaskIds) -> BulkOutcome:
        return await self.runner.run(self.core.run_now_many_plan(task_ids))

    async def requeue_many(self: HasAsyncRunner, task_ids: TaskIds) -> BulkOutcome:
        return await self.runner.run(self.core.requeue_many_plan(task_ids))

    async def purge_many(self: HasAsyncRunner, task_ids: TaskIds) -> BulkOutcome:
        return await self.runner.run(self.core.purge_many_plan(task_ids))
