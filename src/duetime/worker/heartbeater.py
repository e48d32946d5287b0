"""The heartbeat of a worker: it proves the worker alive, renews the leases of its
attempts, learns which were fenced and which tasks were cancelled, and finds ids in its
lists that it does not hold (whose BLMOVE reply was lost)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from duetime.backoff import Outage
from duetime.errors import DuetimeError
from duetime.worker.cancels import past_grace, stop_cancelled
from duetime.worker.state import Attempt, Shard, SharedState, WorkerSetup, log_dropped
from duetime.worker.timeouts import TimeoutTimer

log = logging.getLogger("duetime.worker")


class Heartbeater:
    """Beats every ``heartbeat_interval`` in each shard, from the start until the worker
    closes (it goes on while running attempts drain)."""

    def __init__(self, setup: WorkerSetup, state: SharedState, timeouts: TimeoutTimer) -> None:
        self._setup = setup
        self._state = state
        self._timeouts = timeouts
        self._runner = setup.runner
        self._worker_id = setup.worker_id
        self._settings = setup.settings

    async def loop(self) -> None:
        shards = self._setup.shards
        state = self._state
        outages = {
            shard.index: Outage(
                log,
                f"worker {self._worker_id} heartbeat"
                + ("" if len(shards) == 1 else f" in {shard.label}"),
            )
            for shard in shards
        }
        while not state.closing.is_set():
            # Keeps renewing leases while running attempts drain; ends once closing.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.heartbeat_interval):
                    await state.closing.wait()
                return
            if self._setup.tally is not None:
                self._setup.tally.flush()
            now = time.monotonic()
            # A finished attempt keeps its lease until its outcome is acked: a slow ack
            # (a busy server, a stop) must not let the task run again elsewhere. One past
            # its timeout, or past its cancel's grace, is left to lose it.
            grace = self._settings.cancel_grace
            running = [
                a
                for a in state.held.values()
                if not a.fenced
                and (
                    a.finished
                    or (
                        (not a.timeout or now - a.started < a.timeout + 1)
                        and not past_grace(a, now, grace)
                    )
                )
            ]
            await asyncio.gather(
                *(
                    self._beat(shard, [a for a in running if a.shard is shard], outages)
                    for shard in shards
                )
            )

    async def _beat(self, shard: Shard, running: list[Attempt], outages: dict[int, Outage]) -> None:
        """One shard's heartbeat: renew its running attempts' leases, fence the lost ones
        and learn of ids in the worker's list there that it does not hold."""
        named = [(a.task_id, a.attempt) for a in running]
        try:
            await self._runner.run(shard.operations.state.refresh_clock())
            sent = time.monotonic()
            fences = shard.fences_unreported
            reply = await self._runner.run(
                shard.operations.worker.heartbeat(
                    self._worker_id, self._setup.lease_ms, named, fences
                )
            )
            shard.fences_unreported -= fences
            outages[shard.index].succeeded()
        except DuetimeError as error:
            outages[shard.index].failed(error, self._settings.heartbeat_interval)
            return
        if not reply.was_registered:
            log.warning(
                "worker %s had been presumed dead; its attempts were taken back", self._worker_id
            )
        held = self._state.held
        lost = set(reply.lost)
        fenced: list[Attempt] = []
        for task_id, number in named:
            # The very attempt named: a newer attempt of the same task (claimed again
            # by this worker after a pause) is another entry, and keeps running.
            attempt = held.get((shard.index, task_id))
            if attempt is None or attempt.attempt != number or attempt.fenced:
                continue
            if (task_id, number) not in lost:
                attempt.leased_at = sent
                continue
            if attempt.finished:
                # Its outcome is on its way: the ack may already have removed the lease
                # this heartbeat asked about. The ack or fail script decides, and says so.
                continue
            attempt.fenced = True
            fenced.append(attempt)
            if attempt.runner is not None:
                attempt.runner.cancel()
        if fenced:
            log_dropped(fenced, "running attempt")
        for task_id in reply.cancelling:
            attempt = held.get((shard.index, task_id))
            if attempt is not None:
                stop_cancelled(attempt, self._timeouts, self._settings.cancel_grace)
        shard.untracked = [i for i in reply.held if (shard.index, i) not in held]
        if shard.untracked:
            self._state.slot_freed.set()  # let the claimer pick them up now
