"""What the flow control page shows, read through ``AsyncQueue.flow`` and shaped for the
template: the queue's limits (in words, and as the text its forms take back), its due
and running totals, the queue's rate wait, and per limit key what holds its tasks (due,
running against its concurrency, its rate, throttled until when, in the turns or not).

Nothing here writes; the forms that change limits are read in ``inputs`` and acted on in
``actions``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from duetime import AsyncQueue, KeyLimits, Limits
from duetime.client import MinuteFigures
from duetime.store.plans.flow_control import FlowState

#: Limit keys listed (the first ones in key order, as ``AsyncQueue.flow`` reads them).
KEYS_SHOWN = 50
#: Named keys' own limits listed; past that the page says how many more there are.
OVERRIDES_SHOWN = 200


def key_limits_of(limits: Limits, key: str) -> KeyLimits:
    """The limits a limit key's tasks answer to: each of its own wins, else each key's
    (as the claim script reads them). Tasks without a key ("") have none of their own."""
    if key == "":
        return KeyLimits()
    own = limits.keys.get(key, KeyLimits())
    each = limits.each_key
    return KeyLimits(
        own.concurrency if own.concurrency is not None else each.concurrency,
        own.rate if own.rate is not None else each.rate,
    )


def queue_wide(limits: Limits | None) -> str:
    """The queue-wide limits (cap, rate, each key's) as one text: the queue form sends
    back the one it was shown with, and is refused when they have changed since."""
    if limits is None:
        return "none"
    fields = Limits(limits.cap, limits.rate, limits.each_key).fields()
    return ";".join(f"{name}={value}" for name, value in sorted(fields.items())) or "-"


@dataclass(frozen=True, slots=True)
class KeyRow:
    """One limit key's line in the table ("" for the tasks without a key)."""

    key: str
    due: int
    running: int
    limits: KeyLimits  # what its tasks answer to (its own, else each key's)
    own: bool  # it has limits of its own
    throttled_until: float | None  # epoch seconds: its rate lets the next start then
    has_turn: bool
    held_since: float | None = None  # epoch seconds: its next task is held since then

    @property
    def state(self) -> str:
        """Why its due tasks wait, in a word or two."""
        if self.due == 0:
            return "nothing due"
        if self.has_turn:
            return "in turns"
        if self.throttled_until is not None:
            return "rate limit"
        concurrency = self.limits.concurrency
        if concurrency is not None and self.running >= concurrency:
            return "at concurrency"
        return "out of turns"


@dataclass(frozen=True, slots=True)
class Waits:
    """How long the attempts completed in a window waited (seconds, None when none
    completed): late, the queue's own delay, and held by flow control's limits, the wait
    they asked for (metrics.md, what lateness measures)."""

    lateness_mean: float | None = None
    lateness_max: float | None = None
    held_mean: float | None = None
    held_max: float | None = None


def _weighted_mean(pairs: Sequence[tuple[float | None, int]]) -> float | None:
    counted = [(value, count) for value, count in pairs if value is not None and count]
    if not counted:
        return None
    return sum(value * count for value, count in counted) / sum(count for _, count in counted)


def window_waits(figures: Sequence[MinuteFigures]) -> Waits:
    """The waits of the attempts completed over ``figures`` (per minute)."""
    late_maxima = [minute.lateness_max for minute in figures if minute.lateness_max is not None]
    held_maxima = [minute.held_max for minute in figures if minute.held_max is not None]
    return Waits(
        _weighted_mean([(minute.lateness_mean, minute.completed) for minute in figures]),
        max(late_maxima, default=None),
        _weighted_mean([(minute.held_mean, minute.completed) for minute in figures]),
        max(held_maxima, default=None),
    )


@dataclass(frozen=True, slots=True)
class FlowView:
    enabled: bool
    limits: Limits
    since: float | None  # epoch seconds: when the queue came under flow control
    due: int  # due tasks waiting for a turn or a limit
    running: int
    queue_throttled_until: float | None  # epoch seconds: the queue's rate wait
    rows: list[KeyRow]  # the first KEYS_SHOWN keys with due or running tasks
    more_keys: bool  # more keys have due or running tasks than are listed
    overrides: list[tuple[str, KeyLimits]]  # named keys' own limits, the first ones
    overrides_total: int
    seen: str  # queue_wide(limits), sent back by the queue form
    waits: Waits = Waits()  # of the last hour's completed attempts
    oldest_held: float | None = None  # epoch seconds: the listed keys' oldest held task


def _seconds(milliseconds: float | None) -> float | None:
    return None if milliseconds is None else milliseconds / 1000


def _since(fields: Mapping[str, str]) -> float | None:
    try:
        return float(fields["since"]) / 1000
    except (KeyError, ValueError):
        return None


def flow_view(state: FlowState, most_keys: int = KEYS_SHOWN, waits: Waits = Waits()) -> FlowView:
    """The page's view of ``state``, read with ``most_keys`` + 1 keys (to know of more)."""
    limits = Limits.from_fields(state.fields)
    rows = [
        KeyRow(
            group.key,
            group.due,
            group.running,
            key_limits_of(limits, group.key),
            group.key in limits.keys,
            _seconds(group.throttled_until_ms),
            group.has_turn,
            _seconds(state.held_since_ms(group)),
        )
        for group in state.groups[:most_keys]
    ]
    held = [row.held_since for row in rows if row.held_since is not None]
    overrides = sorted(limits.keys.items())
    return FlowView(
        enabled=state.enabled,
        limits=limits,
        since=_since(state.fields),
        due=state.due,
        running=state.running,
        queue_throttled_until=_seconds(state.queue_throttled_until_ms),
        rows=rows,
        more_keys=len(state.groups) > most_keys,
        overrides=overrides[:OVERRIDES_SHOWN],
        overrides_total=len(overrides),
        seen=queue_wide(limits if state.enabled else None),
        waits=waits,
        oldest_held=min(held, default=None),
    )


async def read_flow(queue: AsyncQueue, most_keys: int = KEYS_SHOWN) -> FlowView:
    """The flow control of ``queue``: one ``flow`` call, for one key more than shown, and
    the last hour's waits."""
    state, figures = await asyncio.gather(queue.flow(most_keys + 1), queue.throughput(60))
    return flow_view(state, most_keys, window_waits(figures))
