"""The worker against a real server: outcomes, poison, timeouts, results, fencing,
graceful shutdown and recovery from a worker killed at each step."""

from __future__ import annotations

import asyncio
import threading
from contextlib import closing
from typing import Any

import msgpack
import pytest
import redis

import duetime
from duetime import App, Dispatcher, ManualClock, Queue, Settings, Worker
from duetime.errors import ResultTimeoutError, TaskFailedError, TaskStateError
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operations import QueueOperations
from duetime.store.plans.working import Ended, Outcome
from duetime.store.redis.runner import AsyncRunner, SyncRunner
from tests.helpers import FAST, decoded, running, take_waiting, wait_until


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_named_and_default_handlers_run_with_their_context(redis_url: str, queue_name: str) -> None:
    seen: dict[str, Any] = {}
    app = App()

    @app.task
    async def greet(data: dict[str, str]) -> None:
        seen["greet"] = (data, duetime.current_task())

    @app.default
    def fallback(data: dict[str, int]) -> None:
        seen["default"] = (data, duetime.current_task())

    with Queue(queue_name, redis_url) as queue:
        greet_id = queue.schedule_now({"name": "ada"}, task=greet)
        default_id = queue.schedule_in(0.05, {"n": 1})

        async def scenario() -> None:
            async with running(
                Dispatcher([queue_name], redis_url), Worker(app, queue_name, redis_url)
            ):
                await wait_until(lambda: len(seen) == 2, what="both handlers")

        run(scenario())
        assert queue.check() == []
        assert queue.stats().counters["completed"] == 2
    data, context = seen["greet"]
    assert data == {"name": "ada"}
    assert (context.id, context.task, context.attempt, context.queue_name) == (
        greet_id,
        "greet",
        1,
        queue_name,
    )
    assert seen["default"][1].id == default_id and seen["default"][1].task == ""


def test_failures_retry_with_backoff_then_succeed(redis_url: str, queue_name: str) -> None:
    attempts: list[int] = []

    def flaky(data: object) -> str:
        attempts.append(duetime.current_task().attempt)
        if len(attempts) < 3:
            raise ValueError(f"failure {len(attempts)}")
        return "finally"

    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_now({"x": 1}, max_attempts=5, result_ttl=60)

        async def scenario() -> None:
            worker = Worker(App(default=flaky), queue_name, redis_url, settings=FAST)
            async with running(Dispatcher([queue_name], redis_url, settings=FAST), worker):
                await wait_until(lambda: len(attempts) == 3, what="three attempts")

        run(scenario())
        assert attempts == [1, 2, 3]
        assert queue.result(task_id, timeout=5) == "finally"
        counters = queue.stats().counters
        assert (counters["failed"], counters["retried"], counters["completed"]) == (2, 2, 1)
        assert queue.check() == []


def test_exhausted_attempts_go_to_dead_and_can_be_requeued_or_purged(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    calls: list[int] = []

    def broken(data: object) -> None:
        calls.append(1)
        raise RuntimeError("always broken")

    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_now({"x": 1}, max_attempts=2, result_ttl=60)
        dispatcher = Dispatcher([queue_name], redis_url, settings=FAST)

        async def until_dead(count: int) -> None:
            async with running(
                dispatcher, Worker(App(default=broken), queue_name, redis_url, settings=FAST)
            ):
                await wait_until(
                    lambda: queue.stats().dead == 1 and len(calls) == count, what="death"
                )

        run(until_dead(2))
        status = queue.status(task_id)
        assert status is not None and status.state == "dead" and status.attempts == 2
        assert status.last_error == "RuntimeError: always broken"
        assert "raise RuntimeError" in (status.last_traceback or "")
        with pytest.raises(TaskFailedError, match="always broken"):
            queue.result(task_id, timeout=1)
        [entry] = queue.dead_tasks()
        assert (entry.id, entry.error, entry.attempts) == (
            task_id,
            "RuntimeError: always broken",
            2,
        )
        assert queue.check() == []

        assert queue.requeue_dead([task_id]) == 1
        dispatcher = Dispatcher([queue_name], redis_url, settings=FAST)
        run(until_dead(4))  # a fresh set of two attempts
        assert queue.purge_dead() == 1
        assert queue.status(task_id) is not None  # only its (failed) result is left
        assert queue.status(task_id).state == "finished"  # type: ignore[union-attr]
        assert queue.check() == []
    assert not raw.exists(QueueKeys(queue_name).tasks)


@pytest.mark.parametrize(
    ("envelope", "expected"),
    [
        (b"\xc1garbage", "not a valid msgpack document"),
        (msgpack.packb([9, "t", {}, 0, 1, 1000, 0]), "newer than this worker"),
        (msgpack.packb([1, "unregistered", {}, 0, 3, 1000, 0]), "no handler named 'unregistered'"),
    ],
)
def test_poison_goes_to_dead_and_the_worker_carries_on(
    redis_url: str, raw: redis.Redis, queue_name: str, envelope: bytes, expected: str
) -> None:
    keys = QueueKeys(queue_name)
    raw.hset(keys.tasks, "poison", envelope)
    raw.rpush(keys.ready, "poison")
    raw.rpush(keys.ready, "ghost")  # an id with no envelope at all
    done: list[object] = []
    with Queue(queue_name, redis_url) as queue:
        healthy = queue.schedule_now({"ok": True})
        worker = Worker(App(default=done.append), queue_name, redis_url, settings=FAST)

        async def scenario() -> None:
            async with running(worker):
                await wait_until(
                    lambda: bool(done) and queue.stats().dead == 1, what="poison and healthy"
                )

        run(scenario())
        status = queue.status("poison")
        assert status is not None and status.state == "dead"
        assert expected in (status.last_error or "")
        assert queue.status(healthy) is None  # done, keeps no result
        assert worker.counters.dropped == 1
        assert queue.check() == []


def test_timeouts_fail_the_attempt_and_a_hung_thread_does_not_stall_the_worker(
    redis_url: str, queue_name: str
) -> None:
    release = threading.Event()
    finished: list[str] = []
    app = App()

    @app.task
    async def slow_async(data: object) -> None:
        await asyncio.sleep(30)

    @app.task
    def hung_sync(data: object) -> None:
        release.wait(30)

    @app.task
    def quick(data: object) -> None:
        finished.append("quick")

    with Queue(queue_name, redis_url) as queue:
        slow = queue.schedule_now({}, task=slow_async, timeout=0.2, max_attempts=1)
        hung = queue.schedule_now({}, task=hung_sync, timeout=0.2, max_attempts=1)
        quick_ids = [queue.schedule_in(0.5, {}, task=quick) for _ in range(5)]
        # Concurrency 2: both slots are taken by the stuck handlers until they time out.
        worker = Worker(app, queue_name, redis_url, concurrency=2, settings=FAST)

        async def scenario() -> None:
            async with running(Dispatcher([queue_name], redis_url, settings=FAST), worker):
                await wait_until(lambda: len(finished) == 5, what="quick tasks after the timeouts")

        try:
            run(scenario())
        finally:
            release.set()
        for task_id in (slow, hung):
            status = queue.status(task_id)
            assert status is not None and status.state == "dead"
            assert status.last_error == "TaskTimeoutError: timed out after 0.2s"
        assert worker.counters.timed_out == 2
        assert all(queue.status(i) is None for i in quick_ids)


def test_results_are_stored_with_a_ttl_and_waited_for(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        kept = queue.schedule_in(0.3, {"a": 2}, result_ttl=30)
        not_kept = queue.schedule_now({"a": 3})
        with pytest.raises(TaskStateError, match="without result_ttl"):
            queue.result(not_kept)
        with pytest.raises(ResultTimeoutError):
            queue.result(kept, timeout=0.05)
        outcome: list[Any] = []
        waiter = threading.Thread(target=lambda: outcome.append(queue.result(kept, timeout=10)))
        waiter.start()

        async def scenario() -> None:
            worker = Worker(App(default=lambda data: data["a"] * 21), queue_name, redis_url)
            async with running(Dispatcher([queue_name], redis_url), worker):
                await wait_until(lambda: not waiter.is_alive(), what="the waiter")

        run(scenario())
        waiter.join()
        assert outcome == [42]
        assert queue.result(kept) == 42  # waiting does not consume it
        assert 0 < raw.pttl(QueueKeys(queue_name).result(kept)) <= 30_000
        assert queue.check() == []


def test_an_expired_attempt_is_fenced(redis_url: str, raw: redis.Redis, queue_name: str) -> None:
    """A worker whose lease expired cannot ack, fail or renew; its result is dropped."""
    clock = ManualClock(1_800_000_000_000)
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        task_id = queue.schedule_now({"a": 1}, result_ttl=60)

    async def scenario() -> None:
        runner = AsyncRunner(redis_url, Settings())
        operations = QueueOperations(keys, clock)
        try:
            [claimed] = await runner.run(operations.worker.claim("stale", 1000, 1)) or []
            clock.advance(1.0)  # the lease deadline is reached
            assert await runner.run(operations.dispatcher.reap_expired_leases(100)) == 1
            late = Outcome(task_id, claimed.attempt, 60_000, b"late")
            assert await runner.run(operations.worker.ack("stale", [late])) == [Ended.FENCED]
            assert not await runner.run(
                operations.worker.fail("stale", task_id, claimed.attempt, b"e", None)
            )
            beat = await runner.run(
                operations.worker.heartbeat("stale", 1000, [(task_id, claimed.attempt)])
            )
            assert beat.lost == [(task_id, claimed.attempt)]
            # The same worker claiming the task again does not revive the old attempt.
            await runner.run(operations.dispatcher.promote_due(10))
            [again] = await runner.run(operations.worker.claim("stale", 1000, 1)) or []
            assert again.attempt == claimed.attempt + 1
            # A late report names the old attempt only; the new one is renewed, not lost.
            both = [(task_id, claimed.attempt), (task_id, again.attempt)]
            beat = await runner.run(operations.worker.heartbeat("stale", 1000, both))
            assert beat.lost == [(task_id, claimed.attempt)]
            assert await runner.run(operations.worker.ack("stale", [late])) == [Ended.FENCED]
            fresh = Outcome(task_id, again.attempt, 60_000, b"\xc3")
            assert await runner.run(operations.worker.ack("stale", [fresh])) == [Ended.APPLIED]
        finally:
            await runner.close()

    run(scenario())
    counters = raw.hgetall(keys.stats)
    # Each dropped outcome once, where it was dropped: the two late acks and the late
    # fail, refused by their scripts; a heartbeat's "lost" report drops nothing itself.
    assert int(counters[b"fenced"]) == 3
    assert raw.lrange(keys.result(task_id), 0, -1) == [b"\xc3"]


def test_graceful_shutdown_hands_back_what_did_not_finish(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    started = asyncio.Event()
    keys = QueueKeys(queue_name)

    async def endless(data: object) -> None:
        started.set()
        await asyncio.sleep(60)

    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_now({"a": 1})
        settings = FAST.replace(shutdown_grace=0.2)

        async def scenario() -> None:
            worker = Worker(App(default=endless), queue_name, redis_url, settings=settings)
            async with running(worker):
                await asyncio.wait_for(started.wait(), 10)
            assert worker.worker_id.encode() not in raw.zrange(keys.workers, 0, -1)

        run(scenario())
        status = queue.status(task_id)
        assert status is not None and status.state == "ready" and status.attempts == 0
        assert raw.lrange(keys.ready, 0, 0) == [task_id.encode()]
        assert queue.stats().counters["handed_back"] == 1
        assert queue.check() == []


# --- a worker killed at each step: the Redis state a kill -9 leaves, then recovery ---


def test_a_claim_of_thousands_moves_leases_and_acks_every_id_in_order(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """A claim larger than one variadic command's share (1,000 ids) takes every id from
    the head of ready in order, with its envelope and first attempt; a claim of 0 takes
    none; acks of 500 at a time finish them all."""
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        ids = queue.schedule_many([duetime.Job({"i": i}, delay=0) for i in range(2_600)])
    ready = decoded(raw.lrange(keys.ready, 0, -1))
    assert sorted(ready) == sorted(ids)

    operations = QueueOperations(keys, duetime.ServerClock())
    with closing(SyncRunner(redis_url, Settings())) as runner:
        assert runner.run(operations.worker.claim("w", 60_000, 0)) == []
        assert raw.llen(keys.ready) == 2_600
        claimed = runner.run(operations.worker.claim("w", 60_000, 2_500)) or []
        assert [c.task_id for c in claimed] == ready[:2_500]
        assert {c.attempt for c in claimed} == {1}
        assert all(c.envelope and c.problem is None for c in claimed)
        assert decoded(raw.lrange(keys.ready, 0, -1)) == ready[2_500:]
        assert decoded(raw.lrange(keys.active("w"), 0, -1)) == ready[:2_500]
        assert raw.zcard(keys.leases) == 2_500
        for first in range(0, 2_500, 500):
            outcomes = [Outcome(c.task_id, c.attempt) for c in claimed[first : first + 500]]
            assert runner.run(operations.worker.ack("w", outcomes)) == [Ended.APPLIED] * 500
    assert raw.llen(keys.active("w")) == 0 and raw.zcard(keys.leases) == 0
    assert raw.hlen(keys.tasks) == 100


def test_a_claim_into_a_list_of_the_wrong_type_leaves_ready_whole(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_many([duetime.Job({"i": i}, delay=0) for i in range(5)])
    before = raw.lrange(keys.ready, 0, -1)
    raw.set(keys.active("w"), "not a list")

    with (
        closing(SyncRunner(redis_url, Settings())) as runner,
        pytest.raises(duetime.errors.DuetimeError, match="WRONGTYPE"),
    ):
        runner.run(QueueOperations(keys, duetime.ServerClock()).worker.claim("w", 60_000, 5))
    assert raw.lrange(keys.ready, 0, -1) == before
    assert raw.zcard(keys.leases) == 0 and not raw.exists(keys.attempts)


def _dead_worker_leaves(redis_url: str, queue_name: str, step: str) -> str:
    """Bring a task to ``step`` as worker "victim", which then never speaks again."""
    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_now({"step": step})

    async def as_victim() -> None:
        runner = AsyncRunner(redis_url, Settings())
        operations = QueueOperations(QueueKeys(queue_name), duetime.ServerClock())
        try:
            await runner.run(operations.worker.heartbeat("victim", 1000, ()))
            taken = await runner.run(operations.worker.take_ready("victim", 1.0))
            assert taken == task_id
            if step != "after BLMOVE, before the lease":
                await runner.run(operations.worker.claim("victim", 60_000, 0, [taken]))
        finally:
            await runner.close()

    run(as_victim())
    return task_id


@pytest.mark.parametrize(
    "step",
    ["after BLMOVE, before the lease", "mid-task (leased)", "handler done, before the ack"],
)
def test_a_task_survives_its_worker_dying_at_any_step(
    redis_url: str, queue_name: str, step: str
) -> None:
    task_id = _dead_worker_leaves(redis_url, queue_name, step)
    runs: list[str] = []
    with Queue(queue_name, redis_url) as queue:
        assert queue.status(task_id).state == "running"  # type: ignore[union-attr]

        async def scenario() -> None:
            app = App(default=lambda d: runs.append(duetime.current_task().id))
            rescuer = Worker(app, queue_name, redis_url, settings=FAST)
            async with running(Dispatcher([queue_name], redis_url, settings=FAST), rescuer):
                await wait_until(lambda: bool(runs), what="the rescue run")
                await wait_until(lambda: queue.status(task_id) is None, what="the ack")

        run(scenario())
        assert runs == [task_id]  # exactly once more
        assert queue.check() == []
        assert queue.stats().counters["reaped_workers"] >= 1


def test_an_id_whose_blmove_reply_was_lost_is_found_and_run(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    runs: list[str] = []
    with Queue(queue_name, redis_url) as queue:
        worker = Worker(App(default=lambda d: runs.append(d["n"])), queue_name, redis_url,
                        settings=FAST, worker_id="w-lost-reply")  # fmt: skip

        async def scenario() -> None:
            async with running(worker):
                await wait_until(lambda: raw.zscore(keys.workers, "w-lost-reply") is not None)
                # What a BLMOVE whose reply never arrived leaves: the id in the list, unleased.
                task_id = queue.schedule_in(3600, {"n": "lost"})
                take_waiting(raw, keys, task_id)
                raw.rpush(keys.active("w-lost-reply"), task_id)
                await wait_until(lambda: runs == ["lost"], what="the reconciled task")
                await wait_until(lambda: queue.status(task_id) is None, what="its ack")

        run(scenario())
        assert queue.check() == []


def test_orphan_processing_lists_are_swept(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    runs: list[object] = []
    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_in(3600, {"n": 1})
        take_waiting(raw, keys, task_id)
        raw.rpush(keys.active("gone-worker"), task_id)  # a list with no registered worker
        assert [v.kind for v in queue.check()] == ["orphan list", "unleased"]

        async def scenario() -> None:
            async with running(
                Dispatcher([queue_name], redis_url),
                Worker(App(default=runs.append), queue_name, redis_url),
            ):
                await wait_until(lambda: len(runs) == 1, what="the swept task")

        run(scenario())
        assert queue.check() == []


def test_a_handlers_own_timeout_error_is_an_ordinary_failure(
    redis_url: str, queue_name: str
) -> None:
    def talks_to_a_slow_service(data: object) -> None:
        raise TimeoutError("upstream did not answer")

    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_now({}, max_attempts=1)
        worker = Worker(App(default=talks_to_a_slow_service), queue_name, redis_url, settings=FAST)

        async def scenario() -> None:
            async with running(worker):
                await wait_until(lambda: queue.stats().dead == 1, what="the failure")

        run(scenario())
        status = queue.status(task_id)
        assert status is not None and status.last_error == "TimeoutError: upstream did not answer"
        assert worker.counters.timed_out == 0


def test_a_task_promoted_ahead_waits_for_its_run_at_even_when_handed_back(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """promote_ahead moves a task to ready before it is due; the claiming worker holds it
    until its clock reads the run-at. Driven clock: the task must not start until the
    test moves the clock, however long the test waits in real time. The claim takes the
    early note, so when that worker stops and hands the task back (as when a claim whose
    reply was lost is made again), the next claim finds none: the task must still wait,
    for its envelope's run-at."""
    t0 = 1_800_000_000_000
    clock = ManualClock(t0)
    keys = QueueKeys(queue_name)
    started: list[int | None] = []

    async def handler(data: object) -> None:
        started.append(clock.now_ms())

    settings = FAST.replace(promote_ahead=1.0, shutdown_grace=0.2)  # ahead by up to 1 s
    with Queue(queue_name, redis_url, clock=clock) as queue:
        task_id = queue.schedule_task((t0 + 500.5) / 1000, {"a": 1})

        def new_worker() -> Worker:
            return Worker(App(default=handler), queue_name, redis_url, settings=settings,
                          clock=clock)  # fmt: skip

        async def held_by(worker: Worker) -> None:
            lease = f"{worker.worker_id}|{task_id}"
            await wait_until(lambda: bool(started) or raw.zscore(keys.leases, lease) is not None,
                             what="the claim")  # fmt: skip
            await asyncio.sleep(0.3)  # real time passes; the driven clock does not
            assert started == []

        async def scenario() -> None:
            dispatcher = Dispatcher([queue_name], redis_url, settings=settings, clock=clock)
            async with running(dispatcher):
                first = new_worker()
                async with running(first):
                    await held_by(first)
                    assert raw.hlen(keys.early) == 0  # the worker took the noted run-at
                second = new_worker()  # the first stopped and handed the task back
                async with running(second):
                    await held_by(second)
                    clock.set(t0 + 500)
                    await asyncio.sleep(0.15)
                    assert started == []  # still half a millisecond early
                    clock.set(t0 + 501)
                    await wait_until(lambda: started != [], what="the start")

        run(scenario())
    assert started == [t0 + 501]


def test_cancelling_a_task_promoted_ahead_leaves_no_note_behind(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    t0 = 1_800_000_000_000
    clock = ManualClock(t0)
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        cancelled = queue.schedule_task((t0 + 3) / 1000, {"a": 1})
        moved = queue.schedule_task((t0 + 4) / 1000, {"a": 2})

        async def promote() -> None:
            runner = AsyncRunner(redis_url, Settings())
            try:
                await runner.run(
                    QueueOperations(keys, clock).dispatcher.promote_due(10, ahead_ms=5)
                )
            finally:
                await runner.close()

        run(promote())
        assert raw.hlen(keys.early) == 2
        assert queue.cancel(cancelled)
        queue.reschedule(moved, (t0 + 60_000) / 1000)
        assert raw.hlen(keys.early) == 0
        assert queue.check() == []


def test_an_early_note_far_past_any_promote_ahead_is_garbage_not_a_wait(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """A number in `early` that no dispatcher could have written (an hour ahead) would
    hold a worker slot for an hour: the task goes to dead saying why, the rest run."""
    keys = QueueKeys(queue_name)
    done: list[object] = []
    with Queue(queue_name, redis_url) as queue:
        odd = queue.schedule_now({"n": 1})
        fine = queue.schedule_now({"n": 2})
        seconds, _ = raw.time()
        raw.hset(keys.early, odd, (int(seconds) + 3600) * 1000)
        worker = Worker(App(default=done.append), queue_name, redis_url, settings=FAST)

        async def scenario() -> None:
            async with running(worker):
                await wait_until(lambda: queue.stats().dead == 1 and len(done) == 1)

        run(scenario())
        status = queue.status(odd)
        assert status is not None and status.state == "dead"
        assert "early run-at note" in (status.last_error or "")
        assert queue.status(fine) is None and done == [{"n": 2}]
        assert queue.check() == []


def test_a_blocked_plain_handler_does_not_hold_up_the_ones_behind_it(
    redis_url: str, queue_name: str
) -> None:
    """Plain handlers share the worker's threads, handed work in batches: while one
    handler blocks, the tasks claimed with it still run on other threads, each attempt
    in its own context."""
    release = threading.Event()
    quick_runs: list[str] = []
    app = App()

    @app.task
    def blocks(data: object) -> None:
        release.wait(30)

    @app.task
    def quick(data: object) -> None:
        quick_runs.append(duetime.current_task().id)

    with Queue(queue_name, redis_url) as queue:
        blocking = [queue.schedule_now({}, task=blocks) for _ in range(2)]
        quick_ids = [queue.schedule_now({}, task=quick) for _ in range(20)]
        worker = Worker(app, queue_name, redis_url, concurrency=4, settings=FAST)

        async def scenario() -> None:
            async with running(worker):
                try:
                    await wait_until(lambda: len(quick_runs) == 20, what="the quick tasks")
                finally:
                    release.set()
                await wait_until(lambda: worker.counters.succeeded == 22, what="all acked")

        run(scenario())
        assert sorted(quick_runs) == sorted(quick_ids)
        assert all(queue.status(i) is None for i in blocking)
        assert queue.check() == []
