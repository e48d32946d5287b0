"""The plans of cron jobs: declare one, pause or resume it, remove it, read the table,
find the jobs due and fire their ticks (compare-and-set on each job's next tick)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from duetime import validation
from duetime.states import CronFireOutcome
from duetime.store.plans import scripts
from duetime.store.plans.base import QueuePlans
from duetime.store.plans.replies import as_text, count_or_none, pairs
from duetime.store.plans.requests import Batch, Command, Eval, Plan, packed_arguments

#: Most due jobs one due_cron call reads (its script passes their names to HMGET in one
#: call: Lua's unpack takes about 8,000 values).
MOST_DUE_CRON = 5000


@dataclass(frozen=True, slots=True)
class CronState:
    """What firing a job keeps of it (``cron_state``): for jobs with max_runs or
    pause_after_failures, and jobs that ended."""

    runs: int  # ticks fired (HSETNX'd) since declared
    failures: int  # runs judged failed in a row (dead)
    ended: bool  # its end passed, its runs are done, or its expression fires no more


@dataclass(frozen=True, slots=True)
class CronBackfill:
    """A job's backfill (``cron_backfill``): its range, pace and progress, and the ticks
    it does not run again (``covered``): those the job's earlier backfills handled, and
    those of its range the job's schedule had enqueued when it was planned.

    Its own progress covers the ticks from ``from_ms`` to the one before ``next_tick_ms``
    (to ``to_ms`` once done): each of them it fired, passed over or found run already."""

    from_ms: int  # the range's first tick
    to_ms: int  # its last tick
    spacing_ms: int
    next_tick_ms: int | None  # None: done
    fired: int  # ticks it enqueued
    total: int  # ticks in its range
    skipped: int = 0  # ticks skipped under overlap="skip"
    already_ran: int = 0  # ticks not run again: an earlier backfill ran them, or live
    #: Instants (ms, both ends included, in order, apart) within which every tick of the
    #: job was handled by an earlier backfill, or enqueued by its schedule.
    covered: tuple[tuple[int, int], ...] = ()

    def handled(self) -> tuple[tuple[int, int], ...]:
        """The spans of ticks handled by this backfill and those before it."""
        end = self.to_ms if self.next_tick_ms is None else self.next_tick_ms - 1
        own = ((self.from_ms, end),) if end >= self.from_ms else ()
        return merged_spans((*self.covered, *own))

    def encoded(self) -> str:
        """The ``cron_backfill`` value (fire_backfill.lua and start_backfill.lua read it)."""
        next_tick = -1 if self.next_tick_ms is None else self.next_tick_ms
        spans = ",".join(f"{low}:{high}" for low, high in self.covered)
        return (
            f"{self.from_ms}|{self.to_ms}|{self.spacing_ms}|{next_tick}|{self.fired}|"
            f"{self.total}|{self.skipped}|{self.already_ran}|{spans}"
        )


def covering(spans: Sequence[tuple[int, int]], tick_ms: int) -> int | None:
    """The end of the span of ``spans`` that holds ``tick_ms``; None when none does."""
    for low, high in spans:
        if low <= tick_ms <= high:
            return high
    return None


def merged_spans(spans: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Spans of instants in order, those that overlap or touch made one."""
    out: list[tuple[int, int]] = []
    for low, high in sorted(spans):
        if out and low <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], high))
        else:
            out.append((low, high))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class DueBackfill:
    name: str
    due_ms: int  # the score read, compared and set by fire_backfill
    definition: bytes | None
    backfill: CronBackfill | None  # None: its record is missing or garbage
    record: bytes = b""  # the record as read, compared by fire_backfill


@dataclass(frozen=True, slots=True)
class CronTable:
    definitions: dict[str, bytes]
    next_ticks: dict[str, int]  # paused jobs are absent
    last_task: dict[str, str]
    held: dict[str, int]
    states: dict[str, CronState] = field(default_factory=dict)
    backfills: dict[str, CronBackfill] = field(default_factory=dict)
    #: The spans of ticks each job's own schedule enqueued (``cron_fired``), in order.
    fired: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DueCron:
    name: str
    next_tick_ms: int  # the score read, compared and set by fire_cron
    definition: bytes | None
    held_tick_ms: int | None
    problem: str | None = None  # its held tick is garbage: the job is a poison record


class CronPlans(QueuePlans):
    """The plans of a queue's cron jobs (dispatchers fire them, clients declare them)."""

    def declare_cron(self, jobs: Sequence[tuple[str, bytes, int]]) -> Plan[list[int]]:
        """Declare jobs (name, definition, due time of the first tick after now) in one
        script call: per job 0 unchanged, 1 created, 2 updated."""
        k = self.keys
        keys = (k.cron, k.cron_next, k.wake, k.cron_state, k.cron_last, k.cron_fired)
        args = [value for job in jobs for value in job]
        return [int(code) for code in (yield Eval(scripts.DECLARE_CRON, keys, args))]

    def set_cron_next(self, name: str, next_tick_ms: int | None) -> Plan[int]:
        """Resume a cron job from ``next_tick_ms``, or pause it with None: 1 done, 2 done
        and it was so already, 0 no such job."""
        k = self.keys
        tick = -1 if next_tick_ms is None else next_tick_ms
        keys = (k.cron, k.cron_next, k.cron_held, k.wake, k.cron_state, k.cron_last,
                k.cron_fired)  # fmt: skip
        return int((yield Eval(scripts.SET_CRON_NEXT, keys, (name, tick))))

    def remove_cron(self, name: str) -> Plan[bool]:
        k = self.keys
        keys = (k.cron, k.cron_next, k.cron_last, k.cron_held, k.cron_state, k.cron_backfill,
                k.cron_backfill_due, k.cron_fired)  # fmt: skip
        return bool((yield Eval(scripts.REMOVE_CRON, keys, (name,))))

    def cron_table(self) -> Plan[CronTable]:
        """Every cron job's definition, next tick, last tick task id, held tick, state
        and backfill."""
        k = self.keys
        replies = yield Batch(
            (
                Command(("HGETALL", k.cron)),
                Command(("ZRANGE", k.cron_next, 0, -1, "WITHSCORES")),
                Command(("HGETALL", k.cron_last)),
                Command(("HGETALL", k.cron_held)),
                Command(("HGETALL", k.cron_state)),
                Command(("HGETALL", k.cron_backfill)),
                Command(("HGETALL", k.cron_fired)),
            )
        )
        return _table(*(pairs(reply) for reply in replies))

    def cron_entry(self, name: str) -> Plan[CronTable]:
        """The table of one cron job (empty when there is none): what ``cron_table``
        holds of it, read without reading every job (a queue may hold millions)."""
        k = self.keys
        replies = yield Batch(
            (
                Command(("HGET", k.cron, name)),
                Command(("ZSCORE", k.cron_next, name)),
                Command(("HGET", k.cron_last, name)),
                Command(("HGET", k.cron_held, name)),
                Command(("HGET", k.cron_state, name)),
                Command(("HGET", k.cron_backfill, name)),
                Command(("HGET", k.cron_fired, name)),
            )
        )
        return _table(*([] if reply is None else [(name, reply)] for reply in replies))

    def due_cron(self, now_ms: int, limit: int) -> Plan[list[DueCron]]:
        """Cron jobs whose next tick has come (at most ``limit``, within
        ``MOST_DUE_CRON``): name, the score read, definition, held tick."""
        k = self.keys
        keys = (k.cron_next, k.cron, k.cron_held)
        flat, definitions, held = yield Eval(
            scripts.DUE_CRON, keys, (now_ms, min(limit, MOST_DUE_CRON))
        )
        due = []
        for i in range(len(definitions)):
            held_tick = count_or_none(held[i])
            problem = None
            if held[i] is not None and held_tick is None:
                problem = f"its held tick is not a number: {as_text(held[i])[:40]!r}"
            due.append(
                DueCron(
                    as_text(flat[2 * i]), int(float(flat[2 * i + 1])), definitions[i], held_tick,
                    problem,
                )
            )  # fmt: skip
        return due

    def backfill_record(self, name: str) -> Plan[tuple[bytes | None, tuple[tuple[int, int], ...]]]:
        """A job's backfill record as stored (start_backfill compares it), and the spans
        of ticks its schedule enqueued."""
        k = self.keys
        record, fired, last = yield Batch(
            (
                Command(("HGET", k.cron_backfill, name)),
                Command(("HGET", k.cron_fired, name)),
                Command(("HGET", k.cron_last, name)),
            )
        )
        return (None if record is None else bytes(record)), parsed_fired(fired, last)

    def start_backfill(
        self, name: str, replaced: bytes | None, backfill: CronBackfill, now_ms: int
    ) -> Plan[int]:
        """Record a job's backfill, its next tick due at ``now_ms``, if its record is
        still ``replaced`` (None: none): 1 done, 2 the record changed meanwhile (nothing
        written), 0 no such job."""
        k = self.keys
        keys = (k.cron, k.cron_backfill, k.cron_backfill_due, k.wake)
        args = (name, b"" if replaced is None else replaced, backfill.encoded(), now_ms,
                0 if backfill.next_tick_ms is None else 1)  # fmt: skip
        return int((yield Eval(scripts.START_BACKFILL, keys, args)))

    def due_backfills(self, now_ms: int, limit: int) -> Plan[list[DueBackfill]]:
        """Backfills whose next tick is due: name, the score read, definition, record."""
        k = self.keys
        flat = yield Command(
            ("ZRANGE", k.cron_backfill_due, "-inf", now_ms, "BYSCORE", "WITHSCORES", "LIMIT", 0,
             limit)
        )  # fmt: skip
        if not flat:
            return []
        names = [as_text(flat[i]) for i in range(0, len(flat), 2)]
        definitions, records = yield Batch(
            (Command(("HMGET", k.cron, *names)), Command(("HMGET", k.cron_backfill, *names)))
        )
        return [
            DueBackfill(
                name,
                int(float(flat[2 * i + 1])),
                definitions[i],
                parsed_backfill(records[i]) if records[i] else None,
                bytes(records[i] or b""),
            )
            for i, name in enumerate(names)
        ]

    def fire_backfill(self, rows: Sequence[Sequence[Any]]) -> Plan[list[CronFireOutcome | int]]:
        """For each job, fire its backfill's next tick (fire_backfill.lua reads the rows)."""
        k = self.keys
        keys = (k.cron_backfill_due, k.cron_backfill, k.cron_last, k.tasks, k.ready, k.stats,
                k.limits, k.flow_records, k.scheduled, k.wake, k.cron_fired)  # fmt: skip
        replies = yield Eval(scripts.FIRE_BACKFILL, keys, (packed_arguments(list(rows)),))
        return [r if isinstance(r, int) else CronFireOutcome(as_text(r)) for r in replies]

    def drop_backfill(self, name: str) -> Plan[None]:
        """Forget a backfill that cannot go on (its job or record is gone or unusable)."""
        k = self.keys
        yield Command(("ZREM", k.cron_backfill_due, name))

    def fire_cron(self, firings: Sequence[Sequence[Any]]) -> Plan[list[CronFireOutcome | int]]:
        """For each job, enqueue its due ticks and advance it (compare-and-set on its
        next tick), all in one script call: per job the number of ticks enqueued, or
        why none was. Each firing is the job's row as fire_cron.lua reads it."""
        k = self.keys
        keys = (
            k.cron_next,
            k.cron_last,
            k.cron_held,
            k.tasks,
            k.ready,
            k.stats,
            k.limits,
            k.flow_records,
            k.scheduled,
            k.wake,
            k.cron_state,
            k.dead,
            k.cron_fired,
        )
        replies = yield Eval(scripts.FIRE_CRON, keys, (packed_arguments(list(firings)),))
        return [r if isinstance(r, int) else CronFireOutcome(as_text(r)) for r in replies]


def _table(*columns: list[tuple[Any, Any]]) -> CronTable:
    """A CronTable from (name, value) pairs of each record, in ``CronTable``'s order."""
    definitions, next_ticks, last, held, states, backfills, fired = columns
    last_task = {as_text(n): as_text(i) for n, i in last}
    return CronTable(
        {as_text(n): blob for n, blob in definitions},
        {as_text(n): int(float(s)) for n, s in next_ticks},
        last_task,
        # A held tick that is not a number is garbage; the job shows as not held.
        {as_text(n): t for n, raw in held if (t := count_or_none(raw)) is not None},
        {as_text(n): s for n, raw in states if (s := _state(raw)) is not None},
        {as_text(n): b for n, raw in backfills if (b := parsed_backfill(raw)) is not None},
        {as_text(n): parsed_fired(raw, last_task.get(as_text(n))) for n, raw in fired},
    )


def _state(raw: bytes) -> CronState | None:
    """A ``cron_state`` value, or None when it is not one duetime wrote."""
    runs, failures, ended, _ = [*as_text(raw).split("|", 3), "", "", ""][:4]
    if not (validation.is_whole(runs) and validation.is_whole(failures) and ended in ("0", "1")):
        return None
    return CronState(int(runs), int(failures), ended == "1")


def parsed_backfill(raw: bytes) -> CronBackfill | None:
    """A ``cron_backfill`` value, or None when it is not one duetime wrote (six fields:
    one written before backfills kept what earlier ones covered)."""
    parts = as_text(raw).split("|")
    if len(parts) == 6:
        parts += ["0", "0", ""]
    if len(parts) != 9 or not all(validation.is_whole(p, signed=True) for p in parts[:8]):
        return None
    start, end, spacing, next_tick, fired, total, skipped, before = (int(p) for p in parts[:8])
    spans = _parsed_spans(parts[8])
    if spans is None:
        return None
    return CronBackfill(
        start, end, spacing, None if next_tick < 0 else next_tick, fired, total, skipped,
        before, spans,
    )  # fmt: skip


def parsed_fired(raw: Any, last_task: Any) -> tuple[tuple[int, int], ...]:
    """The spans of ticks a job's schedule enqueued, in order, from its ``cron_fired``
    value "<open low>|<closed spans>" and its ``cron_last`` task id (where its open span
    ends; fired_spans.lua); none when it has none or the value is not one duetime wrote
    (then backfills know no tick of its schedule, as before)."""
    open_low, _, text = as_text(raw or b"").partition("|")
    spans = _parsed_spans(text)
    if spans is None or not (open_low == "" or validation.is_whole(open_low)):
        return ()
    if open_low:
        low, high = int(open_low), as_text(last_task or b"").rpartition(":")[2]
        spans = merged_spans(
            (*spans, (low, max(low, int(high) if validation.is_whole(high) else low)))
        )
    return spans


def _parsed_spans(text: str) -> tuple[tuple[int, int], ...] | None:
    """Spans written as "low:high,low:high" (in any order), merged and in order; None
    when ``text`` is not that."""
    spans = []
    for span in filter(None, text.split(",")):
        low, _, high = span.partition(":")
        if not (validation.is_whole(low) and validation.is_whole(high)):
            return None
        spans.append((int(low), int(high)))
    return merged_spans(spans)
