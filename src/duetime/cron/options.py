"""Checking what a cron declaration gives, before anything is stored: the expression and
the zone (cached, since many jobs share a few), and the schedule's options (interval,
catch-up window, jitter, start and end, most runs, pause after failures) turned into the
fields a ``CronJob`` keeps."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from duetime import validation
from duetime.cron import ticks
from duetime.errors import InvalidInputError

MISSED_POLICIES: tuple[str, ...] = ("skip", "once", "all")
OVERLAP_POLICIES: tuple[str, ...] = ("allow", "skip", "delay")
#: The shortest interval of an ``every`` schedule (a cron expression's finest is 1 s too).
SHORTEST_INTERVAL_MS = 1000
#: Most runs (``max_runs``) and consecutive failures (``pause_after_failures``) a job takes.
MOST_RUNS = 1_000_000_000
MOST_FAILURES = 1_000_000


@lru_cache(maxsize=4096)
def valid_expression(expression: str) -> bool:
    """Whether croniter reads the expression (cached: many jobs share a few)."""
    return croniter.is_valid(ticks.expanded(expression))


@lru_cache(maxsize=1024)
def known_zone(name: str) -> bool:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
        return False
    return True


def check_timetable(name: str, expression: object, every_ms: int, timezone: object) -> None:
    """A cron expression or an interval (not both), and a zone this host knows."""
    if every_ms and expression is not None:
        raise InvalidInputError(f"cron job {name!r}: give a cron expression or every=, not both")
    if not every_ms and (not isinstance(expression, str) or not valid_expression(expression)):
        raise InvalidInputError(
            f"invalid cron expression {validation.shown(expression)}: use 5 fields (minute "
            "hour day month weekday), an optional 6th for seconds, "
            "@hourly/@daily/@weekly/@monthly/@yearly, or every= for an interval"
        )
    if not isinstance(timezone, str):
        raise InvalidInputError(
            f"tz must be the name of an IANA time zone such as Europe/Paris, got "
            f"{validation.shown(timezone)}"
        )
    if not known_zone(timezone):
        raise InvalidInputError(
            f"unknown time zone {validation.shown(timezone)}: use an IANA name such as Europe/Paris"
        )


def check_policies(missed: object, overlap: object) -> None:
    if missed not in MISSED_POLICIES:
        raise InvalidInputError(
            f"missed must be one of {', '.join(MISSED_POLICIES)}, got {validation.shown(missed)}"
        )
    if overlap not in OVERLAP_POLICIES:
        raise InvalidInputError(
            f"overlap must be one of {', '.join(OVERLAP_POLICIES)}, got {validation.shown(overlap)}"
        )


#: The schedule options ``define`` takes.
SCHEDULE_OPTIONS = (
    "every",
    "catch_up",
    "jitter",
    "start",
    "end",
    "max_runs",
    "pause_after_failures",
)


def schedule_options(given: dict[str, Any]) -> dict[str, Any]:
    """The schedule options of a declaration, checked, as ``CronJob`` fields."""
    unknown = sorted(set(given) - set(SCHEDULE_OPTIONS))
    if unknown:
        raise TypeError(f"unexpected cron option(s): {', '.join(unknown)}")
    every = _window(given.get("every"), "every")
    if every is not None and every < SHORTEST_INTERVAL_MS:
        raise InvalidInputError(
            f"every must be at least 1 second, got {validation.shown(given.get('every'))}"
        )
    start, end = _moment(given.get("start"), "start"), _moment(given.get("end"), "end")
    if start is not None and end is not None and end < start:
        raise InvalidInputError(
            f"end ({validation.shown(given.get('end'))}) is before start "
            f"({validation.shown(given.get('start'))})"
        )
    return {
        "every_ms": every or 0,
        "catch_up_ms": _window(given.get("catch_up"), "catch_up"),
        "jitter_ms": _window(given.get("jitter"), "jitter") or 0,
        "start_ms": start,
        "end_ms": end,
        "max_runs": _count(given.get("max_runs"), "max_runs", MOST_RUNS),
        "pause_after_failures": _count(
            given.get("pause_after_failures"), "pause_after_failures", MOST_FAILURES
        ),
    }


def _window(value: object, what: str) -> int | None:
    """A duration option in whole ms (rounded up), None when not given; 0, negative, NaN
    and infinite are refused (leave the option out for none)."""
    if value is None:
        return None
    return validation.milliseconds(value, what)


def _moment(value: object, what: str) -> int | None:
    """A time option (epoch seconds or an aware datetime) in whole ms, rounded up."""
    if value is None:
        return None
    try:
        return math.ceil(validation.timestamp_ms(value))
    except InvalidInputError as error:
        raise InvalidInputError(f"{what}: {str(error).replace('run-at ', '')}") from None


def _count(value: object, what: str, most: int) -> int | None:
    return None if value is None else validation.whole_number(value, what, 1, most)
