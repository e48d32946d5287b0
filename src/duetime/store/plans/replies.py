"""Reading the server's replies: text from bytes, pairs from a hash, scores, times and
counters as duetime wrote them (garbage written by hand reads as None, not a crash)."""

from __future__ import annotations

import math
import re
from typing import Any


def as_text(value: bytes | str) -> str:
    # surrogateescape: an id that is not UTF-8 (written by hand) still round-trips to
    # the same bytes (the runner encodes with the same error handler).
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def pairs(reply: Any) -> list[tuple[Any, Any]]:
    """Name/value pairs from a flat list or a dict reply."""
    if isinstance(reply, dict):
        return list(reply.items())
    return list(zip(reply[::2], reply[1::2], strict=True))


def score_or_none(value: bytes | str | None) -> float | None:
    """A score a script replied; None when absent or negative (the scripts send -1 for
    none)."""
    if value is None:
        return None
    number = float(value)
    return None if number < 0 else number


def whole_score(value: bytes | str | None) -> int | None:
    """A score written in whole milliseconds (deadlines, heartbeats, cron ticks)."""
    number = score_or_none(value)
    return None if number is None else int(number)


def ms_or_none(value: bytes | str | None) -> float | None:
    """A time (ms) duetime wrote; None for none or garbage (the checker reports it)."""
    try:
        number = float(as_text(value)) if value is not None else math.nan
    except ValueError:
        return None
    return number if math.isfinite(number) else None


_COUNT = re.compile(r"-?[0-9]{1,18}")


def count_or_none(value: bytes | str | None) -> int | None:
    """A counter duetime wrote as a decimal integer; None for anything else (garbage
    written by hand), so one bad value is reported rather than failing the whole read."""
    if value is None:
        return None
    text = as_text(value)
    return int(text) if _COUNT.fullmatch(text) else None
