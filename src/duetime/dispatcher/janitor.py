"""A queue's housekeeping, every ``maintenance_interval``: orphan processing lists swept,
dead tasks past retention purged, the minute figures trimmed to those kept, and the
records of debounce, throttle and unique keys that mean nothing more dropped."""

from __future__ import annotations

import logging

from duetime.settings import Settings
from duetime.store.plans.dispatching import MINUTE_MS, MINUTES_KEPT
from duetime.store.plans.keyed import recheck_ms
from duetime.store.plans.operations import QueueOperations
from duetime.store.redis.runner import AsyncRunner

log = logging.getLogger("duetime.dispatcher")


class Janitor:
    """Cleans up one queue (or shard) when its time has come (``next_at_ms``)."""

    def __init__(
        self, queue: str, runner: AsyncRunner, operations: QueueOperations, settings: Settings
    ) -> None:
        self.queue = queue
        self.runner = runner
        self.operations = operations
        self.settings = settings
        self.next_at_ms = 0  # server ms of the next clean-up

    async def clean_up(self, now: int) -> None:
        run = self.runner.run
        orphans = await run(self.operations.dispatcher.sweep_orphan_lists())
        if orphans:
            log.warning(
                "queue %s: %d task(s) re-entered from orphan processing lists", self.queue, orphans
            )
        purged = await run(
            self.operations.operator.purge_dead(
                died_before_ms=now - round(self.settings.dead_ttl * 1000),
                keep_at_most=self.settings.dead_max,
            )
        )
        if purged:
            log.info("queue %s: %d dead task(s) past retention purged", self.queue, len(purged))
        await run(self.operations.dispatcher.trim_minutes(now // MINUTE_MS - MINUTES_KEPT + 1))
        await run(self.operations.keyed.sweep_keyed(recheck_ms(self.settings.maintenance_interval)))
        self.next_at_ms = now + round(self.settings.maintenance_interval * 1000)
