"""Checks applied where input enters duetime, before anything is written."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from decimal import ROUND_CEILING, Decimal
from typing import Any

import msgpack

from duetime.errors import (
    InvalidNameError,
    InvalidOptionError,
    InvalidPayloadError,
    InvalidTimestampError,
)

QUEUE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# "|" is reserved: lease members are "<worker>|<task id>".
TASK_ID = re.compile(r"[A-Za-z0-9_.:@/+=~-]{1,200}")
TASK_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,199}")
WORKER_ID = re.compile(r"[A-Za-z0-9_.:-]{1,120}")
# Year 9999: far enough, and keeps milliseconds exact in a double (sorted-set scores).
LATEST_TIMESTAMP = 253_402_300_799.0


def _require(pattern: re.Pattern[str], value: object, what: str, allowed: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidNameError(f"invalid {what} {value!r}: use {allowed}")
    return value


def queue_name(value: object) -> str:
    return _require(QUEUE_NAME, value, "queue name", "1-64 characters of A-Z a-z 0-9 _ . -")


def task_id(value: object) -> str:
    return _require(TASK_ID, value, "task id", "1-200 characters of A-Z a-z 0-9 _ . : @ / + = ~ -")


def task_name(value: object) -> str:
    return _require(
        TASK_NAME, value, "task name", "a letter or _ then up to 199 of A-Z a-z 0-9 _ . : -"
    )


def worker_id(value: object) -> str:
    return _require(WORKER_ID, value, "worker id", "1-120 characters of A-Z a-z 0-9 _ . : -")


def timestamp_ms(value: object) -> float:
    """Epoch seconds (int/float) or an aware datetime, as milliseconds to the microsecond,
    rounded up so the result is never before the time given."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidTimestampError(
                f"naive datetime {value.isoformat()} has no time zone; pass an aware datetime "
                "(e.g. datetime.now(timezone.utc)) or epoch seconds"
            )
        seconds = value.timestamp()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:
            raise InvalidTimestampError(f"run-at {value!r} is too large") from None
    else:
        raise InvalidTimestampError(
            "run-at must be epoch seconds (int or float) or an aware datetime, "
            f"got {type(value).__name__}"
        )
    if not math.isfinite(seconds):
        raise InvalidTimestampError(f"run-at must be a finite number, got {value!r}")
    if seconds < 0:
        raise InvalidTimestampError(f"run-at must not be negative, got {value!r}")
    if seconds > LATEST_TIMESTAMP:
        raise InvalidTimestampError(
            f"run-at {value!r} is after the year 9999; is it in milliseconds?"
        )
    if isinstance(value, datetime):
        micros = (value - _EPOCH) // timedelta(microseconds=1)  # exact, unlike timestamp()
    else:
        # The float read as the shortest decimal that stands for it (its repr), which is
        # what was written: 12.003 is 12,003,000 µs, although the nearest double lies a
        # hair above. Exact arithmetic, where a product of floats could round below the
        # time given: integers on the float's exact value first (cheap), and the decimal
        # only when a whole microsecond just below also stands for this float.
        numerator, denominator = seconds.as_integer_ratio()
        micros = -((-numerator * 1_000_000) // denominator)
        if (micros - 1) / 1_000_000 == seconds:
            micros = int((Decimal(repr(seconds)) * 1_000_000).to_integral_value(ROUND_CEILING))
    return _milliseconds_not_below(micros)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _milliseconds_not_below(micros: int) -> float:
    """``micros`` / 1000 as a float (a sorted-set score), never below the exact value:
    far in the future a double has no exact microseconds, so the next one up is taken."""
    milliseconds = micros / 1000
    numerator, denominator = milliseconds.as_integer_ratio()
    if numerator * 1000 < micros * denominator:
        milliseconds = math.nextafter(milliseconds, math.inf)
    return milliseconds


#: Longest delay, timeout or result TTL accepted (100 years): keeps milliseconds exact
#: and within what PEXPIRE and msgpack integers take.
LONGEST_SECONDS = 100 * 365.25 * 24 * 3600


def positive_seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidOptionError(f"{what} must be a number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds) or not 0 < seconds <= LONGEST_SECONDS:
        raise InvalidOptionError(
            f"{what} must be a positive number of seconds up to {LONGEST_SECONDS:.0f}, "
            f"got {value!r}"
        )
    return seconds


def milliseconds(value: object, what: str) -> int:
    """A positive duration in whole milliseconds, rounded up (never to 0)."""
    return math.ceil(positive_seconds(value, what) * 1000)


def attempts(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
        raise InvalidOptionError(f"max_attempts must be an integer from 1 to 1000, got {value!r}")
    return value


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
    if packed is not None:
        # msgpack encodes some things it cannot decode (a tuple as a dict key): refuse
        # them here rather than dead-letter the task later.
        try:
            msgpack.unpackb(packed, raw=False, strict_map_key=False)
        except Exception as error:
            raise InvalidPayloadError(
                f"task data would not decode again ({error}); use str or int dict keys"
            ) from None
