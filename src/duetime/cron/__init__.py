"""Recurring jobs: the definition, its validation, its ticks and their jitter, and the
task each tick becomes.

A tick is one instant at which a job fires: a cron expression's (on its zone's wall
clock, see ``duetime.cron.ticks`` for the daylight-saving rules) or an interval's (``every``,
from an anchor). Each becomes an ordinary task with the deterministic id
``cron:<name>:<tick ms>``, so however many dispatchers fire the same tick, one task
exists. With a ``jitter`` window a tick's task runs at the tick plus a deterministic
offset, below the window and below the gap to the next tick (so runs keep their order);
never before the tick. A job's ticks lie within its ``start`` and ``end`` (both
included). Which due ticks fire (missed-tick policy, catch-up window) is
``duetime.cron.firing``'s.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, cast
from zoneinfo import ZoneInfo

from duetime import codec, flow, validation
from duetime.cron import options as cron_options
from duetime.cron import ticks
from duetime.errors import InvalidInputError

MissedPolicy = Literal["skip", "once", "all"]
OverlapPolicy = Literal["allow", "skip", "delay"]
MISSED_POLICIES = cron_options.MISSED_POLICIES
OVERLAP_POLICIES = cron_options.OVERLAP_POLICIES

#: Kept for callers of the earlier module: the aliases of cron expressions.
ALIASES = ticks.ALIASES

#: A cron task's outcome (a tick's, or a triggered run's) is kept this long, so that
#: `cron list` can show the last run.
RESULT_TTL_MS = 3600 * 1000


@dataclass(frozen=True, slots=True)
class CronJob:
    """A recurring job as declared; immutable, compared whole to detect changes."""

    name: str
    expression: str  # "" for an interval schedule (every_ms)
    data: Any
    timezone: str = "UTC"
    task: str = ""
    missed: MissedPolicy = "skip"
    overlap: OverlapPolicy = "allow"
    max_attempts: int = 5
    timeout_ms: int = 300_000
    #: Flow control of its ticks (docs/flow.md); defaults: none.
    priority: int = 0
    limit_key: str | None = None
    cost: int = 1
    #: The schedule's options (docs/cron.md); defaults: none. Any of them is stored in
    #: definition format 3.
    every_ms: int = 0  # an interval schedule: ticks every this many ms from its anchor
    catch_up_ms: int | None = None  # due ticks older than this are skipped, counted
    jitter_ms: int = 0  # each tick's run is put off by a deterministic offset below this
    start_ms: int | None = None  # no tick before (an interval's anchor; else the epoch)
    end_ms: int | None = None  # no tick after
    max_runs: int | None = None  # the job ends after this many ticks fired
    pause_after_failures: int | None = None  # paused after this many failed runs in a row

    @property
    def flow_record(self) -> str:
        """Its ticks' flow record ("" for none: priority 0, cost 1, no limit key)."""
        return flow.flow_record(self.priority, self.cost, self.limit_key)

    @property
    def has_schedule_options(self) -> bool:
        return bool(
            self.every_ms
            or self.jitter_ms
            or self.catch_up_ms is not None
            or self.start_ms is not None
            or self.end_ms is not None
            or self.max_runs is not None
            or self.pause_after_failures is not None
        )

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def wildcard_hour(self) -> bool:
        return bool(self.expression) and ticks.wildcard_hour(self.expression)

    @property
    def keeps_state(self) -> bool:
        """Whether firing it keeps a count of its runs and failures (``cron_state``)."""
        return self.max_runs is not None or self.pause_after_failures is not None

    def ticks_after(self, after_ms: int) -> Iterator[int]:
        """Tick instants (ms) strictly after ``after_ms``, in order, within start and end."""
        if self.start_ms is not None:
            after_ms = max(after_ms, self.start_ms - 1)
        if self.every_ms:
            series = ticks.interval_ticks_after(self.every_ms, self.start_ms or 0, after_ms)
        else:
            series = ticks.cron_ticks_after(self.expression, self.zone, after_ms)
        for tick in series:
            if self.end_ms is not None and tick > self.end_ms:
                return
            yield tick

    def next_tick(self, after_ms: int) -> int | None:
        return next(self.ticks_after(after_ms), None)

    def run_at(self, tick_ms: int, following_ms: int | None) -> int:
        """When the run of ``tick_ms`` is due: the tick plus its jitter offset, which
        stays below the gap to the ``following_ms`` tick (None: no later tick)."""
        if not self.jitter_ms:
            return tick_ms
        window = self.jitter_ms
        if following_ms is not None:
            window = min(window, following_ms - tick_ms)
        return tick_ms + ticks.jitter_offset(self.name, tick_ms, window)

    @property
    def schedule_key(self) -> tuple[str, str, int, int | None, int | None]:
        """What its ticks depend on (not its name or data): jobs that share it share
        their ticks, which are computed once for all of them (caches below)."""
        return (self.expression, self.timezone, self.every_ms, self.start_ms, self.end_ms)

    def first_run_after(self, after_ms: int) -> int | None:
        """The due time (tick plus jitter) of the first tick after ``after_ms``: a newly
        declared or resumed job's next score; None when it never fires again."""
        upcoming = _upcoming(*self.schedule_key, after_ms)
        if not upcoming:
            return None
        return self.run_at(upcoming[0], upcoming[1] if len(upcoming) > 1 else None)

    def tick_of(self, due_ms: int) -> int:
        """The tick whose run is due at ``due_ms`` (a job's stored score): the last tick
        not after it, since a tick's offset stays below the gap to the next one."""
        if not self.jitter_ms:
            return due_ms
        if self.every_ms:
            anchor = self.start_ms or 0
            return anchor + max(due_ms - anchor, 0) // self.every_ms * self.every_ms
        # The tick lies in (due - jitter, due]; ticks are read a window at a time, one
        # window shared by the jobs of a schedule due about then.
        low = (due_ms - self.jitter_ms) // self.jitter_ms * self.jitter_ms
        near = _ticks_between(*self.schedule_key, low, low + 2 * self.jitter_ms)
        index = bisect.bisect_right(near, due_ms)
        return near[index - 1] if index else due_ms

    def upcoming(self, first_due_ms: int, count: int) -> list[int]:
        """The due times of the tick due at ``first_due_ms`` and of up to ``count`` - 1
        after it."""
        tick = self.tick_of(first_due_ms)
        series = [tick, *_take(self.ticks_after(tick), count)]
        return [
            self.run_at(tick, series[i + 1] if i + 1 < len(series) else None)
            for i, tick in enumerate(series[:count])
        ]

    def tick_id(self, tick_ms: int) -> str:
        return tick_id(self.name, tick_ms)


@lru_cache(maxsize=4096)
def _upcoming(
    expression: str,
    timezone: str,
    every_ms: int,
    start_ms: int | None,
    end_ms: int | None,
    after_ms: int,
) -> tuple[int, ...]:
    """The first two ticks after ``after_ms`` of a schedule (``CronJob.schedule_key``)."""
    schedule = CronJob("", expression, None, timezone, every_ms=every_ms, start_ms=start_ms,
                       end_ms=end_ms)  # fmt: skip
    return tuple(_take(schedule.ticks_after(after_ms), 2))


@lru_cache(maxsize=256)
def _ticks_between(
    expression: str,
    timezone: str,
    every_ms: int,
    start_ms: int | None,
    end_ms: int | None,
    low_ms: int,
    high_ms: int,
) -> tuple[int, ...]:
    """A schedule's ticks in (``low_ms``, ``high_ms``]."""
    schedule = CronJob("", expression, None, timezone, every_ms=every_ms, start_ms=start_ms,
                       end_ms=end_ms)  # fmt: skip
    found = []
    for tick in schedule.ticks_after(low_ms):
        if tick > high_ms:
            break
        found.append(tick)
    return tuple(found)


def _take(iterator: Iterator[int], count: int) -> list[int]:
    taken: list[int] = []
    for item in iterator:
        if len(taken) >= count:
            break
        taken.append(item)
    return taken


def define(
    name: str,
    expression: str | None,
    data: Any,
    *,
    timezone: str = "UTC",
    task: str = "",
    missed: str = "skip",
    overlap: str = "allow",
    max_attempts: int = 5,
    timeout: float = 300.0,
    max_payload_bytes: int = 512 * 1024,
    priority: int = 0,
    limit_key: str | None = None,
    cost: int = 1,
    **schedule: Any,
) -> CronJob:
    """Validate a declaration completely; raises InvalidInputError before anything is
    stored. ``schedule`` holds the schedule's options: ``every``, ``catch_up``,
    ``jitter``, ``start``, ``end``, ``max_runs``, ``pause_after_failures``."""
    validation.cron_name(name)
    options = cron_options.schedule_options(schedule)
    cron_options.check_timetable(name, expression, options["every_ms"], timezone)
    cron_options.check_policies(missed, overlap)
    packed = codec.pack(data)
    validation.payload(data, len(packed), max_payload_bytes, packed)
    flow.checked_record(priority, limit_key, cost)
    job = CronJob(
        name, expression or "", data, timezone, task,
        cast(MissedPolicy, missed), cast(OverlapPolicy, overlap),
        validation.attempts(max_attempts),
        validation.milliseconds(timeout, "timeout"),
        priority, limit_key, cost, **options,
    )  # fmt: skip
    # Checked from the start of this minute, so that jobs declared together share the
    # work (a tick left in this minute is checked again when the job is stored).
    if not _upcoming(*job.schedule_key, ticks.now_ms() // 60_000 * 60_000):
        if job.end_ms is not None:
            raise InvalidInputError(
                f"cron job {name!r} never fires again: its end "
                f"({validation.shown(schedule.get('end'))}) is before its next tick"
            )
        raise InvalidInputError(
            f"cron expression {validation.shown(expression)} never fires (e.g. February 30)"
        )
    return job


# --- a cron job's tasks --------------------------------------------------------------


def task_of(job: CronJob, run_at_ms: float) -> codec.Envelope:
    """The task a run of ``job`` at ``run_at_ms`` is: the job's handler, data, attempts and
    timeout, its outcome kept ``RESULT_TTL_MS``. A run triggered now (the client's
    ``trigger_cron``); a tick's task is ``CronTemplate.tick_task``'s, the same task."""
    return codec.Envelope(
        job.task, job.data, run_at_ms, job.max_attempts, job.timeout_ms, RESULT_TTL_MS
    )


def tick_id(name: str, tick_ms: int) -> str:
    """A tick's task id: deterministic, so that however many dispatchers fire the tick,
    one task exists."""
    return f"cron:{name}:{tick_ms}"


def tick_of_task(task_id: str) -> int | None:
    """The tick (ms) in a tick task's id, or None for another id."""
    prefix, _, tick = task_id.rpartition(":")
    return int(tick) if prefix.startswith("cron:") and validation.is_whole(tick) else None
