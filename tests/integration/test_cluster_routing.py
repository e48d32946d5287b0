"""Script calls on a Redis Cluster go straight to the node of their slot: redis-py is
never left to look their keys up with COMMAND GETKEYS on its default node (an extra
round trip on a healthy cluster, and a failure on every master while that one node is
down)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from duetime import AsyncQueue, Queue
from duetime.store.keys import QueueLayout
from tests.conftest import require_binary
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
