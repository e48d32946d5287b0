"""Times and durations as people type and read them, for the command line.

Parsing: a duration is ``90s``, ``5m``, ``1h30m``, ``1.5h``, ``2d``, ``1w``, ``250ms`` or
plain seconds (``30``); a point in time is ISO 8601 *with* a zone
(``2026-12-01T09:00+01:00``, ``2026-12-01T08:00Z``) or epoch seconds. A time without a
zone is refused rather than guessed: the same text would mean different instants on
different hosts. Every refusal is an ``InvalidInputError`` that says what to write.

Display: an instant is shown in a zone given by the caller, or the local zone of this
host when none is (with the offset that applies at that instant, so across DST too).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, tzinfo

from duetime.errors import InvalidInputError
from duetime.validation import shown

_UNITS = {"w": 604_800.0, "d": 86_400.0, "h": 3_600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
# "ms" before "m" so that 250ms is not read as 250 minutes and a stray "s".
_PART = re.compile(rf"\s*({_NUMBER})\s*(ms|w|d|h|m|s)\s*")
_PLAIN = re.compile(rf"\s*{_NUMBER}\s*")
_DURATION_FORMS = "90s, 5m, 1h30m, 1.5h, 2d, 1w, 250ms, or plain seconds such as 30"
_TIME_FORMS = "ISO 8601 with a zone (2026-12-01T09:00+01:00, 2026-12-01T08:00Z)"


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``1h30m`` (see the module docstring for the forms).

    Raises InvalidInputError for anything else, negative durations included.
    """
    if _PLAIN.fullmatch(text):
        seconds = float(text)
    else:
        parts = _PART.findall(text) if _parts_cover(text) else []
        if not parts:
            if text.strip().startswith("-"):
                raise InvalidInputError(f"a duration cannot be negative, got {shown(text)}")
            raise InvalidInputError(
                f"cannot read {shown(text)} as a duration: write {_DURATION_FORMS}"
            )
        seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
    if not math.isfinite(seconds):
        raise InvalidInputError(f"duration {shown(text)} is too long")
    return seconds


def _parts_cover(text: str) -> bool:
    """Whether ``text`` is made of duration parts only (findall alone skips garbage)."""
    position = 0
    while position < len(text):
        found = _PART.match(text, position)
        if found is None or found.end() == position:
            return False
        position = found.end()
    return position > 0


def parse_time(text: str) -> float:
    """Epoch seconds of ``text``: ISO 8601 with a zone, or epoch seconds.

    A time without a zone raises InvalidInputError naming the zones to add.
    """
    stripped = text.strip()
    try:
        seconds = float(stripped)
    except ValueError:
        return _parse_iso(stripped, f"give {_TIME_FORMS} or epoch seconds").timestamp()
    if not math.isfinite(seconds):
        raise InvalidInputError(f"{shown(text)} is not a finite time: give {_TIME_FORMS}")
    return seconds


def parse_moment(text: str, now: float) -> float:
    """Epoch seconds of ``text``: ISO 8601 with a zone, or a duration before ``now``
    (``2h`` is two hours ago). A bare number is refused as ambiguous (seconds ago, or
    epoch seconds?) with both spellings suggested."""
    stripped = text.strip()
    if _PLAIN.fullmatch(stripped):
        example = f"{stripped}s" if len(stripped) <= 20 else "30s"
        raise InvalidInputError(
            f"{shown(text)} is ambiguous: write a duration with its unit ({example}, 5m, 2h, "
            f"1d) for that long ago, or {_TIME_FORMS}"
        )
    if _parts_cover(stripped):
        return now - parse_duration(stripped)
    return _parse_iso(stripped, f"write a duration ago (30m, 2h, 1d) or {_TIME_FORMS}").timestamp()


def _parse_iso(text: str, forms: str) -> datetime:
    """An aware datetime from ISO 8601 text; ``forms`` says what to write instead."""
    # fromisoformat takes "Z" but not its lower-case form.
    readable = text[:-1] + "Z" if text.endswith("z") else text
    try:
        moment = datetime.fromisoformat(readable)
    except ValueError:
        raise InvalidInputError(f"cannot read {shown(text)} as a time: {forms}") from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        suggestion = moment.isoformat(timespec="minutes")
        try:
            local = moment.astimezone().strftime("%z")
            here = f", or {suggestion}{local[:3]}:{local[3:]} for this host's zone"
        except (OverflowError, OSError, ValueError):  # out of the platform's range
            here = ""
        raise InvalidInputError(
            f"{shown(text)} has no time zone: add one, e.g. {suggestion}Z for UTC{here}"
        )
    return moment


def format_time(seconds: float | None, zone: tzinfo | None = None, precise: bool = False) -> str:
    """``seconds`` (epoch) in ``zone`` (None: this host's local zone), with its offset.

    ``2026-12-01 09:00:00+01:00`` by default (25 characters, for tables);
    ``precise`` gives ISO 8601 to the millisecond, ``2026-12-01T09:00:00.000+01:00``.
    None (no time) is shown as ``-``.
    """
    if seconds is None:
        return "-"
    try:
        moment = datetime.fromtimestamp(seconds, UTC).astimezone(zone)
    except (OverflowError, OSError, ValueError):  # past what datetime can show
        return f"{seconds:.3f} (epoch seconds)"
    if precise:
        return moment.isoformat(timespec="milliseconds")
    return moment.isoformat(sep=" ", timespec="seconds")


#: Width of ``format_time`` output in tables: the column that holds it is never narrower.
TIME_WIDTH = len("2026-12-01 09:00:00+01:00")


def format_duration(seconds: float) -> str:
    """A short reading of a duration: ``850 ms``, ``12.5 s``, ``4m 10s``, ``3h 5m``, ``2d 4h``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if round(seconds, 1) < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    unit, size, smaller, small_size = next(
        step for step in _STEPS if whole >= step[1] or step[0] == "m"
    )
    rest = (whole % size) // small_size
    return f"{whole // size}{unit} {rest}{smaller}" if rest else f"{whole // size}{unit}"


# Each unit of format_duration with the next smaller one shown after it.
_STEPS = (("d", 86_400, "h", 3_600), ("h", 3_600, "m", 60), ("m", 60, "s", 1))
