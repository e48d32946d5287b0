"""The plans of cron jobs: declare one, pause or resume it, remove it, read the table,
find the jobs due and fire their ticks (compare-and-set on each job's next tick)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from duetime.states import CronFireOutcome
from duetime.store import scripts
from duetime.store.base import QueueBase
from duetime.store.replies import as_text, count_or_none, pairs
from duetime.store.requests import Batch, Command, Eval, Plan, packed_arguments

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
    """A job's backfill (``cron_backfill``): its range, pace and progress."""

    from_ms: int
    to_ms: int
    spacing_ms: int
    next_tick_ms: int | None  # None: done
    fired: int
    total: int


@dataclass(frozen=True, slots=True)
class DueBackfill:
    name: str
    due_ms: int  # the score read, compared and set by fire_backfill
    definition: bytes | None
    backfill: CronBackfill | None  # None: its record is missing or garbage


@dataclass(frozen=True, slots=True)
class CronTable:
    definitions: dict[str, bytes]
    next_ticks: dict[str, int]  # paused jobs are absent
    last_task: dict[str, str]
    held: dict[str, int]
    states: dict[str, CronState] = field(default_factory=dict)
    backfills: dict[str, CronBackfill] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DueCron:
    name: str
    next_tick_ms: int  # the score read, compared and set by fire_cron
    definition: bytes | None
    held_tick_ms: int | None
    problem: str | None = None  # its held tick is garbage: the job is a poison record


class CronPlans(QueueBase):
    """The plans of a queue's cron jobs (dispatchers fire them, clients declare them)."""

    def declare_cron(self, jobs: Sequence[tuple[str, bytes, int]]) -> Plan[list[int]]:
        """Declare jobs (name, definition, due time of the first tick after now) in one
        script call: per job 0 unchanged, 1 created, 2 updated."""
        k = self.keys
        keys = (k.cron, k.cron_next, k.wake, k.cron_state)
        args = [value for job in jobs for value in job]
        return [int(code) for code in (yield Eval(scripts.DECLARE_CRON, keys, args))]

    def set_cron_next(self, name: str, next_tick_ms: int | None) -> Plan[int]:
        """Resume a cron job from ``next_tick_ms``, or pause it with None: 1 done, 2 done
        and it was so already, 0 no such job."""
        k = self.keys
        tick = -1 if next_tick_ms is None else next_tick_ms
        keys = (k.cron, k.cron_next, k.cron_held, k.wake, k.cron_state)
        return int((yield Eval(scripts.SET_CRON_NEXT, keys, (name, tick))))

    def remove_cron(self, name: str) -> Plan[bool]:
        k = self.keys
        keys = (k.cron, k.cron_next, k.cron_last, k.cron_held, k.cron_state, k.cron_backfill,
                k.cron_backfill_due)  # fmt: skip
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

    def start_backfill(
        self, name: str, range_ms: tuple[int, int], spacing_ms: int, first_tick_ms: int, total: int
    ) -> Plan[tuple[int, CronBackfill | None]]:
        """Record a job's backfill, due now: (0 no such job | 1 started | 2 the same range
        was recorded already, its record)."""
        now = yield from self.now()
        k = self.keys
        keys = (k.cron, k.cron_backfill, k.cron_backfill_due, k.wake)
        args = (name, f"{range_ms[0]}|{range_ms[1]}", spacing_ms, first_tick_ms, total, now)
        return _start_backfill_reply((yield Eval(scripts.START_BACKFILL, keys, args)))

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
                _backfill(records[i]) if records[i] else None,
            )
            for i, name in enumerate(names)
        ]

    def fire_backfill(self, rows: Sequence[Sequence[Any]]) -> Plan[list[CronFireOutcome | int]]:
        """For each job, fire its backfill's next tick (fire_backfill.lua reads the rows)."""
        k = self.keys
        keys = (k.cron_backfill_due, k.cron_backfill, k.cron_last, k.tasks, k.ready, k.stats,
                k.limits, k.flow_records, k.scheduled, k.wake)  # fmt: skip
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
        )
        replies = yield Eval(scripts.FIRE_CRON, keys, (packed_arguments(list(firings)),))
        return [r if isinstance(r, int) else CronFireOutcome(as_text(r)) for r in replies]


def _start_backfill_reply(reply: Any) -> tuple[int, CronBackfill | None]:
    code, record = reply
    return int(code), _backfill(record) if record else None


def _table(*columns: list[tuple[Any, Any]]) -> CronTable:
    """A CronTable from (name, value) pairs of each record, in ``CronTable``'s order."""
    definitions, next_ticks, last, held, states, backfills = columns
    return CronTable(
        {as_text(n): blob for n, blob in definitions},
        {as_text(n): int(float(s)) for n, s in next_ticks},
        {as_text(n): as_text(i) for n, i in last},
        # A held tick that is not a number is garbage; the job shows as not held.
        {as_text(n): t for n, raw in held if (t := count_or_none(raw)) is not None},
        {as_text(n): s for n, raw in states if (s := _state(raw)) is not None},
        {as_text(n): b for n, raw in backfills if (b := _backfill(raw)) is not None},
    )


def _state(raw: bytes) -> CronState | None:
    """A ``cron_state`` value, or None when it is not one duetime wrote."""
    runs, failures, ended, _ = [*as_text(raw).split("|", 3), "", "", ""][:4]
    if not (runs.isdigit() and failures.isdigit() and ended in ("0", "1")):
        return None
    return CronState(int(runs), int(failures), ended == "1")


def _backfill(raw: bytes) -> CronBackfill | None:
    """A ``cron_backfill`` value, or None when it is not one duetime wrote."""
    parts = as_text(raw).split("|")
    if len(parts) != 6 or not all(p.lstrip("-").isdigit() for p in parts):
        return None
    start, end, spacing, next_tick, fired, total = (int(p) for p in parts)
    return CronBackfill(start, end, spacing, None if next_tick < 0 else next_tick, fired, total)
