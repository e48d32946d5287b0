"""The plans of cron jobs: declare one, pause or resume it, remove it, read the table,
find the jobs due and fire their ticks (compare-and-set on each job's next tick)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from duetime.states import CronFireOutcome
from duetime.store import scripts
from duetime.store.base import QueueBase
from duetime.store.replies import as_text, count_or_none, pairs
from duetime.store.requests import Batch, Command, Eval, Plan


@dataclass(frozen=True, slots=True)
class CronTable:
    definitions: dict[str, bytes]
    next_ticks: dict[str, int]  # paused jobs are absent
    last_task: dict[str, str]
    held: dict[str, int]


@dataclass(frozen=True, slots=True)
class DueCron:
    name: str
    next_tick_ms: int  # the score read, compared and set by fire_cron
    definition: bytes | None
    held_tick_ms: int | None
    problem: str | None = None  # its held tick is garbage: the job is a poison record


class CronPlans(QueueBase):
    """The plans of a queue's cron jobs (dispatchers fire them, clients declare them)."""

    def declare_cron(self, name: str, definition: bytes, first_tick_ms: int) -> Plan[int]:
        """0 unchanged, 1 created, 2 updated."""
        k = self.keys
        keys = (k.cron, k.cron_next, k.wake)
        return int((yield Eval(scripts.DECLARE_CRON, keys, (name, definition, first_tick_ms))))

    def set_cron_next(self, name: str, next_tick_ms: int | None) -> Plan[int]:
        """Resume a cron job from ``next_tick_ms``, or pause it with None: 1 done, 2 done
        and it was so already, 0 no such job."""
        k = self.keys
        tick = -1 if next_tick_ms is None else next_tick_ms
        keys = (k.cron, k.cron_next, k.cron_held, k.wake)
        return int((yield Eval(scripts.SET_CRON_NEXT, keys, (name, tick))))

    def remove_cron(self, name: str) -> Plan[bool]:
        k = self.keys
        keys = (k.cron, k.cron_next, k.cron_last, k.cron_held)
        return bool((yield Eval(scripts.REMOVE_CRON, keys, (name,))))

    def cron_table(self) -> Plan[CronTable]:
        """Every cron job's definition, next tick, last tick task id and held tick."""
        k = self.keys
        definitions, next_ticks, last, held = yield Batch(
            (
                Command(("HGETALL", k.cron)),
                Command(("ZRANGE", k.cron_next, 0, -1, "WITHSCORES")),
                Command(("HGETALL", k.cron_last)),
                Command(("HGETALL", k.cron_held)),
            )
        )
        return CronTable(
            {as_text(n): blob for n, blob in pairs(definitions)},
            {as_text(n): int(float(s)) for n, s in pairs(next_ticks)},
            {as_text(n): as_text(i) for n, i in pairs(last)},
            # A held tick that is not a number is garbage; the job shows as not held.
            {as_text(n): t for n, raw in pairs(held) if (t := count_or_none(raw)) is not None},
        )

    def due_cron(self, now_ms: int, limit: int) -> Plan[list[DueCron]]:
        """Cron jobs whose next tick has come: name, the score read, definition, held tick."""
        k = self.keys
        flat = yield Command(
            ("ZRANGE", k.cron_next, "-inf", now_ms, "BYSCORE", "WITHSCORES", "LIMIT", 0, limit)
        )
        if not flat:
            return []
        names = [as_text(flat[i]) for i in range(0, len(flat), 2)]
        definitions, held = yield Batch(
            (Command(("HMGET", k.cron, *names)), Command(("HMGET", k.cron_held, *names)))
        )
        due = []
        for i, name in enumerate(names):
            held_tick = count_or_none(held[i])
            problem = None
            if held[i] is not None and held_tick is None:
                problem = f"its held tick is not a number: {as_text(held[i])[:40]!r}"
            due.append(
                DueCron(name, int(float(flat[2 * i + 1])), definitions[i], held_tick, problem)
            )
        return due

    def fire_cron(
        self,
        name: str,
        expected_next_ms: int,
        following_ms: int | None,
        overlap: str,
        retry_at_ms: int,
        held_tick_ms: int,
        ticks: Sequence[tuple[str, int, bytes, str]],
    ) -> Plan[CronFireOutcome | int]:
        """Enqueue due ticks and advance the job (compare-and-set on its next tick):
        the number of ticks enqueued, or why none was."""
        k = self.keys
        args: list[Any] = [
            name,
            expected_next_ms,
            -1 if following_ms is None else following_ms,
            overlap,
            retry_at_ms,
            held_tick_ms,
        ]
        for task_id, run_at_ms, envelope, record in ticks:
            args += (task_id, run_at_ms, envelope, record)
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
        )
        reply = yield Eval(scripts.FIRE_CRON, keys, args)
        return reply if isinstance(reply, int) else CronFireOutcome(as_text(reply))
