"""Running one claimed attempt: its checks, its wait for the run-at, its handler (async
on the loop, a plain function on the worker's threads) under its timeout, in a context
where ``current_task()`` answers, and what the hooks and metrics are told of it; its
outcome then goes to the reporter."""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from typing import Any

from duetime import codec
from duetime.app import App
from duetime.clock import Clock, wait_until
from duetime.codec import Envelope, ResultRecord
from duetime.errors import (
    CorruptStateError,
    DecodeError,
    DuetimeError,
    SnoozeLimitError,
    TaskCancelledError,
    TaskExpiredError,
    TaskTimeoutError,
    UnknownHandlerError,
)
from duetime.hooks import AttemptOutcome, AttemptResult
from duetime.settings import MOST_PROMOTE_AHEAD
from duetime.store.plans.working import Claimed, Outcome
from duetime.supervisor import Supervisor
from duetime.worker.context import Snooze
from duetime.worker.reporter import Reporter
from duetime.worker.state import Attempt, Shard, SharedState, WorkerSetup, current_attempt
from duetime.worker.threads import ThreadRunner
from duetime.worker.timeouts import TimeoutTimer

log = logging.getLogger("duetime.worker")

#: Seconds by which an early run-at note may exceed the furthest promote_ahead (the
#: dispatcher's and this worker's clock estimates may differ by a few milliseconds).
EARLY_NOTE_SLACK = 1.0
#: How far ahead of a worker's clock (ms) a run-at can be when duetime hands it a task.
FURTHEST_NOTE_MS = (MOST_PROMOTE_AHEAD + EARLY_NOTE_SLACK) * 1000


class _HandlerExit(Exception):
    """Carries a BaseException a handler raised (SystemExit, KeyboardInterrupt, ...)
    out of the handler as an ordinary failure: left alone, asyncio would end the whole
    event loop with it, and with it the worker."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(original)
        self.original = original


def not_before(clock: Clock, item: Claimed, envelope: codec.Envelope) -> float | None:
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


def _implausible_early(shard: Shard, item: Claimed) -> str | None:
    """A dispatcher notes a run-at at most MOST_PROMOTE_AHEAD ahead of its clock; a
    note much further ahead was not written by duetime, and waiting for it would hold
    a slot (with a renewed lease) for as long as it says."""
    now = shard.operations.clock.now_ms()
    if item.early_run_at_ms is None or now is None:
        return None
    if item.early_run_at_ms - now > FURTHEST_NOTE_MS:
        return f"its early run-at note is {item.early_run_at_ms:.0f}, far past now ({now})"
    return None


def _expired(clock: Clock, envelope: Envelope) -> bool:
    """Whether the task may no longer start: its ``expires`` after its run-at has passed."""
    if not envelope.expires_after_ms:
        return False
    now = clock.now_ms()
    return now is not None and now > envelope.run_at_ms + envelope.expires_after_ms


def _ending(attempt: Attempt, outcome: AttemptOutcome) -> AttemptOutcome:
    """How the attempt ended as hooks hear it: ``outcome`` unless it lost its lease
    (fenced) or its task was cancelled while it ran (which then ends it as cancelled)."""
    if attempt.fenced:
        return AttemptOutcome.FENCED
    return AttemptOutcome.CANCELLED if attempt.cancel_asked else outcome


class AttemptRunner:
    """Starts the attempts the claimers lease, each in an asyncio task of its own, and
    runs each to its outcome."""

    def __init__(
        self,
        setup: WorkerSetup,
        state: SharedState,
        *,
        app: App,
        threads: ThreadRunner,
        timeouts: TimeoutTimer,
        reporter: Reporter,
        supervisor: Supervisor,
    ) -> None:
        self._state = state
        self._app = app
        self._threads = threads
        self._timeouts = timeouts
        self._report_failure = reporter.report_failure
        self._report_snooze = reporter.report_snooze
        self._supervisor = supervisor
        self._runner = setup.runner
        self._worker_id = setup.worker_id
        self._settings = setup.settings
        self._lease_ms = setup.lease_ms
        self._hooks = setup.hooks
        self._tally = setup.tally
        # An attempt that starts later than this after its lease was granted renews the
        # lease first (see _still_leased).
        self._renew_before_start = setup.settings.lease_duration / 2

    def start(self, shard: Shard, item: Claimed, leased_at: float) -> None:
        state = self._state
        if item.envelope is None:
            state.counters.dropped += 1
            log.warning("dropped task id %s from ready: it has no envelope", item.task_id)
            return
        attempt = Attempt(shard, item.task_id, item.attempt, leased_at)
        state.held[shard.index, item.task_id] = attempt
        state.running += 1
        attempt.runner = asyncio.create_task(self._execute(attempt, item))

    # Long: one coroutine runs an attempt from its claim to its outcome (see the
    # docstring); the plain steps before and after the handler are methods of their own.
    async def _execute(self, attempt: Attempt, item: Claimed) -> None:
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
                    garbage = item.problem or _implausible_early(attempt.shard, item)
                    if garbage is not None:
                        raise CorruptStateError(f"task {item.task_id}: {garbage}")
                handler = self._app.handler(envelope.task)
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
            own = handler.max_snoozes
            attempt.max_snoozes = self._settings.max_snoozes if own is None else own
            clock = attempt.shard.operations.clock
            try:
                if (waits_for := not_before(clock, item, envelope)) is not None:
                    await wait_until(clock, waits_for)
                if _expired(clock, envelope):
                    expired = TaskExpiredError(attempt.task_id)
                    await self._report_failure(attempt, envelope, expired, "", final=True)
                    return
                stale = time.monotonic() - attempt.leased_at >= self._renew_before_start
                if stale and not await self._still_leased(attempt):
                    return
                self._begin(attempt, item, envelope, clock)
                try:
                    if handler.is_async:
                        try:
                            value = await handler.function(envelope.data)
                        except (Exception, asyncio.CancelledError):
                            raise
                        except BaseException as error:
                            raise _HandlerExit(error) from None
                    else:
                        call = self._threads.submit(handler.function, envelope.data)
                        attempt.thread_call = call
                        await call.done
                        if call.error is not None:
                            if isinstance(call.error, Exception):
                                raise call.error
                            raise _HandlerExit(call.error)
                        value = call.value
                finally:
                    attempt.deadline = 0.0
            except asyncio.CancelledError:
                if attempt.thread_call is not None:
                    self._threads.abandon(attempt.thread_call)
                if attempt.cancel_asked and not attempt.fenced:
                    # Its task was cancelled: the fail script ends it as cancelled.
                    await self._failed(attempt, envelope, TaskCancelledError(attempt.task_id))
                    return
                if not self._timeouts.timed_out(attempt):
                    cut_off = (
                        AttemptOutcome.FENCED if attempt.fenced else AttemptOutcome.INTERRUPTED
                    )
                    self._after(attempt, cut_off)
                    if attempt.fenced:  # cancelled because its lease is gone: nothing to report
                        self._state.drop(attempt)
                    raise
                failure: BaseException = TaskTimeoutError(f"timed out after {attempt.timeout:g}s")
                await self._failed(attempt, envelope, failure)
                return
            except Snooze as snooze:
                if envelope.snoozes >= attempt.max_snoozes:
                    await self._snoozed_past_limit(attempt, envelope, handler.max_snoozes)
                    return
                fenced = AttemptOutcome.FENCED
                self._after(attempt, fenced if attempt.fenced else AttemptOutcome.SNOOZED)
                await self._report_snooze(attempt, snooze)
                return
            except Exception as raised:
                failure = raised.original if isinstance(raised, _HandlerExit) else raised
                await self._failed(attempt, envelope, failure)
                return
            self._succeeded(attempt, envelope, value, clock)
        except Exception:
            self._supervisor.crashes += 1
            log.exception(
                "worker %s: the attempt of task %s failed unexpectedly",
                self._worker_id,
                item.task_id,
            )
        finally:
            if not attempt.finished:
                attempt.finished = True
                self._state.release_slot()

    def _begin(self, attempt: Attempt, item: Claimed, envelope: Envelope, clock: Clock) -> None:
        """The handler starts now: note how late, make the attempt the current task, tell
        the hooks and the metrics, and watch its timeout."""
        attempt.started_ms = clock.now_ms() or 0
        # From when it was due (a retry's back-off, a requeue or a re-entry
        # noted in the claim), to the microsecond (now_ms() is whole ms).
        due_ms = envelope.run_at_ms
        if item.early_run_at_ms is not None and item.early_run_at_ms > due_ms:
            due_ms = item.early_run_at_ms
        # Under flow control: a wait its limits imposed is not lateness, but held.
        if item.held_until_ms is not None and item.held_until_ms > due_ms:
            attempt.held = (item.held_until_ms - due_ms) / 1000
            due_ms = item.held_until_ms
        attempt.due_ms = due_ms
        attempt.lateness = -clock.seconds_until(due_ms)
        attempt.ran = True
        current_attempt.set(attempt)
        if self._hooks.around_attempts:
            self._hooks.before_attempt(attempt.attempt_info())
        if self._tally is not None:
            self._tally.started_tasks.append(envelope.task)
            self._tally.started.append(attempt.lateness)
            if attempt.held:
                self._tally.held.append((envelope.task, attempt.held))
        attempt.started = started = time.monotonic()
        if attempt.timeout:
            attempt.deadline = deadline = started + attempt.timeout
            timeouts = self._timeouts
            if timeouts.handle is None or deadline < timeouts.at:
                timeouts.arm(deadline)

    def _succeeded(self, attempt: Attempt, envelope: Envelope, value: Any, clock: Clock) -> None:
        """The handler returned: free its slot, tell the hooks, and queue its ack (with
        its result where the task keeps one)."""
        attempt.finished = True
        state = self._state
        state.release_slot()
        self._after(attempt, _ending(attempt, AttemptOutcome.SUCCEEDED))
        if attempt.fenced:
            state.drop(attempt)
            return
        result = b""
        if envelope.result_ttl_ms:
            finished = clock.now_ms() or 0
            result = codec.encode_result(
                ResultRecord(True, value, attempt.started_ms, finished, attempt.attempt)
            )
        state.outcomes.append(
            (
                attempt.shard,
                Outcome(
                    attempt.task_id,
                    attempt.attempt,
                    envelope.result_ttl_ms,
                    result,
                    round(attempt.lateness * 1e6),
                    round(attempt.ran_for * 1e6),
                    envelope.task,
                    round(attempt.held * 1e6),
                ),
            )
        )
        state.outcome_ready.set()

    async def _failed(self, attempt: Attempt, envelope: Envelope, failure: BaseException) -> None:
        """The handler raised or timed out: tell the hooks, then record the failure."""
        if isinstance(failure, TaskTimeoutError):
            self._state.counters.timed_out += 1
        final = attempt.attempt >= envelope.max_attempts
        trace = "".join(traceback.format_exception(failure))
        outcome = _ending(attempt, AttemptOutcome.DEAD if final else AttemptOutcome.RETRY)
        self._after(attempt, outcome, failure, trace)
        if self._tally is not None:
            self._tally.flush()  # failures are few: counted at once
        await self._report_failure(attempt, envelope, failure, trace, final=final)

    async def _snoozed_past_limit(
        self, attempt: Attempt, envelope: Envelope, own_limit: int | None
    ) -> None:
        """The handler snoozed once more than its task may: the task goes to dead with
        SnoozeLimitError, never to snooze for ever."""
        where = "Settings.max_snoozes" if own_limit is None else "max_snoozes of the handler"
        error = SnoozeLimitError(attempt.task_id, envelope.snoozes, attempt.max_snoozes, where)
        trace = "".join(traceback.format_exception(error))
        self._after(attempt, _ending(attempt, AttemptOutcome.DEAD), error, trace)
        if self._tally is not None:
            self._tally.flush()
        await self._report_failure(attempt, envelope, error, trace, final=True)

    def _after(
        self,
        attempt: Attempt,
        outcome: AttemptOutcome,
        error: BaseException | None = None,
        trace: str = "",
    ) -> None:
        """The handler started has ended: tell the hooks (if they were told of its
        start) and the built-in metrics."""
        if not attempt.ran:
            return
        attempt.ran_for = duration = time.monotonic() - attempt.started
        if attempt.info is not None:
            self._hooks.after_attempt(attempt.info, AttemptResult(outcome, duration, error, trace))
        if self._tally is not None:
            assert attempt.envelope is not None
            self._tally.ended_tasks.append(attempt.envelope.task)
            self._tally.ended.append((outcome, duration))

    async def _still_leased(self, attempt: Attempt) -> bool:
        """Whether an attempt may start its handler. Normally it starts at once, well
        within its lease; but a worker that was paused (SIGSTOP, a VM freeze, a stalled
        loop) between the claim and the start may wake after its lease ran out and the
        task was given to another worker. Past half a lease since the last grant, the
        lease is renewed first, and an attempt found lost does not start at all."""
        if time.monotonic() - attempt.leased_at < self._settings.lease_duration / 2:
            return True
        sent = time.monotonic()
        try:
            reply = await self._runner.run(
                attempt.shard.operations.worker.heartbeat(
                    self._worker_id, self._lease_ms, [(attempt.task_id, attempt.attempt)]
                )
            )
        except DuetimeError:
            return True  # cannot tell: run it; fencing still drops a late outcome
        if reply.lost:
            attempt.fenced = True
            log.warning(
                "task %s attempt %d lost its lease before it could start (this worker was "
                "paused or stalled); not started",
                attempt.task_id,
                attempt.attempt,
            )
            self._state.drop(attempt)
            return False
        attempt.leased_at = sent
        return True
