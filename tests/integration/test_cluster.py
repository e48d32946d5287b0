"""duetime on a real 3-master Redis Cluster started by the test: queues whose slots live
on different masters, reached through a redis+cluster:// URL or a RedisCluster client,
with the main scenarios end to end (schedule, promote, claim, retry, dead, cancel,
result, cron, checker)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio.cluster
import redis.cluster
from redis.crc import key_slot

from duetime import (
    App,
    AsyncQueue,
    Debounce,
    Dispatcher,
    Job,
    KeyLimits,
    Limits,
    Queue,
    Throttle,
    Unique,
    Worker,
    cron,
    current_task,
)
from duetime.errors import ConfigurationError, NotDurableError, RedisCommandError, TaskFailedError
from duetime.store.plans.layout import QueueLayout
from tests.conftest import require_binary
from tests.helpers import FAST, SLOW_HEARTBEAT, running, subscribers, wait_until, wait_until_sync
from tests.servers import SLOTS, Cluster, command

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
                        {i for i, _ in runs} >= {*now_ids, *later, broken}
                        and (flaky, 2) in runs  # its retry, after a back-off
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
        # The ticks its schedule fired are known to a backfill over them (cron_fired is
        # in the job's slot): none runs again.
        ticks = {t for i, _ in runs if (t := cron.tick_of_task(i)) is not None}
        info = queue.backfill_cron("every-second", min(ticks) / 1000, max(ticks) / 1000)
        assert info.already_ran >= len(ticks) and info.to_run == info.ticks - info.already_ran
        # Each shard's keys are on its own master.
        for keys in SHARDED.shards:
            node = clean_cluster.node_of_slot(key_slot(keys.stats.encode())).client()
            try:
                assert int(node.hget(keys.stats, "completed") or 0) > 0
            finally:
                node.close()
        assert queue.check() == []


def test_flow_control_on_a_sharded_queue_keeps_each_shards_limits(clean_cluster: Cluster) -> None:
    """Limits on a sharded queue across three masters: each shard keeps its own limits
    state (docs/flow.md), so a key's concurrency of 1 lets at most one of its tasks run
    per shard; every task runs, and every shard's invariants hold."""
    url = clean_cluster.url
    app = App()
    now_running: dict[tuple[str, int], int] = {}
    peak: dict[tuple[str, int], int] = {}
    done: list[str] = []

    @app.default
    async def record(data: dict[str, Any]) -> None:
        where = (data["key"], SHARDED.of_task(current_task().id))
        now_running[where] = now_running.get(where, 0) + 1
        peak[where] = max(peak.get(where, 0), now_running[where])
        await asyncio.sleep(0.01)
        now_running[where] -= 1
        done.append(current_task().id)

    with Queue(SHARDED.queue, url, shards=SHARDED.count, settings=FAST) as queue:
        queue.set_limits(Limits(each_key=KeyLimits(concurrency=1)))
        ids = queue.schedule_many(
            [Job({"key": f"k{n % 3}"}, delay=0, limit_key=f"k{n % 3}", priority=n % 5)
             for n in range(90)]
        )  # fmt: skip
        assert queue.limits() == Limits(each_key=KeyLimits(concurrency=1))

        async def scenario() -> None:
            worker = Worker(app, SHARDED.queue, url, shards=SHARDED.count, settings=FAST)
            dispatcher = Dispatcher(SHARDED.queue, url, shards=SHARDED.count, settings=FAST)
            async with running(dispatcher, worker):
                await wait_until(lambda: set(ids) <= set(done), timeout=30, what="every task")

        run(scenario())
        assert sorted(done) == sorted(ids)
        assert set(peak.values()) == {1}  # never two of a key at once within a shard
        assert {shard for _, shard in peak} == {0, 1, 2}
        assert queue.check() == []
        assert queue.flow().running == 0


def test_keyed_calls_on_a_sharded_queue_across_three_masters(clean_cluster: Cluster) -> None:
    """Debounce, throttle and unique keys of a queue sharded over three masters: each
    key's calls meet in the shard its key hashes to (one slot, one script), collapse or
    drop there, and each task runs once with the right data."""
    url = clean_cluster.url
    app = App()
    runs: list[tuple[str, Any]] = []

    @app.default
    async def record(data: Any) -> None:
        runs.append((current_task().id, data))

    keys = [f"user:{n}" for n in range(9)]
    with Queue(SHARDED.queue, url, shards=SHARDED.count, settings=FAST) as queue:
        debounced = {
            key: [queue.schedule_keyed({key: n}, debounce=Debounce(key, 2)) for n in range(5)]
            for key in keys
        }
        throttled = [queue.schedule_keyed({"t": n}, throttle=Throttle("api", 60)) for n in range(3)]
        unique = [queue.schedule_keyed({"u": n}, unique=Unique("report")) for n in range(3)]
        assert {SHARDED.of_keyed(key) for key in keys} == {0, 1, 2}
        for made in debounced.values():
            assert {m.id for m in made} == {made[0].id} and made[-1].calls == 5
        assert [t.outcome for t in throttled] == ["created", "dropped", "dropped"]
        assert [u.outcome for u in unique] == ["created", "existing", "existing"]

        async def scenario() -> None:
            worker = Worker(app, SHARDED.queue, url, shards=SHARDED.count, settings=FAST)
            dispatcher = Dispatcher(SHARDED.queue, url, shards=SHARDED.count, settings=FAST)
            async with running(dispatcher, worker):
                await wait_until(lambda: len(runs) == len(keys) + 2, timeout=30, what="runs")

        run(scenario())
        expected = {made[0].id: {key: 4} for key, made in debounced.items()}
        expected |= {throttled[0].id: {"t": 0}, unique[0].id: {"u": 0}}
        assert dict(runs) == expected and len(runs) == len(expected)
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
        seen[context.queue_name].append((data["kind"], context.attempt))
        if data["kind"] == "flaky" and context.attempt == 1:
            raise ValueError("first attempt fails")
        if data["kind"] == "broken":
            raise ValueError("always fails")
        return f"ok from {context.queue_name}"

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


def test_running_tasks_on_every_master_hear_their_cancels_before_any_heartbeat(
    clean_cluster: Cluster,
) -> None:
    """The sharded queue's cancel channels are published on three masters; the worker's
    one subscription hears them all (a cluster forwards what is published everywhere),
    so each running task stops long before a heartbeat (30 s apart) could tell it."""
    url = clean_cluster.url
    settings = FAST.replace(**SLOW_HEARTBEAT)
    started: set[str] = set()
    stopped: set[str] = set()
    app = App()

    @app.default
    async def waits(data: Any) -> None:
        started.add(current_task().id)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.add(current_task().id)
            raise

    worker = Worker(app, SHARDED.queue, url, shards=SHARDED.count, settings=settings)
    dispatcher = Dispatcher(SHARDED.queue, url, shards=SHARDED.count, settings=settings)

    async def scenario() -> None:
        async with (
            AsyncQueue(SHARDED.queue, url, shards=SHARDED.count) as queue,
            running(dispatcher, worker),
        ):
            # Three ids of each shard: nine random ones miss a shard one time in thirteen.
            chosen = [f"cancel-{n}" for n in range(100)]
            ids: list[str] = []
            for shard in range(3):
                ids += [i for i in chosen if SHARDED.of_task(i) == shard][:3]
            for n, task_id in enumerate(ids):
                await queue.schedule_now({"n": n}, id=task_id)
            await wait_until(lambda: started == set(ids), what="all nine running")
            assert {SHARDED.of_task(task_id) for task_id in ids} == {0, 1, 2}
            # It subscribes beside its claimers: a cancel before is heard at a heartbeat.
            await wait_until(lambda: subscribers(nodes, channel) == 1, what="it to listen")
            for task_id in ids:
                assert await queue.cancel(task_id)
            await wait_until(lambda: stopped == set(ids), timeout=10, what="all nine stopped")
            await wait_until(lambda: worker.counters.cancelled == 9, what="all nine ended")
            assert await queue.check() == []

    nodes = [node.client() for node in clean_cluster.nodes]
    channel = SHARDED.shards[0].cancel_channel  # one of them: all are subscribed at once
    try:
        run(scenario())
    finally:
        for client in nodes:
            client.close()


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


@pytest.fixture(scope="module")
def replicated_cluster() -> Iterator[Cluster]:
    instance = Cluster("redis", require_binary("redis"), replicas=1)
    instance.start()
    yield instance
    instance.stop()


def test_durable_mode_on_a_cluster_waits_for_the_replica_of_every_master_written(
    replicated_cluster: Cluster,
) -> None:
    """One schedule_many over three shards writes to three masters; it returns once each
    master's replica confirmed (a WAIT per master, after its writes, on its connection)."""
    url = replicated_cluster.url
    with Queue(SHARDED.queue, url, shards=SHARDED.count, durable=True) as queue:
        ids = queue.schedule_many([(time.time() + 3600, {"n": n}) for n in range(90)])
    assert {SHARDED.of_task(i) for i in ids} == {0, 1, 2}
    on_replicas = 0
    for replica in replicated_cluster.replica_nodes:
        client = replica.client()
        command(client, "READONLY")  # a cluster replica serves reads only when asked so
        on_replicas += sum(
            int(command(client, "HLEN", keys.tasks))
            for keys in SHARDED.shards
            if replicated_cluster.node_of_slot(key_slot(keys.tasks.encode()))
            is replicated_cluster.nodes[replicated_cluster.replica_nodes.index(replica)]
        )
        client.close()
    assert on_replicas == 90

    app = App()
    done: list[str] = []

    @app.default
    async def record(data: dict[str, int]) -> None:
        done.append(current_task().id)

    durable = FAST.replace(durable_replicas=1)
    with Queue(SHARDED.queue, url, shards=SHARDED.count, settings=durable) as queue:
        now_ids = queue.schedule_many([(0, {"n": n}) for n in range(30)])

        async def scenario() -> None:
            worker = Worker(app, SHARDED.queue, url, shards=SHARDED.count, settings=durable)
            async with running(worker):
                await wait_until(lambda: set(now_ids) <= set(done), what="30 tasks acked")
            assert worker.counters.succeeded == 30 and worker.counters.fenced == 0

        run(scenario())
        assert queue.stats().counters["completed"] == 30

    # With the replica of shard 2's master gone, a write to that master alone is
    # unconfirmed: each master's WAIT counts, not the first or the best.
    master = replicated_cluster.node_of_slot(key_slot(SHARDED.shards[2].tasks.encode()))
    replicated_cluster.replica_nodes[replicated_cluster.nodes.index(master)].stop()
    quick = FAST.replace(durable_timeout=0.3)
    ids_by_shard = {SHARDED.of_task(f"d{n}"): f"d{n}" for n in range(50)}
    with Queue(SHARDED.queue, url, shards=SHARDED.count, durable=True, settings=quick) as queue:
        queue.schedule_many([Job({"n": 0}, delay=60, id=ids_by_shard[s]) for s in (0, 1)])
        with pytest.raises(NotDurableError) as raised:
            queue.schedule_many([Job({"n": 0}, delay=60, id=ids_by_shard[s]) for s in (0, 1, 2)])
        assert raised.value.confirmed == 0


def test_durable_mode_on_a_cluster_without_replicas_says_the_writes_are_unconfirmed(
    clean_cluster: Cluster,
) -> None:
    settings = FAST.replace(durable_timeout=0.2)
    with (
        Queue(SHARDED.queue, clean_cluster.url, shards=3, durable=True, settings=settings) as queue,
        pytest.raises(NotDurableError) as raised,
    ):
        queue.schedule_many([(time.time() + 60, {"n": n}) for n in range(30)])
    assert raised.value.confirmed == 0 and len(raised.value.task_ids) == 30
    with Queue(SHARDED.queue, clean_cluster.url, shards=3) as queue:
        assert queue.stats().scheduled == 30  # written on the masters, as the error says


def test_durable_fsync_on_a_cluster_waits_for_the_aof_of_every_master_written(
    clean_cluster: Cluster,
) -> None:
    """A WAITAOF per master written (Valkey), or a refusal before any write where the
    servers lack WAITAOF (Redis 7.0)."""
    settings = FAST.replace(durable_fsync=True)
    jobs = [(time.time() + 3600, {"n": n}) for n in range(30)]
    clients = [node.client() for node in clean_cluster.nodes]
    version = clients[0].info("server")["redis_version"]
    try:
        if clean_cluster.kind == "redis" and tuple(map(int, version.split(".")[:2])) < (7, 2):
            with (
                Queue(SHARDED.queue, clean_cluster.url, shards=3, settings=settings) as queue,
                pytest.raises(ConfigurationError, match=r"durable_fsync.*WAITAOF"),
            ):
                queue.schedule_many(jobs)
            assert sum(client.dbsize() for client in clients) == 0
            return
        for client in clients:
            command(client, "CONFIG", "SET", "appendonly", "yes")
        wait_until_sync(
            lambda: all(
                c.info("persistence")["aof_rewrite_in_progress"] == 0
                and c.info("persistence")["aof_enabled"] == 1
                for c in clients
            ),
            what="the append-only files",
        )
        with Queue(SHARDED.queue, clean_cluster.url, shards=3, settings=settings) as queue:
            ids = queue.schedule_many(jobs)
            assert queue.stats().scheduled == 30
        assert {SHARDED.of_task(task_id) for task_id in ids} == {0, 1, 2}
        # Each master: one check before its first write, and a wait after the writes
        # (sent again with them when the script had to be loaded first).
        for client in clients:
            assert client.info("commandstats")["cmdstat_waitaof"]["calls"] >= 2
    finally:
        for client in clients:
            if clean_cluster.kind != "redis":
                command(client, "CONFIG", "SET", "appendonly", "no")
            client.close()
