"""The cron methods of ``Queue`` and ``AsyncQueue``: declare, list, pause, resume,
remove, trigger and backfill recurring jobs. Kept apart from ``queue`` so that each class
stays readable; the plans are ``QueueCore``'s, so both flavours behave the same."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from duetime import cron
from duetime.client.models import CronBackfillInfo, CronInfo, Timestamp
from duetime.client.search_methods import HasAsyncRunner, HasRunner
from duetime.cron import CronJob


class CronMethods:
    """``Queue``'s cron methods (it sets ``core`` and ``runner``)."""

    def cron_job(
        self: HasRunner, name: str, expression: str | None, data: Any, **options: Any
    ) -> CronJob:
        """A validated cron definition for ``sync_cron`` or ``add_crons``."""
        return self.core.cron_job(name, expression, data, **options)

    def add_cron(
        self: HasRunner, name: str, expression: str | None, data: Any, **options: Any
    ) -> str:
        """Create or update a recurring job; returns created, updated or unchanged.
        Options: tz, task, missed, overlap, every, jitter... (see docs/cron.md)."""
        job = self.core.cron_job(name, expression, data, **options)
        return self.runner.run(self.core.declare_cron_plan([job]))[name]

    def add_crons(self: HasRunner, jobs: Sequence[cron.CronJob]) -> dict[str, int]:
        """Create or update many jobs (``cron_job``); returns counts by outcome."""
        return self.runner.run(self.core.add_crons_plan(jobs))

    def backfill_cron(
        self: HasRunner,
        name: str,
        start: Timestamp,
        end: Timestamp | None = None,
        rate: float = 1.0,
    ) -> CronBackfillInfo:
        """Run the job's ticks from ``start`` to ``end`` (None: now) that have not run, at
        most ``rate`` a second; says how many of them had run already (docs/cron.md)."""
        return self.runner.run(self.core.backfill_cron_plan(name, start, end, rate))

    def sync_cron(
        self: HasRunner, jobs: Sequence[cron.CronJob], prune: bool = True
    ) -> dict[str, str]:
        """Make the queue's cron jobs exactly ``jobs`` (declared in code); with ``prune``,
        jobs no longer declared are removed. Returns name -> what happened."""
        return self.runner.run(self.core.sync_cron_plan(jobs, prune))

    def list_cron(self: HasRunner, upcoming: int = 3) -> list[CronInfo]:
        return self.runner.run(self.core.list_cron_plan(upcoming))

    def cron_info(self: HasRunner, name: str, upcoming: int = 3) -> CronInfo | None:
        """One job as ``list_cron`` shows it (read alone); None when there is none."""
        return self.runner.run(self.core.cron_info_plan(name, upcoming))

    def pause_cron(self: HasRunner, name: str) -> bool:
        """Stop firing the job; False when it was paused already."""
        return self.runner.run(self.core.pause_cron_plan(name, paused=True))

    def resume_cron(self: HasRunner, name: str) -> bool:
        """Resume from the next tick after now (ticks while paused are not run); False
        when it was not paused."""
        return self.runner.run(self.core.pause_cron_plan(name, paused=False))

    def remove_cron(self: HasRunner, name: str) -> bool:
        return self.runner.run(self.core.remove_cron_plan(name))

    def trigger_cron(self: HasRunner, name: str) -> str:
        """Run a cron job once now, outside its schedule; returns the task id."""
        return self.runner.run(self.core.trigger_cron_plan(name))


class AsyncCronMethods:
    """``AsyncQueue``'s cron methods, awaited."""

    def cron_job(
        self: HasAsyncRunner, name: str, expression: str | None, data: Any, **options: Any
    ) -> CronJob:
        return self.core.cron_job(name, expression, data, **options)

    async def add_cron(
        self: HasAsyncRunner, name: str, expression: str | None, data: Any, **options: Any
    ) -> str:
        job = self.core.cron_job(name, expression, data, **options)
        return (await self.runner.run(self.core.declare_cron_plan([job])))[name]

    async def add_crons(self: HasAsyncRunner, jobs: Sequence[cron.CronJob]) -> dict[str, int]:
        return await self.runner.run(self.core.add_crons_plan(jobs))

    async def backfill_cron(
        self: HasAsyncRunner,
        name: str,
        start: Timestamp,
        end: Timestamp | None = None,
        rate: float = 1.0,
    ) -> CronBackfillInfo:
        return await self.runner.run(self.core.backfill_cron_plan(name, start, end, rate))

    async def sync_cron(
        self: HasAsyncRunner, jobs: Sequence[cron.CronJob], prune: bool = True
    ) -> dict[str, str]:
        return await self.runner.run(self.core.sync_cron_plan(jobs, prune))

    async def list_cron(self: HasAsyncRunner, upcoming: int = 3) -> list[CronInfo]:
        return await self.runner.run(self.core.list_cron_plan(upcoming))

    async def cron_info(self: HasAsyncRunner, name: str, upcoming: int = 3) -> CronInfo | None:
        return await self.runner.run(self.core.cron_info_plan(name, upcoming))

    async def pause_cron(self: HasAsyncRunner, name: str) -> bool:
        return await self.runner.run(self.core.pause_cron_plan(name, paused=True))

    async def resume_cron(self: HasAsyncRunner, name: str) -> bool:
        return await self.runner.run(self.core.pause_cron_plan(name, paused=False))

    async def remove_cron(self: HasAsyncRunner, name: str) -> bool:
        return await self.runner.run(self.core.remove_cron_plan(name))

    async def trigger_cron(self: HasAsyncRunner, name: str) -> str:
        return await self.runner.run(self.core.trigger_cron_plan(name))
