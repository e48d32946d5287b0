"""The dispatcher daemon over many queues, and each queue's loop: one pass promotes the
queue's due tasks and calls on its recoverer, cron firer and janitor in turn, then the
loop sleeps until work may next be due.

It never polls on a fixed interval: after each promotion it sleeps on a local timer
until the earliest of the next due time, the next lease deadline and the moment the
oldest worker heartbeat goes stale, and a long-lived BLPOP on the queue's wake list
cuts the sleep short when a new earliest task is scheduled. (Server-side blocking
timeouts tick at the server's ``hz``, 100 ms by default, too coarse for punctuality;
the local timer is exact.) Tasks are promoted ``promote_ahead`` (5 ms) before their
run-at, with the run-at noted beside them; the claiming worker waits for it on a
precise timer, so the promote and claim round trips happen before the task is due,
not after.

Each queue's loop runs under a ``Supervisor``: an unexpected exception is logged and
the loop restarted; one that keeps failing stops the dispatcher with
``DaemonFailedError``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Awaitable, Callable, Sequence

from duetime import validation
from duetime.backoff import Backoff, Outage
from duetime.clock import Clock, ServerClock, sleep_precisely
from duetime.dispatcher.cron import CronFirer
from duetime.dispatcher.janitor import Janitor
from duetime.dispatcher.recoverer import Recoverer
from duetime.errors import ConfigurationError, DuetimeError
from duetime.settings import DEFAULT_SETTINGS, Settings
from duetime.startup import DaemonStartup, register
from duetime.store.plans.dispatching import Promotion
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.layout import QueueLayout, shard_tag
from duetime.store.plans.operations import QueueOperations
from duetime.store.redis.runner import BLOCK_MARGIN, AsyncRunner, RedisSpec
from duetime.supervisor import Supervisor, cancel_and_wait

log = logging.getLogger("duetime.dispatcher")

#: On stop, how long a cancelled wake BLPOP may take to end before its connection is
#: closed under it.
STOP_GRACE = 0.1
#: A pause long enough to resample the clock in it without delaying promotion.
IDLE_ENOUGH = 0.02
#: The timer wakes this much early; the rest of the wait yields to the event loop.
TIMER_SLACK = 0.0015


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
        self.recoverer = Recoverer(self.queue, runner, self.operations, settings)
        self.cron = CronFirer(self.queue, runner, self.operations, clock)
        self.janitor = Janitor(self.queue, runner, self.operations, settings)
        self.unfinished_wake: asyncio.Task[bool] | None = None  # left running at stop

    @property
    def cron_ticks(self) -> dict[tuple[str, str], int]:
        """The cron ticks this dispatcher handled, by (job, outcome), for metrics (see
        ``TickTally``)."""
        return self.cron.tally.counts

    async def step(self) -> int | None:
        """Promote, reap and maintain once; returns the server time (ms) at which work
        may next be due, or None when more is waiting right now."""
        await self.cron.fire_prepared()
        promotion = await self.runner.run(
            self.operations.dispatcher.promote_due(self._batch, self._ahead_ms, self._stage_ms)
        )
        now = promotion.now_ms
        busy = promotion.moved + promotion.staged >= self._batch
        if await self.recoverer.recover(promotion):
            busy = True
        if promotion.next_cron_tick_ms is not None and promotion.next_cron_tick_ms <= now:
            fired_a_batch = await self.cron.fire_due(now)
            busy = busy or fired_a_batch
        if now >= self.janitor.next_at_ms:
            await self.janitor.clean_up(now)
        if busy:
            return None
        wake_at = self._wake_at(promotion)
        if wake_at == promotion.next_cron_tick_ms:
            await self.cron.prepare(wake_at)
        return wake_at

    def _wake_at(self, promotion: Promotion) -> int:
        wake_at = [self.janitor.next_at_ms, *self.recoverer.due_times(promotion)]
        if promotion.next_due_ms is not None:
            # Promotion reaches _ahead_ms past the whole-ms "now": wake when that covers it.
            wake_at.append(math.ceil(promotion.next_due_ms) - self._ahead_ms)
        if promotion.next_bucket_ms is not None and self._stage_ms > self._ahead_ms:
            # Stage once the earliest bucket is within half of stage_ahead, so that a
            # pass stages about half of stage_ahead's tasks at once, not one at a time.
            wake_at.append(math.ceil(promotion.next_bucket_ms) - self._stage_ms // 2)
        if promotion.next_cron_tick_ms is not None:
            wake_at.append(promotion.next_cron_tick_ms)
        return min(wake_at)

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
                        await self.runner.run(self.operations.state.refresh_clock())
                        continue  # recompute the sleep with the fresh clock
                    except DuetimeError:
                        pass  # sleep as planned; the next step retries
                # The wake BLPOP is never cancelled by the timer: a timed-out local wait
                # leaves it pending for the next sleep, so no connection is torn down.
                if wake is None:
                    wake = asyncio.create_task(
                        self.runner.run(
                            self.operations.dispatcher.wait_wake(self.settings.block_timeout)
                        )
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
        async with DaemonStartup(self._redis, self.settings) as startup:
            dispatchers = [
                QueueDispatcher(q, startup.runner, self.settings, self._clock(), shard)
                for q in self.queues
                for shard in range(self.shards)
            ]
            startup.after_runner_closed(functools.partial(self._end_wakes, dispatchers))
            layouts = [QueueLayout(queue, self.shards) for queue in self.queues]
            await startup.prepare(
                layouts,
                dispatchers[0].operations,
                functools.partial(register, startup.runner, layouts),
                dispatchers=dispatchers,
            )
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
        self.supervisor.raise_if_failed()

    async def _end_wakes(self, dispatchers: list[QueueDispatcher]) -> None:
        """Once the runner is closed: the wake BLPOPs left unfinished end at once (their
        connections are closed under them)."""
        unfinished = [d.unfinished_wake for d in dispatchers if d.unfinished_wake]
        if unfinished:
            await asyncio.wait(unfinished, timeout=self.settings.block_timeout + BLOCK_MARGIN)
            for task in unfinished:
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: the connection was closed under it
