"""What each page shows, read through the public ``AsyncQueue`` API and shaped for the
templates: queue cards with their throughput chart, the timeline of scheduled tasks,
searches over task listings (bounded, and saying so), running tasks with their workers'
heartbeats, and dead tasks chosen by ``duetime.client.selection`` filters (workers by
queue are ``workers_view``).

Nothing here writes; the actions live in ``app``. Every scan has a bound so that one page
view costs a bounded amount of Redis work, and every bounded result says it was bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from markupsafe import Markup

from duetime import (
    AsyncQueue,
    DeadTask,
    MinuteFigures,
    QueueStats,
    TaskSummary,
)
from duetime.client import (
    LISTED_STATES,
    DeadFilter,
    DeadSelection,
    dead_matching_async,
    in_batches_async,
    select_dead_async,
)
from duetime.dashboard.charts import Chart, Column, Series, render_svg
from duetime.dashboard.flow_view import Waits, window_waits
from duetime.store.plans.flow_control import FlowState

#: Tasks shown per page of a listing.
PAGE_SIZE = 50
#: Most tasks a filtered search reads (one ``tasks`` call): beyond that it says so.
SEARCH_SCAN = 5_000
#: Most scheduled tasks the timeline reads.
TIMELINE_SCAN = 10_000
#: Most running tasks the running and workers pages read.
RUNNING_SCAN = 1_000
#: Page size of dead-letter scans.
DEAD_PAGE = 1_000

STATES: tuple[str, ...] = tuple(str(state) for state in LISTED_STATES)

THROUGHPUT_SERIES = (
    Series("completed", "ok"),
    Series("retried", "warn"),
    Series("dead", "bad"),
)


# --- the overview ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueCard:
    """One queue on the overview."""

    stats: QueueStats
    chart: Markup
    completed: int  # in the chart's window
    retried: int
    dead: int
    waits: Waits  # late and held, over the completed attempts of the window
    flow: FlowState  # its flow control's totals (no limit keys read)


def throughput_chart(figures: Sequence[MinuteFigures]) -> Chart:
    """Per-minute completed / retried / dead attempts, oldest minute first."""
    columns = [
        Column(
            datetime.fromtimestamp(minute.start, UTC).strftime("%H:%M UTC"),
            (float(minute.completed), float(minute.retried), float(minute.dead)),
        )
        for minute in figures
    ]
    # Column i is the minute that started len - 1 - i minutes before the current one.
    last = len(columns) - 1
    ticks = [(0, f"-{len(columns)} min" if len(columns) != 60 else "-1 h")]
    if last >= 30:
        ticks.append((last - 30, "-30 min"))
    ticks.append((last, "now"))
    return Chart("attempts per minute", THROUGHPUT_SERIES, columns, ticks, "no attempts finished")


async def queue_card(queue: AsyncQueue) -> QueueCard:
    stats, figures, flow = await asyncio.gather(
        queue.stats(), queue.throughput(60), queue.flow(most_keys=0)
    )
    completed = sum(minute.completed for minute in figures)
    return QueueCard(
        stats=stats,
        chart=render_svg(throughput_chart(figures)),
        completed=completed,
        retried=sum(minute.retried for minute in figures),
        dead=sum(minute.dead for minute in figures),
        waits=window_waits(figures),
        flow=flow,
    )


# --- the timeline ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Window:
    name: str
    seconds: float
    buckets: int
    tick_every: int  # a label under every this many buckets
    tick_unit: float  # seconds a label counts in
    unit_name: str


WINDOWS: Mapping[str, Window] = {
    "hour": Window("hour", 3600, 60, 15, 60, "min"),
    "day": Window("day", 86_400, 96, 24, 3600, "h"),
}


@dataclass(frozen=True, slots=True)
class Timeline:
    window: Window
    start: float
    chart: Markup
    in_window: int
    overdue: int  # first attempts past their run-at, not yet promoted
    retries: int  # of those found, failed attempts waiting out a back-off
    upcoming: list[TaskSummary]  # the first ones in the window
    scanned: int
    complete: bool  # False: the scan stopped at TIMELINE_SCAN before the window's end
    total: int  # scheduled tasks in the queue


async def _scheduled_until(queue: AsyncQueue, end: float) -> tuple[list[TaskSummary], bool]:
    """Scheduled tasks in serving order until one is due after ``end`` (then the rest
    are too), reading at most TIMELINE_SCAN; True when it got that far."""
    found: list[TaskSummary] = []
    limit = 1000
    while len(found) < TIMELINE_SCAN:
        page = await queue.tasks("scheduled", min(limit, TIMELINE_SCAN - len(found)), len(found))
        found += page
        # Ordered by due time: one past the end means every later task is past it too.
        past_end = any((t.due_at or 0) > end for t in page)
        if past_end or len(page) < limit:
            return found, True
        limit = min(limit * 2, 5000)
    return found, False


async def timeline(queue: AsyncQueue, window: Window, now: float) -> Timeline:
    end = now + window.seconds
    found, complete = await _scheduled_until(queue, end)
    total = (await queue.stats()).scheduled
    size = window.seconds / window.buckets
    counts = [0] * window.buckets
    overdue = retries = 0
    upcoming: list[TaskSummary] = []
    for task in found:
        due_at = task.due_at or 0.0  # a retry's is after its back-off, not its run-at
        retries += task.attempts > 0
        if due_at <= now:
            overdue += 1
        elif due_at <= end:
            counts[min(int((due_at - now) / size), window.buckets - 1)] += 1
            if len(upcoming) < 25:
                upcoming.append(task)
    columns = [
        Column(
            "from "
            + datetime.fromtimestamp(now + i * size, UTC).strftime("%H:%M UTC")
            + f" ({size / 60:g} min)",
            (float(count),),
        )
        for i, count in enumerate(counts)
    ]
    ticks = [(0, "now")]
    for i in range(window.tick_every, window.buckets, window.tick_every):
        ticks.append((i, f"+{i * size / window.tick_unit:g} {window.unit_name}"))
    ticks.append((window.buckets - 1, f"+{window.seconds / window.tick_unit:g} {window.unit_name}"))
    chart = Chart(
        f"tasks due in the next {window.name}", (Series("due", "due"),), columns, ticks,
        f"no task due in the next {window.name}",
    )  # fmt: skip
    # Wider than the overview's chart: it spans the page, and its text stays the same size.
    drawn = render_svg(chart, width=1200, height=200)
    return Timeline(
        window, now, drawn, sum(counts), overdue, retries, upcoming, len(found), complete, total
    )


# --- browsing and searching --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskQuery:
    """A listing of one state, optionally narrowed: exact handler name, id prefix, a
    part of the last error (in any case)."""

    state: str = "scheduled"
    task: str = ""
    id_prefix: str = ""
    error: str = ""
    page: int = 0

    @property
    def filtered(self) -> bool:
        return bool(self.task or self.id_prefix or self.error)

    def matches(self, task: TaskSummary) -> bool:
        return (
            (not self.task or (task.task or "") == self.task)
            and task.id.startswith(self.id_prefix)
            and (not self.error or self.error.casefold() in (task.error or "").casefold())
        )


@dataclass(frozen=True, slots=True)
class TaskPage:
    tasks: list[TaskSummary]
    total: int  # tasks in the state
    has_next: bool
    counts: dict[str, int]  # tasks in each listed state
    scanned: int | None = None  # a search: how many tasks it read
    matched: int | None = None  # a search: how many of those matched
    bounded: bool = False  # a search that did not read every task of the state


def _counts(stats: QueueStats) -> dict[str, int]:
    counts = {"scheduled": stats.scheduled, "ready": stats.ready}
    return counts | {"running": stats.running, "dead": stats.dead}


async def browse(queue: AsyncQueue, query: TaskQuery) -> TaskPage:
    counts = _counts(await queue.stats())
    total = counts[query.state]
    start = query.page * PAGE_SIZE
    if not query.filtered:
        found = await queue.tasks(query.state, PAGE_SIZE + 1, start)
        return TaskPage(found[:PAGE_SIZE], total, len(found) > PAGE_SIZE, counts)
    listed = await queue.tasks(query.state, SEARCH_SCAN)
    matches = [task for task in listed if query.matches(task)]
    return TaskPage(
        matches[start : start + PAGE_SIZE], total, len(matches) > start + PAGE_SIZE, counts,
        scanned=len(listed), matched=len(matches),
        bounded=len(listed) >= SEARCH_SCAN and total > len(listed),
    )  # fmt: skip


async def running_entry(queue: AsyncQueue, task_id: str) -> TaskSummary | None:
    """A running task's listing entry (its worker and lease), if among the first read."""
    for task in await queue.tasks("running", RUNNING_SCAN):
        if task.id == task_id:
            return task
    return None


# --- running tasks -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunningTask:
    task: TaskSummary
    heartbeat_age: float | None  # None: the worker is not registered (any more)


@dataclass(frozen=True, slots=True)
class Running:
    tasks: list[RunningTask]
    total: int
    stats: QueueStats


async def running(queue: AsyncQueue) -> Running:
    stats, listed = await asyncio.gather(queue.stats(), queue.tasks("running", RUNNING_SCAN))
    rows = [RunningTask(task, stats.workers.get(task.worker or "")) for task in listed]
    return Running(rows, stats.running, stats)


# --- dead tasks --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeadPage:
    tasks: list[DeadTask]
    total: int
    has_next: bool
    scanned: int | None = None
    matched: int | None = None
    bounded: bool = False


async def dead_page(queue: AsyncQueue, chosen: DeadFilter, page: int) -> DeadPage:
    total = (await queue.stats()).dead
    start = page * PAGE_SIZE
    if chosen.selects_everything:
        found = await queue.dead_tasks(PAGE_SIZE + 1, start)
        return DeadPage(found[:PAGE_SIZE], total, len(found) > PAGE_SIZE)
    read = 0

    def count(size: int) -> None:
        nonlocal read
        read += size

    matches: list[DeadTask] = []
    # An async generator (annotated as an iterator): closed at once when left early.
    scan = cast(
        AsyncGenerator[DeadTask, None],
        dead_matching_async(queue, chosen, page_size=DEAD_PAGE, on_page=count),
    )
    async with aclosing(scan) as found_tasks:
        async for dead in found_tasks:
            matches.append(dead)
            if read >= SEARCH_SCAN:
                break
    return DeadPage(
        matches[start : start + PAGE_SIZE], total, len(matches) > start + PAGE_SIZE,
        scanned=read, matched=len(matches), bounded=read >= SEARCH_SCAN and total > read,
    )  # fmt: skip


async def dead_ids(queue: AsyncQueue, chosen: DeadFilter) -> DeadSelection:
    """Every matching dead task's id (an action acts on all of them, so no bound), the
    first 20 in full to show, and how many carry an id the API refuses (written by hand),
    which are left out: ``selection.select_dead``, awaited."""
    return await select_dead_async(queue, chosen, page_size=DEAD_PAGE)


async def act_on_dead(queue: AsyncQueue, action: str, ids: Sequence[str] | None) -> int:
    """Requeue or delete (purge) dead tasks: the given ids in batches, or all when None."""
    step = queue.requeue_dead if action == "requeue" else queue.purge_dead
    if ids is None:
        return await step(None)
    return await in_batches_async(ids, step)
