"""Lateness measures the queue, not the caller (issue #29): an attempt's lateness, the
per-minute lateness the dashboard shows and the age of the oldest ready task all count
from when the task was due in the queue: its run-at, or later when it was scheduled
with a run-at in the past, retried (the end of its back-off), requeued from dead, or
re-entered after its worker lost it. The clock is a ManualClock that stands still
while an attempt is handed over, so a lateness the queue did not cause shows as 0,
exactly, and one it did (the old definition) as the whole time before."""

from __future__ import annotations

import asyncio

import redis

from duetime import App, ManualClock, Queue, Worker
from duetime.hooks import AttemptInfo, Hooks
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operations import QueueOperations
from duetime.store.redis.runner import AsyncRunner
from tests.helpers import FAST, running, scheduled_score, wait_until

YEAR_2020 = 1_577_836_800  # 2020-01-01, epoch seconds


def server_ms(raw: redis.Redis) -> int:
    seconds, micros = raw.time()
    return int(seconds) * 1000 + int(micros) // 1000


class Starts(Hooks):
    """What each attempt was told as it started."""

    def __init__(self) -> None:
        self.infos: list[AttemptInfo] = []

    def before_attempt(self, attempt: AttemptInfo) -> None:
        self.infos.append(attempt)


def latest_minute_lateness(queue: Queue) -> tuple[float | None, float | None]:
    """The dashboard's figures for this minute: mean and max start lateness."""
    minute = queue.throughput(1)[-1]
    return minute.lateness_mean, minute.lateness_max


def test_a_task_dated_2020_is_not_years_late(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """Before, its lateness and the oldest ready age were the six years since 2020."""
    clock = ManualClock(server_ms(raw))
    starts = Starts()

    async def handler(data: object) -> None:
        return None

    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.schedule_task(YEAR_2020, {"n": 1})
        assert queue.stats().oldest_ready_age == 0
        worker = Worker(
            App(default=handler, hooks=[starts]), queue_name, redis_url, settings=FAST, clock=clock
        )

        async def scenario() -> None:
            async with running(worker):
                await wait_until(lambda: worker.counters.succeeded == 1, what="the task done")

        asyncio.run(scenario())
        [info] = starts.infos
        assert info.lateness == 0
        assert info.due_at == info.run_at == info.started_at  # due since it was scheduled
        assert latest_minute_lateness(queue) == (0, 0)
        assert queue.check() == []


def test_a_requeued_task_is_not_late_by_the_time_it_was_dead(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """Before, requeueing a task dead for 66 s added 66 s to its lateness (and the
    oldest ready age said 66 s the moment it was requeued)."""
    clock = ManualClock(server_ms(raw))
    starts = Starts()
    fixed: list[bool] = []

    def handler(data: object) -> None:
        if not fixed:
            raise RuntimeError("broken until fixed")

    settings = FAST.replace(max_attempts=1)
    with Queue(queue_name, redis_url, settings=settings, clock=clock) as queue:
        task_id = queue.schedule_now({"n": 1})
        worker = Worker(
            App(default=handler, hooks=[starts]), queue_name, redis_url, settings=settings,
            clock=clock,
        )  # fmt: skip

        async def scenario() -> None:
            async with running(worker):
                await wait_until(lambda: worker.counters.dead == 1, what="the task dead")
                clock.advance(66)
                fixed.append(True)
                queue.requeue_dead([task_id])
                await wait_until(lambda: worker.counters.succeeded == 1, what="the requeued run")

        asyncio.run(scenario())
        first, second = starts.infos
        assert first.lateness == 0
        assert second.lateness == 0
        assert second.started_at - second.run_at == 66  # the old figure
        assert latest_minute_lateness(queue) == (0, 0)
        assert queue.check() == []


def test_the_oldest_ready_age_of_a_requeued_task_counts_from_the_requeue(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(server_ms(raw))
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        task_id = queue.schedule_now({"n": 1})
        # Dead as a worker would leave it, without running one.
        raw.lrem(keys.ready, 1, task_id)
        raw.zadd(keys.dead, {task_id: clock.now_ms()})
        clock.advance(66)
        assert queue.requeue_dead([task_id]) == 1
        assert queue.stats().oldest_ready_age == 0
        clock.advance(2)
        assert queue.stats().oldest_ready_age == 2
        assert queue.check() == []


def test_a_retry_is_late_from_the_end_of_its_back_off(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """Before, a retry's lateness included its back-off (here several seconds)."""
    clock = ManualClock(server_ms(raw))
    starts = Starts()
    settings = FAST.replace(retry_base=30.0, retry_max=60.0)
    keys = QueueKeys(queue_name)

    def flaky(data: object) -> None:
        if len(starts.infos) == 1:
            raise RuntimeError("first time fails")

    with Queue(queue_name, redis_url, clock=clock) as queue:
        task_id = queue.schedule_now({"n": 1})
        worker = Worker(
            App(default=flaky, hooks=[starts]), queue_name, redis_url, settings=settings,
            clock=clock,
        )  # fmt: skip

        async def scenario() -> float:
            runner = AsyncRunner(redis_url, settings)
            operations = QueueOperations(keys, clock)
            try:
                async with running(worker):
                    await wait_until(lambda: worker.counters.failed == 1, what="the failure")
                    retry_at = scheduled_score(raw, keys, task_id)
                    assert retry_at is not None and retry_at > clock.now_ms() + 1000
                    clock.set(int(retry_at))  # the back-off ends
                    assert (await runner.run(operations.dispatcher.promote_due(10))).moved == 1
                    assert queue.stats().oldest_ready_age == 0
                    await wait_until(lambda: worker.counters.succeeded == 1, what="the retry")
                    return retry_at
            finally:
                await runner.close()

        retry_at = asyncio.run(scenario())
        first, second = starts.infos
        assert (first.attempt, second.attempt) == (1, 2)
        assert first.lateness == second.lateness == 0
        assert second.due_at * 1000 == retry_at
        assert latest_minute_lateness(queue) == (0, 0)
        assert queue.check() == []


def test_an_attempt_after_a_lost_lease_is_late_from_the_re_entry(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """A hung attempt's lease runs out and the task is re-entered: the next attempt's
    lateness counts from the re-entry, not from the first run-at (before, it included
    the hung attempt and its whole lease)."""
    clock = ManualClock(server_ms(raw))
    starts = Starts()
    release = asyncio.Event()
    keys = QueueKeys(queue_name)

    async def hangs_once(data: object) -> None:
        if len(starts.infos) == 1:
            await release.wait()

    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.schedule_now({"n": 1})
        worker = Worker(
            App(default=hangs_once, hooks=[starts]), queue_name, redis_url, settings=FAST,
            clock=clock,
        )  # fmt: skip

        async def scenario() -> None:
            runner = AsyncRunner(redis_url, FAST)
            operations = QueueOperations(keys, clock)
            try:
                async with running(worker):
                    await wait_until(lambda: len(starts.infos) == 1, what="attempt 1")
                    clock.advance(FAST.lease_duration + 5)  # its lease runs out
                    assert await runner.run(operations.dispatcher.reap_expired_leases(10)) == 1
                    assert (await runner.run(operations.dispatcher.promote_due(10))).moved == 1
                    await wait_until(lambda: worker.counters.succeeded == 1, what="attempt 2")
                    release.set()
            finally:
                await runner.close()

        asyncio.run(scenario())
        first, second = starts.infos[:2]
        assert (first.attempt, second.attempt) == (1, 2)
        assert second.lateness == 0
        assert second.started_at - second.run_at == FAST.lease_duration + 5  # the old figure
        assert queue.check() == []


def test_a_retry_cancelled_or_rescheduled_during_its_back_off_leaves_no_note(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """A retry waits with the time it is due from beside it; cancelling or rescheduling
    the task takes that away too (the checker reports a note of no waiting task)."""
    clock = ManualClock(server_ms(raw))
    settings = FAST.replace(retry_base=30.0, retry_max=60.0)
    keys = QueueKeys(queue_name)

    def fails(data: object) -> None:
        raise RuntimeError("fails")

    with Queue(queue_name, redis_url, settings=settings, clock=clock) as queue:
        cancelled, moved = queue.schedule_now({"n": 1}), queue.schedule_now({"n": 2})
        worker = Worker(App(default=fails), queue_name, redis_url, settings=settings, clock=clock)

        async def scenario() -> None:
            async with running(worker):
                await wait_until(lambda: worker.counters.failed == 2, what="both failed")

        asyncio.run(scenario())
        assert set(raw.hkeys(keys.early)) == {cancelled.encode(), moved.encode()}
        assert queue.check() == []
        assert queue.cancel(cancelled)
        queue.reschedule(moved, clock.now_ms() / 1000 + 3600)
        assert raw.hkeys(keys.early) == []
        assert queue.check() == []
