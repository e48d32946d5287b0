"""Search and bulk actions on a real 3-master Redis Cluster: a sharded queue whose shards
live on three masters is walked shard by shard (HSCAN and the matches' status calls
reach each shard's master), and a bulk action on tasks of every shard, sync and asyncio,
also on tasks that wait under flow control."""

from __future__ import annotations

import asyncio

from duetime import AsyncQueue, Job, Queue, TaskSearch
from duetime.client import select_matching, select_matching_async
from duetime.states import TaskState
from tests.integration.test_bulk_flow import assert_reached_on_every_shard, backlog_on_shards
from tests.integration.test_cluster import SHARDED, clean_cluster, cluster
from tests.servers import Cluster

__all__ = ["clean_cluster", "cluster"]  # the fixtures, shared with test_cluster


def test_a_sharded_queue_on_three_masters_is_searched_and_acted_on(clean_cluster: Cluster) -> None:
    name, url = SHARDED.queue, clean_cluster.url
    with Queue(name, url, shards=3) as queue:
        ids = queue.schedule_many(
            [Job({"n": n, "even": n % 2 == 0}, delay=3600, task="t") for n in range(1800)]
        )
        homes = {queue.core.queue.layout.of_task(task_id) for task_id in ids}
        assert homes == {0, 1, 2}
        evens = TaskSearch(data_field="even", data_value="true")
        chosen = select_matching(queue, evens, budget=500)
        assert sorted(chosen.ids) == sorted(ids[::2]) and chosen.complete
        outcome = queue.run_now_many(chosen.ids)
        assert len(outcome.done) == 900 and outcome.skipped == {}
        assert queue.stats().ready == 900

    async def scenario() -> None:
        async with AsyncQueue(name, url, shards=3) as aqueue:
            ready = TaskSearch(task="t", state="ready")
            picked = await select_matching_async(aqueue, ready, budget=700)
            assert sorted(picked.ids) == sorted(ids[::2])
            cancelled = await aqueue.cancel_many(picked.ids)
            assert len(cancelled.done) == 900
            left = await aqueue.search(TaskSearch(id_prefix=ids[1]))
            assert [status.state for status in left.tasks] == [TaskState.SCHEDULED]

    asyncio.run(scenario())
    with Queue(name, url, shards=3) as queue:
        assert queue.stats().scheduled == 900 and queue.check() == []


def test_a_sharded_queue_under_flow_control_is_reached_on_three_masters(
    clean_cluster: Cluster,
) -> None:
    with Queue(SHARDED.queue, clean_cluster.url, shards=3) as queue:
        assert_reached_on_every_shard(queue, backlog_on_shards(queue))
