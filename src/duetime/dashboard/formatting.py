"""How values look on a page: times (UTC in the HTML, the browser's zone once the script
has run, or a cron job's own zone), durations, rate limits, and task data, which is
untrusted and therefore only ever turned into text that Jinja escapes. Registered as
Jinja filters."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from markupsafe import Markup, escape

from duetime.flow import Rate
from duetime.times import format_duration

#: Longest data shown on a task page; the rest is cut, and the cut said.
DATA_SHOWN = 100_000
#: Longest data preview in a table cell.
PREVIEW = 80
#: The units a rate is written in, largest first: a period is written in the largest
#: one it is a whole number of.
_UNITS_MS = (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000), ("ms", 1))


def _moment(seconds: float, zone: Any = UTC) -> datetime | None:
    try:
        return datetime.fromtimestamp(seconds, UTC).astimezone(zone)
    except (OverflowError, OSError, ValueError):  # past what datetime can show
        return None


def when(seconds: float | None) -> Markup:
    """A ``<time>`` in UTC that the script rewrites in the browser's zone (the UTC text
    stays in the title)."""
    if seconds is None:
        return Markup('<span class="muted">-</span>')
    moment = _moment(seconds)
    if moment is None:
        return escape(f"{seconds:.3f} (epoch seconds)")
    utc = moment.strftime("%Y-%m-%d %H:%M:%S UTC")
    stamp = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return Markup('<time datetime="{}" data-local title="{}">{}</time>').format(stamp, utc, utc)


def in_zone(seconds: float | None, zone_name: str) -> Markup:
    """A ``<time>`` in a named zone (a cron job's), shown as is; UTC in the title. A zone
    this host lacks falls back to UTC, which the text then says."""
    if seconds is None:
        return Markup('<span class="muted">-</span>')
    try:
        zone: Any = ZoneInfo(zone_name)
    except (ZoneInfoNotFoundError, ValueError):
        zone = UTC
    moment, utc_moment = _moment(seconds, zone), _moment(seconds)
    if moment is None or utc_moment is None:
        return escape(f"{seconds:.3f} (epoch seconds)")
    text = moment.strftime("%a %Y-%m-%d %H:%M:%S ") + (moment.tzname() or zone_name)
    stamp = utc_moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    title = utc_moment.strftime("%Y-%m-%d %H:%M:%S UTC")
    return Markup('<time datetime="{}" title="{}">{}</time>').format(stamp, title, text)


def duration(seconds: float | None) -> str:
    """``850 ms``, ``12.5 s``, ``4m 10s``; ``-`` for None; a negative one with a sign."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    if seconds < 0:
        return "-" + format_duration(-seconds)
    return format_duration(seconds)


def relative(seconds: float | None, now: float) -> str:
    """``in 4.0 s`` or ``3m 2s ago``."""
    if seconds is None:
        return "-"
    delta = seconds - now
    return f"in {duration(delta)}" if delta >= 0 else f"{duration(-delta)} ago"


def number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value == int(value) else f"{value:,.2f}"


def _plain(value: Any, depth: int = 0) -> Any:
    """``value`` as something ``json.dumps`` takes: bytes shown, not decoded; keys as text."""
    if depth > 100:
        return "<nested too deep to show>"
    if isinstance(value, bytes):
        shown = repr(value[:64]) + ("..." if len(value) > 64 else "")
        return f"<{len(value)} bytes: {shown}>"
    if isinstance(value, dict):
        return {
            key if isinstance(key, str) else repr(key): _plain(item, depth + 1)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_plain(item, depth + 1) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def pretty(data: Any) -> str:
    """Task data indented for reading (cut at ``DATA_SHOWN`` characters)."""
    text = json.dumps(_plain(data), indent=2, ensure_ascii=False, default=repr)
    if len(text) > DATA_SHOWN:
        return text[:DATA_SHOWN] + f"\n... ({len(text) - DATA_SHOWN:,} more characters not shown)"
    return text


def preview(data: Any, limit: int = PREVIEW) -> str:
    """Task data on one line, cut to ``limit`` characters."""
    text = json.dumps(_plain(data), ensure_ascii=False, default=repr, separators=(", ", ": "))
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def task_name(name: str | None) -> str:
    if name is None:
        return "?"
    return name or "(default)"


def rate_text(rate: Rate | None) -> str:
    """A rate as ``Rate.parse`` reads it back, without its burst ("10/s", "5/2min",
    "3/250ms"); "" for none. The period is exact: whole milliseconds."""
    if rate is None:
        return ""
    period = rate.period_ms
    for unit, size in _UNITS_MS:
        if period % size == 0:
            times = period // size
            return f"{rate.count}/{unit}" if times == 1 else f"{rate.count}/{times}{unit}"
    raise AssertionError("every period is a whole number of milliseconds")


def rate_shown(rate: Rate | None) -> str:
    """A rate for people: "10/s", "100/min (burst 20)"; "none" for none."""
    if rate is None:
        return "none"
    return rate_text(rate) + (f" (burst {rate.burst})" if rate.burst > 1 else "")


FILTERS = {
    "when": when,
    "in_zone": in_zone,
    "duration": duration,
    "number": number,
    "pretty": pretty,
    "preview": preview,
    "task_name": task_name,
    "rate": rate_shown,
    "rate_text": rate_text,
}
