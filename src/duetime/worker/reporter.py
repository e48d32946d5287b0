"""How a worker reports what its attempts came to: successes acked in batches by the
acker loop, failures one at a time (a retry or dead), each retried through a Redis
outage while the lease may still hold."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from duetime import codec
from duetime.backoff import Backoff, retry_delay
from duetime.codec import Envelope, ErrorRecord, ResultRecord
from duetime.errors import (
    NotDurableError,
    RedisCommandError,
    RedisUnavailableError,
    TaskExpiredError,
)
from duetime.hooks import AttemptInfo, DeadTaskInfo
from duetime.store.plans.requests import Durability
from duetime.store.plans.working import Ended, Outcome
from duetime.worker.context import Snooze
from duetime.worker.state import Attempt, Shard, SharedState, WorkerSetup, log_dropped

log = logging.getLogger("duetime.worker")

#: Outcomes per ack script call. The script unpack()s the batch's ids onto Lua's stack
#: (about 8,000 slots), so keep it well below that.
ACK_BATCH = 500
#: Longest error text and traceback kept in a task's error record; the rest is cut,
#: and the record says how long the original was.
MAX_ERROR_CHARS = 4_000
MAX_TRACEBACK_CHARS = 16_000
#: Longest error text an entry of the queue's history keeps (its first line).
MAX_HISTORY_ERROR_CHARS = 200


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


def _summary(text: str) -> str:
    """The error as the history keeps it: its first line, cut short."""
    line = text.partition("\n")[0]
    return line if len(line) <= MAX_HISTORY_ERROR_CHARS else line[:MAX_HISTORY_ERROR_CHARS] + "…"


def _info(attempt: Attempt) -> AttemptInfo | None:
    """What hooks are told of the attempt; None if its handler never started."""
    return attempt.attempt_info() if attempt.ran else None


class Reporter:
    """Sends the outcomes of a worker's attempts to Redis and counts what came of them."""

    def __init__(self, setup: WorkerSetup, state: SharedState, durable: Durability | None) -> None:
        self._setup = setup
        self._state = state
        self._durable = durable
        self._runner = setup.runner
        self._worker_id = setup.worker_id
        self._settings = setup.settings
        self._hooks = setup.hooks
        self._tally = setup.tally

    # --- acknowledging ---------------------------------------------------------------

    async def loop(self) -> None:
        """The acker: sends the outcomes of finished attempts, in batches, as they come."""
        state = self._state
        while not state.closing.is_set():
            await state.outcome_ready.wait()
            state.outcome_ready.clear()
            if self._tally is not None:
                self._tally.flush()  # the metrics hear of an attempt before its ack is sent
            await self.flush()

    async def flush(self) -> None:
        state = self._state
        shards = self._setup.shards
        while state.outcomes:
            batch, state.outcomes = state.outcomes[:ACK_BATCH], state.outcomes[ACK_BATCH:]
            by_shard: dict[int, list[Outcome]] = {}
            for shard, outcome in batch:
                by_shard.setdefault(shard.index, []).append(outcome)
            await asyncio.gather(
                *(self._acknowledge(shards[i], outcomes) for i, outcomes in by_shard.items())
            )

    async def _acknowledge(self, shard: Shard, outcomes: list[Outcome]) -> None:
        try:
            flags = await self._with_retries(
                lambda: shard.operations.worker.ack(self._worker_id, outcomes, self._durable)
            )
        except NotDurableError as error:
            # Acked on the master; a failover may bring the tasks back to run again.
            log.warning("acks of %d task(s) not confirmed by replicas: %s", len(outcomes), error)
            flags = error.reply[0] if isinstance(error.reply, list) else False
        if flags is False:
            flags = [False] * len(outcomes)
        state = self._state
        counters = state.counters
        dropped: list[Outcome] = []
        for outcome, acked in zip(outcomes, flags, strict=True):
            state.forget(shard, outcome.task_id, outcome.attempt)
            if acked == Ended.CANCELLED:
                counters.cancelled += 1
            elif acked:
                counters.succeeded += 1
            else:
                counters.fenced += 1
                dropped.append(outcome)
        if dropped:
            log_dropped(dropped, "result")

    # --- failures --------------------------------------------------------------------

    async def report_failure(
        self,
        attempt: Attempt,
        envelope: Envelope | None,
        error: BaseException,
        trace: str,
        *,
        final: bool,
    ) -> None:
        state = self._state
        try:
            if not self._ending(attempt):
                return
            text = _capped(_describe(error), MAX_ERROR_CHARS)
            trace = _capped(trace, MAX_TRACEBACK_CHARS, keep_end=True)
            failed_at = attempt.shard.operations.clock.now_ms() or int(time.time() * 1000)
            error_record = codec.encode_error(
                ErrorRecord(text, trace, attempt.attempt, failed_at, self._worker_id)
            )
            retry_delay_ms = None
            if not final:
                delay = retry_delay(
                    attempt.attempt, self._settings.retry_base, self._settings.retry_max
                )
                retry_delay_ms = round(delay * 1000)
            ttl = envelope.result_ttl_ms if envelope else 0
            result = b""
            if ttl and final:
                outcome = ResultRecord(False, text, attempt.started_ms, failed_at, attempt.attempt)
                result = codec.encode_result(outcome)
            applied = await self._with_retries(
                lambda: attempt.shard.operations.worker.fail(
                    self._worker_id,
                    attempt.task_id,
                    attempt.attempt,
                    error_record,
                    retry_delay_ms,
                    ttl,
                    result,
                    attempt.ran_micros(),
                    _summary(text),
                    isinstance(error, TaskExpiredError),
                )
            )
            self._count_failure(attempt, envelope, text, applied, final, retry_delay_ms)
        finally:
            state.forget(attempt.shard, attempt.task_id, attempt.attempt)

    def _ending(self, attempt: Attempt) -> bool:
        """An attempt ended without success: free its slot. False when its lease is gone
        (dropped: there is nothing to report, another attempt owns the task)."""
        attempt.finished = True
        self._state.release_slot()
        if attempt.fenced:
            self._state.drop(attempt)
            return False
        return True

    async def report_snooze(self, attempt: Attempt, snooze: Snooze) -> None:
        """The handler asked to run again later: the task waits, its attempt given back."""
        state = self._state
        try:
            if not self._ending(attempt):
                return
            applied = await self._with_retries(
                lambda: attempt.shard.operations.worker.snooze(
                    self._worker_id,
                    attempt.task_id,
                    attempt.attempt,
                    round(snooze.seconds * 1000),
                    snooze.whole_key,
                    attempt.ran_micros() or (0, 0),
                )
            )
            if applied == Ended.CANCELLED:
                state.counters.cancelled += 1
            elif applied:
                state.counters.snoozed += 1
            else:
                state.counters.fenced += 1
        finally:
            state.forget(attempt.shard, attempt.task_id, attempt.attempt)

    def _count_failure(
        self,
        attempt: Attempt,
        envelope: Envelope | None,
        text: str,
        applied: Ended,
        final: bool,
        retry_delay_ms: int | None,
    ) -> None:
        """Count what the fail script did with the failure, and tell the hooks."""
        counters = self._state.counters
        if not applied:
            counters.fenced += 1
        elif applied == Ended.CANCELLED:
            counters.cancelled += 1
        elif applied == Ended.EXPIRED:
            counters.expired += 1
        elif final:
            counters.dead += 1
            task = envelope.task if envelope else None
            info = _info(attempt)
            queue = self._setup.queue
            self._hooks.on_dead(DeadTaskInfo(queue, attempt.task_id, task, info, text))
            if info is None and self._tally is not None:
                self._tally.dead_unstarted(task)
        else:
            counters.failed += 1
            info = _info(attempt)
            if info is not None and retry_delay_ms is not None:
                self._hooks.on_retry(info, text, retry_delay_ms / 1000)

    async def _with_retries(self, plan_factory: Any) -> Any:
        """Run a reporting plan, retrying through a Redis outage while the lease may
        still hold; after that the lease decides and the outcome no longer matters."""
        backoff = Backoff(cap=1.0)
        deadline = time.monotonic() + self._settings.lease_duration
        while True:
            try:
                return await self._runner.run(plan_factory())
            except RedisCommandError as error:
                # Refused (not unreachable): retrying cannot help; the lease decides.
                log.error("could not report an outcome (%s); its lease will bring it back", error)
                return False
            except RedisUnavailableError as error:
                if time.monotonic() > deadline or self._state.stop_now:
                    log.error(
                        "could not report an outcome (%s); its lease will bring it back", error
                    )
                    return False
                await asyncio.sleep(backoff.next())
