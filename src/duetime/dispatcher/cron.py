"""Firing a queue's cron jobs: each due job's ticks worked out per its policies, fired
with one compare-and-set script call per job, and counted for metrics.

A cron definition this host cannot use is a poison record: that job is paused and
logged once, and every other job goes on. The jobs due at the next tick are worked out
while the dispatcher sleeps, so that at the tick the only round trip is the firing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from duetime import cron
from duetime.clock import Clock
from duetime.errors import DecodeError
from duetime.states import CronFireOutcome
from duetime.store import AsyncRunner
from duetime.store.cron_jobs import DueCron
from duetime.store.operations import QueueOperations

log = logging.getLogger("duetime.dispatcher")

#: Most cron jobs fired per pass.
CRON_BATCH = 100
#: With overlap="delay", how often a held tick looks again whether the previous run ended.
CRON_OVERLAP_RECHECK_MS = 1000


@dataclass(frozen=True, slots=True)
class CronFiring:
    """One fire_cron call for one job, worked out for a given moment."""

    name: str
    expected_next_ms: int
    following_ms: int | None
    overlap: cron.OverlapPolicy
    first_tick_ms: int
    ticks: list[tuple[str, int, bytes, str]]
    missed: int = 0  # due ticks before the current one (fired late or dropped per policy)


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
        #: (cron job, outcome) -> ticks, for metrics: fired, skipped, delayed (counted when
        #: first held), missed. Only this process's firings; read, never reset.
        self.ticks_counted: dict[tuple[str, str], int] = {}

    async def fire_due(self, now: int) -> bool:
        """Fire every job due at ``now``; True when a full batch was (more may be due)."""
        firings = await self._plan(now)
        await self._fire(firings, now)
        return len(firings) == CRON_BATCH

    async def prepare(self, tick_ms: int) -> None:
        """Read the jobs and work out their ticks while asleep, so that at the tick the
        only round trip is the (compare-and-set) firing itself."""
        self._prepared = (tick_ms, await self._plan(tick_ms))

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

    async def _plan(self, at_ms: int) -> list[CronFiring]:
        """The firings of every cron job due at ``at_ms`` (its ticks, per its policy)."""
        due = await self.runner.run(self.operations.due_cron(at_ms, CRON_BATCH))
        firings = []
        for entry in due:
            try:
                firings.append(self._firing(entry, at_ms))
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
                await self.runner.run(self.operations.set_cron_next(entry.name, None))
        return firings

    @staticmethod
    def _firing(entry: DueCron, at_ms: int) -> CronFiring:
        """The firing of one due job; DecodeError when its stored record is unusable."""
        if entry.definition is None:
            raise DecodeError("its definition is missing")
        if entry.problem is not None:
            raise DecodeError(entry.problem)
        job = cron.decode_job(entry.definition)
        first = entry.held_tick_ms if entry.held_tick_ms is not None else entry.next_tick_ms
        try:
            ticks = job.ticks_to_fire(first, at_ms)
            following = job.next_tick(at_ms)
            # Counted again only when some were missed (the current tick is not the first).
            missed = 0 if ticks[-1] == first else len(job.due_ticks(first, at_ms)) - 1
        except (ValueError, OverflowError, KeyError) as error:  # croniter on odd input
            raise DecodeError(f"its ticks cannot be computed ({error})") from error
        return CronFiring(
            name=job.name,
            expected_next_ms=entry.next_tick_ms,
            following_ms=following,
            overlap=job.overlap,
            first_tick_ms=first,
            ticks=[cron.tick_task(job, tick) for tick in ticks],
            missed=missed,
        )

    async def _fire(self, firings: list[CronFiring], now: int) -> None:
        for firing in firings:
            outcome = await self.runner.run(
                self.operations.fire_cron(
                    firing.name,
                    firing.expected_next_ms,
                    firing.following_ms,
                    firing.overlap,
                    now + CRON_OVERLAP_RECHECK_MS,
                    firing.first_tick_ms,
                    firing.ticks,
                )
            )
            if outcome in (CronFireOutcome.SKIPPED, CronFireOutcome.DELAYED):
                log.info(
                    "queue %s: cron job %r tick %s: previous run still live",
                    self.queue,
                    firing.name,
                    outcome,
                )
            self._count(firing, outcome)

    def _count(self, firing: CronFiring, outcome: CronFireOutcome | int) -> None:
        """Tally a firing in ``ticks_counted``. A stale one was another dispatcher's; a
        held tick looked at again (its job's next score is then the recheck time) is not
        new."""
        counts = self.ticks_counted
        if outcome == CronFireOutcome.DELAYED:
            if firing.first_tick_ms == firing.expected_next_ms:
                counts[firing.name, "delayed"] = counts.get((firing.name, "delayed"), 0) + 1
            return
        if isinstance(outcome, int):
            counts[firing.name, "fired"] = counts.get((firing.name, "fired"), 0) + outcome
        elif outcome == CronFireOutcome.SKIPPED:
            counts[firing.name, "skipped"] = counts.get((firing.name, "skipped"), 0) + 1
        else:
            return
        counts[firing.name, "missed"] = counts.get((firing.name, "missed"), 0) + firing.missed
