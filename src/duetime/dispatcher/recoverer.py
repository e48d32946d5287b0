"""Recovering a queue's tasks from workers that lost them: reaping expired leases and
silent workers, and the second look at the list of a reaped or stopped worker.

A failover holds every process's commands, workers' heartbeats and renewals too, so
after one the recoverer waits out a worker TTL before it takes anyone for dead.
"""

from __future__ import annotations

import logging
import time

from duetime.settings import Settings
from duetime.store.plans.dispatching import Promotion
from duetime.store.plans.operations import QueueOperations
from duetime.store.redis.runner import AsyncRunner

log = logging.getLogger("duetime.dispatcher")

REAP_BATCH = 1000


class Recoverer:
    """Re-enters the tasks of one queue (or shard) whose worker lost them, when the
    dispatcher's pass finds a lease expired, a worker silent or a reaped worker's list
    due for its second look."""

    def __init__(
        self, queue: str, runner: AsyncRunner, operations: QueueOperations, settings: Settings
    ) -> None:
        self.queue = queue
        self.runner = runner
        self.operations = operations
        self.settings = settings
        self.worker_ttl_ms = round(settings.worker_ttl * 1000)
        self._look_again_ms = round(settings.look_again_after_reap * 1000)
        self.reaping_from_ms = 0  # server ms; later after a failover held commands

    async def recover(self, promotion: Promotion) -> bool:
        """Reap what the promotion found due; True when any of it ran (more may be
        waiting: the next pass starts at once)."""
        run = self.runner.run
        now = promotion.now_ms
        ran = False
        # A failover held every process's commands, workers' heartbeats and renewals too:
        # silence from before it has ended plus a worker TTL proves no one dead.
        held_ms = round(
            (self.runner.interrupted_at() + self.settings.worker_ttl - time.monotonic()) * 1000
        )
        if held_ms > 0:
            self.reaping_from_ms = now + held_ms
        reaping = now >= self.reaping_from_ms
        if (
            reaping
            and promotion.next_lease_deadline_ms is not None
            and promotion.next_lease_deadline_ms <= now
        ):
            reaped = await run(self.operations.dispatcher.reap_expired_leases(REAP_BATCH))
            if reaped:
                log.warning(
                    "queue %s: %d task(s) re-entered after their lease expired", self.queue, reaped
                )
            ran = True
        if (
            reaping
            and promotion.oldest_heartbeat_ms is not None
            and promotion.oldest_heartbeat_ms + self.worker_ttl_ms <= now
        ):
            reaped = await run(
                self.operations.dispatcher.reap_dead_workers(
                    self.worker_ttl_ms, self._look_again_ms
                )
            )
            if reaped:
                log.warning(
                    "queue %s: reaped silent worker(s); %d task(s) re-entered", self.queue, reaped
                )
            ran = True
        if promotion.next_reaped_look_ms is not None and promotion.next_reaped_look_ms <= now:
            reaped = await run(self.operations.dispatcher.look_at_reaped(self.worker_ttl_ms))
            if reaped:
                log.warning(
                    "queue %s: %d task(s) re-entered from the list of a reaped or stopped "
                    "worker (a BLMOVE it had left pending moved them there)",
                    self.queue,
                    reaped,
                )
            ran = True
        return ran

    def due_times(self, promotion: Promotion) -> list[int]:
        """When reaping may next have work (server ms): the next lease deadline, the
        moment the oldest heartbeat goes stale, the next look at a reaped worker's list."""
        due = []
        # Reaping waits out a failover's hold (see recover).
        if promotion.next_lease_deadline_ms is not None:
            due.append(max(promotion.next_lease_deadline_ms, self.reaping_from_ms))
        if promotion.oldest_heartbeat_ms is not None:
            reap_at = promotion.oldest_heartbeat_ms + self.worker_ttl_ms
            due.append(max(reap_at, self.reaping_from_ms))
        if promotion.next_reaped_look_ms is not None:
            due.append(promotion.next_reaped_look_ms)
        return due
