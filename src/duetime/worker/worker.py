"""The worker daemon: claim, run under a lease, renew, ack / retry / dead-letter.

One asyncio loop per process runs four small parts of one worker:
- the claimer takes ids with BLMOVE from ``ready`` into the worker's own processing
  list and leases them (a backlog is claimed in batches by one script call);
- each claimed attempt runs its handler, async ones on the loop, plain functions on the
  worker's own threads (see ``_ThreadRunner``), under the task's timeout (one timer for
  the whole worker, see ``_arm_timeouts``);
- the acker sends finished attempts in batches (one script call per batch);
- the heartbeater proves the worker alive, renews the leases of running attempts,
  learns which attempts were fenced, and finds ids whose BLMOVE reply was lost.
Each loop runs under a ``Supervisor``: an unexpected exception is logged, counted and
the loop restarted; a loop that keeps failing shuts the worker down, and ``run()``
raises ``DaemonFailedError``. A handler's own exceptions, ``SystemExit`` and
``KeyboardInterrupt`` included, are the attempt's failure, never the worker's.

Shutdown (``stop``): stop claiming, let running attempts finish within the grace
period, ack what finished, hand back the rest atomically and deregister.
``stop(now=True)`` (or a second ``stop()``) skips the grace period: running attempts
are abandoned at once, finished ones still acked, and the rest handed back, within
about a second while Redis answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import os
import socket
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from duetime import codec, validation
from duetime.app import App
from duetime.backoff import Backoff, Outage, retry_delay
from duetime.clock import Clock, wait_until
from duetime.codec import Envelope, ErrorRecord, ResultRecord
from duetime.errors import (
    ConfigurationError,
    CorruptStateError,
    DecodeError,
    DuetimeError,
    NotDurableError,
    RedisCommandError,
    RedisUnavailableError,
    TaskTimeoutError,
    UnknownHandlerError,
)
from duetime.hooks import (
    AttemptInfo,
    AttemptOutcome,
    AttemptResult,
    DeadTaskInfo,
    HookChain,
    LogHooks,
)
from duetime.settings import DEFAULT_SETTINGS, MOST_PROMOTE_AHEAD, Settings
from duetime.startup import (
    check_durability,
    freeze_startup_objects,
    warn_if_beyond,
    warn_if_evicting,
)
from duetime.store import AsyncRunner
from duetime.store.keys import QueueLayout
from duetime.store.operations import (
    Claimed,
    Durability,
    Outcome,
    QueueOperations,
    shard_operations,
)
from duetime.store.runner import BLOCK_MARGIN, RedisSpec
from duetime.supervisor import Supervisor, cancel_and_wait

if TYPE_CHECKING:
    from duetime.metrics import AttemptTally

log = logging.getLogger("duetime.worker")

#: Attempts a worker runs at once unless told otherwise. Measured with
#: ``bench/bench_core.py --scenario concurrency`` (one worker process): a handler that
#: waits 1 ms runs 2.2x (async) and 1.4x (plain function) faster at 25 than at 10, one
#: that sends one Redis command 1.5x (async) and the same (plain); beyond 25, plain
#: functions lose to thread contention.
DEFAULT_CONCURRENCY = 25
#: Outcomes per ack script call. The script unpack()s the batch's ids onto Lua's stack
#: (about 8,000 slots), so keep it well below that.
ACK_BATCH = 500
#: After stop(now=True), the most seconds spent on reporting outcomes and handing back.
HURRY = 1.0
#: Longest error text and traceback kept in a task's error record; the rest is cut,
#: and the record says how long the original was.
MAX_ERROR_CHARS = 4_000
MAX_TRACEBACK_CHARS = 16_000
#: Seconds by which an early run-at note may exceed the furthest promote_ahead (the
#: dispatcher's and this worker's clock estimates may differ by a few milliseconds).
EARLY_NOTE_SLACK = 1.0
#: How far ahead of a worker's clock (ms) a run-at can be when duetime hands it a task.
FURTHEST_NOTE_MS = (MOST_PROMOTE_AHEAD + EARLY_NOTE_SLACK) * 1000


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What a handler may want to know about the attempt it runs (``current_task()``)."""

    id: str
    queue: str
    task: str
    attempt: int
    max_attempts: int
    run_at: float  # epoch seconds
    worker_id: str


#: The attempt a handler runs, in the attempt's own context. Its TaskContext is made
#: only when asked for: most handlers never ask, and an attempt must cost little.
_current: contextvars.ContextVar[_Attempt] = contextvars.ContextVar("duetime_task")


def current_task() -> TaskContext:
    """The attempt the calling handler runs; LookupError outside a handler."""
    return _current.get().task_context()


def new_worker_id() -> str:
    host = "".join(c if c.isalnum() or c in "-_." else "-" for c in socket.gethostname())[:60]
    return f"{host or 'host'}.{os.getpid()}.{os.urandom(3).hex()}"


@dataclass(slots=True)
class _Shard:
    """The worker's part in one shard of its queue (an unsharded queue is one shard)."""

    index: int
    operations: QueueOperations
    queue: str  # the queue's name (a shard's keys carry its own label)
    worker_id: str
    untracked: list[str] = field(default_factory=list)  # ids in its list not held here
    fences_unreported: int = 0  # outcomes dropped here, not yet added to `fenced`
    paused: bool = False  # the queue was found paused (said once in the log)
    woken: bool = False  # the last wait for a resume was woken, not timed out

    @property
    def label(self) -> str:
        return self.operations.keys.queue


class _Attempt:
    """One claimed attempt, from its claim to its reported outcome. A plain class, not a
    dataclass: most fields keep their class-level default for the whole attempt, and
    only the first five are set per attempt (a worker starts tens of thousands a second)."""

    leased_at: float  # monotonic time the lease was last granted or renewed (sent)
    started: float  # monotonic; the claim, then the handler's start
    timeout = 0.0
    started_ms = 0
    lateness = 0.0  # seconds after it was due (AttemptInfo.due_at) that the handler started
    due_ms = 0.0  # when the queue owed it its start (server clock, ms)
    deadline = 0.0  # monotonic; while the handler runs under a timeout, else 0
    fenced = False
    timed_out = False  # cancelled by the timeout timer
    finished = False  # handler returned; outcome being reported
    ran = False  # the handler was started
    runner: asyncio.Task[None] | None = None
    envelope: Envelope | None = None
    job: _Job | None = None  # a plain handler's run on the worker's threads
    info: AttemptInfo | None = None  # what hooks are told, made when the handler starts
    context: TaskContext | None = None  # made on the first current_task()

    def __init__(self, shard: _Shard, task_id: str, attempt: int, leased_at: float) -> None:
        self.shard = shard
        self.task_id = task_id
        self.attempt = attempt
        self.leased_at = leased_at
        self.started = leased_at

    @property
    def key(self) -> tuple[int, str]:
        return self.shard.index, self.task_id

    def task_context(self) -> TaskContext:
        if self.context is None:
            envelope = self.envelope
            assert envelope is not None  # set before the handler runs
            self.context = TaskContext(
                self.task_id, self.shard.queue, envelope.task, self.attempt,
                envelope.max_attempts, validation.seconds_of_ms(envelope.run_at_ms),
                self.shard.worker_id,
            )  # fmt: skip
        return self.context

    def attempt_info(self) -> AttemptInfo:
        """What hooks are told of this attempt (once its handler started)."""
        if self.info is None:
            envelope = self.envelope
            assert envelope is not None
            run_at = validation.seconds_of_ms(envelope.run_at_ms)
            due_at = validation.seconds_of_ms(self.due_ms)  # due_ms is at least the run-at
            self.info = AttemptInfo(
                self.shard.queue, self.task_id, envelope.task, self.attempt,
                envelope.max_attempts, run_at, due_at + self.lateness,
                self.shard.worker_id, due_at,
            )  # fmt: skip
        return self.info


class _Job:
    """One call of a plain handler on the worker's threads. Only the thread that takes
    it writes its outcome; the loop reads it once ``done`` is resolved."""

    __slots__ = ("abandoned", "context", "data", "done", "error", "function", "thread", "value")

    def __init__(
        self, done: asyncio.Future[None], context: contextvars.Context, function: Any, data: Any
    ) -> None:
        self.done = done
        self.context = context
        self.function = function
        self.data = data
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread: _Thread | None = None  # the thread running it, while it runs
        self.abandoned = False  # timed out or cancelled before a thread took it


class _Thread:
    __slots__ = ("abandoned", "wake")

    def __init__(self) -> None:
        self.wake = threading.Lock()  # held while the thread is parked; released to wake it
        self.wake.acquire()
        self.abandoned = False  # left to a hung handler; exits when (if ever) it returns


class _ThreadRunner:
    """Runs plain-function handlers off the event loop, on at most ``size`` threads of
    its own, with hand-offs in batches both ways.

    A pool hand-off per call (a future, a queue put, a thread woken, a call_soon_threadsafe
    back) costs more than a no-op handler by far. Here, jobs wait in one deque, and threads
    stay awake while there is work: a thread that finishes a job takes the next one
    without being woken. Finished jobs are handed back in bulk: the loop is woken once
    for all the jobs that finished since it last looked.

    Blocking handlers must not hold up the jobs behind them, so a thread never keeps work
    waiting alone: whenever a job is taken while others still wait and no other thread is
    free (awake, not inside a handler), one more is woken, or started, up to ``size``.
    A handler that blocks thus hands the queue on to another thread within a wake-up;
    handlers that return at once leave one thread doing all the work, the others parked.

    A job that timed out is abandoned with its thread: the thread no longer counts, so a
    hung handler does not eat the worker's capacity, and it exits if it ever returns.
    Threads are daemon threads: a handler still hung when the process exits does not
    keep it alive (its task was handed back, and runs again elsewhere)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: deque[_Job] = deque()
        self._finished: deque[_Job] = deque()
        self._lock = threading.Lock()  # guards the counts, _parked and _reporting
        self._parked: list[_Thread] = []
        self._threads = 0  # live, not abandoned
        self._free = 0  # awake and not inside a handler (or about to wake)
        self._reporting = False  # a hand-back to the loop is scheduled
        self._closed = False

    def submit(self, function: Any, data: Any) -> _Job:
        """Queue ``function(data)``, run in a copy of the caller's context; await
        ``job.done``, then read ``job.value`` or ``job.error``."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        job = _Job(loop.create_future(), contextvars.copy_context(), function, data)
        with self._lock:  # a thread decides to park under it: see _work
            self._waiting.append(job)
            if not self._free:
                self._wake_one()
        return job

    def abandon(self, job: _Job) -> None:
        """Give up on a job (timed out, or its attempt was cancelled): one not taken yet
        is skipped; the thread of one running is left to it and replaced."""
        with self._lock:
            job.abandoned = True
            thread = job.thread  # None unless a thread runs it right now
            if thread is not None and not thread.abandoned:
                thread.abandoned = True
                self._threads -= 1

    def close(self) -> None:
        """Drop the jobs not started and let the parked threads exit."""
        with self._lock:
            self._closed = True
            self._waiting.clear()
            parked, self._parked = self._parked, []
        for thread in parked:
            thread.wake.release()

    def _wake_one(self) -> None:
        # Called with the lock held.
        if self._closed:
            return
        if self._parked:
            self._free += 1
            self._parked.pop().wake.release()
        elif self._threads < self._size:
            self._free += 1
            self._threads += 1
            thread = _Thread()
            threading.Thread(
                target=self._work, args=(thread,), name="duetime-task", daemon=True
            ).start()

    def _work(self, me: _Thread) -> None:
        waiting, lock = self._waiting, self._lock
        while True:
            try:
                job = waiting.popleft()
            except IndexError:
                with lock:
                    if self._closed:
                        self._free -= 1
                        return
                    if waiting:  # one came in between: take it
                        continue
                    self._free -= 1
                    self._parked.append(me)
                me.wake.acquire()  # parked until woken
                if self._closed:
                    return
                continue
            with lock:
                if job.abandoned:
                    continue
                job.thread = me
                self._free -= 1
                if waiting and not self._free:
                    self._wake_one()  # this handler may block: keep the rest moving
            try:
                job.value = job.context.run(job.function, job.data)
            except BaseException as error:  # the attempt's failure, whatever it is
                job.error = error
            with lock:
                job.thread = None
                if me.abandoned:
                    return  # replaced meanwhile; its result is not wanted
                self._free += 1
                self._finished.append(job)
                if self._reporting:
                    continue
                self._reporting = True
            assert self._loop is not None
            try:
                self._loop.call_soon_threadsafe(self._hand_back)
            except RuntimeError:  # the loop is closed: nobody waits for the results
                return

    def _hand_back(self) -> None:
        """On the loop: resolve every job finished since the last call."""
        with self._lock:
            self._reporting = False
            finished, self._finished = self._finished, deque()
        for job in finished:
            if not job.done.done():  # cancelled when its attempt was
                job.done.set_result(None)


@dataclass(slots=True)
class WorkerCounters:
    succeeded: int = 0
    failed: int = 0
    dead: int = 0
    fenced: int = 0  # outcomes dropped because the attempt's lease was gone
    timed_out: int = 0
    dropped: int = 0  # ids found without an envelope


class _HandlerExit(Exception):
    """Carries a BaseException a handler raised (SystemExit, KeyboardInterrupt, ...)
    out of the handler as an ordinary failure: left alone, asyncio would end the whole
    event loop with it, and with it the worker."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(original)
        self.original = original


def _log_dropped(dropped: list[Outcome] | list[_Attempt], what: str) -> None:
    """One warning for a batch of fenced attempts, ids at debug level: a failover can
    fence hundreds at once. The lease may have expired or been lost with a server (a
    failover to a replica that had not yet seen it): the worker cannot tell which."""
    log.warning(
        "%d %s(s) dropped: their leases were gone (expired, or lost in a failover)",
        len(dropped), what,
    )  # fmt: skip
    if log.isEnabledFor(logging.DEBUG):
        named = ", ".join(f"{each.task_id} attempt {each.attempt}" for each in dropped)
        log.debug("dropped %s(s): %s", what, named)


def _describe(error: BaseException) -> str:
    """ "ValueError: bad input", or only the type where there is no message."""
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def _capped(text: str, most: int, keep_end: bool = False) -> str:
    """``text`` cut to about ``most`` characters, saying so (a traceback keeps its end,
    where the failing line is)."""
    if len(text) <= most:
        return text
    note = f" [... cut: {len(text):,} characters in all]"
    return note + text[-most:] if keep_end else text[:most] + note


class Worker:
    """Runs the handlers of ``app`` for one queue with up to ``concurrency`` attempts.
    For a sharded queue (``shards``, as given to its ``Queue``) it serves every shard:
    one claimer per shard blocks on that shard's ready list, and all share the slots."""

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
        self.shards = [
            _Shard(index, operations, self.queue, self.worker_id)
            for index, operations in enumerate(
                shard_operations(self.layout, clock, settings.clock_resync_interval)
            )
        ]
        self.operations = self.shards[0].operations
        self.runner: AsyncRunner | None = None
        self._redis = redis
        self.counters = WorkerCounters()
        # Running, or finished with the outcome in flight; by (shard, task id).
        self._held: dict[tuple[int, str], _Attempt] = {}
        self._running = 0
        self._reserved = 0  # slots a claimer is claiming for right now
        self._slot_freed = asyncio.Event()
        self._outcomes: list[tuple[_Shard, Outcome]] = []
        self._outcome_ready = asyncio.Event()
        self._stop = asyncio.Event()  # stop claiming
        self._closing = asyncio.Event()  # running attempts are done or abandoned
        self._stop_now = False
        self._threads = _ThreadRunner(concurrency)
        # One timer enforces every running attempt's timeout (see _arm_timeouts).
        self._timeout_timer: asyncio.TimerHandle | None = None
        self._timeout_at = 0.0  # monotonic time the timer fires at
        self._lease_ms = round(settings.lease_duration * 1000)
        # An attempt that starts later than this after its lease was granted renews the
        # lease first (see _still_leased).
        self._renew_before_start = settings.lease_duration / 2
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
        self._stop_now = self._stop_now or now or self._stop.is_set()
        self._stop.set()
        if self._stop_now:
            self._slot_freed.set()  # wakes the drain, which then stops waiting

    async def run(self) -> None:
        """Work until ``stop()``; returns after the shutdown sequence. Raises
        DaemonFailedError when a part of the worker kept failing (after shutting down)."""
        runner = self.runner = AsyncRunner(self._redis, self.settings)
        unexport: Callable[[], None] | None = None
        try:
            if self.settings.metrics_port:
                from duetime import metrics

                unexport = metrics.export(
                    self.settings, self._redis, [self.queue], len(self.shards)
                )
            await warn_if_evicting(runner, self.operations)
            await warn_if_beyond(runner, self.layout)
            shard_operations = [shard.operations for shard in self.shards]
            await check_durability(runner, shard_operations, self._durable)
            await self._register()
            freeze_startup_objects(self.settings)
            keep = self.supervisor.keep_running
            claimers = [
                asyncio.create_task(
                    keep(self._claimer_name(shard), functools.partial(self._claim_loop, shard)),
                    name=self._claimer_name(shard),
                )
                for shard in self.shards
            ]
            heartbeater = asyncio.create_task(
                keep("heartbeater", self._heartbeat_loop), name="heartbeater"
            )
            acker = asyncio.create_task(keep("acker", self._ack_loop), name="acker")
            stopping = asyncio.create_task(self._stop.wait())
            failing = asyncio.create_task(self.supervisor.failed.wait())
            await asyncio.wait((stopping, failing), return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            failing.cancel()
            if self.supervisor.failure is not None:
                log.critical("worker %s shutting down: %s", self.worker_id, self.supervisor.failure)
                self._stop.set()
            await asyncio.gather(*(self._end(claimer) for claimer in claimers))
            await self._drain()
            self._closing.set()
            self._outcome_ready.set()
            # Not cancelled: a cancel mid-flush would lose a popped batch of acks.
            await asyncio.wait([acker], timeout=self._reporting_time())
            await self._end(acker)
            await self._end(heartbeater)
            await self._flush_outcomes()
            await self._hand_back()
        finally:
            if self._tally is not None:
                self._tally.flush()
            for attempt in self._held.values():
                if attempt.runner is not None:
                    attempt.runner.cancel()
            self._threads.close()
            if self._timeout_timer is not None:
                self._timeout_timer.cancel()
            await runner.close()
            if unexport is not None:  # may wait for a scrape in flight: off the loop
                await asyncio.to_thread(unexport)
        self.supervisor.raise_if_failed()

    def _claimer_name(self, shard: _Shard) -> str:
        return "claimer" if len(self.shards) == 1 else f"claimer of shard {shard.index}"

    def _reporting_time(self) -> float:
        return HURRY if self._stop_now else self.settings.lease_duration + BLOCK_MARGIN

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
                "bring them back", self.worker_id, error or "timed out",
            )  # fmt: skip
            return
        log.info("worker %s stopped; %d task(s) handed back", self.worker_id, sum(handed_back))

    async def _release(self, shard: _Shard) -> int:
        assert self.runner is not None
        return await self.runner.run(
            shard.operations.release_worker(
                self.worker_id, self._look_again_ms, shard.fences_unreported
            )
        )

    async def _end(self, task: asyncio.Task[None]) -> None:
        """Stop a loop (each loop also ends on its own at its next check of the stop
        flags)."""
        wait = HURRY if self._stop_now else self.settings.block_timeout + BLOCK_MARGIN
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
                    await run(shard.operations.heartbeat(self.worker_id, self._lease_ms, ()))
                outage.succeeded()
                break
            except RedisUnavailableError as error:
                if self._stop.is_set():
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
                    shard.operations.reap_dead_workers(
                        round(self.settings.worker_ttl * 1000), self._look_again_ms
                    )
                )
        except DuetimeError as error:
            log.warning("could not clear silent workers at start-up: %s", error)

    async def _drain(self) -> None:
        """Let running attempts finish within the grace period (not at all after
        ``stop(now=True)``); cancel the rest, whose ids are then handed back."""
        deadline = time.monotonic() + self.settings.shutdown_grace
        while self._running > 0 and not self._stop_now:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._slot_freed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._slot_freed.wait()
        for attempt in self._held.values():
            if not attempt.finished and attempt.runner is not None:
                attempt.runner.cancel()  # its id stays in the list and is handed back

    # --- claiming --------------------------------------------------------------------

    def _free(self) -> int:
        return self.concurrency - self._running - self._reserved

    def _claim_size(self, free: int) -> int:
        """Ids to claim in one call: up to claim_batch, and no more than half the slots,
        so that under a backlog the next claim is on its way while this one's attempts
        run. Claiming every slot at once would leave the worker idle while Redis answers
        the claim and Redis idle while the worker runs what it claimed."""
        return min(free, self.settings.claim_batch, max(1, (self.concurrency + 1) // 2))

    async def _claim_loop(self, shard: _Shard) -> None:
        """Claim from one shard: a backlog in batches, then block on its ready list. With
        several shards, each has its claimer (so every shard is watched while a slot is
        free, and none is polled); they share the slots, which a claimer reserves before
        it claims, and take turns for freed ones (the wake-up order of the slot event)."""
        assert self.runner is not None
        run = self.runner.run
        operations = shard.operations
        backoff = Backoff()
        outage = Outage(log, f"worker {self.worker_id} claiming from {shard.label}")
        while not self._stop.is_set():
            free = self._free()
            if free <= 0:
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            try:
                taken = [i for i in shard.untracked if (shard.index, i) not in self._held][:free]
                shard.untracked = []
                slots = max(self._claim_size(free), len(taken))
                claimed = await self._claim(shard, slots, taken)
                outage.succeeded()
                if claimed is None:
                    await self._while_paused(shard)
                elif not claimed:
                    task_id = await run(
                        operations.take_ready(self.worker_id, self.settings.block_timeout)
                    )
                    if task_id is None:
                        continue
                    if self._free() <= 0:
                        # Another shard's claimer filled the last slot meanwhile.
                        await run(operations.give_back(self.worker_id, task_id))
                        continue
                    slots = self._claim_size(self._free())
                    if await self._claim(shard, slots, [task_id]) is None:
                        await self._while_paused(shard)
                backoff.reset()
            except DuetimeError as error:  # unreachable, or a command refused: never die of it
                pause = backoff.next()
                outage.failed(error, pause)
                await asyncio.sleep(pause)

    async def _while_paused(self, shard: _Shard) -> None:
        """The queue is paused: block until it is resumed (or block_timeout passes, to
        look at the stop flag and the pause again)."""
        assert self.runner is not None
        timeout = self.settings.block_timeout
        if not shard.paused:
            shard.paused = True
            log.info("worker %s: %s is paused; claiming nothing", self.worker_id, shard.label)
        elif shard.woken:
            # Woken as if resumed, yet still paused: a wake left in place by hand. Without
            # this pause the claimer would spin.
            await asyncio.sleep(min(timeout, 1.0))
        shard.woken = await self.runner.run(shard.operations.wait_resumed(timeout))

    async def _claim(self, shard: _Shard, slots: int, taken: list[str]) -> list[Claimed] | None:
        """Lease the ``taken`` ids and more from the shard's ready list, ``slots`` in all,
        and start them. The slots are reserved while the claim is in flight, and those it
        did not fill are offered to the other claimers. None: the queue is paused."""
        assert self.runner is not None
        self._reserved += slots
        try:
            leased_at = time.monotonic()
            claimed = await self.runner.run(
                shard.operations.claim(
                    self.worker_id, self._lease_ms, max(0, slots - len(taken)), taken
                )
            )
        finally:
            self._reserved -= slots
        if claimed is None:
            self._slot_freed.set()
            return None
        if shard.paused:
            shard.paused = False
            log.info("worker %s: %s is resumed", self.worker_id, shard.label)
        for item in claimed:
            self._start(shard, item, leased_at)
        if len(claimed) < slots:
            self._slot_freed.set()
        return claimed

    def _start(self, shard: _Shard, item: Claimed, leased_at: float) -> None:
        if item.envelope is None:
            self.counters.dropped += 1
            log.warning("dropped task id %s from ready: it has no envelope", item.task_id)
            return
        attempt = _Attempt(shard, item.task_id, item.attempt, leased_at)
        self._held[shard.index, item.task_id] = attempt
        self._running += 1
        attempt.runner = asyncio.create_task(self._execute(attempt, item))

    # --- running ---------------------------------------------------------------------

    async def _execute(self, attempt: _Attempt, item: Claimed) -> None:
        """Run one attempt and report its outcome. An exception that escapes the steps
        below (a bug: the handler's own are its failure) is logged and counted here; the
        task's id stays in the worker's list, and its lease brings it back. (One
        coroutine per attempt, not one calling another: each costs a frame per task.)"""
        try:
            assert item.envelope is not None
            try:
                envelope = codec.decode_envelope(item.envelope)
            except DecodeError as error:
                # Poison: retrying cannot help, so it goes straight to dead.
                await self._report_failure(attempt, None, error, "", final=True)
                return
            try:
                if item.problem is not None or item.early_run_at_ms is not None:
                    garbage = item.problem or self._implausible_early(attempt.shard, item)
                    if garbage is not None:
                        raise CorruptStateError(f"task {item.task_id}: {garbage}")
                handler = self.app.handler(envelope.task)
            except (CorruptStateError, UnknownHandlerError) as error:
                await self._report_failure(attempt, envelope, error, "", final=True)
                return
            if attempt.attempt > envelope.max_attempts:
                problem = DuetimeError(
                    f"attempt {attempt.attempt - 1} of {envelope.max_attempts} lost its lease "
                    "(the worker died, hung or was cut off) and no attempts are left"
                )
                await self._report_failure(attempt, envelope, problem, "", final=True)
                return
            attempt.envelope = envelope
            attempt.timeout = envelope.timeout_ms / 1000
            clock = attempt.shard.operations.clock
            try:
                if (not_before := self._not_before(clock, item, envelope)) is not None:
                    await wait_until(clock, not_before)
                stale = time.monotonic() - attempt.leased_at >= self._renew_before_start
                if stale and not await self._still_leased(attempt):
                    return
                attempt.started_ms = clock.now_ms() or 0
                # From when it was due (a retry's back-off, a requeue or a re-entry
                # noted in the claim), to the microsecond (now_ms() is whole ms).
                due_ms = envelope.run_at_ms
                if item.early_run_at_ms is not None and item.early_run_at_ms > due_ms:
                    due_ms = item.early_run_at_ms
                attempt.due_ms = due_ms
                attempt.lateness = -clock.seconds_until(due_ms)
                attempt.ran = True
                _current.set(attempt)
                if self._hooks.around_attempts:
                    self._hooks.before_attempt(attempt.attempt_info())
                if self._tally is not None:
                    self._tally.started_tasks.append(envelope.task)
                    self._tally.started.append(attempt.lateness)
                attempt.started = started = time.monotonic()
                if attempt.timeout:
                    attempt.deadline = deadline = started + attempt.timeout
                    if self._timeout_timer is None or deadline < self._timeout_at:
                        self._arm_timeouts(deadline)
                try:
                    if handler.is_async:
                        try:
                            value = await handler.function(envelope.data)
                        except (Exception, asyncio.CancelledError):
                            raise
                        except BaseException as error:
                            raise _HandlerExit(error) from None
                    else:
                        job = attempt.job = self._threads.submit(handler.function, envelope.data)
                        await job.done
                        if job.error is not None:
                            if isinstance(job.error, Exception):
                                raise job.error
                            raise _HandlerExit(job.error)
                        value = job.value
                finally:
                    attempt.deadline = 0.0
            except asyncio.CancelledError:
                if attempt.job is not None:
                    self._threads.abandon(attempt.job)
                if not self._timed_out(attempt):
                    cut_off = (
                        AttemptOutcome.FENCED if attempt.fenced else AttemptOutcome.INTERRUPTED
                    )
                    self._after(attempt, cut_off)
                    if attempt.fenced:  # cancelled because its lease is gone: nothing to report
                        self._drop(attempt)
                    raise
                failure: BaseException = TaskTimeoutError(f"timed out after {attempt.timeout:g}s")
                await self._failed(attempt, envelope, failure)
                return
            except Exception as raised:
                failure = raised.original if isinstance(raised, _HandlerExit) else raised
                await self._failed(attempt, envelope, failure)
                return
            attempt.finished = True
            self._release_slot()
            self._after(
                attempt, AttemptOutcome.FENCED if attempt.fenced else AttemptOutcome.SUCCEEDED
            )
            if attempt.fenced:
                self._drop(attempt)
                return
            result = b""
            if envelope.result_ttl_ms:
                finished = clock.now_ms() or 0
                result = codec.encode_result(
                    ResultRecord(True, value, attempt.started_ms, finished, attempt.attempt)
                )
            self._outcomes.append(
                (
                    attempt.shard,
                    Outcome(
                        attempt.task_id,
                        attempt.attempt,
                        envelope.result_ttl_ms,
                        result,
                        round(attempt.lateness * 1e6),
                    ),
                )
            )
            self._outcome_ready.set()
        except Exception:
            self.supervisor.crashes += 1
            log.exception("worker %s: the attempt of task %s failed unexpectedly",
                          self.worker_id, item.task_id)  # fmt: skip
        finally:
            if not attempt.finished:
                attempt.finished = True
                self._release_slot()

    async def _failed(self, attempt: _Attempt, envelope: Envelope, failure: BaseException) -> None:
        """The handler raised or timed out: tell the hooks, then record the failure."""
        if isinstance(failure, TaskTimeoutError):
            self.counters.timed_out += 1
        final = attempt.attempt >= envelope.max_attempts
        trace = "".join(traceback.format_exception(failure))
        outcome = (
            AttemptOutcome.FENCED
            if attempt.fenced
            else (AttemptOutcome.DEAD if final else AttemptOutcome.RETRY)
        )
        self._after(attempt, outcome, failure, trace)
        if self._tally is not None:
            self._tally.flush()  # failures are few: counted at once
        await self._report_failure(attempt, envelope, failure, trace, final=final)

    def _arm_timeouts(self, deadline: float) -> None:
        """Set the worker's one timeout timer to fire at ``deadline`` (monotonic). An
        asyncio.timeout per attempt would cost a timer handle in the loop's heap per
        attempt; attempts of a task mostly share one timeout, so their deadlines arrive
        in the order they started, and the timer rarely needs moving."""
        if self._timeout_timer is not None:
            self._timeout_timer.cancel()
        self._timeout_at = deadline
        self._timeout_timer = asyncio.get_running_loop().call_later(
            max(0.0, deadline - time.monotonic()), self._enforce_timeouts
        )

    def _enforce_timeouts(self) -> None:
        """Cancel the attempts whose handler ran past its timeout (each then fails with
        TaskTimeoutError), and set the timer for the next deadline."""
        self._timeout_timer = None
        now = time.monotonic()
        earliest = 0.0
        for attempt in self._held.values():
            deadline = attempt.deadline
            if not deadline or attempt.timed_out:
                continue
            if deadline <= now:
                attempt.timed_out = True
                if attempt.runner is not None:
                    attempt.runner.cancel()
            elif not earliest or deadline < earliest:
                earliest = deadline
        if earliest:
            self._arm_timeouts(earliest)

    @staticmethod
    def _timed_out(attempt: _Attempt) -> bool:
        """Whether the cancellation being handled is the attempt's timeout alone: a stop
        or a lost lease may have cancelled the attempt too, and then wins (as with
        asyncio.timeout, which this timer replaces)."""
        if not attempt.timed_out or attempt.runner is None:
            return False
        return attempt.runner.uncancel() == 0

    @staticmethod
    def _info(attempt: _Attempt) -> AttemptInfo | None:
        """What hooks are told of the attempt; None if its handler never started."""
        return attempt.attempt_info() if attempt.ran else None

    def _after(
        self,
        attempt: _Attempt,
        outcome: AttemptOutcome,
        error: BaseException | None = None,
        trace: str = "",
    ) -> None:
        """The handler started has ended: tell the hooks (if they were told of its
        start) and the built-in metrics."""
        if not attempt.ran:
            return
        duration = time.monotonic() - attempt.started
        if attempt.info is not None:
            self._hooks.after_attempt(attempt.info, AttemptResult(outcome, duration, error, trace))
        if self._tally is not None:
            assert attempt.envelope is not None
            self._tally.ended_tasks.append(attempt.envelope.task)
            self._tally.ended.append((outcome, duration))

    @staticmethod
    def _not_before(clock: Clock, item: Claimed, envelope: codec.Envelope) -> float | None:
        """The server time (ms) the attempt waits for before it starts, if any: the later
        of its early note (promoted ahead, promote_ahead; or the time of a retry, requeue
        or re-entry) and its envelope's run-at while that is at most as far ahead as a
        note could be. The first claim takes the note, so a task a
        stopping worker handed back, or a claim made again after its reply was lost,
        comes with none, yet may still be short of its run-at. (The envelope's run-at is
        the latest one given, by scheduling or rescheduling; a retry's is later still.)"""
        note = item.early_run_at_ms
        now = clock.now_ms()
        if now is None or envelope.run_at_ms <= now:
            return note
        if envelope.run_at_ms - now > FURTHEST_NOTE_MS:
            return note  # not written by this task's scheduling: do not hold a slot for it
        # A re-entry or hand-back notes its own time, which may come before the run-at
        # of a task promoted ahead and claimed once already: wait for the later.
        return envelope.run_at_ms if note is None else max(note, envelope.run_at_ms)

    def _implausible_early(self, shard: _Shard, item: Claimed) -> str | None:
        """A dispatcher notes a run-at at most MOST_PROMOTE_AHEAD ahead of its clock; a
        note much further ahead was not written by duetime, and waiting for it would hold
        a slot (with a renewed lease) for as long as it says."""
        now = shard.operations.clock.now_ms()
        if item.early_run_at_ms is None or now is None:
            return None
        if item.early_run_at_ms - now > FURTHEST_NOTE_MS:
            return f"its early run-at note is {item.early_run_at_ms:.0f}, far past now ({now})"
        return None

    async def _still_leased(self, attempt: _Attempt) -> bool:
        """Whether an attempt may start its handler. Normally it starts at once, well
        within its lease; but a worker that was paused (SIGSTOP, a VM freeze, a stalled
        loop) between the claim and the start may wake after its lease ran out and the
        task was given to another worker. Past half a lease since the last grant, the
        lease is renewed first, and an attempt found lost does not start at all."""
        if time.monotonic() - attempt.leased_at < self.settings.lease_duration / 2:
            return True
        assert self.runner is not None
        sent = time.monotonic()
        try:
            reply = await self.runner.run(
                attempt.shard.operations.heartbeat(
                    self.worker_id, self._lease_ms, [(attempt.task_id, attempt.attempt)]
                )
            )
        except DuetimeError:
            return True  # cannot tell: run it; fencing still drops a late outcome
        if reply.lost:
            attempt.fenced = True
            log.warning(
                "task %s attempt %d lost its lease before it could start (this worker was "
                "paused or stalled); not started", attempt.task_id, attempt.attempt,
            )  # fmt: skip
            self._drop(attempt)
            return False
        attempt.leased_at = sent
        return True

    def _drop(self, attempt: _Attempt) -> None:
        """An attempt fenced before its outcome reached Redis: the outcome is dropped here,
        so it is counted here, and the queue's `fenced` counter learns of it with the next
        heartbeat (or the hand-back). Refusals by the ack and fail scripts are counted by
        those scripts: each dropped outcome is counted once, where it is dropped."""
        self.counters.fenced += 1
        attempt.shard.fences_unreported += 1
        self._forget(attempt.shard, attempt.task_id, attempt.attempt)

    def _forget(self, shard: _Shard, task_id: str, attempt: int) -> None:
        """Drop a finished attempt, unless the task was claimed again meanwhile (a
        fenced attempt finishing late must not drop its successor's entry)."""
        held = self._held.get((shard.index, task_id))
        if held is not None and held.attempt == attempt:
            del self._held[held.key]

    def _release_slot(self) -> None:
        self._running -= 1
        self._slot_freed.set()

    async def _report_failure(
        self,
        attempt: _Attempt,
        envelope: Envelope | None,
        error: BaseException,
        trace: str,
        *,
        final: bool,
    ) -> None:
        attempt.finished = True
        self._release_slot()
        try:
            if attempt.fenced:
                self._drop(attempt)
                return
            assert self.runner is not None
            text = _capped(_describe(error), MAX_ERROR_CHARS)
            trace = _capped(trace, MAX_TRACEBACK_CHARS, keep_end=True)
            failed_at = attempt.shard.operations.clock.now_ms() or int(time.time() * 1000)
            error_record = codec.encode_error(
                ErrorRecord(text, trace, attempt.attempt, failed_at, self.worker_id)
            )
            retry_delay_ms = None
            if not final:
                delay = retry_delay(
                    attempt.attempt, self.settings.retry_base, self.settings.retry_max
                )
                retry_delay_ms = round(delay * 1000)
            ttl = envelope.result_ttl_ms if envelope else 0
            result = b""
            if ttl and final:
                outcome = ResultRecord(False, text, attempt.started_ms, failed_at, attempt.attempt)
                result = codec.encode_result(outcome)
            applied = await self._with_retries(
                lambda: attempt.shard.operations.fail(
                    self.worker_id,
                    attempt.task_id,
                    attempt.attempt,
                    error_record,
                    retry_delay_ms,
                    ttl,
                    result,
                )
            )
            if not applied:
                self.counters.fenced += 1
            elif final:
                self.counters.dead += 1
                task = envelope.task if envelope else None
                info = self._info(attempt)
                self._hooks.on_dead(DeadTaskInfo(self.queue, attempt.task_id, task, info, text))
                if info is None and self._tally is not None:
                    self._tally.dead_unstarted(task)
            else:
                self.counters.failed += 1
                info = self._info(attempt)
                if info is not None and retry_delay_ms is not None:
                    self._hooks.on_retry(info, text, retry_delay_ms / 1000)
        finally:
            self._forget(attempt.shard, attempt.task_id, attempt.attempt)

    async def _with_retries(self, plan_factory: Any) -> Any:
        """Run a reporting plan, retrying through a Redis outage while the lease may
        still hold; after that the lease decides and the outcome no longer matters."""
        assert self.runner is not None
        backoff = Backoff(cap=1.0)
        deadline = time.monotonic() + self.settings.lease_duration
        while True:
            try:
                return await self.runner.run(plan_factory())
            except RedisCommandError as error:
                # Refused (not unreachable): retrying cannot help; the lease decides.
                log.error("could not report an outcome (%s); its lease will bring it back", error)
                return False
            except RedisUnavailableError as error:
                if time.monotonic() > deadline or self._stop_now:
                    log.error(
                        "could not report an outcome (%s); its lease will bring it back", error
                    )
                    return False
                await asyncio.sleep(backoff.next())

    # --- acknowledging ---------------------------------------------------------------

    async def _ack_loop(self) -> None:
        while not self._closing.is_set():
            await self._outcome_ready.wait()
            self._outcome_ready.clear()
            if self._tally is not None:
                self._tally.flush()  # the metrics hear of an attempt before its ack is sent
            await self._flush_outcomes()

    async def _flush_outcomes(self) -> None:
        while self._outcomes:
            batch, self._outcomes = self._outcomes[:ACK_BATCH], self._outcomes[ACK_BATCH:]
            by_shard: dict[int, list[Outcome]] = {}
            for shard, outcome in batch:
                by_shard.setdefault(shard.index, []).append(outcome)
            await asyncio.gather(
                *(self._acknowledge(self.shards[i], outcomes) for i, outcomes in by_shard.items())
            )

    async def _acknowledge(self, shard: _Shard, outcomes: list[Outcome]) -> None:
        try:
            flags = await self._with_retries(
                lambda: shard.operations.ack(self.worker_id, outcomes, self._durable)
            )
        except NotDurableError as error:
            # Acked on the master; a failover may bring the tasks back to run again.
            log.warning("acks of %d task(s) not confirmed by replicas: %s", len(outcomes), error)
            flags = error.reply[0] if isinstance(error.reply, list) else False
        if flags is False:
            flags = [False] * len(outcomes)
        dropped: list[Outcome] = []
        for outcome, acked in zip(outcomes, flags, strict=True):
            self._forget(shard, outcome.task_id, outcome.attempt)
            if acked:
                self.counters.succeeded += 1
            else:
                self.counters.fenced += 1
                dropped.append(outcome)
        if dropped:
            _log_dropped(dropped, "result")

    # --- heartbeat -------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        outages = {
            shard.index: Outage(
                log,
                f"worker {self.worker_id} heartbeat"
                + ("" if len(self.shards) == 1 else f" in {shard.label}"),
            )
            for shard in self.shards
        }
        while not self._closing.is_set():
            # Keeps renewing leases while running attempts drain; ends once closing.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.heartbeat_interval):
                    await self._closing.wait()
                return
            if self._tally is not None:
                self._tally.flush()
            now = time.monotonic()
            # A finished attempt keeps its lease until its outcome is acked: a slow ack
            # (a busy server, a stop) must not let the task run again elsewhere.
            running = [
                a
                for a in self._held.values()
                if not a.fenced and (a.finished or not a.timeout or now - a.started < a.timeout + 1)
            ]
            await asyncio.gather(
                *(
                    self._heartbeat(shard, [a for a in running if a.shard is shard], outages)
                    for shard in self.shards
                )
            )

    async def _heartbeat(
        self, shard: _Shard, running: list[_Attempt], outages: dict[int, Outage]
    ) -> None:
        """One shard's heartbeat: renew its running attempts' leases, fence the lost ones
        and learn of ids in the worker's list there that it does not hold."""
        assert self.runner is not None
        named = [(a.task_id, a.attempt) for a in running]
        try:
            await self.runner.run(shard.operations.refresh_clock())
            sent = time.monotonic()
            fences = shard.fences_unreported
            reply = await self.runner.run(
                shard.operations.heartbeat(self.worker_id, self._lease_ms, named, fences)
            )
            shard.fences_unreported -= fences
            outages[shard.index].succeeded()
        except DuetimeError as error:
            outages[shard.index].failed(error, self.settings.heartbeat_interval)
            return
        if not reply.was_registered:
            log.warning(
                "worker %s had been presumed dead; its attempts were taken back", self.worker_id
            )
        lost = set(reply.lost)
        fenced: list[_Attempt] = []
        for task_id, number in named:
            # The very attempt named: a newer attempt of the same task (claimed again
            # by this worker after a pause) is another entry, and keeps running.
            attempt = self._held.get((shard.index, task_id))
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
            _log_dropped(fenced, "running attempt")
        shard.untracked = [i for i in reply.held if (shard.index, i) not in self._held]
        if shard.untracked:
            self._slot_freed.set()  # let the claimer pick them up now
