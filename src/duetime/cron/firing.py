"""Which of a job's due ticks a dispatcher fires at a given moment: the ticks whose run
is due (the tick plus its jitter), less those older than the job's catch-up window
(skipped, and counted), then the missed-tick policy over the rest.

The latest due tick is the *current* one and earlier due ticks were *missed* (every
dispatcher was down, or the one firing the job was held up past them). ``skip`` fires
the current tick only, ``once`` the latest missed one too, ``all`` every missed one (at
most ``MAX_CATCH_UP``, the latest). With a catch-up window, a tick whose run was due
more than the window before now is skipped whatever the policy, the current one
included: a daily 09:00 report with ``catch_up=1h`` does not run at 15:00 after an
outage.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import lru_cache

from duetime.cron import CronJob

#: With missed="all", at most this many missed ticks (the latest) are fired on catch-up.
MAX_CATCH_UP = 100


@dataclass(frozen=True, slots=True)
class TickPlan:
    """What to fire for one job at one moment."""

    ticks: list[tuple[int, int]]  # (tick, run-at) to fire, in order
    following_ms: int | None  # the due time of the next tick after them; None: no more
    missed: int  # due ticks within the window before the current one
    outside_window: int  # due ticks older than the catch-up window: skipped


def plan(job: CronJob, first_tick_ms: int, now_ms: int) -> TickPlan:
    """The ticks of ``job`` to fire at ``now_ms``, from ``first_tick_ms`` (its oldest
    tick not fired yet: the one its score stands for, or the one held back)."""
    series = _series(
        job.expression, job.timezone, job.every_ms, job.start_ms, job.end_ms, first_tick_ms, now_ms
    )
    window_start = None if job.catch_up_ms is None else now_ms - job.catch_up_ms
    in_window: deque[tuple[int, int]] = deque(maxlen=MAX_CATCH_UP + 1)
    counted = outside = 0
    following = None
    for index, tick in enumerate(series):
        run_at = job.run_at(tick, series[index + 1] if index + 1 < len(series) else None)
        if run_at > now_ms:
            following = run_at
            break
        if window_start is not None and run_at < window_start:
            outside += 1
            continue
        in_window.append((tick, run_at))
        counted += 1
    return TickPlan(_by_policy(job, list(in_window)), following, max(counted - 1, 0), outside)


def _by_policy(job: CronJob, due: list[tuple[int, int]]) -> list[tuple[int, int]]:
    if not due:
        return []
    current, missed = due[-1], due[:-1]
    if not missed or job.missed == "skip":
        return [current]
    if job.missed == "once":
        return [missed[-1], current]
    return [*missed[-MAX_CATCH_UP:], current]


@lru_cache(maxsize=64)
def _series(
    expression: str,
    timezone: str,
    every_ms: int,
    start_ms: int | None,
    end_ms: int | None,
    first_ms: int,
    now_ms: int,
) -> tuple[int, ...]:
    """A schedule's ticks from ``first_ms`` on, up to the second one after ``now_ms``
    (fewer when the schedule ends). Cached: the jobs a dispatcher fires at one moment
    mostly share a schedule (one job per user), and the ticks of a cron expression are
    what costs (croniter)."""
    schedule = CronJob(
        "", expression, None, timezone, every_ms=every_ms, start_ms=start_ms, end_ms=end_ms
    )
    series = [first_ms]
    after = 0 if first_ms <= now_ms else 1
    for tick in schedule.ticks_after(first_ms):
        series.append(tick)
        if tick > now_ms:
            after += 1
            if after >= 2:
                break
    return tuple(series)
