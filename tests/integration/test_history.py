"""The history of finished attempts on a real server: each script that ends an attempt
(ack, fail to a retry or to dead, snooze, the reaps of an expired lease and of a silent
worker, and cancel) records it in the same step; the history is capped, trimmed with
its index, read newest first, filtered, by task, across shards, sync and async; a
damaged history never fails a step; the invariant checker reads it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from duetime import App, AsyncQueue, Dispatcher, HistoryOutcome, ManualClock, Queue, Worker
from duetime.errors import InvalidInputError
from duetime.store.plans.history import HISTORY_TRIM_STEP
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.layout import QueueLayout
from duetime.store.plans.working import Outcome
from tests.helpers import FAST, running, wait_until

NOW_MS = 1_800_000_000_000
LEASE_MS = 60_000


def outcomes(found: list[Any]) -> list[tuple[str, str, int]]:
    return [(attempt.task_id, str(attempt.outcome), attempt.attempt) for attempt in found]


def test_every_ending_of_an_attempt_is_recorded_in_the_step_that_ends_it(
    redis_url: str, queue_name: str
) -> None:
    clock = ManualClock(NOW_MS)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        ops, run = queue.core.queue.operations, queue.runner.run
        queue.schedule_now({}, id="ok", task="send")
        queue.schedule_now({}, id="flaky", task="send", max_attempts=2)
        queue.schedule_now({}, id="snoozy", task="poll")
        queue.schedule_in(3600, {}, id="later", task="report")
        run(ops.worker.claim("w1", LEASE_MS, 10))
        clock.advance(0.005)
        run(
            ops.worker.ack(
                "w1", [Outcome("ok", 1, lateness_us=1_500, duration_us=2_500, task="send")]
            )
        )
        failed = run(
            ops.worker.fail("w1", "flaky", 1, b"e", 1_000, ran=(3_000, 200), summary="E: x")
        )
        snoozed = run(ops.worker.snooze("w1", "snoozy", 1, 500, False, ran=(100, 0)))
        assert failed and snoozed
        clock.advance(1)
        run(ops.dispatcher.promote_due(10))
        run(ops.worker.claim("w2", LEASE_MS, 10))  # snoozy (its attempt was given back), flaky #2
        clock.advance(LEASE_MS / 1000 + 1)
        assert run(ops.dispatcher.reap_expired_leases(10)) == 2
        run(ops.dispatcher.promote_due(10))
        run(ops.worker.claim("w3", LEASE_MS, 10))
        assert run(ops.dispatcher.reap_worker("w3", clock.now_ms() + 1)) == 2  # w3 went silent
        assert queue.cancel("later")

        assert outcomes(queue.history()) == [
            ("later", "cancelled", 0),
            ("snoozy", "lost", 2),
            ("flaky", "lost", 3),
            ("snoozy", "lost", 1),
            ("flaky", "lost", 2),
            ("snoozy", "snoozed", 1),
            ("flaky", "retried", 1),
            ("ok", "succeeded", 1),
        ]
        ok, retried = queue.history(task_id="ok")[0], queue.history(task_id="flaky")[-1]
        assert (ok.task, ok.worker, ok.duration, ok.lateness) == ("send", "w1", 0.0025, 0.0015)
        assert ok.finished_at == (NOW_MS + 5) / 1000 and ok.error is None
        assert (retried.error, retried.duration, retried.lateness) == ("E: x", 0.003, 0.0002)
        lost = queue.history(outcome="lost")
        assert [(a.worker, a.duration, a.lateness) for a in lost] == [
            ("w3", None, None), ("w3", None, None), ("w2", None, None), ("w2", None, None),
        ]  # fmt: skip
        cancelled = queue.history(1)[0]
        assert (cancelled.task, cancelled.worker, cancelled.duration) == ("report", None, None)
        # One task's attempts, newest first, found through its index without a scan.
        assert outcomes(queue.history(task_id="flaky")) == [
            ("flaky", "lost", 3), ("flaky", "lost", 2), ("flaky", "retried", 1),
        ]  # fmt: skip
        assert outcomes(queue.history(task="poll", outcome=HistoryOutcome.LOST)) == [
            ("snoozy", "lost", 2), ("snoozy", "lost", 1),
        ]  # fmt: skip
        assert outcomes(queue.history(2, 1)) == [("snoozy", "lost", 2), ("flaky", "lost", 3)]
        assert queue.history(task_id="never") == []
        assert queue.check() == []


def test_a_worker_records_what_its_attempts_came_to(redis_url: str, queue_name: str) -> None:
    def handler(data: dict[str, Any]) -> None:
        if data["fail"]:
            raise ValueError("bad input\nsecond line")

    with Queue(queue_name, redis_url) as queue:
        worker = Worker(App(default=handler), queue_name, redis_url, settings=FAST)

        async def scenario() -> None:
            async with running(Dispatcher([queue_name], redis_url, settings=FAST), worker):
                queue.schedule_now({"fail": False}, id="good")
                queue.schedule_now({"fail": True}, id="bad", max_attempts=2)
                await wait_until(lambda: len(queue.history()) == 3, what="three attempts")

        asyncio.run(scenario())
        assert queue.status("good") is None  # gone, no result kept: the history knows it
        [good] = queue.history(task_id="good")
        assert (good.outcome, good.attempt, good.worker) == ("succeeded", 1, worker.worker_id)
        assert good.duration is not None and good.duration > 0
        assert good.lateness is not None and good.lateness >= 0
        assert outcomes(queue.history(task_id="bad")) == [("bad", "dead", 2), ("bad", "retried", 1)]
        assert {a.error for a in queue.history(task_id="bad")} == {"ValueError: bad input"}
        assert queue.check() == []


def test_the_history_keeps_its_size_and_trims_its_index_with_it(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    clock = ManualClock(NOW_MS)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        ops, run = queue.core.queue.operations, queue.runner.run
        assert queue.history_size() == 1000
        queue.set_history(3)
        queue.schedule_now({}, id="first")
        run(ops.worker.claim("w", LEASE_MS, 1))
        run(ops.worker.fail("w", "first", 1, b"e", 0))  # first's entry 1
        for n in range(3):
            queue.cancel(queue.schedule_in(60, {}, id=f"c{n}"))  # entries 2 to 4
        run(ops.dispatcher.promote_due(10))
        run(ops.worker.claim("w", LEASE_MS, 1))
        run(ops.worker.fail("w", "first", 2, b"e", 0))  # entry 5; entries 1 and 2 are past the size
        assert outcomes(queue.history()) == [
            ("first", "retried", 2), ("c2", "cancelled", 0), ("c1", "cancelled", 0),
        ]  # fmt: skip
        # first's entry names its entry 1, which is no longer kept: the walk stops there.
        assert outcomes(queue.history(task_id="first")) == [("first", "retried", 2)]
        assert queue.history(task_id="c0") == []
        # Trimmed in steps: once the log holds HISTORY_TRIM_STEP entries past its size,
        # back to its size, with the index entries of what went.
        assert raw.llen(keys.history) == 5
        for n in range(HISTORY_TRIM_STEP - 2):
            queue.cancel(queue.schedule_in(60, {}, id=f"d{n}"))
        assert raw.llen(keys.history) == 3 and raw.zcard(keys.history_tasks) == 3
        assert len(queue.history()) == 3 and queue.check() == []
        queue.set_history(1)  # trims at once, index too
        assert raw.llen(keys.history) == 1 and raw.zcard(keys.history_tasks) == 1
        queue.set_history(0)  # off: what is kept goes, nothing more is recorded
        queue.cancel(queue.schedule_in(60, {}))
        assert queue.history_size() == 0 and queue.history() == []
        assert not raw.exists(keys.history, keys.history_tasks)
        queue.set_history(None)  # the default again
        queue.cancel(queue.schedule_in(60, {}, id="again"))
        assert queue.history_size() == 1000
        assert outcomes(queue.history()) == [("again", "cancelled", 0)]
        assert queue.check() == []


def test_a_damaged_history_records_nothing_and_never_fails_a_step(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        raw.set(keys.history, "not a list")
        assert queue.cancel(queue.schedule_in(60, {}))
        assert raw.get(keys.history) == b"not a list" and not raw.exists(keys.history_state)
        raw.delete(keys.history)
        raw.hset(keys.history_state, "size", "lots")
        assert queue.cancel(queue.schedule_in(60, {}))
        assert not raw.exists(keys.history) and queue.history_size() == 0
        assert [str(v) for v in queue.check()] == ["garbage: history_state.size: b'lots'"]


def test_the_checker_reports_a_history_beyond_its_size_and_a_stale_index(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        queue.set_history(2)
        for n in range(2):
            queue.cancel(queue.schedule_in(60, {}, id=f"c{n}"))
        assert queue.check() == []
        raw.zadd(keys.history_tasks, {"ghost": 7, "c0": 2})  # 7 was never written; 2 is c1's
        entry = raw.lindex(keys.history, 0) or b""
        raw.rpush(keys.history, *[entry] * HISTORY_TRIM_STEP)  # past any trim
        found = sorted(str(v) for v in queue.check())
        assert found == [
            "leak: ghost: history index entry of entry 7, which is not kept",
            f"leak: history: holds {2 + HISTORY_TRIM_STEP} entries; it keeps 2, and is trimmed "
            f"{HISTORY_TRIM_STEP} later",
            "stale index: c0: history index points at entry 2, of task c1",
        ]


def test_a_sharded_queue_keeps_a_history_per_shard_read_as_one(
    redis_url: str, queue_name: str
) -> None:
    ids = [f"task-{n}" for n in range(9)]
    assert {QueueLayout(queue_name, 3).of_task(task_id) for task_id in ids} == {0, 1, 2}
    clock = ManualClock(NOW_MS)
    with Queue(queue_name, redis_url, clock=clock, shards=3) as queue:
        for task_id in ids:
            clock.advance(0.01)
            queue.cancel(queue.schedule_in(60, {}, id=task_id))
        assert [a.task_id for a in queue.history()] == ids[::-1]
        assert [a.task_id for a in queue.history(3, 3)] == ids[5:2:-1]
        assert all(queue.history(task_id=task_id)[0].task_id == task_id for task_id in ids)
        queue.set_history(1)  # per shard
        assert len(queue.history()) == 3 and queue.history_size() == 1
        assert queue.check() == []


def test_async_queue_reads_the_same_history(redis_url: str, queue_name: str) -> None:
    with Queue(queue_name, redis_url) as queue:
        for n in range(3):
            queue.cancel(queue.schedule_in(60, {}, id=f"c{n}", task="report"))
        expected = queue.history()

    async def read() -> tuple[Any, ...]:
        async with AsyncQueue(queue_name, redis_url) as aqueue:
            await aqueue.set_history(2)
            return (
                await aqueue.history(),
                await aqueue.history(task="report", task_id="c2"),
                await aqueue.history_size(),
            )

    found, one, size = asyncio.run(read())
    assert found == expected[:2] and one == expected[:1] and size == 2


def test_bad_history_requests_are_refused_before_anything_is_written(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        for call, message in (
            (lambda: queue.history(outcome="exploded"), "outcome must be one of"),
            (lambda: queue.history(0), "limit"),
            (lambda: queue.history(task_id="a|b"), "task id"),
            (lambda: queue.history(task="no spaces"), "task name"),
            (lambda: queue.set_history(-1), "history size"),
            (lambda: queue.set_history(100_001), "history size"),
        ):
            with pytest.raises(InvalidInputError, match=message):
                call()
    assert raw.dbsize() == 0
