"""Acting on many waiting tasks at once: cancel, reschedule or run now each task of a
list of ids, chosen by hand or by a search (``select_matching``), and say what was done
and what was skipped, and why.

Each task is its own atomic step (the same script as for one task), so a task that
started, died or finished meanwhile is skipped, never half-changed; nothing is held
across tasks, and a step that fails part-way leaves the tasks before it done. Every id
is checked before the first step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from duetime import codec, validation
from duetime.client.control import Control
from duetime.client.models import Duration, TaskIds, TaskStatus, Timestamp
from duetime.client.searching import DEFAULT_BUDGET, MOST_LIMIT, SearchPage, TaskSearch
from duetime.errors import InvalidInputError
from duetime.states import RescheduleOutcome, TaskState
from duetime.store.requests import Plan

#: Why a task was skipped: it was running, dead, already due (run now), or not live.
GONE = "gone"


@dataclass(frozen=True, slots=True)
class BulkOutcome:
    """What a bulk action did: ``done``, the ids it acted on, in the order given;
    ``skipped``, each other id with why (``running``, ``dead``, ``ready`` for a task
    already due that was to run now, or ``gone``: finished, cancelled, never there)."""

    action: str  # cancel | reschedule | run_now
    done: list[str]
    skipped: dict[str, str]

    @property
    def summary(self) -> str:
        """One line for people: ``cancelled 12; skipped 3 (2 running, 1 gone)``."""
        verb = {"cancel": "cancelled", "reschedule": "rescheduled", "run_now": "made due now"}
        said = f"{verb[self.action]} {len(self.done):,}"
        if not self.skipped:
            return said
        reasons: dict[str, int] = {}
        for reason in self.skipped.values():
            reasons[reason] = reasons.get(reason, 0) + 1
        parts = ", ".join(f"{count:,} {reason}" for reason, count in sorted(reasons.items()))
        return f"{said}; skipped {len(self.skipped):,} ({parts})"


@dataclass
class _Tally:
    action: str
    done: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def outcome(self) -> BulkOutcome:
        return BulkOutcome(self.action, self.done, self.skipped)


def _checked_ids(task_ids: TaskIds) -> list[str]:
    """The ids, each checked, once each in the order given (None is refused here: a bulk
    action never means every task)."""
    if task_ids is None:
        raise InvalidInputError("give the task ids to act on (a list, or one id)")
    return list(dict.fromkeys(validation.task_ids(task_ids)))


class BulkControl(Control):
    """The plans of ``QueueCore`` that act on many waiting tasks, one atomic step each."""

    def cancel_many_plan(self, task_ids: TaskIds) -> Plan[BulkOutcome]:
        """Cancel each task that has not started (scheduled or ready), and ask each running
        one's worker to stop it (it ends as cancelled); a dead one is left alone (a dead
        task is purged with ``purge_dead``)."""
        tally = _Tally("cancel")
        for task_id in _checked_ids(task_ids):
            place = yield from self._cancel_live(task_id)
            if place in (TaskState.SCHEDULED, TaskState.READY, TaskState.RUNNING):
                tally.done.append(task_id)
            else:
                tally.skipped[task_id] = GONE if place is None else str(place)
        return tally.outcome()

    def reschedule_many_plan(self, task_ids: TaskIds, at: Timestamp) -> Plan[BulkOutcome]:
        """Give each waiting task (scheduled or ready) the run-at ``at``; a time not in
        the future makes it due now."""
        ids = _checked_ids(task_ids)
        run_at_ms = validation.timestamp_ms(at)
        tally = _Tally("reschedule")
        for task_id in ids:
            outcome = yield from self._reschedule_one(task_id, run_at_ms)
            if outcome == RescheduleOutcome.OK:
                tally.done.append(task_id)
            else:
                tally.skipped[task_id] = GONE if outcome is None else str(outcome)
        return tally.outcome()

    def reschedule_many_in_plan(self, task_ids: TaskIds, delay: Duration) -> Plan[BulkOutcome]:
        """``reschedule_many_plan`` to ``delay`` from now, by the server's clock."""
        ids = _checked_ids(task_ids)
        delay_ms = validation.delay_ms(delay)
        now_ms = yield from self.operations.now()
        return (yield from self.reschedule_many_plan(ids, (now_ms + delay_ms) / 1000))

    def _cancel_live(self, task_id: str) -> Plan[TaskState | None]:
        return (yield from self._first_found(task_id, lambda shard: shard.cancel(task_id, True)))

    def _reschedule_one(self, task_id: str, run_at_ms: float) -> Plan[RescheduleOutcome | None]:
        return (
            yield from self._first_found(
                task_id,
                lambda shard: shard.reschedule(task_id, run_at_ms, codec.rescheduled_envelope),
            )
        )

    def run_now_many_plan(self, task_ids: TaskIds) -> Plan[BulkOutcome]:
        """Make each scheduled task due now (its run-at becomes the server's now); a
        task already due (ready) is skipped, as are running, dead and gone ones."""
        tally = _Tally("run_now")
        for task_id in _checked_ids(task_ids):
            shard, reply = yield from self._locate(task_id)
            if reply.state != TaskState.SCHEDULED:
                live = reply.state in (TaskState.READY, TaskState.RUNNING, TaskState.DEAD)
                tally.skipped[task_id] = str(reply.state) if live else GONE
                continue
            now_ms = yield from shard.now()
            # The step is atomic: a task claimed since the look above is refused by it.
            outcome = yield from shard.reschedule(task_id, now_ms, codec.rescheduled_envelope)
            if outcome == RescheduleOutcome.OK:
                tally.done.append(task_id)
            else:
                tally.skipped[task_id] = GONE if outcome is None else str(outcome)
        return tally.outcome()


# --- choosing by a search ----------------------------------------------------------------


class Searchable(Protocol):
    """What ``select_matching`` needs of a queue: ``duetime.Queue`` has it."""

    def search(
        self, criteria: TaskSearch, *, cursor: str | None = ..., budget: int = ..., limit: int = ...
    ) -> SearchPage: ...


class AsyncSearchable(Protocol):
    """What ``select_matching_async`` needs of a queue: ``duetime.AsyncQueue`` has it."""

    async def search(
        self, criteria: TaskSearch, *, cursor: str | None = ..., budget: int = ..., limit: int = ...
    ) -> SearchPage: ...


@dataclass(frozen=True, slots=True)
class MatchSelection:
    """The tasks a search matched, walked to its end or to a bound: every id (once),
    the first ``sample`` in full, how many entries were read, and whether the walk got
    to its end (False: it stopped at the bound; later tasks were not looked at).
    ``unnameable`` matches carry an id duetime does not accept (written by hand), which
    the bulk actions would refuse: they are left out of ``ids``."""

    ids: list[str]
    sample: list[TaskStatus]
    scanned: int
    complete: bool
    unnameable: int = 0


@dataclass
class _Collecting:
    sample: int
    most_scanned: int | None
    on_page: Callable[[SearchPage], None] | None
    ids: dict[str, None] = field(default_factory=dict)  # ordered, once each
    shown: list[TaskStatus] = field(default_factory=list)
    scanned: int = 0
    looked: int = 0
    unnameable: set[str] = field(default_factory=set)

    def budget(self, per_call: int) -> int:
        if self.most_scanned is None:
            return per_call
        return max(1, min(per_call, self.most_scanned - self.looked))

    def add(self, page: SearchPage, budget: int) -> bool:
        """Take a page in; True while the walk should go on."""
        self.scanned += page.scanned
        self.looked += budget
        for status in page.tasks:
            if status.id in self.ids or status.id in self.unnameable:
                continue  # a walk may meet a task twice
            try:
                self.ids[validation.task_id(status.id)] = None
            except InvalidInputError:
                self.unnameable.add(status.id)
                continue
            if len(self.shown) < self.sample:
                self.shown.append(status)
        if self.on_page is not None:
            self.on_page(page)
        within = self.most_scanned is None or self.looked < self.most_scanned
        return page.cursor is not None and within

    def selection(self, cursor: str | None) -> MatchSelection:
        return MatchSelection(
            list(self.ids), self.shown, self.scanned, cursor is None, len(self.unnameable)
        )


def select_matching(
    queue: Searchable,
    criteria: TaskSearch,
    *,
    most_scanned: int | None = None,
    sample: int = 20,
    budget: int = DEFAULT_BUDGET,
    on_page: Callable[[SearchPage], None] | None = None,
) -> MatchSelection:
    """Every task ``criteria`` match, walking the whole queue ``budget`` entries per
    call (or until ``most_scanned`` were looked at); ``on_page`` hears of each call."""
    collecting = _Collecting(sample, most_scanned, on_page)
    cursor: str | None = None
    while True:
        asked = collecting.budget(budget)
        page = queue.search(criteria, cursor=cursor, budget=asked, limit=MOST_LIMIT)
        cursor = page.cursor
        if not collecting.add(page, asked):
            return collecting.selection(cursor)


async def select_matching_async(
    queue: AsyncSearchable,
    criteria: TaskSearch,
    *,
    most_scanned: int | None = None,
    sample: int = 20,
    budget: int = DEFAULT_BUDGET,
    on_page: Callable[[SearchPage], None] | None = None,
) -> MatchSelection:
    """``select_matching`` for an ``AsyncQueue``."""
    collecting = _Collecting(sample, most_scanned, on_page)
    cursor: str | None = None
    while True:
        asked = collecting.budget(budget)
        page = await queue.search(criteria, cursor=cursor, budget=asked, limit=MOST_LIMIT)
        cursor = page.cursor
        if not collecting.add(page, asked):
            return collecting.selection(cursor)
