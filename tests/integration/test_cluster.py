"""duetime on a real 3-master Redis Cluster started by the test: queues whose slots live
on different masters, reached through a redis+cluster:// URL or a RedisCluster client,
with the main scenarios end to end (schedule, promote, claim, retry, dead, cancel,
result, cron, checker)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio.cluster
import redis.cluster
from redis.crc import key_slot

from duetime import App, AsyncQueue, Dispatcher, Queue, Worker, current_task
from duetime.errors import ConfigurationError, RedisCommandError, TaskFailedError
from duetime.store.keys import QueueLayout
from tests.conftest import require_binary
from tests.helpers import FAST, running, wait_until
from tests.servers import SLOTS, Cluster

#: Queue names whose hash tags fall on masters 0, 1 and 2 of a 3-master test cluster.
QUEUES = ("qa", "qc", "qb")
#: A queue whose three shards fall on masters 1, 0 and 2.
SHARDED = QueueLayout("work", 3)


@pytest.fixture(scope="module", params=["redis", "valkey"])
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    instance = Cluster(request.param, require_binary(request.param))
    instance.start()
    yield instance
    instance.stop()


@pytest.fixture
def clean_cluster(cluster: Cluster) -> Cluster:
    for node in cluster.nodes:
        client = node.client()
        client.flushall()
        client.close()
    return cluster


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_the_queues_under_test_live_on_three_different_masters(cluster: Cluster) -> None:
    masters = {cluster.node_of_slot(key_slot(name.encode())).port for name in QUEUES}
    assert len(masters) == 3 and SLOTS == 16384


def test_the_shards_of_the_sharded_queue_live_on_three_different_masters(
    cluster: Cluster,
) -> None:
    masters = {cluster.node_of_slot(key_slot(k.tasks.encode())).port for k in SHARDED.shards}
    assert len(masters) == 3


def test_a_sharded_queue_spans_three_masters(clean_cluster: Cluster) -> None:
    url = clean_cluster.url
    app = App()
    runs: list[tuple[str, int]] = []

    @app.default
    async def record(data: dict[str, Any]) -> int:
        context = current_task()
        runs.append((context.id, context.attempt))
        if data.get("flaky") and context.attempt == 1:
            raise ValueError("first attempt fails")
        if data.get("broken"):
            raise ValueError("always fails")
        return int(data.get("n", 0))

    with Queue(SHARDED.queue, url, shards=SHARDED.count, settings=FAST) as queue:
        now_ids = queue.schedule_many([(0, {"n": n}) for n in range(300)])
        later = [queue.schedule_in(0.3, {"n": n}, result_ttl=60) for n in range(30)]
        flaky = queue.schedule_now({"flaky": True}, max_attempts=3, result_ttl=60)
        broken = queue.schedule_now({"broken": True}, max_attempts=1)
        cancelled = queue.schedule_in(3600, {"n": -1})
        assert queue.cancel(cancelled)
        queue.add_cron("every-second", "* * * * * *", {"n": 7})

        async def scenario() -> None:
            workers = [
                Worker(app, SHARDED.queue, url, shards=SHARDED.count, settings=FAST)
                for _ in range(2)
            ]
            dispatcher = Dispatcher(SHARDED.queue, url, shards=SHARDED.count, settings=FAST)
            async with running(dispatcher, *workers):
                await wait_until(
                    lambda: (
                        {i for i, _ in runs} >= {*now_ids, *later, flaky, broken}
                        and any(i.startswith("cron:") for i, _ in runs)
                        and queue.stats().dead == 1
                    ),
                    timeout=30,
                    what="every task of every shard run",
                )

        run(scenario())
        started = [i for i, _ in runs]
        assert all(started.count(i) == 1 for i in [*now_ids, *later, broken])
        assert cancelled not in started and (flaky, 2) in runs
        assert {SHARDED.of_task(i) for i in now_ids} == {0, 1, 2}
        assert queue.result(later[-1], timeout=5) == 29
        assert queue.result(flaky, timeout=5) == 0
        with pytest.raises(TaskFailedError, match="always fails"):
            queue.result(broken, timeout=5)
        assert [d.id for d in queue.dead_tasks()] == [broken]
        [job] = queue.list_cron()
        assert job.last_run is not None
        # Each shard's keys are on its own master.
        for keys in SHARDED.shards:
            node = clean_cluster.node_of_slot(key_slot(keys.stats.encode())).client()
            try:
                assert int(node.hget(keys.stats, "completed") or 0) > 0
            finally:
                node.close()
        assert queue.check() == []


def test_a_write_to_every_shard_reloads_scripts_flushed_from_every_master(
    clean_cluster: Cluster,
) -> None:
    """One pipelined write spans three masters; NOSCRIPT on each is answered by loading
    the script on every primary and sending the refused calls again."""

    def flush_scripts() -> None:
        for node in clean_cluster.nodes:
            client = node.client()
            client.script_flush()
            client.close()

    with Queue(SHARDED.queue, clean_cluster.url, shards=SHARDED.count) as queue:
        flush_scripts()
        ids = queue.schedule_many([(0, {"n": n}) for n in range(60)])
        assert queue.stats().ready == 60 and {SHARDED.of_task(i) for i in ids} == {0, 1, 2}

    async def on_asyncio() -> None:
        async with AsyncQueue(SHARDED.queue, clean_cluster.url, shards=SHARDED.count) as queue:
            flush_scripts()
            await queue.schedule_many([(0, {"n": n}) for n in range(60)])
            assert (await queue.stats()).ready == 120
            assert await queue.check() == []

    run(on_asyncio())


def test_main_scenarios_on_three_masters(clean_cluster: Cluster) -> None:
    url = clean_cluster.url
    seen: dict[str, list[tuple[str, int]]] = {name: [] for name in QUEUES}
    app = App()

    @app.default
    def record(data: dict[str, str]) -> str:
        context = current_task()
        seen[context.queue].append((data["kind"], context.attempt))
        if data["kind"] == "flaky" and context.attempt == 1:
            raise ValueError("first attempt fails")
        if data["kind"] == "broken":
            raise ValueError("always fails")
        return f"ok from {context.queue}"

    queues = [Queue(name, url, settings=FAST) for name in QUEUES]
    try:
        ids: dict[str, dict[str, str]] = {}
        for queue in queues:
            ids[queue.name] = {
                "now": queue.schedule_now({"kind": "now"}, result_ttl=60),
                "later": queue.schedule_in(0.3, {"kind": "later"}),
                "flaky": queue.schedule_now({"kind": "flaky"}, max_attempts=3, result_ttl=60),
                "broken": queue.schedule_now({"kind": "broken"}, max_attempts=2),
                "cancelled": queue.schedule_in(3600, {"kind": "cancelled"}),
            }
            queue.schedule_many([(0, {"kind": "many"}) for _ in range(20)])
            assert queue.cancel(ids[queue.name]["cancelled"])
            queue.add_cron("every-second", "* * * * * *", {"kind": "cron"})

        async def scenario() -> None:
            workers = [Worker(app, name, url, settings=FAST) for name in QUEUES]
            async with running(Dispatcher(list(QUEUES), url, settings=FAST), *workers):
                await wait_until(
                    lambda: all(
                        q.stats().dead == 1
                        and q.stats().counters.get("completed", 0) >= 24
                        and ("cron", 1) in seen[q.name]
                        for q in queues
                    ),
                    timeout=30,
                    what="every queue's tasks done, on each master",
                )

        run(scenario())
        for queue in queues:
            mine = ids[queue.name]
            assert queue.result(mine["now"], timeout=5) == f"ok from {queue.name}"
            assert queue.result(mine["flaky"], timeout=5) == f"ok from {queue.name}"
            with pytest.raises(TaskFailedError, match="always fails"):
                queue.result(mine["broken"], timeout=5)
            assert [d.id for d in queue.dead_tasks()] == [mine["broken"]]
            assert queue.requeue_dead(mine["broken"]) == 1 and queue.purge_dead() == 0
            assert ("cancelled", 1) not in seen[queue.name]
            assert sorted(seen[queue.name]).count(("many", 1)) == 20
            assert queue.check() == []
            [job] = queue.list_cron()
            assert job.last_run is not None and job.problem is None
    finally:
        for queue in queues:
            queue.close()


def test_a_redis_py_cluster_client_and_the_asyncio_queue(clean_cluster: Cluster) -> None:
    first = clean_cluster.nodes[0]
    sync_client = redis.cluster.RedisCluster(host="127.0.0.1", port=first.port)
    async_client = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=first.port)
    try:
        with Queue("qb", sync_client) as queue:
            task_id = queue.schedule_in(60, {"n": 1})
            status = queue.status(task_id)
            assert status is not None and status.state == "scheduled"

        async def on_asyncio() -> None:
            async with AsyncQueue("qc", async_client) as queue:
                other = await queue.schedule_in(60, {"n": 2})
                assert (await queue.stats()).scheduled == 1
                assert await queue.cancel(other)
                assert await queue.check() == []
            await async_client.aclose()

        run(on_asyncio())
    finally:
        sync_client.close()


def test_a_single_node_url_on_a_cluster_says_to_use_the_cluster_url(clean_cluster: Cluster) -> None:
    """Pointed at one node, a queue whose slot lives elsewhere is refused with a message
    that names MOVED and redis+cluster://, not a bare "12787 127.0.0.1:7303"."""
    first = clean_cluster.nodes[0]
    name = next(
        q for q in QUEUES
        if clean_cluster.node_of_slot(key_slot(q.encode())) is not first
    )  # fmt: skip
    with (
        Queue(name, first.url) as queue,
        pytest.raises(RedisCommandError, match=r"MOVED.*redis\+cluster://"),
    ):
        queue.schedule_in(60, {"n": 1})


def test_durable_mode_on_a_cluster_is_refused_plainly(clean_cluster: Cluster) -> None:
    with (
        Queue("qa", clean_cluster.url, durable=True) as queue,
        pytest.raises(ConfigurationError, match="not available on Redis Cluster"),
    ):
        queue.schedule_in(60, {"n": 1})
