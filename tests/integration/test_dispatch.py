"""The dispatcher against a real server, with the clock driven by the test."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import redis

from duetime import App, Dispatcher, Job, ManualClock, Queue, Settings, Worker, validation
from duetime.dispatcher import QueueDispatcher
from duetime.store import AsyncRunner, QueueKeys
from duetime.store.operations import QueueOperations
from tests.helpers import decoded, running, wait_until

T0 = 1_800_000_000_000  # ms; a fixed "server time" the test controls


def ready_ids(raw: redis.Redis, queue_name: str) -> list[str]:
    return decoded(raw.lrange(QueueKeys(queue_name).ready, 0, -1))


def test_never_promotes_before_run_at_and_sleeps_until_it(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0)
    settings = Settings(promote_ahead=0)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        first = queue.schedule_task((T0 + 1000) / 1000, {"n": 1})
        second = queue.schedule_task((T0 + 1001) / 1000, {"n": 2})

    async def scenario() -> None:
        runner = AsyncRunner(redis_url, settings)
        dispatcher = QueueDispatcher(queue_name, runner, settings, clock)
        try:
            clock.set(T0 + 999)
            assert await dispatcher.step() == T0 + 1000  # sleeps exactly until the first is due
            assert ready_ids(raw, queue_name) == []
            clock.set(T0 + 1000)
            await dispatcher.step()
            assert ready_ids(raw, queue_name) == [first]
            clock.set(T0 + 5000)
            await dispatcher.step()
            assert ready_ids(raw, queue_name) == [first, second]
            assert raw.hlen(QueueKeys(queue_name).early) == 0  # none went ahead
        finally:
            await runner.close()

    asyncio.run(scenario())


def test_promotes_ahead_by_promote_ahead_and_notes_the_run_at(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0)
    settings = Settings(promote_ahead=0.005)
    early = QueueKeys(queue_name).early
    with Queue(queue_name, redis_url, clock=clock) as queue:
        first = queue.schedule_task((T0 + 1000.25) / 1000, {"n": 1})  # sub-ms run-at
        second = queue.schedule_task((T0 + 1003) / 1000, {"n": 2})

    async def scenario() -> None:
        runner = AsyncRunner(redis_url, settings)
        dispatcher = QueueDispatcher(queue_name, runner, settings, clock)
        try:
            clock.set(T0 + 990)
            # Wakes 5 ms before the (rounded up) run-at of the first.
            assert await dispatcher.step() == T0 + 1001 - 5
            assert ready_ids(raw, queue_name) == []
            clock.set(T0 + 996)
            await dispatcher.step()
            assert ready_ids(raw, queue_name) == [first]
            assert float(raw.hget(early, first) or 0) == validation.timestamp_ms(
                (T0 + 1000.25) / 1000
            )
            clock.set(T0 + 1000)
            await dispatcher.step()
            assert ready_ids(raw, queue_name) == [first, second]
            assert float(raw.hget(early, second) or 0) == T0 + 1003
        finally:
            await runner.close()

    asyncio.run(scenario())


def test_promotion_is_batched_and_reports_more_work(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.schedule_many([Job({"i": i}, at=(T0 + 10 + i) / 1000) for i in range(25)])
    settings = Settings(promote_batch=10)

    async def scenario() -> None:
        runner = AsyncRunner(redis_url, settings)
        dispatcher = QueueDispatcher(queue_name, runner, settings, clock)
        clock.set(T0 + 1000)
        try:
            assert await dispatcher.step() is None  # a full batch: more is waiting
            assert len(ready_ids(raw, queue_name)) == 10
            await dispatcher.step()
            await dispatcher.step()
            assert len(ready_ids(raw, queue_name)) == 25
        finally:
            await runner.close()

    asyncio.run(scenario())


def test_racing_dispatchers_never_promote_a_task_twice(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        ids = queue.schedule_many([Job({"i": i}, at=(T0 + 1 + i) / 1000) for i in range(5000)])
    clock.set(T0 + 10_000)

    async def one_dispatcher() -> int:
        runner = AsyncRunner(redis_url, Settings())
        operations = QueueOperations(QueueKeys(queue_name), clock)
        moved = 0
        try:
            while (promotion := await runner.run(operations.promote_due(37))).moved:
                moved += promotion.moved
        finally:
            await runner.close()
        return moved

    async def race() -> list[int]:
        return list(await asyncio.gather(*(one_dispatcher() for _ in range(6))))

    moved = asyncio.run(race())
    promoted = ready_ids(raw, queue_name)
    assert sum(moved) == 5000
    assert sorted(promoted) == sorted(ids)
    assert max(Counter(promoted).values()) == 1
    assert sum(1 for m in moved if m) > 1  # they really raced


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
