"""A sharded queue on one real server: tasks spread over the shards by id, every lookup
finds its task, workers take from every shard in turns within their concurrency,
dispatchers serve every shard, and dead letters, cron and the checker span the shards.
(On a real cluster, in test_cluster.py, the same queue spans three masters.)"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest
import redis

from duetime import App, AsyncQueue, Dispatcher, Queue, Worker, current_task
from duetime.errors import TaskFailedError
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.layout import QueueLayout
from duetime.store.plans.operations import QueueOperations
from tests.helpers import FAST, decoded, running, scheduled_count, scheduled_score, wait_until

SHARDS = 4


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def shard_ids(layout: QueueLayout, per_shard: int) -> list[str]:
    """Given ids, ``per_shard`` of them in each shard."""
    ids: list[str] = []
    counts = Counter[int]()
    n = 0
    while len(ids) < per_shard * layout.count:
        task_id = f"t{n}"
        n += 1
        if counts[layout.of_task(task_id)] < per_shard:
            counts[layout.of_task(task_id)] += 1
            ids.append(task_id)
    return ids


def test_tasks_spread_over_the_shards_and_every_lookup_finds_its_task(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    layout = QueueLayout(queue_name, SHARDS)
    with Queue(queue_name, redis_url, shards=SHARDS) as queue:
        ids = queue.schedule_many([(time.time() + 3600, {"n": n}) for n in range(400)])
        sizes = [int(scheduled_count(raw, keys)) for keys in layout.shards]
        assert sum(sizes) == 400 and min(sizes) > 50, sizes
        for task_id in ids[:20]:
            home = layout.shards[layout.of_task(task_id)]
            assert scheduled_score(raw, home, task_id) is not None
        # A caller's own id dedupes: its shard is a function of the id.
        assert queue.schedule_in(60, {"mine": 1}, id="order-1") == "order-1"
        assert queue.schedule_in(60, {"mine": 2}, id="order-1") == "order-1"
        status = queue.status("order-1")
        assert status is not None and status.data == {"mine": 1}
        in_other_shards = {layout.of_task(i): i for i in ids}
        assert len(in_other_shards) == SHARDS
        for task_id in in_other_shards.values():
            found = queue.status(task_id)
            assert found is not None and found.state == "scheduled"
        cancelled, moved = list(in_other_shards.values())[:2]
        assert queue.cancel(cancelled) and queue.status(cancelled) is None
        queue.reschedule(moved, time.time() + 7200)
        moved_status = queue.status(moved)
        assert moved_status is not None and moved_status.run_at is not None
        assert moved_status.run_at > time.time() + 7000
        stats = queue.stats()
        assert stats.scheduled == 400 and len(stats.shards) == SHARDS
        assert [s.scheduled for s in stats.shards] == [
            int(scheduled_count(raw, keys)) for keys in layout.shards
        ]
        assert stats.counters["scheduled"] == 401
        assert queue.check() == []


def test_lookups_find_tasks_written_with_another_shard_count_and_the_checker_says_so(
    redis_url: str, queue_name: str
) -> None:
    layout = QueueLayout(queue_name, SHARDS)
    elsewhere = next(f"x{n}" for n in range(100) if layout.of_task(f"x{n}") != 0)
    with Queue(queue_name, redis_url) as unsharded:  # everything in shard 0
        unsharded.schedule_in(3600, {"old": 1}, id=elsewhere)
        unsharded.add_cron("nightly", "0 3 * * *", {"cron": 1})
    with Queue(queue_name, redis_url, shards=SHARDS) as queue:
        status = queue.status(elsewhere)
        assert status is not None and status.data == {"old": 1}
        assert [job.name for job in queue.list_cron()] == ["nightly"]
        queue.pause_cron("nightly")
        assert queue.list_cron()[0].paused
        # Declaring a job again moves it to its own shard: one copy left, or each tick
        # would fire twice.
        assert queue.add_cron("nightly", "0 3 * * *", {"cron": 1}) == "created"
        assert [j.name for j in queue.list_cron()] == ["nightly"]
        job = queue.cron_job("nightly", "0 3 * * *", {"cron": 1})
        assert queue.sync_cron([job]) == {"nightly": "unchanged"}
        assert [j.name for j in queue.list_cron()] == ["nightly"]
        assert queue.cancel(elsewhere)
        assert queue.check() == []
        queue.schedule_many([(time.time() + 3600, {"n": n}) for n in range(50)])
    with Queue(queue_name, redis_url, shards=2) as fewer:
        [beyond] = [v for v in fewer.check() if v.kind == "tasks beyond the shards"]
        assert "shard 2" in str(beyond) and "2 shard(s)" in str(beyond)


def test_workers_and_dispatchers_serve_every_shard_once_within_their_concurrency(
    redis_url: str, queue_name: str
) -> None:
    layout = QueueLayout(queue_name, SHARDS)
    app = App()
    started: list[str] = []
    state = {"now": 0, "most": 0}

    @app.default
    async def handle(data: dict[str, int]) -> int:
        started.append(current_task().id)
        state["now"] += 1
        state["most"] = max(state["most"], state["now"])
        await asyncio.sleep(0.002)
        state["now"] -= 1
        return data["n"] * 2

    async def scenario() -> None:
        async with AsyncQueue(queue_name, redis_url, shards=SHARDS, settings=FAST) as queue:
            now_ids = await queue.schedule_many([(0, {"n": n}) for n in range(200)])
            later_ids = [
                await queue.schedule_in(0.2 + n / 100, {"n": n}, result_ttl=60) for n in range(40)
            ]
            await queue.add_cron("every-second", "* * * * * *", {"n": -1})
            workers = [
                Worker(app, queue_name, redis_url, concurrency=3, shards=SHARDS, settings=FAST)
                for _ in range(2)
            ]
            dispatcher = Dispatcher(queue_name, redis_url, shards=SHARDS, settings=FAST)
            async with running(dispatcher, *workers):
                await wait_until(
                    lambda: (
                        set(now_ids + later_ids) <= set(started)
                        and any(i.startswith("cron:") for i in started)
                    ),
                    timeout=30,
                    what="every task of every shard run, and a cron tick",
                )
                assert await queue.result(later_ids[-1], timeout=5) == 78
            counted = Counter(started)
            assert all(counted[i] == 1 for i in now_ids + later_ids)
            assert state["most"] <= 6  # two workers of three slots each
            assert {layout.of_task(i) for i in now_ids} == set(range(SHARDS))
            assert sum(w.counters.succeeded for w in workers) == len(started)
            [job] = await queue.list_cron()
            assert job.last_run is not None
            stats = await queue.stats()
            assert stats.scheduled == 0 and stats.ready == 0 and stats.running == 0
            assert stats.workers == {}  # both deregistered from every shard
            assert await queue.check() == []

    run(scenario())


def test_a_worker_takes_from_every_backlogged_shard_in_turns(
    redis_url: str, queue_name: str
) -> None:
    layout = QueueLayout(queue_name, SHARDS)
    app = App()
    order: list[int] = []

    @app.default
    async def handle(data: dict[str, int]) -> None:
        order.append(layout.of_task(current_task().id))
        await asyncio.sleep(0.001)

    ids = shard_ids(layout, 40)
    with Queue(queue_name, redis_url, shards=SHARDS) as queue:
        queue.schedule_many([(0, {"n": n}) for n in range(len(ids))])  # generated ids
        queue.schedule_many([(0, {"mine": i}) for i in ids])

    async def scenario() -> None:
        worker = Worker(app, queue_name, redis_url, concurrency=1, shards=SHARDS, settings=FAST)
        async with running(worker):
            await wait_until(lambda: len(order) >= 80, timeout=20, what="80 tasks run")

    run(scenario())
    first = Counter(order[:80])
    assert all(first[shard] >= 10 for shard in range(SHARDS)), first


def test_dead_letters_across_shards(redis_url: str, queue_name: str) -> None:
    app = App()

    @app.default
    def broken(data: dict[str, int]) -> None:
        raise ValueError(f"broken {data['n']}")

    layout = QueueLayout(queue_name, SHARDS)
    ids = shard_ids(layout, 3)
    with Queue(queue_name, redis_url, shards=SHARDS) as queue:
        for n, task_id in enumerate(ids):
            queue.schedule_now({"n": n}, id=task_id, max_attempts=1)

        async def scenario() -> None:
            worker = Worker(app, queue_name, redis_url, shards=SHARDS, settings=FAST)
            async with running(worker):
                await wait_until(lambda: queue.stats().dead == len(ids), what="all dead")

        run(scenario())
        dead = queue.dead_tasks()
        assert sorted(d.id for d in dead) == sorted(ids)
        assert [d.died_at for d in dead] == sorted((d.died_at for d in dead), reverse=True)
        assert [d.id for d in queue.dead_tasks(limit=2, offset=1)] == [d.id for d in dead[1:3]]
        with pytest.raises(TaskFailedError, match="broken"):
            queue.result(ids[-1], timeout=1)
        assert queue.purge_dead([ids[0], ids[1]]) == 2
        assert queue.requeue_dead() == len(ids) - 2
        stats = queue.stats()
        assert stats.dead == 0 and stats.ready == len(ids) - 2
        assert queue.check() == []


def test_an_id_taken_with_no_slot_free_goes_back_to_the_head_of_ready(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        first, second = queue.schedule_many([(0, {"n": 1}), (0, {"n": 2})])
        operations = QueueOperations(keys, queue.core.queue.clock)
        assert queue.runner.run(operations.worker.take_ready("w1", 1)) == first
        assert queue.runner.run(operations.worker.give_back("w1", first))
        assert decoded(raw.lrange(keys.ready, 0, -1)) == [first, second]
        assert raw.llen(keys.active("w1")) == 0
        assert not queue.runner.run(operations.worker.give_back("w1", first))
        assert queue.check() == []
