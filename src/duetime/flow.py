"""Flow control as a program states it: a task's priority, limit key and cost (checked,
and written beside the task as its flow record), and a queue's limits (``Rate``,
``KeyLimits``, ``Limits``), written to the queue's limits hash and read back from it.
How they act is the Lua side's (store/plans/lua/include/flow*.lua, a part per step);
docs/flow.md says what a user gets."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from duetime.errors import InvalidOptionError
from duetime.validation import shown, whole_number

#: A priority ranks a due task as if it were due this many seconds earlier per point.
MOST_PRIORITY: Final = 1000
MOST_COST: Final = 1_000_000
#: A limit key's longest UTF-8 form: it is stored beside every task of its key.
LIMIT_KEY_BYTES: Final = 200
MOST_CONCURRENCY: Final = 1_000_000
MOST_RATE_COUNT: Final = 1_000_000_000
#: A rate's period: from 1 ms to 30 days.
SHORTEST_PERIOD_MS: Final = 1
LONGEST_PERIOD_MS: Final = 30 * 24 * 3600 * 1000
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_RATE = re.compile(
    r"\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*(ms|s|sec|second|m|min|minute|h|hour|d|day)?\s*"
)
_UNIT_MS = {
    "ms": 1, "s": 1000, "sec": 1000, "second": 1000, "m": 60_000, "min": 60_000,
    "minute": 60_000, "h": 3_600_000, "hour": 3_600_000, "d": 86_400_000, "day": 86_400_000,
}  # fmt: skip


def priority(value: object) -> int:
    """A task's priority: among due tasks, one of priority p ranks as if due p seconds
    earlier (higher first); it never runs before its run-at."""
    return whole_number(value, "priority", -MOST_PRIORITY, MOST_PRIORITY)


def cost(value: object) -> int:
    """What one start of the task spends of its rate limits (1 by default)."""
    return whole_number(value, "cost", 1, MOST_COST)


def limit_key(value: object) -> str:
    """A limit key: the tasks sharing one take turns with other keys' tasks, and share
    its limits (a customer, a tenant, an API host)."""
    if not isinstance(value, str) or not value:
        raise InvalidOptionError(f"limit_key must be a non-empty string, got {shown(value)}")
    if _CONTROL.search(value):
        raise InvalidOptionError(f"limit_key may not hold control characters: {shown(value)}")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > LIMIT_KEY_BYTES:
        raise InvalidOptionError(
            f"limit_key is {size} bytes; at most {LIMIT_KEY_BYTES} (it is stored beside "
            f"every task of the key): {shown(value, 40)}"
        )
    return value


def flow_record(task_priority: int, task_cost: int, key: str | None) -> str:
    """A checked task's flow record, as the scripts read it: "" for a task with none of
    it (priority 0, cost 1, no key), which adds nothing to the queue."""
    if task_priority == 0 and task_cost == 1 and key is None:
        return ""
    return f"{task_priority}|{task_cost}||{key or ''}"


def checked_record(task_priority: object, key: object, task_cost: object) -> str:
    """The flow record of a task scheduled with these options, each checked."""
    usual = type(task_priority) is int and type(task_cost) is int and key is None
    if usual and task_priority == 0 and task_cost == 1:
        return ""  # the usual case: nothing to check
    checked_key = None if key is None else limit_key(key)
    return flow_record(priority(task_priority), cost(task_cost), checked_key)


def record_parts(record: str) -> tuple[int, int, str | None]:
    """The priority, cost and limit key of a stored flow record (defaults for garbage)."""
    parts = record.split("|", 3)
    try:
        return int(parts[0]), max(1, int(parts[1])), parts[3] or None
    except (IndexError, ValueError):
        return 0, 1, None


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` starts per ``per`` seconds, evenly spaced (GCRA): after a quiet spell up
    to ``burst`` may start back to back. On average exactly ``count`` start per ``per``
    seconds, and no span of ``per`` seconds sees more than count + burst starts (a start
    a moment late keeps its place in the schedule; past 1,000 starts a second, also two
    milliseconds' worth more: the clock's step). A task's cost counts as that many
    starts; one whose cost is above the burst starts only once the limit is idle, so a
    span may then hold count + that cost."""

    count: int
    per: float = 1.0
    burst: int = 1

    def __post_init__(self) -> None:
        whole_number(self.count, "a rate's count", 1, MOST_RATE_COUNT)
        per = self.per
        if isinstance(per, bool) or not isinstance(per, int | float) or not math.isfinite(per):
            raise InvalidOptionError(f"a rate's period must be seconds, got {shown(per)}")
        if not SHORTEST_PERIOD_MS <= round(per * 1000) <= LONGEST_PERIOD_MS:
            raise InvalidOptionError(
                f"a rate's period must be from 0.001 s to 30 days, got {shown(per)} s"
            )
        whole_number(self.burst, "a rate's burst", 1, MOST_RATE_COUNT)

    @classmethod
    def parse(cls, text: str, burst: int = 1) -> Rate:
        """A rate from text: "10/s", "600/min", "5/2s", "100/1.5h"."""
        match = _RATE.fullmatch(text) if isinstance(text, str) else None
        if match is None or (match[2] is None and match[3] is None):
            raise InvalidOptionError(
                f"a rate is a count per period, like 10/s, 600/min or 5/2s; got {shown(text)}"
            )
        period_ms = float(match[2] or 1) * _UNIT_MS[match[3] or "s"]
        return cls(int(match[1]), period_ms / 1000, burst)

    @property
    def period_ms(self) -> int:
        return round(self.per * 1000)

    def wire(self) -> str:
        return f"{self.count}|{self.period_ms}|{self.burst}"

    @classmethod
    def from_wire(cls, text: str | None) -> Rate | None:
        """A rate as the limits hash keeps it; None for none (or garbage)."""
        try:
            count, period_ms, burst = (int(part) for part in (text or "").split("|"))
            return cls(count, period_ms / 1000, burst)
        except (ValueError, InvalidOptionError):
            return None

    def __str__(self) -> str:
        per = f"{self.per:g}s" if self.per != 1 else "s"
        return f"{self.count}/{per}" + (f" (burst {self.burst})" if self.burst > 1 else "")


def _concurrency(value: int | None, what: str) -> int | None:
    return None if value is None else whole_number(value, what, 1, MOST_CONCURRENCY)


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """The limits of one limit key's tasks: at most ``concurrency`` running at once (over
    every worker of the queue), started at most at ``rate``."""

    concurrency: int | None = None
    rate: Rate | None = None

    def __post_init__(self) -> None:
        _concurrency(self.concurrency, "concurrency")
        if self.rate is not None and not isinstance(self.rate, Rate):
            raise InvalidOptionError(f"rate must be a Rate, got {shown(self.rate)}")


@dataclass(frozen=True, slots=True)
class Limits:
    """A queue's limits. ``cap``: most tasks running at once in the queue, over every
    worker; ``rate``: the queue's start rate; ``each_key``: the limits of every limit
    key that ``keys`` does not name; ``keys``: limits of named keys. Tasks without a
    limit key answer only to ``cap`` and ``rate``."""

    cap: int | None = None
    rate: Rate | None = None
    each_key: KeyLimits = KeyLimits()
    keys: Mapping[str, KeyLimits] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _concurrency(self.cap, "cap")
        for value, what in ((self.rate, "rate"), (self.each_key, "each_key")):
            kind = Rate if what == "rate" else KeyLimits
            if value is not None and not isinstance(value, kind):
                raise InvalidOptionError(f"{what} must be a {kind.__name__}, got {shown(value)}")
        for key, limits in self.keys.items():
            limit_key(key)
            if not isinstance(limits, KeyLimits):
                raise InvalidOptionError(f"keys[{key!r}] must be KeyLimits, got {shown(limits)}")

    def fields(self) -> dict[str, str]:
        """The limits hash's fields for these limits."""
        found: dict[str, str] = {}
        if self.cap is not None:
            found["cap"] = str(self.cap)
        if self.rate is not None:
            found["rate"] = self.rate.wire()
        for suffix, limits in (("", self.each_key), *((f":{k}", v) for k, v in self.keys.items())):
            prefix = ("each_" if not suffix else "") + "{}" + suffix
            if limits.concurrency is not None:
                found[prefix.format("concurrency")] = str(limits.concurrency)
            if limits.rate is not None:
                found[prefix.format("rate")] = limits.rate.wire()
        return found

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Limits:
        """Limits read back from the limits hash (a value that is garbage reads as none)."""
        keys: dict[str, KeyLimits] = {}
        for name, value in fields.items():
            kind, _, key = name.partition(":")
            if key and kind in ("concurrency", "rate"):
                current = keys.get(key, KeyLimits())
                keys[key] = _with(current, kind, value)
        each = _with(_with(KeyLimits(), "concurrency", fields.get("each_concurrency")), "rate",
                     fields.get("each_rate"))  # fmt: skip
        return cls(_count_of(fields.get("cap")), Rate.from_wire(fields.get("rate")), each, keys)


def _count_of(text: str | None) -> int | None:
    try:
        value = int(text or "")
    except ValueError:
        return None
    return value if 1 <= value <= MOST_CONCURRENCY else None


def _with(limits: KeyLimits, kind: str, value: str | None) -> KeyLimits:
    if kind == "concurrency":
        return KeyLimits(_count_of(value), limits.rate)
    return KeyLimits(limits.concurrency, Rate.from_wire(value))
