"""How a worker claims tasks: one loop per shard takes ids from the shard's ready list
into the worker's own processing list and leases them (a backlog in batches, by one
script call), and waits while the queue is paused."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from duetime.backoff import Backoff, Outage
from duetime.errors import DuetimeError
from duetime.store.plans.working import Claimed
from duetime.worker.state import Shard, SharedState, WorkerSetup

log = logging.getLogger("duetime.worker")


class Claimer:
    """Fills the worker's free slots. With several shards, each has its claimer loop (so
    every shard is watched while a slot is free, and none is polled); they share the
    slots, which a claimer reserves before it claims, and take turns for freed ones (the
    wake-up order of the slot event)."""

    def __init__(
        self,
        setup: WorkerSetup,
        state: SharedState,
        start: Callable[[Shard, Claimed, float], None],
    ) -> None:
        self._state = state
        self._runner = setup.runner
        self._worker_id = setup.worker_id
        self._settings = setup.settings
        self._lease_ms = setup.lease_ms
        self._start = start  # starts one claimed attempt

    def _claim_size(self, free: int) -> int:
        """Ids to claim in one call: up to claim_batch, and no more than half the slots,
        so that under a backlog the next claim is on its way while this one's attempts
        run. Claiming every slot at once would leave the worker idle while Redis answers
        the claim and Redis idle while the worker runs what it claimed."""
        concurrency = self._state.concurrency
        return min(free, self._settings.claim_batch, max(1, (concurrency + 1) // 2))

    async def loop(self, shard: Shard) -> None:
        """Claim from one shard: a backlog in batches, then block on its ready list."""
        run = self._runner.run
        operations = shard.operations
        state = self._state
        backoff = Backoff()
        outage = Outage(log, f"worker {self._worker_id} claiming from {shard.label}")
        while not state.stop.is_set():
            free = state.free()
            if free <= 0:
                state.slot_freed.clear()
                await state.slot_freed.wait()
                continue
            try:
                taken = [i for i in shard.untracked if (shard.index, i) not in state.held][:free]
                shard.untracked = []
                slots = max(self._claim_size(free), len(taken))
                claimed = await self._claim(shard, slots, taken)
                outage.succeeded()
                if claimed is None:
                    await self._while_paused(shard)
                elif not claimed:
                    task_id = await run(
                        operations.worker.take_ready(self._worker_id, self._settings.block_timeout)
                    )
                    if task_id is None:
                        continue
                    if state.free() <= 0:
                        # Another shard's claimer filled the last slot meanwhile.
                        await run(operations.worker.give_back(self._worker_id, task_id))
                        continue
                    slots = self._claim_size(state.free())
                    if await self._claim(shard, slots, [task_id]) is None:
                        await self._while_paused(shard)
                backoff.reset()
            except DuetimeError as error:  # unreachable, or a command refused: never die of it
                pause = backoff.next()
                outage.failed(error, pause)
                await asyncio.sleep(pause)

    async def _while_paused(self, shard: Shard) -> None:
        """The queue is paused: block until it is resumed (or block_timeout passes, to
        look at the stop flag and the pause again)."""
        timeout = self._settings.block_timeout
        if not shard.paused:
            shard.paused = True
            log.info("worker %s: %s is paused; claiming nothing", self._worker_id, shard.label)
        elif shard.woken:
            # Woken as if resumed, yet still paused: a wake left in place by hand. Without
            # this pause the claimer would spin.
            await asyncio.sleep(min(timeout, 1.0))
        shard.woken = await self._runner.run(shard.operations.worker.wait_resumed(timeout))

    async def _claim(self, shard: Shard, slots: int, taken: list[str]) -> list[Claimed] | None:
        """Lease the ``taken`` ids and more from the shard's ready list, ``slots`` in all,
        and start them. The slots are reserved while the claim is in flight, and those it
        did not fill are offered to the other claimers. None: the queue is paused."""
        state = self._state
        state.reserved += slots
        try:
            leased_at = time.monotonic()
            claimed = await self._runner.run(
                shard.operations.worker.claim(
                    self._worker_id, self._lease_ms, max(0, slots - len(taken)), taken
                )
            )
        finally:
            state.reserved -= slots
        if claimed is None:
            state.slot_freed.set()
            return None
        if shard.paused:
            shard.paused = False
            log.info("worker %s: %s is resumed", self._worker_id, shard.label)
        start = self._start
        for item in claimed:
            start(shard, item, leased_at)
        if len(claimed) < slots:
            state.slot_freed.set()
        return claimed
