"""Throttle and unique by key against a real server: a throttle's leading run and its
window, calls dropped or folded into one trailing run; a unique key's second call
answering with the live task until it started or finished; every keyed mode on a
sharded queue, where a key's calls all meet in the shard its key hashes to."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis

import duetime
from duetime import App, Debounce, Dispatcher, ManualClock, Queue, Throttle, Unique, Worker
from duetime.keyed import Scheduled
from duetime.states import KeyedOutcome, TaskState
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.layout import QueueLayout, shard_tag
from tests.helpers import FAST, decoded, running, wait_until

T0 = 1_800_000_000_000  # ms


def test_a_throttle_runs_the_first_call_and_drops_the_rest_of_its_window(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    clock = ManualClock(T0)
    throttle = Throttle("api", 10)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        lead = queue.schedule_keyed({"n": 1}, throttle=throttle)
        assert (lead.outcome, lead.run_at, lead.until) == (
            KeyedOutcome.CREATED,
            T0 / 1000,
            (T0 + 10_000) / 1000,
        )
        assert decoded(raw.lrange(keys.ready, 0, -1)) == [lead.id]  # due now: ready
        clock.advance(9.999)
        dropped = queue.schedule_keyed({"n": 2}, throttle=throttle)
        assert (dropped.id, dropped.outcome, dropped.run_at, dropped.calls) == (
            lead.id,
            KeyedOutcome.DROPPED,
            None,
            2,
        )
        assert raw.hlen(keys.tasks) == 1 and queue.stats().counters["throttle_dropped"] == 1
        clock.advance(0.001)  # the window has ended: the next call leads a new one
        again = queue.schedule_keyed({"n": 3}, throttle=throttle)
        assert again.outcome == KeyedOutcome.CREATED and again.id != lead.id
        assert again.until == (T0 + 20_000) / 1000
        # A call whose run-at falls in the window is dropped, whenever it is made.
        later = queue.schedule_keyed({"n": 4}, throttle=throttle, delay=5)
        assert later.outcome == KeyedOutcome.DROPPED
        assert queue.check() == []


def test_a_trailing_throttle_folds_its_window_into_one_run_at_its_end(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    clock = ManualClock(T0)
    throttle = Throttle("api", 10, trailing=True)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        lead = queue.schedule_keyed({"n": 1}, throttle=throttle)
        clock.advance(2)
        trail = queue.schedule_keyed({"n": 2}, throttle=throttle)
        assert trail.outcome == KeyedOutcome.CREATED and trail.id != lead.id
        assert trail.run_at == (T0 + 10_000) / 1000
        clock.advance(3)
        folded = queue.schedule_keyed({"n": 3}, throttle=throttle)
        assert (folded.id, folded.outcome, folded.calls) == (trail.id, KeyedOutcome.COLLAPSED, 3)
        status = queue.status(trail.id)
        assert status is not None and status.data == {"n": 3}  # the last call's data
        assert status.keyed == duetime.KeyedState("throttle", "api", 3, (T0 + 10_000) / 1000)
        assert raw.zscore(keys.scheduled, trail.id) == T0 + 10_000
        # The trailing run opens the next window where it runs: a call there folds into
        # the next trailing run, a window later, so runs stay a window apart.
        clock.set(T0 + 12_000)
        next_trail = queue.schedule_keyed({"n": 4}, throttle=throttle)
        assert next_trail.outcome == KeyedOutcome.CREATED
        assert next_trail.run_at == (T0 + 20_000) / 1000
        # Quiet for a whole window after that run: the next call leads at once.
        clock.set(T0 + 30_000)
        fresh = queue.schedule_keyed({"n": 5}, throttle=throttle)
        assert fresh.run_at == (T0 + 30_000) / 1000 and fresh.until == (T0 + 40_000) / 1000
        assert queue.stats().counters["throttle_folded"] == 3
        assert raw.hlen(keys.tasks) == 4 and queue.check() == []


def test_a_trailing_run_runs_once_with_the_last_data_at_the_window_end(
    redis_url: str, queue_name: str
) -> None:
    runs: list[tuple[str, Any, float, float]] = []
    app = App()

    @app.default
    async def record(data: Any) -> None:
        context = duetime.current_task()
        runs.append((context.id, data, context.run_at, time.time()))

    throttle = Throttle("api", 2, trailing=True)  # 20 calls take a few ms
    with Queue(queue_name, redis_url) as queue:
        calls = [queue.schedule_keyed({"n": n}, throttle=throttle) for n in range(20)]

        async def scenario() -> None:
            async with running(
                Dispatcher([queue_name], redis_url, settings=FAST),
                Worker(app, queue_name, redis_url, settings=FAST),
            ):
                await wait_until(lambda: len(runs) == 2, what="the leading and trailing runs")
                # Acks are sent in batches after the handlers return: wait for the second.
                await wait_until(
                    lambda: queue.stats().counters.get("completed") == 2, what="both acked"
                )

        asyncio.run(scenario())
        assert queue.check() == []
    lead, trail = calls[0], calls[-1]
    assert {c.id for c in calls[1:]} == {trail.id} and trail.calls == 20
    assert [(run[0], run[1]) for run in runs] == [(lead.id, {"n": 0}), (trail.id, {"n": 19})]
    assert runs[1][2] == trail.run_at and runs[1][3] >= trail.run_at  # never early


def test_a_unique_key_answers_with_its_task_until_it_started(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    started: list[str] = []
    release = asyncio.Event()
    app = App()

    @app.default
    async def hold(data: Any) -> None:
        started.append(duetime.current_task().id)
        await release.wait()

    with Queue(queue_name, redis_url) as queue:
        first = queue.schedule_keyed({"n": 1}, unique=Unique("report"), delay=3600)
        hit = queue.schedule_keyed({"n": 2}, unique=Unique("report"))
        assert (hit.id, hit.outcome, hit.state, hit.calls) == (
            first.id,
            KeyedOutcome.EXISTING,
            TaskState.SCHEDULED,
            1,
        )
        assert raw.hlen(keys.tasks) == 1 and queue.stats().counters["unique_hits"] == 1
        queue.run_now(first.id)

        async def scenario() -> Scheduled:
            async with running(
                Dispatcher([queue_name], redis_url, settings=FAST),
                Worker(app, queue_name, redis_url, settings=FAST),
            ):
                await wait_until(lambda: started == [first.id], what="the first task running")
                again = queue.schedule_keyed({"n": 3}, unique=Unique("report"))
                release.set()
                await wait_until(lambda: len(started) == 2, what="the second task")
                return again

        again = asyncio.run(scenario())
        assert again.outcome == KeyedOutcome.CREATED and started == [first.id, again.id]
        assert queue.check() == []


def test_a_unique_key_until_finished_answers_while_its_task_runs(
    redis_url: str, queue_name: str
) -> None:
    started: list[str] = []
    release = asyncio.Event()
    app = App()

    @app.default
    async def hold(data: Any) -> None:
        started.append(duetime.current_task().id)
        await release.wait()

    unique = Unique("nightly", until="finished")
    with Queue(queue_name, redis_url) as queue:

        async def scenario() -> tuple[Scheduled, Scheduled, Scheduled]:
            async with running(
                Dispatcher([queue_name], redis_url, settings=FAST),
                Worker(app, queue_name, redis_url, settings=FAST),
            ):
                first = queue.schedule_keyed({"n": 1}, unique=unique)
                await wait_until(lambda: started == [first.id], what="the task running")
                hit = queue.schedule_keyed({"n": 2}, unique=unique)
                release.set()
                await wait_until(
                    lambda: queue.stats().counters.get("completed") == 1, what="it finished"
                )
                after = queue.schedule_keyed({"n": 3}, unique=unique)
                await wait_until(lambda: len(started) == 2, what="the next task")
                return first, hit, after

        first, hit, after = asyncio.run(scenario())
        assert (hit.id, hit.outcome, hit.state) == (
            first.id,
            KeyedOutcome.EXISTING,
            TaskState.RUNNING,
        )
        assert after.outcome == KeyedOutcome.CREATED and after.id != first.id
        assert queue.check() == []


def test_a_dead_unique_task_counts_as_finished(redis_url: str, queue_name: str) -> None:
    app = App(default=lambda data: 1 / 0)
    unique = Unique("k", until="finished")
    with Queue(queue_name, redis_url) as queue:
        first = queue.schedule_keyed({"n": 1}, unique=unique, max_attempts=1)

        async def scenario() -> None:
            async with running(
                Dispatcher([queue_name], redis_url, settings=FAST),
                Worker(app, queue_name, redis_url, settings=FAST),
            ):
                await wait_until(lambda: queue.stats().dead == 1, what="the task dead")

        asyncio.run(scenario())
        after = queue.schedule_keyed({"n": 2}, unique=unique, delay=3600)
        assert after.outcome == KeyedOutcome.CREATED and after.id != first.id


def test_on_a_sharded_queue_every_call_of_a_key_meets_in_its_keys_shard(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    layout = QueueLayout(queue_name, 4)
    clock = ManualClock(T0)
    with Queue(queue_name, redis_url, clock=clock, shards=4) as queue:
        for n in range(12):
            key = f"user:{n}"
            made = [
                queue.schedule_keyed({"n": n}, debounce=Debounce(key, 60)),
                queue.schedule_keyed({"n": n}, debounce=Debounce(key, 60)),
                queue.schedule_keyed({"n": n}, throttle=Throttle(key, 60)),
                queue.schedule_keyed({"n": n}, throttle=Throttle(key, 60)),
                queue.schedule_keyed({"n": n}, unique=Unique(key)),
                queue.schedule_keyed({"n": n}, unique=Unique(key)),
            ]
            assert [m.id for m in made[::2]] == [m.id for m in made[1::2]]
            home = QueueKeys(shard_tag(queue_name, layout.of_keyed(key)))
            for task_id in {m.id for m in made}:
                assert raw.hexists(home.tasks, task_id)
                assert layout.of_task(task_id) == layout.of_keyed(key)  # status looks there first
                assert queue.status(task_id) is not None
        assert {layout.of_keyed(f"user:{n}") for n in range(12)} == {0, 1, 2, 3}
        assert queue.stats().scheduled + queue.stats().ready == 36
        assert queue.check() == []
