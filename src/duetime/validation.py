"""Checks applied where input enters duetime, before anything is written."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from decimal import ROUND_CEILING, Decimal
from typing import Any

import msgpack

from duetime.errors import (
    ConfigurationError,
    InvalidNameError,
    InvalidOptionError,
    InvalidPayloadError,
    InvalidTimestampError,
)

#: Most shards of one queue: far more than the masters of any cluster duetime may meet,
#: and few enough that a lookup that has to try every shard stays cheap.
MOST_SHARDS = 256
QUEUE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# "|" is reserved: lease members are "<worker>|<task id>".
TASK_ID = re.compile(r"[A-Za-z0-9_.:@/+=~-]{1,200}")
TASK_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,199}")
WORKER_ID = re.compile(r"[A-Za-z0-9_.:-]{1,120}")
# The end of the year 9999 (exclusive; so datetime.max is taken): far enough, and keeps
# milliseconds exact in a double (sorted-set scores).
END_OF_9999 = 253_402_300_800.0


def shown(value: object, most: int = 80) -> str:
    """The repr of a refused value for an error message, cut short: a 10 KB id is not
    echoed whole, and an integer of 5,000 digits (whose repr Python refuses) is named."""
    if isinstance(value, int) and value.bit_length() > 4 * most:
        return f"an integer of about {int(value.bit_length() * 0.30103):,} digits"
    text = repr(value)
    if len(text) <= most:
        return text
    size = f"{len(value):,} characters" if isinstance(value, str | bytes) else "long"
    return f"{text[:most]}... ({size})"


def _require(pattern: re.Pattern[str], value: object, what: str, allowed: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidNameError(f"invalid {what} {shown(value)}: use {allowed}")
    return value


def queue_name(value: object) -> str:
    return _require(QUEUE_NAME, value, "queue name", "1-64 characters of A-Z a-z 0-9 _ . -")


def task_id(value: object) -> str:
    return _require(TASK_ID, value, "task id", "1-200 characters of A-Z a-z 0-9 _ . : @ / + = ~ -")


def task_ids(value: object) -> list[str]:
    """One id (a string) or a sequence of ids; a string is never iterated as ids."""
    if isinstance(value, str):
        return [task_id(value)]
    if isinstance(value, bytes) or not isinstance(value, Sequence | set | frozenset):
        raise InvalidNameError(f"expected a task id or a list of task ids, got {shown(value)}")
    return [task_id(item) for item in value]


def items(value: object, what: str) -> list[Any]:
    """The items of a collection given as ``what`` (e.g. the jobs of schedule_many): any
    iterable but a string or bytes, which would be taken one character at a time."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidOptionError(f"{what} must be a list (or any iterable), got {shown(value)}")
    return list(value)


def flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidOptionError(f"{what} must be True or False, got {shown(value)}")
    return value


def task_name(value: object) -> str:
    return _require(
        TASK_NAME, value, "task name", "a letter or _ then up to 199 of A-Z a-z 0-9 _ . : -"
    )


def cron_name(value: object) -> str:
    return _require(QUEUE_NAME, value, "cron job name", "1-64 of A-Z a-z 0-9 _ . -")


def worker_id(value: object) -> str:
    return _require(WORKER_ID, value, "worker id", "1-120 characters of A-Z a-z 0-9 _ . : -")


def timestamp_ms(value: object) -> float:
    """Epoch seconds (int/float) or an aware datetime, as milliseconds to the microsecond,
    rounded up so the result is never before the time given."""
    return milliseconds_not_below(timestamp_us(value))


#: Below this many epoch seconds (the year 2106) a float times 1e6 is within a µs of the
#: exact product, and no two whole µs share a double: the fast path of timestamp_us.
_FAST_SECONDS = 2.0**32


def timestamp_us(value: object) -> int:
    """Epoch seconds (int/float) or an aware datetime, as whole microseconds, rounded up
    so the result is never before the time given: a float is read as the shortest decimal
    that stands for it (its repr), which is what was written: 12.003 is 12,003,000 µs,
    although the nearest double lies a hair above."""
    if type(value) is float and 0 <= value < _FAST_SECONDS:
        # round() is within a µs of the exact product; the quotients below are exact
        # enough to tell which side of the time each candidate lies (see the unit tests).
        micros = round(value * 1_000_000)
        if micros / 1_000_000 < value:
            return micros + 1
        if (micros - 1) / 1_000_000 == value:  # that µs is what was written
            return micros - 1
        return micros
    if isinstance(value, datetime):
        return _datetime_micros(value)
    seconds = as_float(value)
    if seconds is None:
        raise InvalidTimestampError(
            "run-at must be epoch seconds (int or float) or an aware datetime, "
            f"got {type(value).__name__}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidTimestampError(f"run-at must be a finite number, got {shown(value)}")
    if seconds < 0:
        raise InvalidTimestampError(f"run-at must not be negative, got {shown(value)}")
    if seconds >= END_OF_9999:
        raise InvalidTimestampError(
            f"run-at {shown(value)} is after the year 9999; is it in milliseconds?"
        )
    # Exact arithmetic, where a product of floats could round below the time given:
    # integers on the float's exact value first (cheap), and the decimal only when a
    # whole microsecond just below also stands for this float.
    numerator, denominator = seconds.as_integer_ratio()
    micros = -((-numerator * 1_000_000) // denominator)
    if (micros - 1) / 1_000_000 == seconds:
        micros = int((Decimal(repr(seconds)) * 1_000_000).to_integral_value(ROUND_CEILING))
    return micros


def _datetime_micros(value: datetime) -> int:
    """Microseconds since the epoch, exactly (timestamp() rounds: 23:59:59.999999 of the
    last day of 9999 would come out as the year 10000)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidTimestampError(
            f"naive datetime {value.isoformat()} has no time zone; pass an aware datetime "
            "(e.g. datetime.now(timezone.utc)) or epoch seconds"
        )
    try:
        micros = (value - _EPOCH) // timedelta(microseconds=1)
    except OverflowError:  # an offset that pushes it past datetime's range
        micros = round(END_OF_9999 * 1_000_000)
    if micros < 0:
        raise InvalidTimestampError(f"run-at must not be negative, got {value.isoformat()}")
    if micros >= END_OF_9999 * 1_000_000:
        raise InvalidTimestampError(f"run-at {value.isoformat()} is after the year 9999")
    return micros


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def milliseconds_not_below(micros: int) -> float:
    """``micros`` / 1000 as a float (a sorted-set score), never below the exact value:
    far in the future a double has no exact microseconds, so the next one up is taken.
    A whole millisecond comes back as an int."""
    if micros % 1000 == 0:
        return micros // 1000
    milliseconds = micros / 1000
    numerator, denominator = milliseconds.as_integer_ratio()
    if numerator * 1000 < micros * denominator:
        milliseconds = math.nextafter(milliseconds, math.inf)
    return milliseconds


#: Below this many ms (the year 2109) doubles lie well under a µs apart, so the nearest
#: double of a whole µs stands for no other.
_MICROSECONDS_APART = 2.0**42


def whole_microseconds(run_at_ms: float) -> int:
    """The whole µs a run-at in ms stands for, never before it: the last µs whose ms
    double (as ``timestamp_ms`` makes it) is this one, or else the first whose double is
    above it. A time given to the µs comes back exactly (up to the year 2248, where a
    double in ms tells every µs apart; later at most a double's spacing, 2 µs, late),
    where ``ceil(run_at_ms * 1000)`` can land a µs late (the double is a hair above)."""
    micros = round(run_at_ms * 1000)
    if run_at_ms < _MICROSECONDS_APART and micros / 1000 == run_at_ms:
        return micros  # the nearest double: the usual case, decided without exact sums
    numerator, denominator = run_at_ms.as_integer_ratio()
    last = numerator * 1000 // denominator  # the last µs not after the exact run-at
    return last if milliseconds_not_below(last) == run_at_ms else last + 1


def seconds_of_ms(run_at_ms: float) -> float:
    """Epoch seconds of a stored run-at in ms, never below the run-at it was given as:
    through its whole µs and one correctly rounded int/int division, where
    ``run_at_ms / 1000`` can land a fraction of a µs below (4000000000061.981 ms gave
    4000000000.0619807 s for 4000000000.061981)."""
    return whole_microseconds(run_at_ms) / 1_000_000


#: Longest delay, timeout or result TTL accepted (100 years): keeps milliseconds exact
#: and within what PEXPIRE and msgpack integers take.
LONGEST_SECONDS = 100 * 365.25 * 24 * 3600


def is_whole(text: str, signed: bool = False) -> bool:
    """Whether ``text`` is a whole number as duetime writes one: ASCII digits, after one
    "-" when ``signed``. Not ``str.isdigit`` alone, which takes "²" or "٣" that ``int``
    then refuses: text written by hand, or typed, must be left out or refused, never
    raise where it is read."""
    if signed and text.startswith("-"):
        text = text[1:]
    return text.isascii() and text.isdigit()


def as_float(value: object) -> float | None:
    """A real number (never a bool) as a float, inf where too large for one; None for
    anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:  # an int beyond a float's range
        return math.inf if value > 0 else -math.inf


def seconds_of(value: object) -> object:
    """A ``timedelta`` as its seconds; any other value as it is, for the caller to check.
    Every duration duetime takes may be given either way."""
    return value.total_seconds() if isinstance(value, timedelta) else value


def positive_seconds(value: object, what: str) -> float:
    seconds = as_float(seconds_of(value))
    if seconds is None:
        raise InvalidOptionError(f"{what} must be a number of seconds, got {shown(value)}")
    if not math.isfinite(seconds) or not 0 < seconds <= LONGEST_SECONDS:
        raise InvalidOptionError(
            f"{what} must be a positive number of seconds up to {LONGEST_SECONDS:.0f}, "
            f"got {shown(value)}"
        )
    return seconds


def milliseconds(value: object, what: str) -> int:
    """A positive duration in whole milliseconds, rounded up (never to 0)."""
    return math.ceil(positive_seconds(value, what) * 1000)


def delay_ms(value: object) -> int:
    """A delay from now in whole milliseconds: 0 for a zero (right now), else a positive
    duration rounded up; anything else (None, a string) refused."""
    if as_float(seconds_of(value)) == 0:
        return 0
    return milliseconds(value, "delay")


def wait_seconds(value: object, what: str) -> float | None:
    """A wait: None (for ever) or a finite number of seconds from 0 up."""
    if value is None:
        return None
    seconds = as_float(seconds_of(value))
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        raise InvalidOptionError(
            f"{what} must be a finite number of seconds from 0 up (or None to wait for ever), "
            f"got {shown(value)}"
        )
    return seconds


def whole_number(value: object, what: str, least: int, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise InvalidOptionError(
            f"{what} must be an integer from {least} to {most}, got {shown(value)}"
        )
    return value


def shards(value: object) -> int:
    """A queue's shard count (see ``store.layout.QueueLayout``)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MOST_SHARDS:
        raise ConfigurationError(
            f"shards must be an integer from 1 to {MOST_SHARDS}, got {shown(value)}"
        )
    return value


def attempts(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
        raise InvalidOptionError(
            f"max_attempts must be an integer from 1 to 1000, got {shown(value)}"
        )
    return value


#: Data that decodes again whenever it encoded: no keys, no nesting.
_SCALARS = frozenset({bytes, str, int, float, bool})


def payload(data: Any, encoded_size: int, limit: int, packed: bytes | None = None) -> None:
    if data is None or (isinstance(data, str | bytes) and not data):
        raise InvalidPayloadError(
            "task data is empty; pass a value (an empty dict {} is allowed for handlers "
            "that need no arguments)"
        )
    if encoded_size > limit:
        raise InvalidPayloadError(
            f"task data is {encoded_size} bytes encoded, over the limit of {limit}; store large "
            "data elsewhere and pass a reference, or raise Settings.max_payload_bytes"
        )
    if packed is not None and type(data) not in _SCALARS:
        # msgpack encodes some things it cannot decode (a tuple as a dict key, nesting
        # past its depth limit): refuse them here rather than dead-letter the task later.
        # Decoded inside a one-element array, as the envelope holds it: the data's depth
        # plus the envelope's level is what the worker's decoder meets.
        try:
            msgpack.unpackb(b"\x91" + packed, raw=False, strict_map_key=False)
        except Exception as error:
            raise InvalidPayloadError(
                f"task data would not decode again ({type(error).__name__}: {error}); use "
                "str or int dict keys, and nest containers at most 1,023 levels deep"
            ) from None
