"""Operating safety: eviction warning at start-up, bounded dead-letter retention."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
import redis

from duetime import App, ManualClock, Queue, Settings, Worker
from duetime.dispatcher import QueueDispatcher
from duetime.store.plans.keys import QueueKeys
from duetime.store.redis.runner import AsyncRunner
from tests.helpers import decoded, running, take_waiting

T0 = 1_800_000_000_000


@pytest.fixture
def evicting(raw: redis.Redis) -> Iterator[None]:
    raw.config_set("maxmemory-policy", "allkeys-lru")
    yield
    raw.config_set("maxmemory-policy", "noeviction")


def test_daemons_warn_loudly_when_keys_may_be_evicted(
    evicting: None, redis_url: str, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with running(Worker(App(default=print), queue_name, redis_url)):
            await asyncio.sleep(0)

    with caplog.at_level(logging.WARNING, logger="duetime"):
        asyncio.run(scenario())
    warnings = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert len(warnings) == 1 and "'allkeys-lru'" in warnings[0] and "lose tasks" in warnings[0]


def test_dead_tasks_are_purged_by_age_and_by_count(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    clock = ManualClock(T0)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        ids = [queue.schedule_in(3600, {"n": n}) for n in range(6)]
    for age, task_id in enumerate(ids):  # what fail_task leaves for a dead task, oldest first
        take_waiting(raw, keys, task_id)
        raw.zadd(keys.dead, {task_id: T0 - (10 - age) * 1000})
        raw.hset(keys.errors, task_id, b"x")
    # Two died over 8.5 s ago (past dead_ttl); of the rest, keep the newest three.
    settings = Settings(dead_ttl=8.5, dead_max=3)

    async def scenario() -> None:
        runner = AsyncRunner(redis_url, settings)
        try:
            await QueueDispatcher(queue_name, runner, settings, clock).step()
        finally:
            await runner.close()

    asyncio.run(scenario())
    assert decoded(raw.zrange(keys.dead, 0, -1)) == ids[3:]
    assert raw.hlen(keys.tasks) == 3 and raw.hlen(keys.errors) == 3
    with Queue(queue_name, redis_url, clock=clock) as queue:
        assert queue.check() == []
