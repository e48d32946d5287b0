"""Steering a queue on a real server: pause and resume (workers claim nothing, nothing
else stops), run a delayed task now, list tasks by state, and the lag figures."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

from duetime import App, Dispatcher, Queue, Worker
from duetime.errors import InvalidInputError, TaskNotFoundError, TaskStateError
from duetime.states import TaskState
from duetime.store.plans.layout import QueueLayout
from tests.helpers import FAST, running, wait_until


def paused_lines(caplog: pytest.LogCaptureFixture) -> int:
    return sum("is paused; claiming nothing" in record.message for record in caplog.records)


def test_a_paused_queue_runs_nothing_until_resumed(
    redis_url: str, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    done: list[int] = []
    app = App(default=lambda data: done.append(data["n"]))
    with Queue(queue_name, redis_url) as queue:

        async def scenario() -> None:
            worker = Worker(app, queue_name, redis_url, settings=FAST)
            async with running(Dispatcher([queue_name], redis_url, settings=FAST), worker):
                await wait_until(lambda: bool(queue.stats().workers), what="the worker")
                assert queue.pause() is True and queue.pause() is False
                assert queue.is_paused() and queue.stats().paused
                # The worker is blocked on ready: the next task reaches it by BLMOVE, and
                # the claim gives it back to ready instead of running it.
                queue.schedule_now({"n": 0})
                await wait_until(lambda: paused_lines(caplog) == 1, what="the pause noticed")
                # Scheduling and promotion go on: a delayed task is promoted meanwhile.
                queue.schedule_in(0.05, {"n": 1})
                await wait_until(lambda: queue.stats().ready == 2, what="promotion")
                stats = queue.stats()
                assert (stats.ready, stats.running, done) == (2, 0, [])
                assert queue.check() == []
                assert queue.resume() is True and queue.resume() is False
                await wait_until(lambda: sorted(done) == [0, 1], what="both run once resumed")

        with caplog.at_level(logging.INFO, logger="duetime"):
            asyncio.run(scenario())
        assert not queue.is_paused() and queue.check() == []
        assert any("is resumed" in record.message for record in caplog.records)


def test_a_sharded_queue_pauses_every_shard(redis_url: str, queue_name: str) -> None:
    done: list[int] = []
    app = App(default=lambda data: done.append(data["n"]))
    with Queue(queue_name, redis_url, shards=3) as queue:
        queue.pause()
        # Fixed ids, so the spread is the same every run (random ids left a shard
        # empty about one run in 40); the precondition below says they cover all three.
        ids = [f"task-{n}" for n in range(12)]
        assert {QueueLayout(queue_name, 3).of_task(task_id) for task_id in ids} == {0, 1, 2}
        for n, task_id in enumerate(ids):
            queue.schedule_now({"n": n}, id=task_id)
        assert {shard.ready > 0 for shard in queue.stats().shards} == {True}

        async def scenario() -> None:
            worker = Worker(app, queue_name, redis_url, settings=FAST, shards=3)
            async with running(worker):
                await wait_until(lambda: bool(queue.stats().workers), what="the worker")
                # Registered means its claimers ran: each found its shard paused.
                await asyncio.sleep(0.2)
                assert done == [] and queue.stats().ready == 12
                queue.resume()
                await wait_until(lambda: len(done) == 12, what="all run once resumed")

        asyncio.run(scenario())


def test_run_now_makes_a_waiting_task_due_at_once(redis_url: str, queue_name: str) -> None:
    done: list[str] = []
    app = App(default=lambda data: done.append(data))
    with Queue(queue_name, redis_url) as queue:
        later = queue.schedule_in(3600, "later")
        queue.run_now(later)
        status = queue.status(later)  # due now: straight to ready, as when scheduled so
        assert status is not None and status.state == TaskState.READY
        with pytest.raises(TaskStateError, match="is ready, not scheduled"):
            queue.run_now(later)

        async def scenario() -> None:
            async with running(Worker(app, queue_name, redis_url, settings=FAST)):
                await wait_until(lambda: done == ["later"], what="run")

        asyncio.run(scenario())
        # Gone from the queue, but its history says how it ended; an unknown id is not found.
        with pytest.raises(TaskStateError, match=r"already ended \(succeeded, attempt 1\)"):
            queue.run_now(later)
        with pytest.raises(TaskNotFoundError):
            queue.run_now("never-scheduled")


def test_tasks_are_listed_by_state_in_serving_order(redis_url: str, queue_name: str) -> None:
    app = App()
    started = threading.Event()
    release = threading.Event()

    @app.task
    def hold(data: Any) -> None:
        started.set()
        release.wait(10)

    @app.task
    def broken(data: Any) -> None:
        raise ValueError("nope")

    settings = FAST.replace(max_attempts=1)
    with Queue(queue_name, redis_url, settings=settings, shards=2) as queue:
        now = time.time()
        later = [queue.schedule_task(now + 3600 - n, {"n": n}, task="x") for n in range(4)]
        listed = queue.tasks("scheduled")
        assert [task.id for task in listed] == later[::-1]  # soonest first, across shards
        assert listed[0].task == "x" and listed[0].data == {"n": 3}
        assert listed[0].run_at == pytest.approx(now + 3597, abs=0.01)
        # A first attempt is due at its run-at (kept to the µs; as seconds, a float).
        assert listed[0].due_at == pytest.approx(listed[0].run_at, abs=2e-6)
        assert [t.id for t in queue.tasks("scheduled", limit=2, offset=1)] == later[::-1][1:3]
        held = queue.schedule_now({}, task=hold)
        dead = queue.schedule_now({}, task=broken)

        async def scenario() -> None:
            worker = Worker(app, queue_name, redis_url, settings=settings, shards=2)
            async with running(worker):
                await wait_until(started.is_set, what="hold to start")
                await wait_until(lambda: queue.stats().dead == 1, what="broken to die")
                [run] = queue.tasks("running")
                assert (run.id, run.task, run.worker, run.attempts) == (
                    held, "hold", worker.worker_id, 1,
                )  # fmt: skip
                assert run.lease_deadline is not None and run.lease_deadline > time.time()
                [gone] = queue.tasks("dead")
                assert (gone.id, gone.task, gone.error) == (dead, "broken", "ValueError: nope")
                assert gone.died_at is not None
                release.set()

        asyncio.run(scenario())
        assert queue.tasks("ready") == []
        with pytest.raises(InvalidInputError, match="state must be one of"):
            queue.tasks(TaskState.FINISHED)


def test_a_retry_is_listed_at_its_due_time_not_its_first_run_at(
    redis_url: str, queue_name: str
) -> None:
    app = App(default=lambda data: 1 / 0)
    settings = FAST.replace(retry_base=600.0, retry_max=600.0)  # the back-off: ~10 min
    with Queue(queue_name, redis_url, settings=settings) as queue:
        task_id = queue.schedule_now({})

        async def scenario() -> None:
            async with running(Worker(app, queue_name, redis_url, settings=settings)):
                await wait_until(lambda: queue.stats().scheduled == 1, what="the retry")

        asyncio.run(scenario())
        [retry] = queue.tasks("scheduled")
        assert retry.id == task_id and retry.attempts == 1
        assert retry.run_at is not None and retry.run_at <= time.time()
        assert retry.due_at is not None and retry.due_at > time.time() + 200


def test_the_lag_figures_age_while_nothing_moves(redis_url: str, queue_name: str) -> None:
    with Queue(queue_name, redis_url) as queue:
        assert (queue.stats().oldest_due_age, queue.stats().oldest_ready_age) == (0.0, 0.0)
        queue.schedule_in(0.05, {"n": 1})  # due soon; no dispatcher to promote it
        queue.schedule_now({"n": 2})  # ready at once; no worker to claim it
        time.sleep(0.3)
        stats = queue.stats()
        assert 0.2 <= stats.oldest_due_age < 10
        assert 0.25 <= stats.oldest_ready_age < 10


def test_throughput_counts_each_minute_and_how_late_tasks_started(
    redis_url: str, queue_name: str
) -> None:
    app = App()
    failures = {"flaky": 1}

    @app.task
    def ok(data: Any) -> None:
        pass

    @app.task
    def flaky(data: Any) -> None:
        if failures["flaky"]:
            failures["flaky"] -= 1
            raise ValueError("once")

    @app.task
    def broken(data: Any) -> None:
        raise ValueError("always")

    settings = FAST.replace(max_attempts=2, retry_base=0.01, retry_max=0.02)
    with Queue(queue_name, redis_url, settings=settings, shards=2) as queue:
        assert [m.completed for m in queue.throughput(3)] == [0, 0, 0]
        for _ in range(3):
            queue.schedule_now({}, task=ok)
        queue.schedule_now({}, task=flaky)
        queue.schedule_now({}, task=broken)

        async def scenario() -> None:
            worker = Worker(app, queue_name, redis_url, settings=settings, shards=2)
            dispatcher = Dispatcher([queue_name], redis_url, settings=settings, shards=2)
            async with running(dispatcher, worker):
                await wait_until(lambda: queue.stats().dead == 1 and not queue.stats().running)
                await wait_until(lambda: queue.stats().counters.get("completed") == 4)

        asyncio.run(scenario())
        minutes = queue.throughput(2)  # the work may straddle a minute boundary
        assert minutes[1].start - minutes[0].start == 60
        assert sum(m.completed for m in minutes) == 4
        assert sum(m.retried for m in minutes) == 2  # flaky once, broken once
        assert sum(m.dead for m in minutes) == 1
        busy = [m for m in minutes if m.completed]
        assert all(m.lateness_max is not None and m.lateness_mean is not None for m in busy)
        assert all(0 <= m.lateness_mean <= m.lateness_max < 10 for m in busy)  # type: ignore[operator]
        with pytest.raises(InvalidInputError, match="minutes"):
            queue.throughput(61)


def test_dispatchers_keep_an_hour_of_minutes(redis_url: str, queue_name: str) -> None:
    import redis

    from duetime.store.plans.dispatching import MINUTE_MS
    from duetime.store.plans.keys import QueueKeys

    client = redis.Redis.from_url(redis_url)
    minutes = QueueKeys(queue_name).minutes
    with Queue(queue_name, redis_url) as queue:
        now = queue.runner.run(queue.core.queue.operations.state.now()) // MINUTE_MS
        client.hset(minutes, mapping={f"{now - 61}:completed": 5, f"{now - 60}:completed": 7,
                                      "garbage": 1, f"{now}:completed": 2})  # fmt: skip

        async def scenario() -> None:
            async with running(Dispatcher([queue_name], redis_url, settings=FAST)):
                await wait_until(lambda: client.hlen(minutes) == 2, what="the trim")

        asyncio.run(scenario())
        assert sorted(client.hkeys(minutes)) == sorted(
            [f"{now - 60}:completed".encode(), f"{now}:completed".encode()]
        )
        assert queue.check() == []


def test_dispatchers_note_the_queues_they_serve(redis_url: str, queue_name: str) -> None:
    from duetime import known_queues

    other = f"{queue_name}-b"

    async def scenario() -> None:
        async with running(Dispatcher([queue_name, other], redis_url, settings=FAST, shards=2)):
            await wait_until(lambda: len(known_queues(redis_url)) >= 2, what="registration")

    before = time.time()
    asyncio.run(scenario())
    found = {queue.name: queue for queue in known_queues(redis_url)}
    assert {found[queue_name].shards, found[other].shards} == {2}
    assert found[queue_name].seen_ms / 1000 == pytest.approx(before, abs=10)
