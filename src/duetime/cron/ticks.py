"""The instants a schedule fires at: a cron expression read on a zone's wall clock, or a
fixed interval from an anchor, and the deterministic jitter offset of each tick.

Cron ticks are computed on wall-clock time in the job's zone (zoneinfo), then mapped to
instants with these rules at daylight-saving changes:

- a wall time that happens twice (clocks go back): a job whose hour field is a
  wildcard (``*``, ``*/2``) runs at both instants, as the wall clock says, so
  ``0 * * * *`` runs 25 times that day; a job at a given hour runs once, at the
  first instant, so ``30 1 * * *`` runs once;
- a wall time that does not happen (clocks go forward): a wildcard-hour job skips
  it (``0 * * * *`` runs 23 times); a job at a given hour runs once, shifted forward
  by the length of the gap (02:30 becomes 03:30).

Interval ticks are ``anchor + k * every`` for whole k, in absolute time: no zone, no
daylight saving.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, croniter

#: The widest daylight-saving shift in the tz database is 2 hours.
_DST_WINDOW = timedelta(hours=3)

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def expanded(expression: str) -> str:
    """The expression with an alias (``@hourly``) written out."""
    return ALIASES.get(expression, expression)


def wildcard_hour(expression: str) -> bool:
    return expanded(expression).split()[1].startswith("*")


def cron_ticks_after(expression: str, zone: ZoneInfo, after_ms: int) -> Iterator[int]:
    """Instants (ms) of a cron expression in ``zone`` strictly after ``after_ms``, in order."""
    wildcard = wildcard_hour(expression)
    wall = datetime.fromtimestamp(after_ms / 1000, UTC).astimezone(zone).replace(tzinfo=None)
    # Near an offset change, wall times before `after` can map to instants after it.
    start = wall - (_DST_WINDOW if _near_change(zone, wall) else timedelta(seconds=1))
    candidates = croniter(expanded(expression), start)
    pending: list[int] = []
    while True:
        try:
            moment = candidates.get_next(datetime)
        except CroniterBadDateError:
            return
        pending.extend(i for i in _instants(moment, zone, wildcard) if i > after_ms)
        pending.sort()
        # Around a repeated hour a later wall time can map to an earlier instant:
        # release only what no later wall time can still precede.
        horizon = _utc_ms(moment.replace(tzinfo=zone))
        if _near_change(zone, moment):
            horizon -= int(_DST_WINDOW.total_seconds() * 1000)
        while pending and pending[0] <= horizon:
            yield pending.pop(0)


def interval_ticks_after(every_ms: int, anchor_ms: int, after_ms: int) -> Iterator[int]:
    """Instants ``anchor + k * every`` (k >= 0) strictly after ``after_ms``, in order."""
    if after_ms < anchor_ms:
        tick = anchor_ms
    else:
        tick = anchor_ms + ((after_ms - anchor_ms) // every_ms + 1) * every_ms
    while True:
        yield tick
        tick += every_ms


def jitter_offset(name: str, tick_ms: int, window_ms: int) -> int:
    """A tick's offset in [0, ``window_ms``): the same for a job's tick on every host and
    every run (a hash of the job's name and the tick), spread evenly over the window."""
    if window_ms <= 1:
        return 0
    digest = hashlib.blake2b(f"{name}:{tick_ms}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % window_ms


def _near_change(zone: ZoneInfo, wall: datetime) -> bool:
    before = (wall - _DST_WINDOW).replace(tzinfo=zone).utcoffset()
    return before != (wall + _DST_WINDOW).replace(tzinfo=zone).utcoffset()


def _utc_ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def now_ms() -> int:
    """This host's clock, in ms (for validating a declaration, never for firing)."""
    return _utc_ms(datetime.now(UTC))


def _instants(wall: datetime, zone: ZoneInfo, wildcard_hour: bool) -> list[int]:
    """The instants (ms) at which a matching wall-clock time fires, per the DST rules."""
    first = wall.replace(tzinfo=zone, fold=0)
    second = wall.replace(tzinfo=zone, fold=1)
    first_ms, second_ms = _utc_ms(first), _utc_ms(second)
    if first_ms == second_ms:
        return [first_ms]
    exists = first.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == wall
    if exists:  # repeated: fold=0 is the earlier instant
        return [first_ms, second_ms] if wildcard_hour else [first_ms]
    # Skipped: fold=0 applies the offset from before the change, i.e. shifts the wall
    # time forward by the gap.
    return [] if wildcard_hour else [first_ms]
