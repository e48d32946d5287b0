"""Cron jobs on a real server: declaration, exactly-once ticks across dispatchers,
missed-tick policies after a gap, overlap control, and runs end to end."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import pytest
import redis

import duetime
from duetime import (
    App,
    Dispatcher,
    ManualClock,
    Queue,
    Settings,
    Worker,
    codec,
    cron,
)
from duetime.cron import definitions as cron_definitions
from duetime.dispatcher import QueueDispatcher
from duetime.errors import InvalidInputError, TaskNotFoundError
from duetime.store.plans.keys import QueueKeys
from duetime.store.redis.runner import AsyncRunner
from tests.helpers import FAST, decoded, running, wait_until

T0 = 1_800_000_000_000  # a whole second, on a whole minute
SECOND = 1000


def ready_ids(raw: redis.Redis, queue_name: str) -> list[str]:
    return decoded(raw.lrange(QueueKeys(queue_name).ready, 0, -1))


async def step_all(dispatchers: list[QueueDispatcher]) -> None:
    for dispatcher in dispatchers:
        await dispatcher.step()


def with_dispatchers(redis_url: str, queue_name: str, clock: ManualClock, count: int):  # type: ignore[no-untyped-def]
    """Run ``scenario(dispatchers)`` with ``count`` dispatchers sharing ``clock``."""

    def runner(scenario):  # type: ignore[no-untyped-def]
        async def main() -> None:
            runners = [AsyncRunner(redis_url, Settings()) for _ in range(count)]
            dispatchers = [QueueDispatcher(queue_name, r, Settings(), clock) for r in runners]
            try:
                await scenario(dispatchers)
            finally:
                for r in runners:
                    await r.close()

        asyncio.run(main())

    return runner


def test_declarations_are_validated_idempotent_and_converge(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        with pytest.raises(InvalidInputError, match="unknown time zone"):
            queue.add_cron("report", "0 9 * * *", {}, tz="Nowhere/Land")
        with pytest.raises(InvalidInputError, match="invalid cron expression"):
            queue.add_cron("report", "0 25 * * *", {})
        assert raw.dbsize() == 0  # nothing stored on error

        assert queue.add_cron("report", "0 9 * * *", {"a": 1}, tz="Europe/Paris") == "created"
        assert queue.add_cron("report", "0 9 * * *", {"a": 1}, tz="Europe/Paris") == "unchanged"
        [info] = queue.list_cron()
        assert (info.expression, info.timezone, info.missed, info.paused) == (
            "0 9 * * *", "Europe/Paris", "skip", False,
        )  # fmt: skip
        assert len(info.next_runs) == 3 and info.last_run is None
        assert queue.add_cron("report", "0 10 * * *", {"a": 1}, tz="Europe/Paris") == "updated"
        # T0 is 09:00 in Paris: the 09:00 job next fires tomorrow, the 10:00 one in an hour.
        assert info.next_runs[0] == T0 / 1000 + 86400
        assert queue.list_cron()[0].next_runs[0] == T0 / 1000 + 3600

        queue.pause_cron("report")
        assert queue.list_cron()[0].paused and queue.list_cron()[0].next_runs == []
        queue.resume_cron("report")
        assert not queue.list_cron()[0].paused
        with pytest.raises(TaskNotFoundError):
            queue.pause_cron("nope")

        # Redeploy: code now declares "hourly" only; "report" is pruned.
        outcome = queue.sync_cron([queue.cron_job("hourly", "@hourly", {"b": 2})])
        assert outcome == {"hourly": "created", "report": "removed"}
        assert [job.name for job in queue.list_cron()] == ["hourly"]
        assert queue.check() == []


def test_three_racing_dispatchers_enqueue_each_of_60_ticks_once(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0 - SECOND // 2)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.add_cron("every-second", "* * * * * *", {"n": 1})

    async def scenario(dispatchers: list[QueueDispatcher]) -> None:
        rng = random.Random(7)
        for second in range(60):
            clock.set(T0 + second * SECOND + rng.randrange(0, 300))
            order = dispatchers[:]
            rng.shuffle(order)
            # Interleave the racers on one event loop: their steps overlap in Redis.
            await asyncio.gather(*(d.step() for d in order))

    with_dispatchers(redis_url, queue_name, clock, 3)(scenario)
    fired = ready_ids(raw, queue_name)
    expected = [f"cron:every-second:{T0 + s * SECOND}" for s in range(60)]
    assert sorted(fired) == sorted(expected)
    assert max(Counter(fired).values()) == 1
    assert int(raw.hget(QueueKeys(queue_name).stats, "cron_fired") or 0) == 60


# After the on-time tick at T0, the gap leaves 9 missed ticks plus the current one.
@pytest.mark.parametrize(("missed", "expected"), [("skip", 1), ("once", 2), ("all", 10)])
def test_a_restart_after_a_gap_applies_the_missed_tick_policy(
    redis_url: str, raw: redis.Redis, queue_name: str, missed: str, expected: int
) -> None:
    clock = ManualClock(T0 - 500)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.add_cron("minutely", "* * * * *", {}, missed=missed)

    async def scenario(dispatchers: list[QueueDispatcher]) -> None:
        clock.set(T0 + 100)  # the tick at T0 fires on time
        await step_all(dispatchers)
        # All dispatchers are down for ten minutes; one comes back.
        clock.set(T0 + 10 * 60 * SECOND + 2 * SECOND)
        await step_all(dispatchers)
        await step_all(dispatchers)  # and nothing more on a second pass

    with_dispatchers(redis_url, queue_name, clock, 1)(scenario)
    fired = ready_ids(raw, queue_name)
    assert fired[0] == f"cron:minutely:{T0}"
    assert len(fired) - 1 == expected
    assert fired[-1] == f"cron:minutely:{T0 + 10 * 60 * SECOND}"  # the current tick
    with Queue(queue_name, redis_url, clock=clock) as queue:
        assert queue.list_cron()[0].next_runs[0] * 1000 == T0 + 11 * 60 * SECOND


@pytest.mark.parametrize("overlap", ["skip", "delay"])
def test_overlap_control_while_the_previous_run_is_live(
    redis_url: str, raw: redis.Redis, queue_name: str, overlap: str
) -> None:
    clock = ManualClock(T0 - 500)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.add_cron("exclusive", "* * * * *", {}, overlap=overlap)

        async def scenario(dispatchers: list[QueueDispatcher]) -> None:
            clock.set(T0 + 100)
            await step_all(dispatchers)  # first tick enqueued; nothing runs it
            clock.set(T0 + 60 * SECOND + 100)
            await step_all(dispatchers)  # second tick: the first is still live
            assert ready_ids(raw, queue_name) == [f"cron:exclusive:{T0}"]
            assert queue.cancel(f"cron:exclusive:{T0}")  # the previous run ends
            clock.set(T0 + 61 * SECOND + 200)
            await step_all(dispatchers)

        with_dispatchers(redis_url, queue_name, clock, 1)(scenario)
        fired = ready_ids(raw, queue_name)
        if overlap == "skip":
            assert fired == []  # the second tick was skipped, not run late
            assert int(raw.hget(QueueKeys(queue_name).stats, "cron_skipped") or 0) == 1
        else:
            assert fired == [f"cron:exclusive:{T0 + 60 * SECOND}"]  # held, then run
        assert queue.check() == []


def test_a_per_second_job_runs_end_to_end_and_reports_its_last_run(
    redis_url: str, queue_name: str
) -> None:
    runs: list[duetime.TaskContext] = []
    app = App()

    @app.task
    async def tick(data: object) -> None:
        runs.append(duetime.current_task())

    with Queue(queue_name, redis_url) as queue:
        queue.add_cron("pulse", "* * * * * *", {"x": 1}, task=tick)

        async def scenario() -> None:
            async with running(
                Dispatcher([queue_name], redis_url), Worker(app, queue_name, redis_url)
            ):
                await wait_until(lambda: len(runs) >= 3, timeout=10, what="three ticks")

        asyncio.run(scenario())
        ticks = [context.run_at for context in runs]
        assert all(t == int(t) for t in ticks)  # on the second
        assert len(set(ticks)) == len(ticks)  # each tick once
        last = queue.list_cron()[0].last_run
        assert last is not None and last.task_id.startswith("cron:pulse:")
        assert last.succeeded is True and last.lateness_ms is not None and last.lateness_ms >= 0
        assert queue.check() == []


def test_a_triggered_run_is_the_task_a_tick_would_be(redis_url: str, queue_name: str) -> None:
    # A job without a task name goes to the default handler, as its ticks do (a trigger
    # once refused it), with the timeout as stored (it once went through seconds and back).
    with Queue(queue_name, redis_url) as queue:
        queue.add_cron("sweep", "0 3 * * *", [1, "two"], max_attempts=4, timeout=2.007)
        task_id = queue.trigger_cron("sweep")
        keys = QueueKeys(queue_name)
        with redis.Redis.from_url(redis_url) as raw:
            stored = codec.decode_envelope(raw.hget(keys.tasks, task_id))
            name, data, template = cron_definitions.decode_parts(raw.hget(keys.cron, "sweep"))
        tick = codec.decode_envelope(template.tick_task(name, codec.pack(data), 1_000, 1_000)[2])
        assert stored.task == tick.task == ""
        assert (stored.data, stored.max_attempts, stored.timeout_ms, stored.result_ttl_ms) == (
            tick.data,
            tick.max_attempts,
            tick.timeout_ms,
            tick.result_ttl_ms,
        )
        assert (tick.data, tick.max_attempts, tick.result_ttl_ms) == (
            [1, "two"],
            4,
            cron.RESULT_TTL_MS,
        )


def test_trigger_runs_a_job_once_now_with_its_definition(redis_url: str, queue_name: str) -> None:
    seen: list[tuple[Any, int]] = []
    app = App()

    @app.task
    def report(data: Any) -> None:
        seen.append((data, duetime.current_task().max_attempts))

    with Queue(queue_name, redis_url, shards=2) as queue:
        queue.add_cron("nightly", "0 3 * * *", {"kind": "nightly"}, task=report, max_attempts=7)
        before = queue.list_cron()[0].next_runs
        task_id = queue.trigger_cron("nightly")
        assert not task_id.startswith("cron:")  # a run of its own, not a tick

        async def scenario() -> None:
            worker = Worker(app, queue_name, redis_url, settings=FAST, shards=2)
            async with running(worker):
                await wait_until(lambda: len(seen) == 1, what="the triggered run")

        asyncio.run(scenario())
        assert seen == [({"kind": "nightly"}, 7)]
        assert queue.result(task_id, timeout=1) is None  # kept, like a tick's
        assert queue.list_cron()[0].next_runs == before  # the schedule is untouched
        with pytest.raises(TaskNotFoundError):
            queue.trigger_cron("nobody")
