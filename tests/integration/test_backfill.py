"""Backfills on a real server (docs/cron.md#backfill): a past range's ticks fired at a
bounded pace, each once (a re-run changes nothing), under the job's overlap policy,
with the range refused when it is too long, in the future, or empty."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
import redis

from duetime import ManualClock, Queue
from duetime.client.backfill import MOST_BACKFILL_TICKS
from duetime.dispatcher import QueueDispatcher
from duetime.errors import InvalidInputError, TaskNotFoundError
from tests.integration.test_cron import T0, ready_ids, step_all, with_dispatchers

HOUR = 3600 * 1000


def stepping(
    redis_url: str, queue_name: str, clock: ManualClock, moments: list[int], count: int = 2
) -> list[list[str]]:
    with redis.Redis.from_url(redis_url) as raw:
        return _stepping(raw, redis_url, queue_name, clock, moments, count)


def _stepping(
    raw: redis.Redis,
    redis_url: str,
    queue_name: str,
    clock: ManualClock,
    moments: list[int],
    count: int,
) -> list[list[str]]:
    """Step ``count`` racing dispatchers at each moment; what ready holds after each."""
    seen: list[list[str]] = []

    async def scenario(dispatchers: list[QueueDispatcher]) -> None:
        for moment in moments:
            clock.set(moment)
            await step_all(dispatchers)
            seen.append(ready_ids(raw, queue_name))

    with_dispatchers(redis_url, queue_name, clock, count)(scenario)
    return seen


def test_a_backfill_fires_each_tick_of_the_range_once_at_its_pace(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.add_cron("hourly", "0 * * * *", {"n": 1})
        start, end = (T0 - 10 * HOUR) / 1000, (T0 - HOUR) / 1000
        info = queue.backfill_cron("hourly", start, end, rate=2)
        assert (info.ticks, info.fired, info.done, info.rate) == (10, 0, False, 2)
        # 2 a second: one tick per pass 500 ms apart, however many dispatchers race.
        seen = stepping(redis_url, queue_name, clock, [T0 + i * 500 for i in range(12)])
        assert [len(ready) for ready in seen] == [*range(1, 11), 10, 10]
        expected = [f"cron:hourly:{T0 - h * HOUR}" for h in range(10, 0, -1)]
        assert seen[-1] == expected  # oldest first, each the tick's own id
        [listed] = queue.list_cron()
        assert listed.backfill is not None and listed.backfill.fired == 10
        # The same backfill again runs nothing twice, even once its ticks have run: it
        # says they all ran already.
        assert queue.backfill_cron("hourly", start, end, rate=2).done
        for task_id in expected:
            assert queue.cancel(task_id)
        again = queue.backfill_cron("hourly", start, end, rate=2)
        assert again.done and (again.fired, again.already_ran, again.to_run) == (0, 10, 0)
        assert stepping(redis_url, queue_name, clock, [T0 + 7000, T0 + 8000])[-1] == []
        assert int(raw.hget(f"duetime:{{{queue_name}}}:stats", "cron_backfilled") or 0) == 10
        assert queue.check() == []


@pytest.mark.parametrize("overlap", ["skip", "delay"])
def test_a_backfill_follows_the_jobs_overlap_policy(
    redis_url: str, queue_name: str, overlap: str
) -> None:
    clock = ManualClock(T0)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.add_cron("serial", "0 * * * *", {}, overlap=overlap)
        queue.backfill_cron("serial", (T0 - 3 * HOUR) / 1000, (T0 - HOUR) / 1000, rate=10)
        first, second, third = (f"cron:serial:{T0 - h * HOUR}" for h in (3, 2, 1))
        seen = stepping(redis_url, queue_name, clock, [T0, T0 + 100])
        assert seen == [[first], [first]]  # the first run is live: the second waits or goes
        assert queue.cancel(first)  # the first run ends
        seen = stepping(redis_url, queue_name, clock, [T0 + 1100, T0 + 1200])
        if overlap == "skip":
            assert seen[-1] == [third]  # the second tick was skipped, not run late
        else:
            assert seen[0] == [second]  # held, then run
        [listed] = queue.list_cron()
        assert listed.backfill is not None
        assert queue.check() == []


def test_bad_backfills_are_refused_with_nothing_written(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.add_cron("second", "* * * * * *", {})
        queue.add_cron("ticker", None, {}, every=timedelta(seconds=1))
        before = sorted(raw.keys())
        ten_years = ((T0 - 10 * 365 * 24 * HOUR) / 1000, T0 / 1000)
        refusals: list[tuple[Callable[[], object], type[Exception], str]] = [
            (lambda: queue.backfill_cron("second", *ten_years), InvalidInputError,
             f"at most {MOST_BACKFILL_TICKS:,} ticks"),
            (lambda: queue.backfill_cron("ticker", *ten_years), InvalidInputError,
             f"at most {MOST_BACKFILL_TICKS:,} ticks"),
            (lambda: queue.backfill_cron("second", T0 / 1000 - 10, T0 / 1000 + 10),
             InvalidInputError, "after now"),
            (lambda: queue.backfill_cron("second", T0 / 1000, T0 / 1000 - 10),
             InvalidInputError, "before its start"),
            (lambda: queue.backfill_cron("second", T0 / 1000 - 10, T0 / 1000, rate=0),
             InvalidInputError, "rate must be"),
            (lambda: queue.backfill_cron("second", T0 / 1000 - 10, T0 / 1000, rate=float("nan")),
             InvalidInputError, "rate must be"),
            (lambda: queue.backfill_cron("second", T0 / 1000 - 0.5, T0 / 1000 - 0.2),
             InvalidInputError, "no tick"),
            (lambda: queue.backfill_cron("nobody", T0 / 1000 - 10, T0 / 1000),
             TaskNotFoundError, "no cron job"),
        ]  # fmt: skip
        for call, error, message in refusals:
            with pytest.raises(error, match=message):
                call()
        assert sorted(raw.keys()) == before
