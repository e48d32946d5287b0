"""Cluster master-kill (soak only, ``DUETIME_SOAK=1``, ``make reliability``): a 3-master
cluster with a replica each, producers scheduling plain and durable tasks on a queue
sharded over every master, a dispatcher and workers running; the master of one shard's
slot is killed with SIGKILL mid-run and its replica takes over (CLUSTER FAILOVER
TAKEOVER from the test). Then everything runs to completion and is counted:
acknowledged, lost, ran more than once, early.

Plain writes to the killed master may be lost (asynchronous replication: what the
replica had not received when the master died); durable ones must not be, and no task
may run early."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from duetime import App, AsyncQueue, Dispatcher, Worker, current_task
from duetime.errors import NotDurableError, RedisUnavailableError
from duetime.store.plans.layout import QueueLayout
from tests.conftest import require_binary
from tests.helpers import FAST, running, wait_until
from tests.servers import Cluster, command

SOAK = os.environ.get("DUETIME_SOAK", "") == "1"
#: A queue whose three shards fall on the three masters of a 3-master test cluster.
SHARDED = QueueLayout("work", 3)
PRODUCING = 6.0  # seconds of scheduling; the kill comes once 500 durable tasks are in


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    instance = Cluster("redis", require_binary("redis"), replicas=1)
    instance.start()
    yield instance
    instance.stop()


@pytest.mark.skipif(not SOAK, reason="long-only (DUETIME_SOAK=1)")
def test_a_cluster_master_killed_mid_run(cluster: Cluster) -> None:
    url = cluster.url
    app = App()
    runs: Counter[str] = Counter()
    early: list[str] = []

    @app.default
    async def record(data: dict[str, Any]) -> None:
        task = current_task()
        if time.time() < data["at"]:
            early.append(task.id)
        runs[task.id] += 1

    plain: list[str] = []
    durable: list[str] = []
    victim = cluster.node_of_slot(key_slot(SHARDED.shards[0].tasks.encode()))
    replica = cluster.replica_nodes[cluster.nodes.index(victim)]

    async def produce(queue: AsyncQueue, acknowledged: list[str], stop: float) -> None:
        while time.monotonic() < stop:
            at = time.time() + 0.5
            jobs = [(at, {"at": at}) for _ in range(10)]
            try:
                acknowledged.extend(await queue.schedule_many(jobs))
            except NotDurableError:
                pass  # written but unconfirmed: not acknowledged as durable
            except RedisUnavailableError:
                await asyncio.sleep(0.05)  # the failover in progress; try again

    async def kill_and_promote() -> None:
        await wait_until(
            lambda: len(durable) >= 500, timeout=PRODUCING, what="scheduling under way"
        )
        victim.kill()
        client = replica.client()
        command(client, "CLUSTER", "FAILOVER", "TAKEOVER")
        client.close()

    async def scenario() -> None:
        dispatcher = Dispatcher(SHARDED.queue, url, shards=SHARDED.count, settings=FAST)
        workers = [
            Worker(app, SHARDED.queue, url, shards=SHARDED.count, settings=FAST) for _ in range(2)
        ]
        durable_settings = FAST.replace(durable_timeout=1.0)
        async with (
            AsyncQueue(SHARDED.queue, url, shards=SHARDED.count) as plain_queue,
            AsyncQueue(
                SHARDED.queue, url, shards=SHARDED.count, durable=True, settings=durable_settings
            ) as durable_queue,
            running(dispatcher, *workers),
        ):
            stop = time.monotonic() + PRODUCING
            await asyncio.gather(
                produce(plain_queue, plain, stop),
                produce(durable_queue, durable, stop),
                kill_and_promote(),
            )
            await wait_until(
                lambda: set(durable) <= set(runs), timeout=60, what="every durable task run"
            )
            with contextlib.suppress(AssertionError):  # plain ones may be lost: counted below
                await wait_until(lambda: set(plain) <= set(runs), timeout=10, what="plain run")

    asyncio.run(scenario())
    figures = {
        "acknowledged_plain": len(plain),
        "acknowledged_durable": len(durable),
        "lost_plain": len(set(plain) - set(runs)),
        "lost_durable": len(set(durable) - set(runs)),
        "ran_more_than_once": sum(1 for count in runs.values() if count > 1),
        "early": len(early),
    }
    print(f"\n[reliability] cluster master-kill: {figures}")
    assert figures["lost_durable"] == 0 and figures["early"] == 0, figures
