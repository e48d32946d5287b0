"""The ``Worker``: its configuration, and its life from start-up, through its parts
running under a supervisor, to the shutdown sequence."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from duetime import validation
from duetime.app import App
from duetime.backoff import Backoff, Outage
from duetime.clock import Clock
from duetime.errors import ConfigurationError, DuetimeError, RedisUnavailableError
from duetime.hooks import HookChain, LogHooks
from duetime.settings import DEFAULT_SETTINGS, Settings
from duetime.startup import DaemonStartup
from duetime.store.plans.layout import QueueLayout
from duetime.store.plans.operations import shard_operations
from duetime.store.plans.requests import Durability
from duetime.store.redis.runner import BLOCK_MARGIN, AsyncRunner, RedisSpec
from duetime.supervisor import Supervisor, cancel_and_wait
from duetime.worker.attempt import AttemptRunner
from duetime.worker.cancels import cancel_listening
from duetime.worker.claimer import Claimer
from duetime.worker.context import LentConnection
from duetime.worker.heartbeater import Heartbeater
from duetime.worker.reporter import Reporter
from duetime.worker.state import Shard, SharedState, WorkerCounters, WorkerSetup
from duetime.worker.threads import ThreadRunner
from duetime.worker.timeouts import TimeoutTimer

if TYPE_CHECKING:
    from duetime.metrics import AttemptTally

log = logging.getLogger("duetime.worker")

#: Attempts a worker runs at once unless told otherwise. Measured with
#: ``bench/bench_core.py --scenario concurrency`` (one worker process): a handler that
#: waits 1 ms runs 2.2x (async) and 1.4x (plain function) faster at 25 than at 10, one
#: that sends one Redis command 1.5x (async) and the same (plain); beyond 25, plain
#: functions lose to thread contention.
DEFAULT_CONCURRENCY = 25
#: After stop(now=True), the most seconds spent on reporting outcomes and handing back.
HURRY = 1.0


def new_worker_id() -> str:
    host = "".join(c if c.isalnum() or c in "-_." else "-" for c in socket.gethostname())[:60]
    return f"{host or 'host'}.{os.getpid()}.{os.urandom(3).hex()}"


class Worker:
    """Runs the handlers of ``app`` for one queue with up to ``concurrency`` attempts.
    For a sharded queue (``shards``, as given to its ``Queue``) it serves every shard:
    one claimer per shard blocks on that shard's ready list, and all share the slots.

    Its parts share one ``SharedState``: the claimers (``Claimer``), the attempts they
    start (``AttemptRunner``), the acker (``Reporter``), the heartbeater
    (``Heartbeater``) and the cancel listener (``cancels.cancel_listening``). The
    shutdown, after ``stop()`` or when a part kept failing, goes in this order:

    1. the claimers end: nothing more is claimed;
    2. running attempts finish within ``shutdown_grace`` (not at all after
       ``stop(now=True)``); the rest are cancelled, their ids left in the worker's list;
    3. closing: the acker sends what is pending and ends (given the time of a lease, or
       ``HURRY`` after ``stop(now=True)``); the heartbeater, which kept renewing the
       leases through the drain, ends, then the cancel listener;
    4. the outcomes still pending are sent;
    5. every shard's unfinished tasks are handed back to ready, and the worker
       deregistered;
    6. whatever happened: the metrics hear of the last attempts, the connection lent to
       handlers is taken back, attempts left behind are cancelled, the threads and the
       timeout timer stopped, and (``DaemonStartup``) the runner closed and the metrics
       export taken back."""

    def __init__(
        self,
        app: App | Any,
        queue: str,
        redis: RedisSpec = None,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        settings: Settings = DEFAULT_SETTINGS,
        clock: Clock | None = None,
        worker_id: str | None = None,
        shards: int = 1,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError(
                f"concurrency must be a positive integer, got {validation.shown(concurrency)}"
            )
        self.app = App.coerce(app)
        self.queue = validation.queue_name(queue)
        self.concurrency = concurrency
        self.settings = settings
        self.worker_id = validation.worker_id(worker_id or new_worker_id())
        self.layout = QueueLayout(self.queue, validation.shards(shards))
        self._clock = clock
        self.shards = [
            Shard(index, operations, self.queue, self.worker_id)
            for index, operations in enumerate(
                shard_operations(self.layout, clock, settings.clock_resync_interval)
            )
        ]
        self.operations = self.shards[0].operations
        self.runner: AsyncRunner | None = None
        self._lent: LentConnection | None = None  # lent to the handlers while it runs
        self._redis = redis
        self._state = SharedState(concurrency)
        self.counters: WorkerCounters = self._state.counters
        self._threads = ThreadRunner(concurrency)
        # One timer enforces every running attempt's timeout (see TimeoutTimer).
        self._timeouts = TimeoutTimer(self._state.held)
        self._lease_ms = round(settings.lease_duration * 1000)
        self._look_again_ms = round(settings.look_again_after_reap * 1000)
        self.supervisor = Supervisor(f"worker {self.worker_id}")
        self._durable = Durability.wanted(settings, None)
        self._hooks = HookChain([LogHooks(), *self.app.hooks.hooks])
        # The built-in metrics count attempts in bulk rather than through a hook.
        self._tally: AttemptTally | None = None
        if settings.metrics_port:
            from duetime import metrics  # imported only when metrics are wanted

            self._tally = metrics.builtin_tally(self._hooks, self.queue)

    # --- lifecycle -------------------------------------------------------------------

    def stop(self, now: bool = False) -> None:
        """Ask the worker to shut down gracefully, or at once with ``now`` (a second
        ``stop()`` also means now)."""
        state = self._state
        state.stop_now = state.stop_now or now or state.stop.is_set()
        state.stop.set()
        if state.stop_now:
            state.slot_freed.set()  # wakes the drain, which then stops waiting

    async def run(self) -> None:
        """Work until ``stop()``; returns after the shutdown sequence. Raises
        DaemonFailedError when a part of the worker kept failing (after shutting down)."""
        async with DaemonStartup(self._redis, self.settings) as startup:
            runner = self.runner = startup.runner
            try:
                await startup.prepare(
                    [self.layout],
                    self.operations,
                    self._register,
                    durable_shards=[shard.operations for shard in self.shards],
                    durability=self._durable,
                )
                await self._work(runner)
            finally:
                self._leave_nothing_running()
        self.supervisor.raise_if_failed()

    async def _work(self, runner: AsyncRunner) -> None:
        """Run the parts until ``stop()`` (or a part failing), then shut down in the
        order the class docstring gives."""
        state = self._state
        setup = WorkerSetup(
            worker_id=self.worker_id,
            queue=self.queue,
            settings=self.settings,
            runner=runner,
            shards=self.shards,
            lease_ms=self._lease_ms,
            hooks=self._hooks,
            tally=self._tally,
        )
        self._lend(runner)
        reporter = Reporter(setup, state, self._durable)
        attempts = AttemptRunner(
            setup,
            state,
            app=self.app,
            threads=self._threads,
            timeouts=self._timeouts,
            reporter=reporter,
            supervisor=self.supervisor,
        )
        claimer = Claimer(setup, state, attempts.start)
        keep = self.supervisor.keep_running
        claimers = [
            asyncio.create_task(
                keep(self._claimer_name(shard), functools.partial(claimer.loop, shard)),
                name=self._claimer_name(shard),
            )
            for shard in self.shards
        ]
        heartbeater = asyncio.create_task(
            keep("heartbeater", Heartbeater(setup, state, self._timeouts).loop), name="heartbeater"
        )
        acker = asyncio.create_task(keep("acker", reporter.loop), name="acker")
        listener = self._cancel_listener(setup)
        stopping = asyncio.create_task(state.stop.wait())
        failing = asyncio.create_task(self.supervisor.failed.wait())
        await asyncio.wait((stopping, failing), return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        failing.cancel()
        if self.supervisor.failure is not None:
            log.critical("worker %s shutting down: %s", self.worker_id, self.supervisor.failure)
            state.stop.set()
        await asyncio.gather(*(self._end(task) for task in claimers))
        await self._drain()
        state.closing.set()
        state.outcome_ready.set()
        # Not cancelled: a cancel mid-flush would lose a popped batch of acks.
        await asyncio.wait([acker], timeout=self._reporting_time())
        await self._end(acker)
        await self._end(heartbeater)
        if listener is not None:
            await self._end(listener)
        await reporter.flush()
        await self._hand_back()

    def _leave_nothing_running(self) -> None:
        """Last, whatever happened: the metrics hear of the last attempts, handlers can no
        longer use the worker's connection, and nothing of the worker's keeps running (an
        attempt left behind, a thread, the timer)."""
        if self._tally is not None:
            self._tally.flush()
        if self._lent is not None:
            self._lent.close()
        for attempt in self._state.held.values():
            if attempt.runner is not None:
                attempt.runner.cancel()
        self._threads.close()
        self._timeouts.cancel()

    def _lend(self, runner: AsyncRunner) -> None:
        """Lend the worker's connection to its handlers (``current_task().queue``): they
        schedule on it rather than open connections of their own."""
        self._lent = LentConnection(
            self.queue,
            self.layout.count,
            self.settings,
            self._clock,
            self.app.hooks.hooks,
            runner,
            asyncio.get_running_loop(),
        )
        for shard in self.shards:
            shard.lent = self._lent

    def _claimer_name(self, shard: Shard) -> str:
        return "claimer" if len(self.shards) == 1 else f"claimer of shard {shard.index}"

    def _reporting_time(self) -> float:
        return HURRY if self._state.stop_now else self.settings.lease_duration + BLOCK_MARGIN

    async def _hand_back(self) -> None:
        """Hand every unfinished task back to ready and deregister, in every shard. A
        list is looked at once more later, in case a BLMOVE cut off by the stop still
        lands an id there."""
        try:
            async with asyncio.timeout(self._reporting_time()):
                handed_back = await asyncio.gather(*map(self._release, self.shards))
        except (DuetimeError, TimeoutError) as error:
            log.warning(
                "worker %s could not hand its tasks back (%s); leases and the dispatchers "
                "bring them back",
                self.worker_id,
                error or "timed out",
            )
            return
        log.info("worker %s stopped; %d task(s) handed back", self.worker_id, sum(handed_back))

    async def _release(self, shard: Shard) -> int:
        assert self.runner is not None
        return await self.runner.run(
            shard.operations.worker.release_worker(
                self.worker_id, self._look_again_ms, shard.fences_unreported
            )
        )

    def _cancel_listener(self, setup: WorkerSetup) -> asyncio.Task[None] | None:
        """The part that hears cancels of running tasks as they are asked, if on."""
        if not self.settings.listen_for_cancels:
            return None
        listening = cancel_listening(setup, self._state, self._timeouts)
        keep = self.supervisor.keep_running
        return asyncio.create_task(keep("cancel listener", listening), name="cancel listener")

    async def _end(self, task: asyncio.Task[None]) -> None:
        """Stop a loop (each loop also ends on its own at its next check of the stop
        flags)."""
        wait = HURRY if self._state.stop_now else self.settings.block_timeout + BLOCK_MARGIN
        if not await cancel_and_wait(task, wait):
            log.warning("%s did not stop in time; leaving it behind", task.get_name())

    async def _register(self) -> None:
        backoff = Backoff()
        outage = Outage(log, f"worker {self.worker_id} registering")
        assert self.runner is not None
        run = self.runner.run
        while True:
            try:
                for shard in self.shards:
                    await run(shard.operations.worker.heartbeat(self.worker_id, self._lease_ms, ()))
                outage.succeeded()
                break
            except RedisUnavailableError as error:
                if self._state.stop.is_set():
                    raise
                pause = backoff.next()
                outage.failed(error, pause)
                await asyncio.sleep(pause)
        # Workers killed earlier leave their entries until a dispatcher reaps them; a
        # starting worker clears those that are past worker_ttl, so `inspect` is honest
        # even where no dispatcher runs.
        try:
            for shard in self.shards:
                await run(
                    shard.operations.dispatcher.reap_dead_workers(
                        round(self.settings.worker_ttl * 1000), self._look_again_ms
                    )
                )
        except DuetimeError as error:
            log.warning("could not clear silent workers at start-up: %s", error)

    async def _drain(self) -> None:
        """Let running attempts finish within the grace period (not at all after
        ``stop(now=True)``); cancel the rest, whose ids are then handed back."""
        state = self._state
        deadline = time.monotonic() + self.settings.shutdown_grace
        while state.running > 0 and not state.stop_now:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            state.slot_freed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await state.slot_freed.wait()
        for attempt in state.held.values():
            if not attempt.finished and attempt.runner is not None:
                attempt.runner.cancel()  # its id stays in the list and is handed back
