"""Firing a queue's cron jobs: each due job's ticks worked out per its policies, fired
with one script call per batch of jobs (a compare-and-set on each job's next tick), and
counted for metrics; then the jobs' backfills (``backfill.py``).

A cron definition this host cannot use is a poison record: that job is paused and
logged once, and every other job goes on. The jobs due at the next tick are worked out
while the dispatcher sleeps, so that at the tick the only round trip is the firing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, NamedTuple

from duetime import codec, cron
from duetime.clock import Clock
from duetime.cron import definitions as cron_definitions
from duetime.cron import firing as cron_firing
from duetime.cron.definitions import CronTemplate
from duetime.dispatcher.backfill import BackfillFirer
from duetime.dispatcher.tally import TickTally
from duetime.errors import DecodeError
from duetime.states import CronFireOutcome
from duetime.store.plans.cron_jobs import DueCron
from duetime.store.plans.operations import QueueOperations
from duetime.store.redis.runner import AsyncRunner

log = logging.getLogger("duetime.dispatcher")

#: Most cron jobs fired in one script call.
CRON_BATCH = 500
#: Most due cron jobs a pass reads (and fires, a batch at a time).
CRON_READ = 4 * CRON_BATCH
#: With overlap="delay", how often a held tick looks again whether the previous run ended.
CRON_OVERLAP_RECHECK_MS = 1000


class CronFiring(NamedTuple):
    """One job's part of a fire_cron call, worked out for a given moment (a tuple: a
    pass makes one per due job)."""

    name: str
    expected_next_ms: int
    following_ms: int | None
    #: Whether the first of ``ticks`` is the first tick not fired yet: none was dropped
    #: before it (fire_cron.lua keeps the spans of ticks fired, a span as long as this is).
    chained: bool
    overlap: cron.OverlapPolicy
    hold_tick_ms: int  # with overlap="delay", the tick held back if the previous run is live
    ticks: list[tuple[str, int, bytes, str]]
    missed: int = 0  # due ticks before the current one (fired late or dropped per policy)
    outside_window: int = 0  # due ticks older than the catch-up window: skipped
    held_before: bool = False  # a held tick looked at again
    max_runs: int = 0
    pause_after_failures: int = 0

    def row(self, retry_at_ms: int) -> list[Any]:
        """The job's row as fire_cron.lua reads it (scores as text: exact in Lua)."""
        row: list[Any] = [
            self.name, str(self.expected_next_ms),
            str(-1 if self.following_ms is None else self.following_ms), self.overlap,
            str(retry_at_ms), str(self.hold_tick_ms), self.outside_window, self.max_runs,
            self.pause_after_failures,
            "1" if self.chained else "0",
        ]  # fmt: skip
        for task_id, run_at_ms, envelope, record in self.ticks:
            row += (task_id, str(run_at_ms), envelope, record)
        return row


class CronFirer:
    """Fires the cron jobs of one queue (or shard) as their ticks come."""

    def __init__(
        self, queue: str, runner: AsyncRunner, operations: QueueOperations, clock: Clock
    ) -> None:
        self.queue = queue
        self.runner = runner
        self.operations = operations
        self.clock = clock
        self._prepared: tuple[int, list[CronFiring]] | None = None
        #: For metrics: the ticks fired, skipped, delayed (counted when first held),
        #: missed, outside the catch-up window, backfilled.
        self.tally = TickTally()
        self.backfills = BackfillFirer(queue, runner, operations, self.tally)

    async def fire_due(self, now: int) -> bool:
        """Fire every job (and backfill) due at ``now``; True when as many were due as a
        pass reads (more may be)."""
        due = await self.runner.run(self.operations.cron.due_cron(now, CRON_READ))
        await self._fire_in_batches(due, now)
        more_backfills = await self.backfills.fire_due(now)
        return len(due) == CRON_READ or more_backfills

    async def prepare(self, tick_ms: int) -> None:
        """Read the jobs and work out their ticks while asleep, so that at the tick the
        only round trip is the (compare-and-set) firing itself."""
        due = await self.runner.run(self.operations.cron.due_cron(tick_ms, CRON_BATCH))
        self._prepared = (tick_ms, await self._firings(due, tick_ms))

    async def fire_prepared(self) -> None:
        """Fire what was prepared while asleep, if its tick has come and no later tick
        has (which would change what is due); a firing that went stale is refused by
        the script's compare-and-set and done again by the normal path."""
        prepared, self._prepared = self._prepared, None
        now = self.clock.now_ms()
        if prepared is None or now is None or now < prepared[0]:
            return
        firings = [f for f in prepared[1] if f.following_ms is None or now < f.following_ms]
        await self._fire(firings, now)

    async def _fire_in_batches(self, due: list[DueCron], now: int) -> None:
        """Fire ``due`` a batch (one script call) at a time, each batch worked out while
        the one before runs on the server."""
        in_flight: asyncio.Future[None] | None = None
        try:
            for start in range(0, len(due), CRON_BATCH):
                firings = await self._firings(due[start : start + CRON_BATCH], now)
                if in_flight is not None:
                    await in_flight
                in_flight = asyncio.ensure_future(self._fire(firings, now))
                await asyncio.sleep(0)  # it is sent; the next batch is worked out meanwhile
            if in_flight is not None:
                await in_flight
        finally:
            if in_flight is not None and not in_flight.done():
                # Left by a failure meanwhile, which is what the caller hears of.
                with contextlib.suppress(Exception):
                    await in_flight

    async def _firings(self, due: list[DueCron], at_ms: int) -> list[CronFiring]:
        """The firings of the cron jobs ``due`` at ``at_ms`` (their ticks, per policy)."""
        firings = []
        plans: dict[tuple[CronTemplate, int], cron_firing.TickPlan] = {}
        for entry in due:
            try:
                firings.append(self._firing(entry, at_ms, plans))
            except DecodeError as problem:
                # A poison record: paused (so it is logged once, not at every pass), and
                # reported by `inspect --check` and `cron list`; the rest go on.
                log.error(
                    "queue %s: cron job %r paused: its definition cannot be used here: %s. "
                    "Declare it again and run `duetime cron resume`, or remove it.",
                    self.queue,
                    entry.name,
                    problem,
                )
                await self.runner.run(self.operations.cron.set_cron_next(entry.name, None))
        return firings

    @staticmethod
    def _firing(
        entry: DueCron, at_ms: int, plans: dict[tuple[CronTemplate, int], cron_firing.TickPlan]
    ) -> CronFiring:
        """The firing of one due job; DecodeError when its stored record is unusable. The
        jobs of a template due alike share their plan (``plans``), unless jittered: a
        jittered tick's offset depends on the job's name."""
        if entry.definition is None:
            raise DecodeError("its definition is missing")
        if entry.problem is not None:
            raise DecodeError(entry.problem)
        name, data, template = cron_definitions.decode_parts(entry.definition)
        job = template.named(name, data) if template.job.jitter_ms else template.job
        held = entry.held_tick_ms
        try:
            first = held if held is not None else job.tick_of(entry.next_tick_ms)
            plan = None if job.jitter_ms else plans.get((template, first))
            if plan is None:
                plan = cron_firing.plan(job, first, at_ms)
                if not job.jitter_ms:
                    plans[template, first] = plan
        except (ValueError, OverflowError, KeyError) as error:  # croniter on odd input
            raise DecodeError(f"its ticks cannot be computed ({error})") from error
        packed_data = codec.pack(data)
        return CronFiring(
            name=name,
            expected_next_ms=entry.next_tick_ms,
            following_ms=plan.following_ms,
            chained=bool(plan.ticks) and plan.ticks[0][0] == first,
            overlap=job.overlap,
            hold_tick_ms=plan.ticks[0][0] if plan.ticks else first,
            ticks=[template.tick_task(name, packed_data, *tick) for tick in plan.ticks],
            missed=plan.missed,
            outside_window=plan.outside_window,
            held_before=held is not None,
            max_runs=job.max_runs or 0,
            pause_after_failures=job.pause_after_failures or 0,
        )

    async def _fire(self, firings: list[CronFiring], now: int) -> None:
        if not firings:
            return
        rows = [firing.row(now + CRON_OVERLAP_RECHECK_MS) for firing in firings]
        outcomes = await self.runner.run(self.operations.cron.fire_cron(rows))
        for firing, outcome in zip(firings, outcomes, strict=True):
            if outcome in (CronFireOutcome.SKIPPED, CronFireOutcome.DELAYED):
                log.info(
                    "queue %s: cron job %r tick %s: previous run still live",
                    self.queue,
                    firing.name,
                    outcome,
                )
            elif outcome == CronFireOutcome.PAUSED:
                log.warning(
                    "queue %s: cron job %r paused: its last %d runs failed "
                    "(pause_after_failures); `duetime cron resume` starts it again",
                    self.queue,
                    firing.name,
                    firing.pause_after_failures,
                )
            self._count(firing, outcome)

    def _count(self, firing: CronFiring, outcome: CronFireOutcome | int) -> None:
        """Tally a firing. A stale one was another dispatcher's; a held tick looked at
        again (its job's next score is then the recheck time) is not new."""
        if outcome == CronFireOutcome.DELAYED:
            if not firing.held_before:
                self.tally.add(firing.name, "delayed")
            return
        if outcome in (CronFireOutcome.STALE, CronFireOutcome.PAUSED):
            return
        if firing.outside_window:
            self.tally.add(firing.name, "outside_window", firing.outside_window)
        if isinstance(outcome, int):
            self.tally.add(firing.name, "fired", outcome)
        else:  # skipped
            self.tally.add(firing.name, "skipped")
        if firing.missed:
            self.tally.add(firing.name, "missed", firing.missed)
