"""A wait flow control imposes is not lateness (issue #41, point 3). A task that its rate
limit, its key's concurrency or the queue's cap holds after it is due is "held" for that
long; its lateness counts from the moment the limits let it go. The clock is a
ManualClock that stands still while a task is handed to the worker, so the queue's own
delay shows as 0, exactly, and the wait the limits imposed as held. Before, that wait
was all lateness: a healthy rate-limited queue read as seconds late, and the documented
DuetimeLate alert fired on it."""

from __future__ import annotations

import asyncio
from functools import partial

import redis
from prometheus_client import CollectorRegistry

from duetime import App, Job, KeyLimits, Limits, ManualClock, Queue, Rate, Worker
from duetime.dashboard.flow_view import window_waits
from duetime.metrics import PrometheusHooks
from duetime.metrics.queues import oldest_held_age
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operations import QueueOperations
from duetime.store.redis.runner import AsyncRunner
from tests.helpers import FAST, running, wait_until
from tests.integration.test_lateness import Starts, server_ms


def succeeded(worker: Worker, count: int) -> bool:
    return worker.counters.succeeded == count


def test_a_binding_rate_limit_holds_tasks_and_does_not_make_them_late(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """Three tasks due at once on a key limited to one start a second: the second and the
    third are held 1 s and 2 s, and start 0 s late (before: 1 s and 2 s late)."""
    clock = ManualClock(server_ms(raw))
    start = clock.now_ms()
    starts = Starts()
    registry = CollectorRegistry()
    keys = QueueKeys(queue_name)

    async def handler(data: object) -> None:
        return None

    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.set_limits(Limits(keys={"api": KeyLimits(rate=Rate(1, per=1))}))
        queue.schedule_many([Job(n, delay=0, limit_key="api") for n in range(3)])
        app = App(default=handler, hooks=[starts, PrometheusHooks(registry=registry)])
        worker = Worker(app, queue_name, redis_url, settings=FAST, clock=clock)

        async def scenario() -> None:
            runner = AsyncRunner(redis_url, FAST)
            operations = QueueOperations(keys, clock)
            try:
                async with running(worker):
                    await runner.run(
                        operations.dispatcher.promote_due(10)
                    )  # (none due since point 8)
                    await wait_until(lambda: worker.counters.succeeded == 1, what="the first")
                    state = queue.flow()  # the Flow page's oldest held, and the gauge's
                    assert [state.held_since_ms(group) for group in state.groups] == [start]
                    assert oldest_held_age(queue) > 0
                    for n in (2, 3):
                        clock.set(start + 1000 * (n - 1))  # the rate lets the next one go
                        await runner.run(
                            operations.dispatcher.promote_due(10)
                        )  # gives the turn back
                        await wait_until(partial(succeeded, worker, n), what=f"#{n}")
            finally:
                await runner.close()

        asyncio.run(scenario())
        assert [info.lateness for info in starts.infos] == [0, 0, 0]
        assert [info.held for info in starts.infos] == [0, 1.0, 2.0]
        assert [info.due_at * 1000 - start for info in starts.infos] == [0, 1000, 2000]
        waits = window_waits(queue.throughput(2))  # the overview's and the Flow page's
        assert (waits.lateness_mean, waits.lateness_max) == (0, 0)
        assert (waits.held_mean, waits.held_max) == (1.0, 2.0)
        labels = {"queue": queue_name, "task": "(default)"}
        assert registry.get_sample_value("duetime_task_lateness_seconds_sum", labels) == 0
        assert registry.get_sample_value("duetime_task_held_seconds_sum", labels) == 3.0
        late = {**labels, "le": "0.05"}  # what DuetimeLate's p99 looks at
        assert registry.get_sample_value("duetime_task_lateness_seconds_bucket", late) == 3
        assert queue.check() == []
        assert raw.exists(keys.flow_holds) == 0  # the notes go with the tasks they held


def test_a_key_at_its_concurrency_holds_the_next_task_until_a_slot_frees(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """Concurrency 1: the second task waits 0.5 s for the first to end. It is held that
    long and starts 0 s late (before: 0.5 s late)."""
    clock = ManualClock(server_ms(raw))
    starts = Starts()
    release = asyncio.Event()
    keys = QueueKeys(queue_name)

    async def first_waits(data: object) -> None:
        if data == 0:
            await release.wait()

    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.set_limits(Limits(each_key=KeyLimits(concurrency=1)))
        queue.schedule_many([Job(n, delay=0, limit_key="k", priority=1 - n) for n in range(2)])
        app = App(default=first_waits, hooks=[starts])
        worker = Worker(app, queue_name, redis_url, settings=FAST, clock=clock)

        async def scenario() -> None:
            runner = AsyncRunner(redis_url, FAST)
            try:
                async with running(worker):
                    await runner.run(
                        QueueOperations(keys, clock).dispatcher.promote_due(10)
                    )  # (no-op)
                    await wait_until(lambda: len(starts.infos) == 1, what="the first")
                    clock.advance(0.5)
                    release.set()  # its ack frees the slot; the second starts at once
                    await wait_until(lambda: worker.counters.succeeded == 2, what="both")
            finally:
                await runner.close()

        asyncio.run(scenario())
        first, second = starts.infos
        assert (first.lateness, first.held) == (0, 0)
        assert (second.lateness, second.held) == (0, 0.5)
        assert queue.throughput(1)[-1].held_max == 0.5
        assert queue.check() == []
        assert raw.exists(keys.flow_holds) == 0
