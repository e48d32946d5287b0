"""The dispatcher against a real server, with the clock driven by the test."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import redis

from duetime import App, Dispatcher, Job, ManualClock, Queue, Settings, Worker, validation
from duetime.dispatcher import QueueDispatcher
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operations import QueueOperations
from duetime.store.redis.runner import AsyncRunner
from tests.helpers import decoded, running, wait_until

T0 = 1_800_000_000_000  # ms; a fixed "server time" the test controls


def ready_ids(raw: redis.Redis, queue_name: str) -> list[str]:
    return decoded(raw.lrange(QueueKeys(queue_name).ready, 0, -1))


@contextmanager
def dispatcher_steps(
    redis_url: str, queue_name: str, settings: Settings, clock: ManualClock
) -> Iterator[Callable[[], int | None]]:
    """One dispatcher of the queue, kept across passes: each call of what this yields is
    one pass (``step``), returning when it would wake next (None: at once)."""
    with asyncio.Runner() as loop:
        runner = AsyncRunner(redis_url, settings)
        dispatcher = QueueDispatcher(queue_name, runner, settings, clock)
        try:
            yield lambda: loop.run(dispatcher.step())
        finally:
            loop.run(runner.close())


@contextmanager
def queue_and_dispatcher(
    redis_url: str, queue_name: str, settings: Settings
) -> Iterator[tuple[ManualClock, Queue, Callable[[], int | None]]]:
    """A clock at T0, a client and a dispatcher's passes (as ``dispatcher_steps``) on it."""
    clock = ManualClock(T0)
    with (
        Queue(queue_name, redis_url, clock=clock) as queue,
        dispatcher_steps(redis_url, queue_name, settings, clock) as step,
    ):
        yield clock, queue, step


def test_never_promotes_before_run_at_and_sleeps_until_it(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0)
    settings = Settings(promote_ahead=0)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        first = queue.schedule_task((T0 + 1000) / 1000, {"n": 1})
        second = queue.schedule_task((T0 + 1001) / 1000, {"n": 2})

    with dispatcher_steps(redis_url, queue_name, settings, clock) as step:
        clock.set(T0 + 999)
        assert step() == T0 + 1000  # sleeps exactly until the first is due
        assert ready_ids(raw, queue_name) == []
        clock.set(T0 + 1000)
        step()
        assert ready_ids(raw, queue_name) == [first]
        clock.set(T0 + 5000)
        step()
        assert ready_ids(raw, queue_name) == [first, second]
        assert raw.hlen(QueueKeys(queue_name).early) == 0  # none went ahead


def test_promotes_ahead_by_promote_ahead_and_notes_the_run_at(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0)
    settings = Settings(promote_ahead=0.005)
    early = QueueKeys(queue_name).early
    with Queue(queue_name, redis_url, clock=clock) as queue:
        first = queue.schedule_task((T0 + 1000.25) / 1000, {"n": 1})  # sub-ms run-at
        second = queue.schedule_task((T0 + 1003) / 1000, {"n": 2})

    with dispatcher_steps(redis_url, queue_name, settings, clock) as step:
        clock.set(T0 + 990)
        # Wakes 5 ms before the (rounded up) run-at of the first.
        assert step() == T0 + 1001 - 5
        assert ready_ids(raw, queue_name) == []
        clock.set(T0 + 996)
        step()
        assert ready_ids(raw, queue_name) == [first]
        assert float(raw.hget(early, first) or 0) == validation.timestamp_ms((T0 + 1000.25) / 1000)
        clock.set(T0 + 1000)
        step()
        assert ready_ids(raw, queue_name) == [first, second]
        assert float(raw.hget(early, second) or 0) == T0 + 1003


def test_promotion_is_batched_and_reports_more_work(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.schedule_many([Job({"i": i}, at=(T0 + 10 + i) / 1000) for i in range(25)])
    settings = Settings(promote_batch=10)

    with dispatcher_steps(redis_url, queue_name, settings, clock) as step:
        clock.set(T0 + 1000)
        assert step() is None  # a full batch: more is waiting
        assert len(ready_ids(raw, queue_name)) == 10
        step()
        step()
        assert len(ready_ids(raw, queue_name)) == 25


@pytest.mark.parametrize("stage_ms", [0, 10_000])
def test_racing_dispatchers_never_promote_a_task_twice(
    redis_url: str, raw: redis.Redis, queue_name: str, stage_ms: int
) -> None:
    clock = ManualClock(T0)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        ids = queue.schedule_many([Job({"i": i}, at=(T0 + 1 + i) / 1000) for i in range(5000)])
    # With staging, the first pass finds half due and stages the other half; the second
    # pass, later, promotes those from scheduled.
    passes = (T0 + 2500, T0 + 10_000) if stage_ms else (T0 + 10_000,)
    keys = QueueKeys(queue_name)

    async def one_dispatcher() -> tuple[int, int]:
        runner = AsyncRunner(redis_url, Settings())
        operations = QueueOperations(keys, clock)
        moved = staged = 0
        try:
            while True:
                promotion = await runner.run(operations.dispatcher.promote_due(37, 0, stage_ms))
                if not promotion.moved + promotion.staged:
                    break
                moved += promotion.moved
                staged += promotion.staged
        finally:
            await runner.close()
        return moved, staged

    async def race() -> list[tuple[int, int]]:
        return list(await asyncio.gather(*(one_dispatcher() for _ in range(6))))

    results = []
    for at in passes:
        clock.set(at)
        results += asyncio.run(race())
        if stage_ms and at == passes[0]:
            assert raw.zcard(keys.scheduled) == sum(s for _, s in results) == 2500
            assert raw.exists(keys.delayed, keys.delayed_layout) == 0  # every bucket gone
    promoted = ready_ids(raw, queue_name)
    assert sum(m for m, _ in results) == 5000
    assert sorted(promoted) == sorted(ids)
    assert max(Counter(promoted).values()) == 1
    assert sum(1 for m, s in results if m or s) > 1  # they really raced
    assert raw.zcard(keys.scheduled) == 0


def test_stages_a_delayed_task_ahead_and_promotes_it_at_its_run_at(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    settings = Settings(promote_ahead=0, stage_ahead=2.0)
    with queue_and_dispatcher(redis_url, queue_name, settings) as (clock, queue, step):
        soon = queue.schedule_task((T0 + 10_000.25) / 1000, {"n": 1})  # sub-ms run-at
        later = queue.schedule_task((T0 + 3_600_000) / 1000, {"n": 2})
        # Wakes to stage once the earliest bucket is within half of stage_ahead.
        assert step() == T0 + 10_001 - 1000
        assert raw.zcard(keys.scheduled) == 0
        clock.set(T0 + 9_001)
        # Staged, not promoted: it waits in scheduled at its exact run-at.
        assert step() == T0 + 10_001
        assert raw.zscore(keys.scheduled, soon) == T0 + 10_000.25
        assert raw.zcard(keys.delayed) == 1  # only the later task's bucket is left
        assert raw.hget(keys.delayed_layout, "tasks") == b"1"
        assert ready_ids(raw, queue_name) == []
        status = queue.status(soon)
        assert status is not None and status.state.value == "scheduled"
        assert status.run_at == (T0 + 10_000.25) / 1000
        clock.set(T0 + 10_000)
        step()
        assert ready_ids(raw, queue_name) == []  # never before its run-at
        clock.set(T0 + 10_001)
        step()
        assert ready_ids(raw, queue_name) == [soon]
        assert raw.zcard(keys.scheduled) == 0
        later_status = queue.status(later)
        assert later_status is not None and later_status.run_at == (T0 + 3_600_000) / 1000


def test_a_staged_task_is_cancelled_or_rescheduled_like_any_other(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    settings = Settings(promote_ahead=0, stage_ahead=10.0)
    with queue_and_dispatcher(redis_url, queue_name, settings) as (clock, queue, step):
        cancelled = queue.schedule_task((T0 + 5000) / 1000, {"n": 1})
        moved = queue.schedule_task((T0 + 6000) / 1000, {"n": 2})
        assert step() == T0 + 5000
        assert raw.zcard(keys.scheduled) == 2  # both staged
        assert queue.cancel(cancelled) is True
        queue.reschedule(moved, (T0 + 3_600_000) / 1000)
        assert raw.zcard(keys.scheduled) == 0
        status = queue.status(moved)
        assert status is not None and status.run_at == (T0 + 3_600_000) / 1000
        clock.set(T0 + 10_000)
        step()
        assert ready_ids(raw, queue_name) == []  # neither at the old run-ats
        assert queue.status(cancelled) is None


def test_stage_ahead_zero_promotes_straight_from_the_buckets(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    settings = Settings(promote_ahead=0, stage_ahead=0)
    with queue_and_dispatcher(redis_url, queue_name, settings) as (clock, queue, step):
        task = queue.schedule_task((T0 + 1500) / 1000, {"n": 1})
        assert step() == T0 + 1500
        clock.set(T0 + 1499)
        step()
        assert raw.zcard(keys.scheduled) == 0 and raw.zcard(keys.delayed) == 1
        clock.set(T0 + 1500)
        step()
        assert ready_ids(raw, queue_name) == [task]


def test_earlier_task_wakes_a_dispatcher_sleeping_for_an_hour(
    redis_url: str, queue_name: str
) -> None:
    # block_timeout is long so only the wake signal (not a timed-out BLPOP) can explain
    # a prompt promotion.
    settings = Settings(block_timeout=60.0)
    done: list[float] = []

    async def scenario() -> None:
        async_queue_url = redis_url
        with Queue(queue_name, async_queue_url) as queue:
            queue.schedule_in(3600, {"later": True})
            dispatcher = Dispatcher([queue_name], redis_url, settings=settings)
            worker = Worker(
                App(default=lambda data: done.append(time.time())), queue_name, redis_url
            )
            async with running(dispatcher, worker):
                await asyncio.sleep(0.2)  # the dispatcher is now asleep for ~an hour
                queue.schedule_in(0.3, {"soon": True})
                await wait_until(lambda: bool(done), timeout=10, what="the early task to run")

    asyncio.run(scenario())
    assert len(done) == 1
