"""Debounce by key against a real server: calls collapse into one task whose run-at moves
with each call and never past max_wait, with the last call's data or all of them in
order; 50 concurrent callers (threads, asyncio tasks) make exactly one task; a task that
has started is never changed; the task runs once, never before its final run-at."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

import duetime
from duetime import (
    App,
    AsyncQueue,
    Debounce,
    Dispatcher,
    Job,
    ManualClock,
    Queue,
    Throttle,
    Worker,
)
from duetime.client import keyed as keyed_client
from duetime.errors import NotDurableError
from duetime.keyed import Scheduled
from duetime.states import KeyedOutcome, TaskState
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operations import QueueOperations
from duetime.store.redis.runner import SyncRunner
from tests.helpers import FAST, as_bytes, decoded, running, wait_until

T0 = 1_800_000_000_000  # ms
CALLERS = 50


def test_calls_collapse_and_move_the_run_at_never_past_max_wait(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    clock = ManualClock(T0)
    debounce = Debounce("user:1", 10, max_wait=25)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        first = queue.schedule_keyed({"n": 1}, debounce=debounce)
        assert (first.outcome, first.run_at, first.calls, first.until) == (
            KeyedOutcome.CREATED,
            (T0 + 10_000) / 1000,
            1,
            (T0 + 25_000) / 1000,
        )
        clock.advance(6)
        second = queue.schedule_keyed({"n": 2}, debounce=debounce)
        assert (second.id, second.outcome, second.calls) == (first.id, KeyedOutcome.COLLAPSED, 2)
        assert second.run_at == (T0 + 16_000) / 1000
        assert raw.zscore(keys.scheduled, first.id) == T0 + 16_000
        clock.advance(8)  # t0 + 14 s: now + window would be t0 + 24 s
        # A later call with a longer max_wait cannot lift the deadline the first fixed.
        third = queue.schedule_keyed({"n": 3}, debounce=Debounce("user:1", 10, max_wait=600))
        assert (third.id, third.run_at, third.until) == (
            first.id,
            (T0 + 24_000) / 1000,
            25 + T0 / 1000,
        )
        clock.advance(9)  # t0 + 23 s: now + window is past the deadline
        fourth = queue.schedule_keyed({"n": 4}, debounce=debounce)
        assert (fourth.id, fourth.run_at, fourth.calls) == (first.id, (T0 + 25_000) / 1000, 4)
        status = queue.status(first.id)
        assert status is not None and status.state == TaskState.SCHEDULED
        assert (status.run_at, status.data) == ((T0 + 25_000) / 1000, {"n": 4})
        assert status.keyed == duetime.KeyedState(
            "debounce", "user:1", 4, (T0 + 25_000) / 1000, "last"
        )
        assert raw.hlen(keys.tasks) == 1 and queue.stats().counters["debounced"] == 3
        clock.advance(2)  # t0 + 25 s: the run-at has come: a new call starts afresh
        fifth = queue.schedule_keyed({"n": 5}, debounce=debounce)
        assert fifth.outcome == KeyedOutcome.CREATED and fifth.id != first.id
        assert fifth.run_at == (T0 + 35_000) / 1000
        assert queue.status(first.id).data == {"n": 4}  # type: ignore[union-attr]
        assert queue.check() == []


def test_collect_all_keeps_every_call_in_order_up_to_most_then_runs_it_at_once(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    clock = ManualClock(T0)
    debounce = Debounce("batch", 5, collect="all", most=3)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        made = [queue.schedule_keyed({"n": n}, debounce=debounce) for n in range(3)]
        assert {r.id for r in made} == {made[0].id} and [r.calls for r in made] == [1, 2, 3]
        status = queue.status(made[0].id)
        assert status is not None and status.data == [{"n": 0}, {"n": 1}, {"n": 2}]
        # The fourth call finds the task full: it is due now with its three, and the
        # call starts a new task.
        clock.advance(1)
        fourth = queue.schedule_keyed({"n": 3}, debounce=debounce)
        assert fourth.outcome == KeyedOutcome.CREATED and fourth.id != made[0].id
        assert as_bytes(raw.lindex(keys.ready, 0)).decode() == made[0].id
        full = queue.status(made[0].id)
        assert full is not None and full.state == TaskState.READY
        assert full.data == [{"n": 0}, {"n": 1}, {"n": 2}]
        assert codec_run_at(raw, keys, made[0].id) == T0 + 1000  # due now, not earlier
        assert queue.status(fourth.id).data == [{"n": 3}]  # type: ignore[union-attr]
        # Calls of one key must collect alike while its task waits.
        try:
            queue.schedule_keyed({"n": 4}, debounce=Debounce("batch", 5))
        except duetime.errors.InvalidOptionError as error:
            assert "collects 'all'" in str(error)
        else:
            raise AssertionError("a call collecting otherwise was accepted")
        assert queue.status(fourth.id).data == [{"n": 3}]  # type: ignore[union-attr]
        assert queue.check() == []


def codec_run_at(raw: redis.Redis, keys: QueueKeys, task_id: str) -> float:
    return duetime.codec.decode_envelope(as_bytes(raw.hget(keys.tasks, task_id))).run_at_ms


def test_a_byte_bound_list_runs_at_once_and_the_call_starts_a_new_task(
    redis_url: str, queue_name: str
) -> None:
    clock = ManualClock(T0)
    settings = duetime.Settings(max_payload_bytes=100)
    with Queue(queue_name, redis_url, clock=clock, settings=settings) as queue:
        debounce = Debounce("big", 5, collect="all")
        ids = [queue.schedule_keyed("x" * 40, debounce=debounce).id for _ in range(3)]
        assert ids[0] == ids[1] != ids[2]  # two of 41 bytes fit in 100, three would not
        assert queue.status(ids[0]).data == ["x" * 40] * 2  # type: ignore[union-attr]


def test_50_threads_on_one_key_make_exactly_one_task_holding_every_call_in_order(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    debounce = Debounce("hot", 30, collect="all", most=CALLERS)
    barrier = threading.Barrier(CALLERS)

    def call(queue: Queue, n: int) -> Scheduled:
        barrier.wait()
        return queue.schedule_keyed({"caller": n}, debounce=debounce)

    with Queue(queue_name, redis_url, clock=ManualClock(T0)) as queue:
        with ThreadPoolExecutor(CALLERS) as pool:
            results = list(pool.map(lambda n: call(queue, n), range(CALLERS)))
        assert_one_task_with_every_call(queue, results)
        assert raw.hlen(keys.tasks) == 1 and raw.zcard(keys.scheduled) == 1
        assert queue.stats().counters["debounced"] == CALLERS - 1


def assert_one_task_with_every_call(queue: Queue, results: list[Scheduled]) -> None:
    """One task carries every call, and its list holds each call's data at the place its
    count says (the order the server took the calls in)."""
    assert {r.id for r in results} == {results[0].id}
    assert sorted(r.calls for r in results) == list(range(1, CALLERS + 1))
    assert [r.outcome for r in results].count(KeyedOutcome.CREATED) == 1
    status = queue.status(results[0].id)
    assert status is not None and len(status.data) == CALLERS
    for result in results:
        assert status.data[result.calls - 1] == {"caller": results.index(result)}
    assert queue.check() == []


def test_50_asyncio_tasks_on_one_key_make_exactly_one_task_with_the_last_data(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    debounce = Debounce("hot", 30)

    async def scenario() -> list[Scheduled]:
        async with AsyncQueue(queue_name, redis_url, clock=ManualClock(T0)) as queue:
            calls = [queue.schedule_keyed({"caller": n}, debounce=debounce) for n in range(CALLERS)]
            return list(await asyncio.gather(*calls))

    results = asyncio.run(scenario())
    assert {r.id for r in results} == {results[0].id}
    assert sorted(r.calls for r in results) == list(range(1, CALLERS + 1))
    last = max(results, key=lambda r: r.calls)
    with Queue(queue_name, redis_url) as queue:
        status = queue.status(results[0].id)
        assert status is not None and status.data == {"caller": results.index(last)}
        assert queue.check() == []
    assert raw.hlen(keys.tasks) == 1


def test_each_quiet_period_runs_one_task_with_its_calls_never_before_its_final_run_at(
    redis_url: str, queue_name: str
) -> None:
    runs: list[tuple[str, Any, float, float]] = []  # id, data, run-at, started (s)
    app = App()

    @app.default
    async def record(data: Any) -> None:
        started = time.time()  # loopback: the clock the server's TIME reads
        context = duetime.current_task()
        runs.append((context.id, data, context.run_at, started))

    debounce = Debounce("burst", 1.5, collect="all", most=1000)
    bursts: list[list[tuple[dict[str, int], Scheduled]]] = []

    def burst(queue: Queue, number: int) -> list[tuple[dict[str, int], Scheduled]]:
        def caller(n: int) -> list[tuple[dict[str, int], Scheduled]]:
            sent = [{"burst": number, "caller": n, "call": c} for c in range(4)]
            return [(data, queue.schedule_keyed(data, debounce=debounce)) for data in sent]

        with ThreadPoolExecutor(CALLERS) as pool:
            return [call for calls in pool.map(caller, range(CALLERS)) for call in calls]

    async def scenario(queue: Queue) -> None:
        async with running(
            Dispatcher([queue_name], redis_url, settings=FAST),
            Worker(app, queue_name, redis_url, settings=FAST),
        ):
            for number in range(2):
                bursts.append(await asyncio.to_thread(burst, queue, number))
                await wait_until(lambda: len(runs) == len(bursts), what=f"burst {number} run")

    with Queue(queue_name, redis_url) as queue:
        asyncio.run(scenario(queue))
        assert queue.check() == []
    assert len(runs) == 2
    for calls, (task_id, data, run_at, started) in zip(bursts, runs, strict=True):
        assert {result.id for _, result in calls} == {task_id}  # one task per quiet period
        in_order = sorted(calls, key=lambda call: call[1].calls)
        assert data == [sent for sent, _ in in_order]  # every call's data, in call order
        final = in_order[-1][1]
        assert final.calls == CALLERS * 4
        assert run_at == final.run_at and started >= run_at  # never before the final run-at


def test_a_task_that_started_is_never_changed_later_calls_make_a_new_one(
    redis_url: str, queue_name: str
) -> None:
    runs: list[tuple[str, Any]] = []
    release = asyncio.Event()
    app = App()

    @app.default
    async def hold(data: Any) -> None:
        runs.append((duetime.current_task().id, data))
        await release.wait()

    debounce = Debounce("k", 1)  # the calls below are a few ms apart
    with Queue(queue_name, redis_url) as queue:

        async def scenario() -> tuple[Scheduled, Scheduled, Scheduled]:
            async with running(
                Dispatcher([queue_name], redis_url, settings=FAST),
                Worker(app, queue_name, redis_url, settings=FAST),
            ):
                first = queue.schedule_keyed({"n": 1}, debounce=debounce)
                await wait_until(lambda: len(runs) == 1, what="the first task running")
                second = queue.schedule_keyed({"n": 2}, debounce=debounce)
                third = queue.schedule_keyed({"n": 3}, debounce=debounce)
                running_status = queue.status(first.id)
                assert running_status is not None and running_status.state == TaskState.RUNNING
                assert running_status.data == {"n": 1}
                release.set()
                await wait_until(lambda: len(runs) == 2, what="the second task")
                return first, second, third

        first, second, third = asyncio.run(scenario())
        assert second.outcome == KeyedOutcome.CREATED and second.id != first.id
        assert (third.id, third.outcome, third.calls) == (second.id, KeyedOutcome.COLLAPSED, 2)
        assert runs == [(first.id, {"n": 1}), (second.id, {"n": 3})]
        assert queue.check() == []


def test_a_task_rescheduled_by_hand_leaves_its_key(redis_url: str, queue_name: str) -> None:
    clock = ManualClock(T0)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        first = queue.schedule_keyed({"n": 1}, debounce=Debounce("k", 10))
        queue.reschedule(first.id, (T0 + 60_000) / 1000)
        second = queue.schedule_keyed({"n": 2}, debounce=Debounce("k", 10))
        assert second.outcome == KeyedOutcome.CREATED and second.id != first.id
        moved = queue.status(first.id)
        assert moved is not None and (moved.run_at, moved.data) == ((T0 + 60_000) / 1000, {"n": 1})
        assert queue.check() == []


def test_a_task_promoted_ahead_of_its_run_at_is_taken_back_by_a_call(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """A dispatcher puts a task in ready a few ms before its run-at (promote_ahead): a
    call in those ms still falls in the window, so it takes the task back, later."""
    keys = QueueKeys(queue_name)
    clock = ManualClock(T0)
    runner = SyncRunner(redis_url, duetime.Settings())
    with Queue(queue_name, redis_url, clock=clock) as queue:
        first = queue.schedule_keyed({"n": 1}, debounce=Debounce("k", 1))
        clock.set(T0 + 997)
        assert runner.run(QueueOperations(keys, clock).dispatcher.promote_due(100, 5)).moved == 1
        assert decoded(raw.lrange(keys.ready, 0, -1)) == [first.id]
        assert raw.hget(keys.early, first.id) is not None
        second = queue.schedule_keyed({"n": 2}, debounce=Debounce("k", 1))
        assert (second.id, second.outcome, second.run_at) == (
            first.id,
            KeyedOutcome.COLLAPSED,
            (T0 + 1997) / 1000,
        )
        assert raw.llen(keys.ready) == 0 and raw.hget(keys.early, first.id) is None
        assert raw.zscore(keys.scheduled, first.id) == T0 + 1997
        assert queue.status(first.id).data == {"n": 2}  # type: ignore[union-attr]
        assert queue.check() == []
    runner.close()


def test_under_flow_control_a_due_task_is_taken_back_from_the_due_set(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    clock = ManualClock(T0)
    runner = SyncRunner(redis_url, duetime.Settings())
    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.set_limits(duetime.Limits(cap=1))
        blocker = queue.schedule_now({"blocker": 1}, limit_key="a")
        first = queue.schedule_keyed({"n": 1}, debounce=Debounce("k", 1), limit_key="a")
        clock.set(T0 + 997)
        runner.run(QueueOperations(keys, clock).dispatcher.promote_due(100, 5))
        assert any(first.id in member for member in decoded(raw.zrange(keys.due, 0, -1)))
        second = queue.schedule_keyed({"n": 2}, debounce=Debounce("k", 1), limit_key="a")
        assert (second.id, second.outcome) == (first.id, KeyedOutcome.COLLAPSED)
        assert raw.zscore(keys.scheduled, first.id) == T0 + 1997
        assert all(first.id not in member for member in decoded(raw.zrange(keys.due, 0, -1)))
        assert queue.status(blocker) is not None and queue.check() == []
    runner.close()


def test_schedule_task_and_schedule_many_take_a_debounce_too(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url, clock=ManualClock(T0)) as queue:
        debounce = Debounce("k", 60)
        one = queue.schedule_now({"n": 0}, debounce=debounce)
        two = queue.schedule_task(T0 / 1000, {"n": 1}, debounce=debounce)
        many = queue.schedule_many(
            [Job({"n": 2}, delay=0, debounce=debounce), (T0 / 1000 + 5, {"plain": 1})]
        )
        assert one == two == many[0] != many[1]
        assert raw.hlen(keys.tasks) == 2
        assert queue.status(one).data == {"n": 2}  # type: ignore[union-attr]
        assert queue.check() == []


def test_a_dispatcher_sweeps_records_once_their_run_at_has_passed(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    clock = ManualClock(T0)
    runner = SyncRunner(redis_url, duetime.Settings())
    operations = QueueOperations(keys, clock)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        ids = [
            queue.schedule_keyed({"k": n}, debounce=Debounce(f"k{n}", 10 + n)).id for n in range(3)
        ]
        assert raw.hlen(keys.keyed) == 3 and raw.hlen(keys.keyed_tasks) == 3
        clock.set(T0 + 12_000)  # the run-ats of k0 and k1 have passed (by a second or more)
        assert runner.run(operations.keyed.sweep_keyed(1000)) == 2
        assert decoded(raw.hkeys(keys.keyed)) == ["d:k2"]
        assert decoded(raw.hkeys(keys.keyed_tasks)) == [ids[2]]
        assert decoded(raw.zrange(keys.keyed_expiry, 0, -1)) == ["d:k2"]
        assert queue.status(ids[0]).keyed is None  # type: ignore[union-attr]
        assert queue.check() == []  # the tasks themselves wait on, untouched
    runner.close()


def test_a_generated_id_that_is_live_is_replaced_with_nothing_changed(
    redis_url: str, raw: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Queue(queue_name, redis_url, clock=ManualClock(T0)) as queue:
        live = queue.schedule_in(60, {"plain": 1}, id="taken-id")
        offered = iter(["taken-id", "fresh-id"])
        monkeypatch.setattr(keyed_client, "new_task_id", lambda: next(offered))
        done = queue.schedule_keyed({"n": 1}, debounce=Debounce("k", 5))
        assert (done.id, done.outcome) == ("fresh-id", KeyedOutcome.CREATED)
        assert queue.status(live).data == {"plain": 1}  # type: ignore[union-attr]
        assert raw.hlen(QueueKeys(queue_name).tasks) == 2 and queue.check() == []


def test_a_durable_keyed_call_names_its_task_when_no_replica_confirms_it(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """No replica here: the write stands on the master, unconfirmed, and the error names
    the task that carries the call."""
    settings = duetime.Settings(durable_timeout=0.05)
    with Queue(queue_name, redis_url, settings=settings, durable=True) as queue:
        with pytest.raises(NotDurableError) as refused:
            queue.schedule_keyed({"n": 1}, debounce=Debounce("k", 60))
        [task_id] = refused.value.task_ids
        with pytest.raises(NotDurableError) as again:
            queue.schedule_keyed({"n": 2}, debounce=Debounce("k", 60))
        assert again.value.task_ids == (task_id,)
        assert queue.status(task_id).data == {"n": 2}  # type: ignore[union-attr]


def test_hooks_hear_of_tasks_made_and_asyncio_schedule_calls_take_a_key(
    redis_url: str, queue_name: str
) -> None:
    heard: list[str] = []

    class Listening(duetime.Hooks):
        def on_schedule(self, queue: str, tasks: Sequence[duetime.ScheduledTask]) -> None:
            heard.extend(task.id for task in tasks)

    async def scenario() -> list[str]:
        async with AsyncQueue(
            queue_name, redis_url, clock=ManualClock(T0), hooks=[Listening()]
        ) as queue:
            return [
                await queue.schedule_now({"n": 1}, debounce=Debounce("k", 5)),
                await queue.schedule_in(1, {"n": 2}, debounce=Debounce("k", 5)),
                await queue.schedule_now({"n": 3}, throttle=Throttle("t", 5)),
                await queue.schedule_now({"n": 4}, throttle=Throttle("t", 5)),
            ]

    debounced, joined, lead, dropped = asyncio.run(scenario())
    assert debounced == joined and lead == dropped
    assert heard == [debounced, lead]  # made once each; a join or a drop makes nothing
