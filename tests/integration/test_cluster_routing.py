"""Script calls on a Redis Cluster go straight to the node of their slot: redis-py is
never left to look their keys up with COMMAND GETKEYS on its default node (an extra
round trip on a healthy cluster, and a failure on every master while that one node is
down)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import pytest

from duetime import AsyncQueue, Queue
from duetime.errors import NotDurableError, RedisUnavailableError
from duetime.store.plans.layout import QueueLayout
from tests.conftest import require_binary
from tests.helpers import wait_until_sync
from tests.servers import Cluster, command

#: A queue whose three shards fall on the three masters of a 3-master test cluster.
SHARDED = QueueLayout("work", 3)


@pytest.fixture(scope="module")
def replicated_cluster() -> Iterator[Cluster]:
    instance = Cluster("redis", require_binary("redis"), replicas=1)
    instance.start()
    yield instance
    instance.stop()


def _key_lookups(cluster: Cluster) -> int:
    """COMMAND GETKEYS calls the masters served since their stats were reset."""
    total = 0
    for node in cluster.nodes:
        client = node.client()
        stats = client.info("commandstats")
        client.close()
        total += sum(
            int(value["calls"]) for name, value in stats.items() if "getkeys" in name.lower()
        )
    return total


def _reset_stats(cluster: Cluster) -> None:
    for node in cluster.nodes:
        client = node.client()
        command(client, "CONFIG", "RESETSTAT")
        client.close()


def test_script_calls_on_a_cluster_send_no_key_lookup(replicated_cluster: Cluster) -> None:
    url = replicated_cluster.url
    later = time.time() + 3600
    _reset_stats(replicated_cluster)
    with Queue(SHARDED.queue, url, shards=SHARDED.count) as queue:
        queue.schedule_many([(later, {"n": n}) for n in range(30)])
    with Queue(SHARDED.queue, url, shards=SHARDED.count, durable=True) as queue:
        queue.schedule_many([(later, {"n": n}) for n in range(30)])
        queue.schedule_task(later, {"n": 1})

    async def asynchronously() -> None:
        async with AsyncQueue(SHARDED.queue, url, shards=SHARDED.count, durable=True) as queue:
            await queue.schedule_many([(later, {"n": n}) for n in range(30)])
            await queue.schedule_task(later, {"n": 1})

    asyncio.run(asynchronously())
    assert _key_lookups(replicated_cluster) == 0


@pytest.fixture
def failing_cluster() -> Iterator[Cluster]:
    instance = Cluster("redis", require_binary("redis"), replicas=1)
    instance.start()
    yield instance
    instance.stop()


def test_bulk_script_calls_reach_every_master_while_the_first_node_is_dead(
    failing_cluster: Cluster,
) -> None:
    """The first node of the URL (the client's default node) is killed and its replica
    takes over: bulk and durable scheduling on queues of every master works again as
    soon as the cluster has failed over, not once the dead address comes back."""
    cluster = failing_cluster
    url = cluster.url
    later = time.time() + 3600
    sharded = Queue(SHARDED.queue, url, shards=SHARDED.count)
    durable = Queue(SHARDED.queue, url, shards=SHARDED.count, durable=True)
    sharded.schedule_many([(later, {"n": n}) for n in range(3)])
    cluster.nodes[0].kill()
    # Called before the failover, the client learns a topology that still names the
    # dead node as a master: it stays the client's default node.
    with contextlib.suppress(RedisUnavailableError):
        sharded.schedule_many([(later, {"n": n}) for n in range(3)])
    replica = cluster.replica_nodes[0]  # the replica of nodes[0]
    client = replica.client()
    command(client, "CLUSTER", "FAILOVER", "TAKEOVER")
    wait_until_sync(
        lambda: client.info("replication")["role"] == "master", what="the replica promoted"
    )
    client.close()
    done: list[str] = []

    def scheduled_on_every_master() -> bool:
        try:
            done[:] = sharded.schedule_many([(later, {"n": n}) for n in range(30)])
        except RedisUnavailableError:
            return False
        try:
            durable.schedule_many([(later, {"n": n}) for n in range(30)])
        except RedisUnavailableError:
            return False
        except NotDurableError:
            pass  # written, unconfirmed: the promoted master has no replica left
        return True

    try:
        wait_until_sync(scheduled_on_every_master, timeout=15, what="bulk scheduling works")
    finally:
        sharded.close()
        durable.close()
    assert {SHARDED.of_task(i) for i in done} == {0, 1, 2}
