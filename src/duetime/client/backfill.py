"""Backfilling a cron job from the client's side: its ticks over a past range counted
and bounded, and the backfill recorded for the dispatchers, which fire its ticks at the
pace asked for under the job's overlap policy (``dispatcher/backfill.py``)."""

from __future__ import annotations

import math

from duetime import cron, validation
from duetime.client.models import CronBackfillInfo, Timestamp
from duetime.client.shards import QueueShards
from duetime.errors import InvalidInputError, TaskNotFoundError
from duetime.store.cron_jobs import CronBackfill
from duetime.store.requests import Plan

#: Most ticks one backfill runs: ten years of hourly ticks (87,660) fit; ten years of
#: per-second ticks (315 million) are refused.
MOST_BACKFILL_TICKS = 100_000
#: The fastest pace of a backfill, in ticks per second.
MOST_BACKFILL_RATE = 1000.0


class BackfillPlans(QueueShards):
    """The plan of a cron job's backfill."""

    def backfill_cron_plan(
        self, name: str, start: Timestamp, end: Timestamp, rate: float
    ) -> Plan[CronBackfillInfo]:
        """Run the job's ticks from ``start`` to ``end`` (both included, both past) at
        most ``rate`` a second. The same range again changes nothing but the pace (a
        re-run does not run its ticks twice); another range replaces the backfill."""
        spacing = _spacing(rate)
        from_ms, to_ms = _moment(start, "start"), _moment(end, "end")
        if to_ms < from_ms:
            raise InvalidInputError(f"backfill end ({end!r}) is before its start ({start!r})")
        shard, job = yield from self._cron_home(name)
        now = yield from shard.now()
        if to_ms > now:
            raise InvalidInputError(
                f"backfill end ({end!r}) is after now: a backfill runs past ticks (the "
                "job fires its ticks from now on itself)"
            )
        first, total = _ticks_in(job, from_ms, to_ms)
        code, record = yield from shard.start_backfill(
            name, (from_ms, to_ms), spacing, first, total
        )
        info = backfill_info(record)
        if code and info is not None:
            return info
        raise TaskNotFoundError(f"no cron job {name!r} in queue {self.name!r}")


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


def _ticks_in(job: cron.CronJob, from_ms: int, to_ms: int) -> tuple[int, int]:
    """The range's first tick and how many it holds; InvalidInputError when it holds
    none, or more than ``MOST_BACKFILL_TICKS``."""
    too_many = InvalidInputError(
        f"a backfill runs at most {MOST_BACKFILL_TICKS:,} ticks, and cron job {job.name!r} "
        f"has more from {from_ms} to {to_ms} (ms): backfill shorter ranges one after another"
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
    first, count = None, 0
    for tick in job.ticks_after(from_ms - 1):
        if tick > to_ms:
            break
        first = tick if first is None else first
        count += 1
        if count > MOST_BACKFILL_TICKS:
            raise too_many
    if first is None:
        raise InvalidInputError(
            f"cron job {job.name!r} has no tick from {from_ms} to {to_ms} (ms): nothing to backfill"
        )
    return first, count


def backfill_info(record: CronBackfill | None) -> CronBackfillInfo | None:
    """A backfill's record as the client shows it."""
    if record is None:
        return None
    return CronBackfillInfo(
        start=record.from_ms / 1000,
        end=record.to_ms / 1000,
        rate=1000 / record.spacing_ms,
        ticks=record.total,
        fired=record.fired,
        done=record.next_tick_ms is None,
    )
