"""Choosing dead tasks by what they are: the filters behind ``duetime dead list``,
``requeue`` and ``purge``, kept apart from the command so that other front ends (a
dashboard) choose the same tasks the same way.

Built on the public queue API only: ``dead_tasks(limit, offset)`` pages through the
dead-letter set, most recent death first, and ``requeue_dead(ids)`` / ``purge_dead(ids)``
act on ids. Paging by offset is sound only while the set holds still, so a caller that
changes it collects the matching ids first (``select_dead``), then acts on them in
batches (``in_batches``): one script call per batch, never one call for everything.
Each has an asyncio twin, named with ``_async``, for an ``AsyncQueue``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from duetime.client.models import DeadTask
from duetime.errors import InvalidInputError, InvalidNameError
from duetime.validation import task_id

#: Dead tasks read per ``dead_tasks`` call while scanning (the call takes up to 10,000).
PAGE_SIZE = 1000
#: Ids per ``requeue_dead`` / ``purge_dead`` call: one script call each, short enough
#: not to hold the server for long.
BATCH_SIZE = 1000


class DeadLetters(Protocol):
    """What a scan needs of a queue: ``duetime.Queue`` has it."""

    def dead_tasks(self, limit: int = ..., offset: int = ...) -> list[DeadTask]: ...


class AsyncDeadLetters(Protocol):
    """What an asynchronous scan needs of a queue: ``duetime.AsyncQueue`` has it."""

    async def dead_tasks(self, limit: int = ..., offset: int = ...) -> list[DeadTask]: ...


@dataclass(frozen=True, slots=True)
class DeadFilter:
    """Which dead tasks to take. Every criterion given must hold; with none, every dead
    task matches.

    ``task`` is the handler name, exactly ("" for the default handler); ``error`` a part
    of the last error message, in any case; ``since`` and ``until`` bound the time of
    death (epoch seconds, both included); ``ids`` the task ids to consider.
    """

    task: str | None = None
    error: str | None = None
    since: float | None = None
    until: float | None = None
    ids: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.since is not None and self.until is not None and self.since > self.until:
            raise InvalidInputError(
                "the time range is empty: since is later than until (swap them?)"
            )

    @property
    def selects_everything(self) -> bool:
        """True when no criterion is given."""
        return (self.task, self.error, self.since, self.until, self.ids) == (None,) * 5

    def matches(self, dead: DeadTask) -> bool:
        """Whether ``dead`` meets every criterion."""
        return (
            (self.ids is None or dead.id in self.ids)
            and (self.task is None or (dead.task or "") == self.task)
            and (self.error is None or self.error.casefold() in dead.error.casefold())
            and (self.since is None or dead.died_at >= self.since)
            and (self.until is None or dead.died_at <= self.until)
        )


@dataclass
class _Scan:
    """The state of one pass over the dead-letter set, shared by both flavours."""

    chosen: DeadFilter
    page_size: int
    seen: set[str] = field(default_factory=set)
    offset: int = 0
    done: bool = False

    def take(self, page: list[DeadTask]) -> list[DeadTask]:
        """The matches in ``page``; sets ``done`` once no later page can match."""
        found = []
        for dead in page:
            if self.chosen.since is not None and dead.died_at < self.chosen.since:
                self.done = True  # newest first: everything after this died earlier still
                break
            # A task that dies meanwhile shifts the offsets by one: a task seen on the
            # previous page comes again on this one.
            if dead.id in self.seen:
                continue
            self.seen.add(dead.id)
            if self.chosen.matches(dead):
                found.append(dead)
        self.offset += len(page)
        if len(page) < self.page_size or (
            self.chosen.ids is not None and self.seen >= self.chosen.ids
        ):
            self.done = True
        return found


def _checked_page_size(page_size: int) -> int:
    if not 1 <= page_size <= 10_000:
        raise InvalidInputError(f"page_size must be from 1 to 10000, got {page_size}")
    return page_size


def dead_matching(
    queue: DeadLetters,
    chosen: DeadFilter,
    *,
    page_size: int = PAGE_SIZE,
    on_page: Callable[[int], None] | None = None,
) -> Iterator[DeadTask]:
    """The dead tasks that match ``chosen``, most recent death first, read ``page_size``
    at a time; ``on_page`` is told how many were read after each page.

    Do not requeue or purge while iterating: that shifts the offsets of the pages still
    to come. Collect the ids first (``select_dead``).
    """
    scan = _Scan(chosen, _checked_page_size(page_size))
    while not scan.done:
        page = queue.dead_tasks(page_size, scan.offset)
        yield from scan.take(page)
        if on_page is not None:
            on_page(len(page))


async def dead_matching_async(
    queue: AsyncDeadLetters,
    chosen: DeadFilter,
    *,
    page_size: int = PAGE_SIZE,
    on_page: Callable[[int], None] | None = None,
) -> AsyncIterator[DeadTask]:
    """``dead_matching`` for an ``AsyncQueue``."""
    scan = _Scan(chosen, _checked_page_size(page_size))
    while not scan.done:
        page = await queue.dead_tasks(page_size, scan.offset)
        for dead in scan.take(page):
            yield dead
        if on_page is not None:
            on_page(len(page))


@dataclass(frozen=True, slots=True)
class DeadSelection:
    """The outcome of a scan: the ids to act on, a few of the tasks to show, and how
    many matched but carry an id duetime does not accept (written by hand), which the
    id-taking calls would refuse: they are left out of ``ids``."""

    ids: list[str]
    sample: list[DeadTask]
    unnameable: int = 0


@dataclass
class _Picking:
    """A selection being collected, shared by both flavours of ``select_dead``."""

    sample: int
    ids: list[str] = field(default_factory=list)
    shown: list[DeadTask] = field(default_factory=list)
    unnameable: int = 0

    def add(self, dead: DeadTask) -> None:
        try:
            self.ids.append(task_id(dead.id))
        except InvalidNameError:
            self.unnameable += 1
            return
        if len(self.shown) < self.sample:
            self.shown.append(dead)

    def picked(self) -> DeadSelection:
        return DeadSelection(self.ids, self.shown, self.unnameable)


def select_dead(
    queue: DeadLetters,
    chosen: DeadFilter,
    *,
    sample: int = 20,
    page_size: int = PAGE_SIZE,
    on_page: Callable[[int], None] | None = None,
) -> DeadSelection:
    """Every matching id (strings only, so 100,000 of them stay small), and the first
    ``sample`` matching tasks in full."""
    picking = _Picking(sample)
    for dead in dead_matching(queue, chosen, page_size=page_size, on_page=on_page):
        picking.add(dead)
    return picking.picked()


async def select_dead_async(
    queue: AsyncDeadLetters,
    chosen: DeadFilter,
    *,
    sample: int = 20,
    page_size: int = PAGE_SIZE,
    on_page: Callable[[int], None] | None = None,
) -> DeadSelection:
    """``select_dead`` for an ``AsyncQueue``."""
    picking = _Picking(sample)
    async for dead in dead_matching_async(queue, chosen, page_size=page_size, on_page=on_page):
        picking.add(dead)
    return picking.picked()


def in_batches(
    ids: Sequence[str],
    action: Callable[[list[str]], int],
    *,
    batch_size: int = BATCH_SIZE,
    on_batch: Callable[[int], None] | None = None,
) -> int:
    """Apply ``action`` (e.g. ``queue.requeue_dead``) to ``ids``, ``batch_size`` at a
    time; returns the sum of what it returned (how many it acted on). ``on_batch`` is
    told the size of each batch once it is done."""
    total = 0
    for batch in _batches(ids, batch_size):
        total += action(batch)
        if on_batch is not None:
            on_batch(len(batch))
    return total


async def in_batches_async(
    ids: Sequence[str],
    action: Callable[[list[str]], Awaitable[int]],
    *,
    batch_size: int = BATCH_SIZE,
    on_batch: Callable[[int], None] | None = None,
) -> int:
    """``in_batches`` for an ``AsyncQueue`` (e.g. ``queue.requeue_dead``)."""
    total = 0
    for batch in _batches(ids, batch_size):
        total += await action(batch)
        if on_batch is not None:
            on_batch(len(batch))
    return total


def _batches(ids: Sequence[str], batch_size: int) -> Iterator[list[str]]:
    if batch_size < 1:
        raise InvalidInputError(f"batch_size must be at least 1, got {batch_size}")
    for start in range(0, len(ids), batch_size):
        yield list(ids[start : start + batch_size])
