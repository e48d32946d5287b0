"""Delayed tasks wait in small buckets (sorted sets the server keeps in its compact
listpack encoding), picked by a hash of the id, indexed by their earliest run-at, in
generations that double as the queue grows: lookups find a task in any generation,
dispatchers promote from the index, an empty queue leaves no bucket key behind, and
hand-edited garbage never hides a task."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
import redis

from duetime import App, Dispatcher, Job, Queue, Worker, current_task, validation
from duetime.store.plans.keys import QueueKeys, bucket_name
from tests.helpers import FAST, as_bytes, delayed_buckets, running, wait_until

PAYLOAD = {"user": 12345, "kind": "ab"}  # 16 bytes of msgpack


def generation(raw: redis.Redis, keys: QueueKeys) -> int:
    stored = raw.hget(keys.delayed_layout, "generation")
    return 0 if stored is None else int(stored)


def generations_in_use(raw: redis.Redis, keys: QueueKeys) -> set[int]:
    return {int(as_bytes(name).split(b":")[0]) for name in raw.zrange(keys.delayed, 0, -1)}


def encodings(raw: redis.Redis, keys: QueueKeys) -> set[bytes]:
    return {as_bytes(raw.object("encoding", bucket)) for bucket in delayed_buckets(raw, keys)}


def test_a_delayed_task_waits_in_its_bucket_at_its_run_at_in_microseconds(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        at = time.time() + 3600.0004567  # not a whole µs: kept rounded up, never early
        task_id = queue.schedule_task(at, {"n": 1})
        bucket = keys.delayed_bucket(bucket_name(task_id, 0))
        score = raw.zscore(bucket, task_id)
        run_at_us = round(validation.timestamp_ms(at) * 1000)  # the run-at, to the µs
        assert score is not None and run_at_us <= score <= run_at_us + 1
        assert raw.zscore(keys.scheduled, task_id) is None
        assert raw.zrange(keys.delayed, 0, -1, withscores=True) == [(b"0:0", score)]
        assert raw.hget(keys.delayed_layout, "tasks") == b"1"
        assert encodings(raw, keys) == {b"listpack"}
        status = queue.status(task_id)
        assert status is not None and status.state == "scheduled"
        assert queue.stats().scheduled == 1 and queue.stats().next_due == pytest.approx(at)
        assert queue.check() == []
        assert queue.cancel(task_id)
        # Nothing is left of the buckets once the last delayed task is gone.
        assert raw.keys(f"duetime:{{{queue_name}}}:delayed*") == []


def test_buckets_grow_a_generation_at_a_time_and_lookups_find_every_task(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    at = time.time() + 3600
    with Queue(queue_name, redis_url) as queue:
        ids = [queue.schedule_task(at + n, {"n": n}) for n in range(700)]
        assert generation(raw, keys) >= 4
        assert len(generations_in_use(raw, keys)) >= 4  # older generations keep their tasks
        assert encodings(raw, keys) == {b"listpack"}
        assert raw.hget(keys.delayed_layout, "tasks") == b"700"
        assert queue.check() == []
    # A fresh client knows no generation yet; one that lags behind is told the new one.
    with Queue(queue_name, redis_url) as fresh, Queue(queue_name, redis_url) as lagging:
        for task_id in ids[::50]:
            found = fresh.status(task_id)
            assert found is not None and found.state == "scheduled"
        lagging.core.queue.shards[0].state.generation = 0
        assert lagging.cancel(ids[0]) and lagging.status(ids[0]) is None
        lagging.core.queue.shards[0].state.generation = 1
        lagging.reschedule(ids[1], at + 7200)
        moved = lagging.status(ids[1])
        assert moved is not None and moved.run_at == pytest.approx(at + 7200)
        assert fresh.stats().scheduled == 699
        assert fresh.check() == []


def test_a_large_batch_opens_a_generation_with_room_for_it_bucket_by_bucket(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_now({"warm": True})
        raw.config_resetstat()
        at = time.time() + 3600
        ids = queue.schedule_many([Job(PAYLOAD, at=at + n / 1000) for n in range(5000)])
        opened = generation(raw, keys)
        assert opened == math.ceil(math.log2(5000 / 16))
        assert generations_in_use(raw, keys) == {opened}
        assert encodings(raw, keys) == {b"listpack"}
        # Written bucket by bucket: each of the 5 script calls adds to its own hundred
        # buckets (one ZADD each, and one to the index), not to one per task.
        zadd_calls = int(raw.info("commandstats")["cmdstat_zadd"]["calls"])
        assert zadd_calls <= 2**opened + 5 + 5
        assert queue.tasks("scheduled", limit=3)[0].id == ids[0]
        assert queue.check() == []


def test_dispatchers_promote_from_the_buckets_and_leave_no_bucket_behind(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    started: dict[str, float] = {}

    def handler(data: dict[str, int]) -> None:
        started[current_task().id] = time.time()

    with Queue(queue_name, redis_url) as queue:
        at = time.time() + 0.5
        jobs = [Job({"n": n}, at=at + n / 2000) for n in range(600)]
        ids = queue.schedule_many(jobs)
        run_at = {task_id: at + n / 2000 for n, task_id in enumerate(ids)}

        async def scenario() -> None:
            daemons = [Dispatcher([queue_name], redis_url, settings=FAST) for _ in range(2)]
            async with running(*daemons, Worker(App(default=handler), queue_name, redis_url,
                                                settings=FAST, concurrency=50)):  # fmt: skip
                await wait_until(lambda: len(started) == 600, what="every task")
                await wait_until(lambda: queue.stats().ready == 0, what="an empty queue")

        asyncio.run(scenario())
        assert queue.stats().counters.get("promoted") == 600  # none twice
        assert raw.keys(f"duetime:{{{queue_name}}}:delayed*") == []
        assert queue.check() == []
    # None started before its run-at by the host clock (a coarse check: the server clock
    # is the same host's here; the reliability suite checks lateness by the server's).
    assert all(started[i] >= run_at[i] - 0.002 for i in ids)


def an_hour_ahead(queue: Queue, count: int) -> list[str]:
    """Ids of `count` tasks a second apart, an hour from now."""
    return [queue.schedule_in(3600 + n, {"n": n}) for n in range(count)]


def test_garbage_in_the_layout_never_hides_a_task(redis_url: str, raw: redis.Redis) -> None:
    keys = QueueKeys("garbage")
    with Queue("garbage", redis_url) as queue:
        ids = an_hour_ahead(queue, 100)
        raw.hset(keys.delayed_layout, mapping={"generation": "many", "tasks": "lots"})
        assert {v.kind for v in queue.check()} == {"garbage", "miscount"}
    with Queue("garbage", redis_url) as fresh:
        for task_id in ids[::10]:  # looked up in every generation there may be
            found = fresh.status(task_id)
            assert found is not None and found.state == "scheduled"
        assert fresh.cancel(ids[0])
        fresh.schedule_in(3600, {"after": "garbage"})  # writes on, and counts again
    assert raw.hget(keys.delayed_layout, "generation") == b"many"


def test_the_checker_reports_buckets_that_lookups_or_dispatchers_would_miss(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        ids = an_hour_ahead(queue, 3)
        assert queue.check() == []
        home = keys.delayed_bucket(bucket_name(ids[0], 0))
        raw.zrem(home, ids[0])
        raw.zadd(keys.delayed_bucket("0:1"), {ids[0]: 1})  # gen 0 has one bucket: 0:0
        raw.zadd(keys.delayed, {"0:1": 1, "7:3": 5})  # the second has no bucket
        raw.zadd(keys.delayed, {"0:0": 2})  # earlier than its earliest task
        kinds = sorted((v.kind, v.subject) for v in queue.check())
        assert kinds == [
            ("leak", "7:3"),
            ("misplaced", ids[0]),
            ("stale index", "0:0"),
        ]
        raw.zrem(keys.delayed, "0:1")
        assert ("lost", "0:1") in {(v.kind, v.subject) for v in queue.check()}


def test_a_run_at_past_what_whole_microseconds_hold_waits_in_scheduled(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        far = 2**53 / 1e6 + 86_400  # the year 2255 and a day
        task_id = queue.schedule_task(far, {"n": 1})
        assert raw.zscore(keys.scheduled, task_id) == pytest.approx(far * 1000)
        assert not raw.exists(keys.delayed)
        near = queue.schedule_in(60, {"n": 2})
        queue.reschedule(near, far + 1)
        assert raw.zscore(keys.scheduled, near) == pytest.approx((far + 1) * 1000)
        assert raw.keys(f"duetime:{{{queue_name}}}:delayed*") == []
        assert queue.status(task_id).state == "scheduled"  # type: ignore[union-attr]
        assert queue.check() == []


def test_a_delayed_task_costs_under_150_bytes(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """The point of the buckets: measured as the growth of used_memory over 20,000
    delayed tasks with a 16-byte payload (one big hash and one big sorted set took
    about 200 bytes on Redis 7)."""
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_in(3600, PAYLOAD)
        before = int(raw.info("memory")["used_memory"])
        at = time.time() + 3600
        for start in range(0, 20_000, 5_000):
            queue.schedule_many([(at + (start + n) / 1000, PAYLOAD) for n in range(5_000)])
        per_task = (int(raw.info("memory")["used_memory"]) - before) / 20_000
    assert per_task <= 150, per_task
