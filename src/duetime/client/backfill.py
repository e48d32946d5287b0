"""Backfilling a cron job from the client's side: its ticks over a past range counted
and bounded, and the backfill recorded for the dispatchers, which fire its ticks at the
pace asked for under the job's overlap policy (``dispatcher/backfill.py``)."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC

from duetime import cron, times, validation
from duetime.client.models import CronBackfillInfo, Timestamp
from duetime.client.shards import QueueShards
from duetime.errors import ConcurrentChangeError, InvalidInputError, TaskNotFoundError
from duetime.store.plans.cron_jobs import CronBackfill, merged_spans, parsed_backfill
from duetime.store.plans.requests import Plan

#: Most ticks one backfill runs: ten years of hourly ticks (87,660) fit; ten years of
#: per-second ticks (315 million) are refused.
MOST_BACKFILL_TICKS = 100_000
#: The fastest pace of a backfill, in ticks per second.
MOST_BACKFILL_RATE = 1000.0
#: How many times a backfill is worked out again when the job's backfill record changed
#: under it (each time a dispatcher fired a tick of the backfill it replaces).
MOST_START_TRIES = 20


class BackfillPlans:
    """The plan of a cron job's backfill."""

    def __init__(self, queue: QueueShards) -> None:
        self.queue = queue

    def backfill_cron_plan(
        self, name: str, start: Timestamp, end: Timestamp | None, rate: float
    ) -> Plan[CronBackfillInfo]:
        """Run the job's ticks from ``start`` to ``end`` (both included, both past; None:
        now) at most ``rate`` a second, except those an earlier backfill of the job
        handled, those its own schedule enqueued, and those whose task is live: a tick
        is identified by its instant, so a re-run, a shifted range or an overlapping
        one never runs a tick twice. It replaces the job's backfill before it; what
        that had done stays done."""
        spacing = _spacing(rate)
        from_ms = _moment(start, "start")
        to_ms = None if end is None else _moment(end, "end")
        if to_ms is not None and to_ms < from_ms:
            raise InvalidInputError(
                f"backfill end ({_shown(to_ms)}) is before its start ({_shown(from_ms)})"
            )
        shard, job = yield from self.queue.cron_home(name)
        now = yield from shard.state.now()
        if to_ms is None:
            to_ms = now
            if to_ms < from_ms:
                raise InvalidInputError(
                    f"backfill start ({_shown(from_ms)}) is after now ({_shown(now)})"
                )
        if to_ms > now:
            raise InvalidInputError(
                f"backfill end ({_shown(to_ms)}) is after now ({_shown(now)}): a backfill "
                "runs past ticks (the job fires its ticks from now on itself)"
            )
        ticks = _ticks_in(job, from_ms, to_ms)
        for _ in range(MOST_START_TRIES):
            stored, fired = yield from shard.cron.backfill_record(name)
            previous = None if stored is None else parsed_backfill(stored)
            backfill = _planned(job, ticks, spacing, previous, fired)
            now = yield from shard.state.now()
            code = yield from shard.cron.start_backfill(name, stored, backfill, now)
            if code == 0:
                raise TaskNotFoundError(f"no cron job {name!r} in queue {self.queue.name!r}")
            if code == 1:
                return dataclasses.replace(_info(backfill), replaced=_replaced(previous, backfill))
        raise ConcurrentChangeError(
            f"the backfill of cron job {name!r} kept changing while this one was worked out "
            "(a dispatcher fires it, or other calls replace it): try again, or wait for it "
            "to end"
        )


def _replaced(previous: CronBackfill | None, backfill: CronBackfill) -> CronBackfillInfo | None:
    """The unfinished backfill of another range that ``backfill`` replaces, if any."""
    if previous is None or previous.next_tick_ms is None:
        return None
    if (previous.from_ms, previous.to_ms) == (backfill.from_ms, backfill.to_ms):
        return None  # the same range again: it goes on (what it had done is kept)
    return _info(previous)


def _planned(
    job: cron.CronJob,
    ticks: list[int],
    spacing: int,
    previous: CronBackfill | None,
    fired: tuple[tuple[int, int], ...],
) -> CronBackfill:
    """The backfill of ``ticks`` (the range's, in order) that replaces ``previous``: what
    that and the backfills before it handled is kept, and not run again, nor are the
    ticks of the range the job's schedule enqueued (the spans ``fired``, kept with it:
    a tick the schedule fires later is found by fire_backfill.lua)."""
    low, high = ticks[0], ticks[-1]
    within = [(max(a, low), min(b, high)) for a, b in fired if a <= high and b >= low]
    kept = previous.handled() if previous is not None else ()
    covered = _joined(job, merged_spans((*kept, *within)))
    first: int | None = None
    already_ran = 0
    spans = iter(covered)
    span = next(spans, None)
    for tick in ticks:
        while span is not None and span[1] < tick:
            span = next(spans, None)
        if span is not None and span[0] <= tick:
            already_ran += 1
        elif first is None:
            first = tick
    return CronBackfill(
        from_ms=ticks[0], to_ms=ticks[-1], spacing_ms=spacing, next_tick_ms=first, fired=0,
        total=len(ticks), already_ran=already_ran, covered=covered,
    )  # fmt: skip


def _joined(job: cron.CronJob, spans: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """``spans`` with those that no tick of the job parts made one, so that ranges
    backfilled one after another keep one span."""
    out: list[tuple[int, int]] = []
    for low, high in spans:
        if out:
            following = job.next_tick(out[-1][1])
            if following is None or following >= low:
                out[-1] = (out[-1][0], high)
                continue
        out.append((low, high))
    return tuple(out)


def _shown(moment_ms: int) -> str:
    """An instant of a backfill's error as a person reads it (UTC, to the second, or to
    the millisecond when it has one)."""
    return times.format_time(moment_ms / 1000, UTC, precise=moment_ms % 1000 != 0)


def _spacing(rate: object) -> int:
    """The ms between two ticks' firings: never faster than ``rate`` a second."""
    pace = validation.as_float(rate)
    if pace is None or not math.isfinite(pace) or not 0 < pace <= MOST_BACKFILL_RATE:
        raise InvalidInputError(
            f"backfill rate must be a number of ticks per second above 0 and up to "
            f"{MOST_BACKFILL_RATE:g}, got {validation.shown(rate)}"
        )
    return math.ceil(1000 / pace)


def _moment(value: object, what: str) -> int:
    try:
        return math.ceil(validation.timestamp_ms(value))
    except InvalidInputError as error:
        raise InvalidInputError(f"backfill {what}: {str(error).replace('run-at ', '')}") from None


def _ticks_in(job: cron.CronJob, from_ms: int, to_ms: int) -> list[int]:
    """The range's ticks, in order; InvalidInputError when it holds none, or more than
    ``MOST_BACKFILL_TICKS``."""
    too_many = InvalidInputError(
        f"a backfill runs at most {MOST_BACKFILL_TICKS:,} ticks, and cron job {job.name!r} "
        f"has more from {_shown(from_ms)} to {_shown(to_ms)}: backfill shorter ranges one "
        "after another"
    )
    if job.every_ms:  # counted without listing them
        anchor = job.start_ms or 0
        low, high = max(from_ms, anchor), min(to_ms, job.end_ms or to_ms)
        count = (
            0
            if high < low
            else (high - anchor) // job.every_ms - (low - 1 - anchor) // job.every_ms
        )
        if count > MOST_BACKFILL_TICKS:
            raise too_many
    found: list[int] = []
    for tick in job.ticks_after(from_ms - 1):
        if tick > to_ms:
            break
        found.append(tick)
        if len(found) > MOST_BACKFILL_TICKS:
            raise too_many
    if not found:
        raise InvalidInputError(
            f"cron job {job.name!r} has no tick from {_shown(from_ms)} to {_shown(to_ms)}: "
            "nothing to backfill"
        )
    return found


def backfill_info(record: CronBackfill | None) -> CronBackfillInfo | None:
    """A backfill's record as the client shows it."""
    return None if record is None else _info(record)


def _info(record: CronBackfill) -> CronBackfillInfo:
    return CronBackfillInfo(
        start=record.from_ms / 1000,
        end=record.to_ms / 1000,
        rate=1000 / record.spacing_ms,
        ticks=record.total,
        fired=record.fired,
        done=record.next_tick_ms is None,
        already_ran=record.already_ran,
        skipped=record.skipped,
    )
