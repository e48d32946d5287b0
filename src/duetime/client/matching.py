"""Choosing the tasks a bulk action takes by a search: walk it to its end (or a bound),
keep every match once, and sort them by state into those the action takes (by default
every task that has not started: scheduled, ready, or due and waiting under flow control
for its turn or a limit) and those it leaves alone (running, dead), so that what an
action will not touch is said, never a silent 0. Built on ``search`` alone, so a
dashboard and the CLI choose the same tasks the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol

from duetime import validation
from duetime.client.models import TaskStatus
from duetime.client.searching import (
    DEFAULT_BUDGET,
    MOST_LIMIT,
    SEARCH_STATES,
    WAITING,
    SearchPage,
    TaskSearch,
)
from duetime.errors import InvalidInputError
from duetime.states import TaskState

#: The states a bulk action chosen by a search takes unless told: every task that has
#: not started (ready includes the due tasks waiting under flow control).
NOT_STARTED = (TaskState.SCHEDULED, TaskState.READY)


def state_of(status: TaskStatus) -> str:
    """A task's state as a bulk action tells it: ``waiting`` for a ready task that waits
    under flow control, else its state."""
    return WAITING if status.waiting_for is not None else str(status.state)


def in_states(status: TaskStatus, states: Collection[str]) -> bool:
    """Whether a task is in one of ``states`` (``ready`` takes the waiting ones too)."""
    kind = state_of(status)
    return kind in states or (kind == WAITING and TaskState.READY in states)


def counted(counts: dict[str, int]) -> str:
    """``{"running": 2, "dead": 1}`` as ``1 dead, 2 running``."""
    return ", ".join(f"{count:,} {name}" for name, count in sorted(counts.items()))


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
    the bulk actions would refuse: they are left out of ``ids``. With ``states`` asked,
    ``ids`` are the matches in those states, ``chosen`` counts them by state (``waiting``
    apart from ``ready``: see ``state_of``) and ``left_alone`` counts the other matches by
    state, so that a selection says what it will not touch and why."""

    ids: list[str]
    sample: list[TaskStatus]
    scanned: int
    complete: bool
    unnameable: int = 0
    chosen: dict[str, int] = field(default_factory=dict)
    left_alone: dict[str, int] = field(default_factory=dict)

    @property
    def matched(self) -> int:
        """Every match: chosen, left alone for its state, or with an id not accepted."""
        return len(self.ids) + sum(self.left_alone.values()) + self.unnameable


def states_for(action: str, state: str | None) -> tuple[str, ...]:
    """The states the tasks a bulk ``action`` chosen by a search takes: ``state`` when
    given (``running`` for a cancel only: their workers are asked to stop them), else
    every task that has not started (``NOT_STARTED``)."""
    if state is None:
        return NOT_STARTED
    if state == TaskState.DEAD:
        raise InvalidInputError(
            "a bulk action takes tasks that have not started: dead tasks are requeued or "
            "purged (duetime dead requeue, duetime dead purge)"
        )
    if state == TaskState.RUNNING and action != "cancel":
        raise InvalidInputError(
            "only a cancel takes running tasks (their workers stop them); a reschedule or "
            "run now takes tasks that have not started: scheduled, ready or waiting"
        )
    if state not in SEARCH_STATES:
        states = ", ".join(s for s in SEARCH_STATES if s != TaskState.DEAD)
        raise InvalidInputError(f"state must be one of {states}, got {validation.shown(state)}")
    return (state,)


@dataclass
class _Collecting:
    sample: int
    most_scanned: int | None
    on_page: Callable[[SearchPage], None] | None
    states: Collection[str] | None
    ids: dict[str, None] = field(default_factory=dict)  # ordered, once each
    shown: list[TaskStatus] = field(default_factory=list)
    scanned: int = 0
    looked: int = 0
    unnameable: set[str] = field(default_factory=set)
    met: set[str] = field(default_factory=set)  # every match, chosen or left alone
    chosen: dict[str, int] = field(default_factory=dict)
    left_alone: dict[str, int] = field(default_factory=dict)

    def budget(self, per_call: int) -> int:
        if self.most_scanned is None:
            return per_call
        return max(1, min(per_call, self.most_scanned - self.looked))

    def add(self, page: SearchPage, budget: int) -> bool:
        """Take a page in; True while the walk should go on."""
        self.scanned += page.scanned
        self.looked += budget
        for status in page.tasks:
            if status.id in self.met:
                continue  # a walk may meet a task twice
            self.met.add(status.id)
            kind = state_of(status)
            if self.states is not None and not in_states(status, self.states):
                self.left_alone[kind] = self.left_alone.get(kind, 0) + 1
                continue
            try:
                self.ids[validation.task_id(status.id)] = None
            except InvalidInputError:
                self.unnameable.add(status.id)
                continue
            self.chosen[kind] = self.chosen.get(kind, 0) + 1
            if len(self.shown) < self.sample:
                self.shown.append(status)
        if self.on_page is not None:
            self.on_page(page)
        within = self.most_scanned is None or self.looked < self.most_scanned
        return page.cursor is not None and within

    def selection(self, cursor: str | None) -> MatchSelection:
        return MatchSelection(
            list(self.ids),
            self.shown,
            self.scanned,
            cursor is None,
            len(self.unnameable),
            self.chosen,
            self.left_alone,
        )


def _checked_states(criteria: TaskSearch, states: Collection[str] | None) -> None:
    if states is None:
        return
    unknown = [state for state in states if state not in SEARCH_STATES]
    if unknown or isinstance(states, str):
        raise InvalidInputError(
            f"states must be some of {', '.join(SEARCH_STATES)}, got {validation.shown(states)}"
        )
    if criteria.state is not None:
        raise InvalidInputError(
            "give the states in states, not in the search: the search then finds every "
            "match, and the selection says how many it leaves alone"
        )


def select_matching(
    queue: Searchable,
    criteria: TaskSearch,
    *,
    most_scanned: int | None = None,
    sample: int = 20,
    budget: int = DEFAULT_BUDGET,
    on_page: Callable[[SearchPage], None] | None = None,
    states: Collection[str] | None = None,
) -> MatchSelection:
    """Every task ``criteria`` match, walking the whole queue ``budget`` entries per
    call (or until ``most_scanned`` were looked at); ``on_page`` hears of each call.
    ``states`` (e.g. ``NOT_STARTED``; the search itself then gives no state): only the
    matches in those states are chosen, the others counted in ``left_alone``."""
    _checked_states(criteria, states)
    collecting = _Collecting(sample, most_scanned, on_page, states)
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
    states: Collection[str] | None = None,
) -> MatchSelection:
    """``select_matching`` for an ``AsyncQueue``."""
    _checked_states(criteria, states)
    collecting = _Collecting(sample, most_scanned, on_page, states)
    cursor: str | None = None
    while True:
        asked = collecting.budget(budget)
        page = await queue.search(criteria, cursor=cursor, budget=asked, limit=MOST_LIMIT)
        cursor = page.cursor
        if not collecting.add(page, asked):
            return collecting.selection(cursor)
