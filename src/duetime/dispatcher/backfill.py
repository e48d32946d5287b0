"""Firing cron jobs' backfills: each due backfill's next tick enqueued under its job's
overlap policy, at the backfill's pace, with one script call per batch of jobs (a
compare-and-set on each backfill's due time and next tick).

A backfill whose job is gone or whose definition cannot be used here is dropped and
logged; the other jobs' backfills go on.
"""

from __future__ import annotations

import logging
from typing import Any

from duetime import codec
from duetime.cron import CronJob
from duetime.cron import definitions as cron_definitions
from duetime.dispatcher.tally import TickTally
from duetime.errors import DecodeError
from duetime.store.plans.cron_jobs import CronBackfill, DueBackfill, covering
from duetime.store.plans.operations import QueueOperations
from duetime.store.redis.runner import AsyncRunner

log = logging.getLogger("duetime.dispatcher")

#: Most backfills fired per pass, in one script call.
BACKFILL_BATCH = 100
#: With overlap="delay", how often a backfill tick looks again whether the previous run ended.
BACKFILL_RECHECK_MS = 1000


class BackfillFirer:
    """Fires the backfills of one queue's (or shard's) cron jobs as they come due."""

    def __init__(
        self,
        queue: str,
        runner: AsyncRunner,
        operations: QueueOperations,
        tally: TickTally,
    ) -> None:
        self.queue = queue
        self.runner = runner
        self.operations = operations
        #: The cron firer's, for metrics: backfill ticks this process enqueued.
        self.tally = tally

    async def fire_due(self, now: int) -> bool:
        """Fire every backfill due at ``now``; True when a full batch was (more may be)."""
        due = await self.runner.run(self.operations.cron.due_backfills(now, BACKFILL_BATCH))
        rows = []
        for entry in due:
            try:
                rows.append(self._row(entry, now))
            except DecodeError as problem:
                log.error(
                    "queue %s: backfill of cron job %r dropped: %s", self.queue, entry.name, problem
                )
                await self.runner.run(self.operations.cron.drop_backfill(entry.name))
        if rows:
            outcomes = await self.runner.run(self.operations.cron.fire_backfill(rows))
            for row, outcome in zip(rows, outcomes, strict=True):
                if isinstance(outcome, int):
                    self.tally.add(row[0], "backfilled", outcome)
        return len(due) == BACKFILL_BATCH

    @staticmethod
    def _row(entry: DueBackfill, now: int) -> list[Any]:
        """The row of fire_backfill.lua for one due backfill; DecodeError when its job or
        record cannot be used."""
        if entry.definition is None:
            raise DecodeError("its cron job is gone")
        if entry.backfill is None or entry.backfill.next_tick_ms is None:
            raise DecodeError("its record is missing, done, or not one duetime wrote")
        name, data, template = cron_definitions.decode_parts(entry.definition)
        backfill, tick = entry.backfill, entry.backfill.next_tick_ms
        try:
            following = _next_to_run(template.job, tick, backfill)
        except (ValueError, OverflowError, KeyError) as error:  # croniter on odd input
            raise DecodeError(f"its ticks cannot be computed ({error})") from error
        # A backfill's run is due when it fires: its tick is in its id.
        task_id, run_at, envelope, record = template.tick_task(name, codec.pack(data), tick, now)
        return [
            name, str(entry.due_ms), entry.record, str(following),
            str(now + backfill.spacing_ms), template.job.overlap, str(now + BACKFILL_RECHECK_MS),
            task_id, str(run_at), envelope, record,
        ]  # fmt: skip


def _next_to_run(job: CronJob, after_ms: int, backfill: CronBackfill) -> int:
    """The backfill's first tick after ``after_ms`` not within its covered spans (ticks
    that earlier backfills handled or the job's schedule enqueued, counted as run when
    it was planned): those are jumped over whole; -1 when its range holds no more."""
    tick = job.next_tick(after_ms)  # ticks do not depend on the name
    while tick is not None and tick <= backfill.to_ms:
        end = covering(backfill.covered, tick)
        if end is None:
            return tick
        tick = job.next_tick(end)
    return -1
