"""The dispatcher daemon: promote due tasks, reap expired leases and dead workers.

Stateless; run as many as you like: every move is one atomic script, so two
dispatchers never promote the same task twice. It never polls on a fixed interval:
after each promotion it sleeps on a local timer until the earliest of the next due
time, the next lease deadline and the moment the oldest worker heartbeat goes
stale, and a long-lived BLPOP on the queue's wake list cuts the sleep short when a
new earliest task is scheduled. (Server-side blocking timeouts tick at the server's
``hz``, 100 ms by default, too coarse for punctuality; the local timer is exact.)
Tasks are promoted ``promote_ahead`` (5 ms) before their run-at, with the run-at
noted beside them; the claiming worker waits for it on a precise timer, so the
promote and claim round trips happen before the task is due, not after.

Each queue's loop runs under a ``Supervisor``: an unexpected exception is logged and
the loop restarted; one that keeps failing stops the dispatcher with
``DaemonFailedError``. A cron definition this host cannot use is a poison record:
that job is paused and logged once, and every other job and queue goes on.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from duetime import cron, validation
from duetime.backoff import Backoff, Outage
from duetime.clock import Clock, ServerClock, sleep_precisely
from duetime.codec import Envelope, encode_envelope
from duetime.errors import ConfigurationError, DecodeError, DuetimeError
from duetime.settings import DEFAULT_SETTINGS, Settings
from duetime.startup import freeze_startup_objects, register, warn_if_beyond, warn_if_evicting
from duetime.states import CronFireOutcome
from duetime.store import AsyncRunner, QueueKeys
from duetime.store.cron_jobs import DueCron
from duetime.store.dispatching import MINUTE_MS, MINUTES_KEPT, Promotion
from duetime.store.keys import QueueLayout, shard_tag
from duetime.store.operations import QueueOperations
from duetime.store.runner import BLOCK_MARGIN, RedisSpec
from duetime.supervisor import Supervisor, cancel_and_wait

log = logging.getLogger("duetime.dispatcher")

REAP_BATCH = 1000
#: Most cron jobs fired per pass.
CRON_BATCH = 100
#: With overlap="delay", how often a held tick looks again whether the previous run ended.
CRON_OVERLAP_RECHECK_MS = 1000
#: On stop, how long a cancelled wake BLPOP may take to end before its connection is
#: closed under it.
STOP_GRACE = 0.1
#: A pause long enough to resample the clock in it without delaying promotion.
IDLE_ENOUGH = 0.02
#: The timer wakes this much early; the rest of the wait yields to the event loop.
TIMER_SLACK = 0.0015


@dataclass(frozen=True, slots=True)
class CronFiring:
    """One fire_cron call for one job, worked out for a given moment."""

    name: str
    expected_next_ms: int
    following_ms: int | None
    overlap: cron.OverlapPolicy
    first_tick_ms: int
    ticks: list[tuple[str, int, bytes]]
    missed: int = 0  # due ticks before the current one (fired late or dropped per policy)


def cron_envelope(job: cron.CronJob, tick_ms: int) -> bytes:
    return encode_envelope(
        Envelope(job.task, job.data, tick_ms, job.max_attempts, job.timeout_ms, cron.RESULT_TTL_MS)
    )


class QueueDispatcher:
    """The dispatching steps of one queue, or of one shard of a sharded queue (each
    shard is dispatched on its own, like a queue); ``step`` is one pass, ``run`` loops it."""

    def __init__(
        self, queue: str, runner: AsyncRunner, settings: Settings, clock: Clock, shard: int = 0
    ) -> None:
        self.queue = shard_tag(validation.queue_name(queue), shard)
        self.runner = runner
        self.settings = settings
        self.clock = clock
        self.operations = QueueOperations(QueueKeys(self.queue), clock)
        self._batch = settings.promote_batch
        self._ahead_ms = round(settings.promote_ahead * 1000)
        self._stage_ms = round(settings.stage_ahead * 1000)
        self._worker_ttl_ms = round(settings.worker_ttl * 1000)
        self._look_again_ms = round(settings.look_again_after_reap * 1000)
        self._next_maintenance_ms = 0
        self._reaping_from_ms = 0  # server ms; later after a failover held commands
        self._prepared: tuple[int, list[CronFiring]] | None = None
        self.unfinished_wake: asyncio.Task[bool] | None = None  # left running at stop
        #: (cron job, outcome) -> ticks, for metrics: fired, skipped, delayed (counted when
        #: first held), missed. Only this process's firings; read, never reset.
        self.cron_ticks: dict[tuple[str, str], int] = {}

    async def step(self) -> int | None:
        """Promote, reap and maintain once; returns the server time (ms) at which work
        may next be due, or None when more is waiting right now."""
        run = self.runner.run
        await self._fire_prepared()
        promotion = await run(
            self.operations.promote_due(self._batch, self._ahead_ms, self._stage_ms)
        )
        now = promotion.now_ms
        busy = promotion.moved + promotion.staged >= self._batch
        # A failover held every process's commands, workers' heartbeats and renewals too:
        # silence from before it has ended plus a worker TTL proves no one dead.
        held_ms = round((self.runner.interrupted_at() + self.settings.worker_ttl
                         - time.monotonic()) * 1000)  # fmt: skip
        if held_ms > 0:
            self._reaping_from_ms = now + held_ms
        reaping = now >= self._reaping_from_ms
        if (
            reaping
            and promotion.next_lease_deadline_ms is not None
            and promotion.next_lease_deadline_ms <= now
        ):
            reaped = await run(self.operations.reap_expired_leases(REAP_BATCH))
            if reaped:
                log.warning(
                    "queue %s: %d task(s) re-entered after their lease expired", self.queue, reaped
                )
            busy = True
        if (
            reaping
            and promotion.oldest_heartbeat_ms is not None
            and promotion.oldest_heartbeat_ms + self._worker_ttl_ms <= now
        ):
            reaped = await run(
                self.operations.reap_dead_workers(self._worker_ttl_ms, self._look_again_ms)
            )
            if reaped:
                log.warning(
                    "queue %s: reaped silent worker(s); %d task(s) re-entered", self.queue, reaped
                )
            busy = True
        if promotion.next_reaped_look_ms is not None and promotion.next_reaped_look_ms <= now:
            reaped = await run(self.operations.look_at_reaped(self._worker_ttl_ms))
            if reaped:
                log.warning(
                    "queue %s: %d task(s) re-entered from the list of a reaped or stopped "
                    "worker (a BLMOVE it had left pending moved them there)", self.queue, reaped,
                )  # fmt: skip
            busy = True
        if promotion.next_cron_tick_ms is not None and promotion.next_cron_tick_ms <= now:
            firings = await self._plan_cron(now)
            await self._fire(firings, now)
            busy = busy or len(firings) == CRON_BATCH
        if now >= self._next_maintenance_ms:
            await self._maintain(now)
        if busy:
            return None
        wake_at = self._wake_at(promotion)
        if wake_at == promotion.next_cron_tick_ms:
            # Read the jobs and work out their ticks while asleep, so that at the tick
            # the only round trip is the (compare-and-set) firing itself.
            self._prepared = (wake_at, await self._plan_cron(wake_at))
        return wake_at

    def _wake_at(self, promotion: Promotion) -> int:
        wake_at = [self._next_maintenance_ms]
        if promotion.next_due_ms is not None:
            # Promotion reaches _ahead_ms past the whole-ms "now": wake when that covers it.
            wake_at.append(math.ceil(promotion.next_due_ms) - self._ahead_ms)
        if promotion.next_bucket_ms is not None and self._stage_ms > self._ahead_ms:
            # Stage once the earliest bucket is within half of stage_ahead, so that a
            # pass stages about half of stage_ahead's tasks at once, not one at a time.
            wake_at.append(math.ceil(promotion.next_bucket_ms) - self._stage_ms // 2)
        # Reaping waits out a failover's hold (see step).
        if promotion.next_lease_deadline_ms is not None:
            wake_at.append(max(promotion.next_lease_deadline_ms, self._reaping_from_ms))
        if promotion.oldest_heartbeat_ms is not None:
            reap_at = promotion.oldest_heartbeat_ms + self._worker_ttl_ms
            wake_at.append(max(reap_at, self._reaping_from_ms))
        if promotion.next_cron_tick_ms is not None:
            wake_at.append(promotion.next_cron_tick_ms)
        if promotion.next_reaped_look_ms is not None:
            wake_at.append(promotion.next_reaped_look_ms)
        return min(wake_at)

    async def _plan_cron(self, at_ms: int) -> list[CronFiring]:
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
                    self.queue, entry.name, problem,
                )  # fmt: skip
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
            job.name, entry.next_tick_ms, following, job.overlap, first,
            [(job.tick_id(tick), tick, cron_envelope(job, tick)) for tick in ticks], missed,
        )  # fmt: skip

    async def _fire(self, firings: list[CronFiring], now: int) -> None:
        for firing in firings:
            outcome = await self.runner.run(
                self.operations.fire_cron(
                    firing.name, firing.expected_next_ms, firing.following_ms, firing.overlap,
                    now + CRON_OVERLAP_RECHECK_MS, firing.first_tick_ms, firing.ticks,
                )
            )  # fmt: skip
            if outcome in (CronFireOutcome.SKIPPED, CronFireOutcome.DELAYED):
                log.info("queue %s: cron job %r tick %s: previous run still live", self.queue,
                         firing.name, outcome)  # fmt: skip
            self._count_cron(firing, outcome)

    def _count_cron(self, firing: CronFiring, outcome: CronFireOutcome | int) -> None:
        """Tally a firing in ``cron_ticks``. A stale one was another dispatcher's; a held
        tick looked at again (its job's next score is then the recheck time) is not new."""
        counts = self.cron_ticks
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

    async def _fire_prepared(self) -> None:
        """Fire what was prepared while asleep, if its tick has come and no later tick
        has (which would change what is due); a firing that went stale is refused by
        the script's compare-and-set and done again by the normal path."""
        prepared, self._prepared = self._prepared, None
        now = self.clock.now_ms()
        if prepared is None or now is None or now < prepared[0]:
            return
        firings = [f for f in prepared[1] if f.following_ms is None or now < f.following_ms]
        await self._fire(firings, now)

    async def _maintain(self, now: int) -> None:
        run = self.runner.run
        orphans = await run(self.operations.sweep_orphan_lists())
        if orphans:
            log.warning(
                "queue %s: %d task(s) re-entered from orphan processing lists", self.queue, orphans
            )
        purged = await run(
            self.operations.purge_dead(
                died_before_ms=now - round(self.settings.dead_ttl * 1000),
                keep_at_most=self.settings.dead_max,
            )
        )
        if purged:
            log.info("queue %s: %d dead task(s) past retention purged", self.queue, purged)
        await run(self.operations.trim_minutes(now // MINUTE_MS - MINUTES_KEPT + 1))
        self._next_maintenance_ms = now + round(self.settings.maintenance_interval * 1000)

    def loop(self, stop: asyncio.Event) -> Callable[[], Awaitable[None]]:
        """The queue's loop, as the supervisor restarts it."""
        return lambda: self.run(stop)

    async def run(self, stop: asyncio.Event) -> None:
        backoff = Backoff()
        outage = Outage(log, f"queue {self.queue}")
        wake: asyncio.Task[bool] | None = None
        stopping = asyncio.create_task(stop.wait())
        try:
            while not stop.is_set():
                try:
                    wake_at = await self.step()
                    backoff.reset()
                    outage.succeeded()
                    # Measured now, after the round trip, not from the step's "now".
                    delay = 0.0 if wake_at is None else self.clock.seconds_until(wake_at)
                except DuetimeError as error:
                    # Unreachable, or a command refused (e.g. a key of the wrong type):
                    # log it and back off; a dispatcher never dies of it.
                    wake_at, delay = None, backoff.next()
                    outage.failed(error, delay)
                if delay <= 0:
                    await asyncio.sleep(0)  # let other queues and the wake task run
                    continue
                if wake_at is not None and delay > IDLE_ENOUGH and self.clock.wants_sample():
                    try:
                        await self.runner.run(self.operations.refresh_clock())
                        continue  # recompute the sleep with the fresh clock
                    except DuetimeError:
                        pass  # sleep as planned; the next step retries
                # The wake BLPOP is never cancelled by the timer: a timed-out local wait
                # leaves it pending for the next sleep, so no connection is torn down.
                if wake is None:
                    wake = asyncio.create_task(
                        self.runner.run(self.operations.wait_wake(self.settings.block_timeout))
                    )
                # epoll rounds timeouts up to whole milliseconds: wake a little early on
                # the timer, then sleep the last fraction on the precise timer thread
                # (the event loop is never blocked: `duetime run` shares it with a worker).
                await asyncio.wait(
                    (wake, stopping),
                    timeout=max(0.0, delay - TIMER_SLACK),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if wake_at is not None and not wake.done():
                    await sleep_precisely(min(TIMER_SLACK, self.clock.seconds_until(wake_at)))
                if wake.done():
                    finished, wake = wake, None
                    failure = None if finished.cancelled() else finished.exception()
                    if failure is not None:
                        pause = backoff.next()
                        outage.failed(failure, pause)
                        await asyncio.sleep(pause)
        finally:
            stopping.cancel()
            if wake is not None:
                # Should the BLPOP still not end, the runner's close ends its connection
                # (see Dispatcher.run), rather than a wait of up to block_timeout.
                done = await cancel_and_wait(wake, STOP_GRACE)
                self.unfinished_wake = None if done else wake


class Dispatcher:
    """Dispatches one or more queues from one process; with ``shards``, every shard of
    each (give the count the queues are used with)."""

    def __init__(
        self,
        queues: str | Sequence[str],
        redis: RedisSpec = None,
        *,
        settings: Settings = DEFAULT_SETTINGS,
        clock: Clock | None = None,
        shards: int = 1,
    ) -> None:
        # One name is one queue: a string is never taken as a sequence of names.
        names = [queues] if isinstance(queues, str) else list(queues)
        if not names:
            raise ConfigurationError("a dispatcher needs at least one queue")
        self.queues = [validation.queue_name(q) for q in names]
        self.shards = validation.shards(shards)  # of every queue named
        self.settings = settings
        self.clock = clock  # None: each queue follows the clock of the server holding it
        self._redis = redis
        self._stop = asyncio.Event()
        self.supervisor = Supervisor(f"dispatcher of {', '.join(self.queues)}")

    def stop(self) -> None:
        self._stop.set()

    def _clock(self) -> Clock:
        """The injected clock, or a clock of its own for each queue: on a cluster, queues
        live on different masters, and each queue's "now" is its own server's TIME."""
        return self.clock or ServerClock(self.settings.clock_resync_interval)

    async def run(self) -> None:
        """Dispatch until ``stop()``. Raises DaemonFailedError (after stopping every
        queue) when one queue's loop kept failing."""
        runner = AsyncRunner(self._redis, self.settings)
        dispatchers: list[QueueDispatcher] = []
        unexport: Callable[[], None] | None = None
        try:
            dispatchers = [
                QueueDispatcher(q, runner, self.settings, self._clock(), shard)
                for q in self.queues
                for shard in range(self.shards)
            ]
            if self.settings.metrics_port:
                from duetime import metrics  # imported only when metrics are wanted

                unexport = metrics.export(
                    self.settings, self._redis, self.queues, self.shards, dispatchers
                )
            await warn_if_evicting(runner, dispatchers[0].operations)
            layouts = [QueueLayout(queue, self.shards) for queue in self.queues]
            for layout in layouts:
                await warn_if_beyond(runner, layout)
            await register(runner, layouts)
            freeze_startup_objects(self.settings)
            loops = [
                asyncio.create_task(
                    self.supervisor.keep_running(f"queue {d.queue}", d.loop(self._stop))
                )
                for d in dispatchers
            ]
            failing = asyncio.create_task(self.supervisor.failed.wait())
            await asyncio.wait([*loops, failing], return_when=asyncio.FIRST_COMPLETED)
            if self.supervisor.failure is not None:
                log.critical("dispatcher shutting down: %s", self.supervisor.failure)
                self._stop.set()
            await asyncio.wait(loops)
            failing.cancel()
        finally:
            await runner.close()
            unfinished = [d.unfinished_wake for d in dispatchers if d.unfinished_wake]
            if unfinished:  # their connections are closed now: they end at once
                await asyncio.wait(unfinished, timeout=self.settings.block_timeout + BLOCK_MARGIN)
                for task in unfinished:
                    if task.done() and not task.cancelled():
                        task.exception()  # retrieved: the connection was closed under it
            if unexport is not None:  # may wait for a scrape in flight: off the loop
                await asyncio.to_thread(unexport)
        self.supervisor.raise_if_failed()
