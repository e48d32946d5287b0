"""Leases and fencing at the edges, each driven to the exact step: a late "lost" report
names one attempt, never its successor; an outcome the worker drops itself is counted;
a BLMOVE left pending by a reaped worker cannot hide a task until the next sweep."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis

from duetime import App, Dispatcher, ManualClock, Queue, Settings, Worker
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operations import QueueOperations
from duetime.store.plans.requests import Command, Plan
from duetime.store.plans.working import Ended, Outcome, WorkerPlans
from duetime.store.redis.runner import AsyncRunner
from duetime.worker.heartbeater import Heartbeater
from duetime.worker.reporter import Reporter
from tests.helpers import FAST, running, scheduled_score, wait_until, wait_until_sync


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def server_ms(raw: redis.Redis) -> int:
    seconds, micros = raw.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_a_late_lost_report_of_an_old_attempt_does_not_cancel_the_new_one(
    redis_url: str, raw: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker paused past its lease takes its own task again as attempt 2, while a
    heartbeat sent for attempt 1 is still on its way; that heartbeat's reply (attempt 1
    lost) must fence attempt 1 only. Before, it cancelled attempt 2 and ran attempt 3."""
    keys = QueueKeys(queue_name)
    gate = f"test:{queue_name}:gate"
    real_heartbeat = WorkerPlans.heartbeat
    held_back: list[bool] = []

    def gated_heartbeat(
        self: WorkerPlans, worker_id: str, lease_ms: int, running: Any, *more: Any
    ) -> Plan[Any]:
        running = list(running)
        if (task_id, 1) in running and not held_back:
            held_back.append(True)  # this heartbeat waits until the test lets it go
            yield Command(("BLPOP", gate, 20), block=20)
        return (yield from real_heartbeat(self, worker_id, lease_ms, running, *more))

    monkeypatch.setattr(WorkerPlans, "heartbeat", gated_heartbeat)
    clock = ManualClock(server_ms(raw))
    starts: list[int] = []
    release = asyncio.Event()

    async def handler(data: object) -> str:
        from duetime import current_task

        starts.append(current_task().attempt)
        await release.wait()
        return "ok"

    with Queue(queue_name, redis_url, clock=clock) as queue:
        task_id = queue.schedule_now({"n": 1})
        worker = Worker(App(default=handler), queue_name, redis_url, settings=FAST, clock=clock)

        async def scenario() -> None:
            runner = AsyncRunner(redis_url, Settings())
            operations = QueueOperations(keys, clock)
            try:
                async with running(worker):
                    await wait_until(lambda: starts == [1] and bool(held_back), what="attempt 1")
                    clock.advance(FAST.lease_duration + 1)  # attempt 1's lease runs out
                    assert await runner.run(operations.dispatcher.reap_expired_leases(10)) == 1
                    await runner.run(operations.dispatcher.promote_due(10))
                    await wait_until(lambda: starts == [1, 2], what="attempt 2 on the same worker")
                    raw.rpush(gate, 1)  # the late heartbeat arrives: attempt 1 is lost
                    await wait_until(lambda: raw.llen(gate) == 0, what="the late heartbeat")
                    await asyncio.sleep(3 * FAST.heartbeat_interval)  # its reply is handled
                    release.set()
                    await wait_until(
                        lambda: queue.stats().counters.get("completed") == 1, what="the ack"
                    )
            finally:
                await runner.close()

        run(scenario())
        assert starts == [1, 2]  # one fault, two starts: attempt 2 was not cancelled
        counters = queue.stats().counters
        # Attempt 1's outcome was dropped once: its late ack was refused.
        assert counters["fenced"] == 1
        assert queue.check() == []


def test_an_outcome_dropped_by_the_worker_itself_is_counted_as_fenced(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """The heartbeat learns that a running attempt lost its lease: the worker cancels it
    and drops its outcome without a word to Redis, so the count must come from the
    heartbeat. Before, the queue's fenced counter did not move."""
    clock = ManualClock(server_ms(raw))
    started = asyncio.Event()

    async def hangs(data: object) -> None:
        started.set()
        await asyncio.sleep(60)

    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.schedule_now({"n": 1})
        worker = Worker(App(default=hangs), queue_name, redis_url, settings=FAST, clock=clock)

        async def scenario() -> None:
            async with running(worker):
                await started.wait()
                clock.advance(FAST.lease_duration + 1)
                await wait_until(lambda: worker.counters.fenced == 1, what="the fence")

        run(scenario())
        assert queue.stats().counters.get("fenced") == 1


def test_a_task_moved_by_a_reaped_workers_pending_blmove_is_recovered_after_a_block(
    redis_url: str, raw: redis.Redis, queue_name: str, server: Any
) -> None:
    """A worker paused by SIGSTOP keeps its BLMOVE pending on the server. The dispatcher
    reaps it and re-enters its task; the server then hands that very task to the paused
    worker's BLMOVE, into a list nobody leases. The dispatcher looks at a reaped
    worker's list once more a block later, so the task runs again then, not at the
    next maintenance sweep (an hour away here)."""
    keys = QueueKeys(queue_name)
    settings = FAST.replace(lease_duration=30, block_timeout=1.0, maintenance_interval=3600)
    runs: list[object] = []
    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_now({"n": 1})
        # The paused worker: it had claimed the task, then went silent long ago.
        paused = "paused-worker"
        clock = queue.core.queue.clock

        async def claim_as_paused() -> None:
            runner = AsyncRunner(redis_url, settings)
            try:
                await runner.run(QueueOperations(keys, clock).worker.claim(paused, 30_000, 1))
            finally:
                await runner.close()

        run(claim_as_paused())
        raw.zadd(keys.workers, {paused: 1})
        # Its BLMOVE, sent before it froze, is still waiting on the server.
        blocker = redis.Redis.from_url(redis_url)
        pending = threading.Thread(
            target=lambda: blocker.blmove(
                keys.ready,
                keys.active(paused),
                # redis-py annotates this timeout as int; BLMOVE takes a float (seconds).
                settings.block_timeout,  # type: ignore[arg-type]
                "LEFT",
                "RIGHT",
            ),
            daemon=True,
        )
        pending.start()
        wait_until_sync(lambda: int(raw.info("clients")["blocked_clients"]) >= 1)

        async def scenario() -> None:
            async with running(Dispatcher([queue_name], redis_url, settings=settings)):
                await wait_until(
                    lambda: (
                        raw.zscore(keys.workers, paused) is None
                        and raw.lrange(keys.active(paused), 0, -1) == [task_id.encode()]
                        and raw.hget(keys.stats, "promoted") == b"1"
                    ),
                    what="the reap, then the pending BLMOVE catching the re-entered task",
                )
                assert [v.kind for v in queue.check()] == ["orphan list", "unleased"]
                captured_at = time.monotonic()
                async with running(Worker(App(default=runs.append), queue_name, redis_url)):
                    await wait_until(lambda: len(runs) == 1, timeout=10, what="the task again")
                # Recovered after about a block, not after the hour-long sweep.
                assert time.monotonic() - captured_at < settings.look_again_after_reap + 3

        try:
            run(scenario())
        finally:
            pending.join(5)
            blocker.close()
        assert queue.check() == []
        assert raw.zscore(keys.reaped, paused) is None  # looked at once more, then forgotten


def test_stop_now_acks_what_finished_and_hands_back_the_rest_at_once(
    redis_url: str, raw: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stop(now=True) does not wait for running handlers, yet an attempt that already
    finished is acked (not run again after worker_ttl) and the rest is handed back."""
    keys = QueueKeys(queue_name)

    async def acker_stalled(self: Reporter) -> None:  # outcomes pile up, unsent
        await self._state.closing.wait()

    monkeypatch.setattr(Reporter, "loop", acker_stalled)
    finished: list[object] = []

    async def handler(data: dict[str, str]) -> None:
        if data["kind"] == "slow":
            await asyncio.sleep(60)
        finished.append(data)

    with Queue(queue_name, redis_url) as queue:
        quick = queue.schedule_now({"kind": "quick"})
        slow = queue.schedule_now({"kind": "slow"})
        settings = FAST.replace(shutdown_grace=120)
        worker = Worker(App(default=handler), queue_name, redis_url, settings=settings)

        async def scenario() -> None:
            task = asyncio.create_task(worker.run())
            await wait_until(lambda: len(finished) == 1, what="the quick task")
            await wait_until(lambda: raw.zcard(keys.leases) == 2, what="both claimed")
            worker.stop(now=True)
            await asyncio.wait_for(task, timeout=10)

        run(scenario())
        assert queue.status(quick) is None  # acked: it will not run again
        assert queue.stats().counters.get("completed") == 1
        status = queue.status(slow)
        assert status is not None and status.state == "ready"
        assert raw.zcard(keys.workers) == 0
        assert queue.check() == []


def test_a_finished_attempt_keeps_its_lease_until_its_late_ack(
    redis_url: str, raw: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outcome waiting for its ack (a busy server, a slow acker) keeps its lease: the
    heartbeat renews it, so the ack, three leases later, is applied, not fenced."""
    keys = QueueKeys(queue_name)
    settings = FAST.replace(lease_duration=0.3, heartbeat_interval=0.05, worker_ttl=0.5)
    real_ack_loop = Reporter.loop

    async def acker_late(self: Reporter) -> None:
        await asyncio.sleep(3 * settings.lease_duration)
        await real_ack_loop(self)

    monkeypatch.setattr(Reporter, "loop", acker_late)
    runs: list[object] = []
    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_now({"n": 1})

        async def scenario() -> None:
            async with running(Worker(App(default=runs.append), queue_name, redis_url,
                                      settings=settings)):  # fmt: skip
                await wait_until(lambda: queue.status(task_id) is None, what="the late ack")

        run(scenario())
        assert len(runs) == 1
        counters = queue.stats().counters
        assert counters.get("completed") == 1 and not counters.get("fenced")
        assert raw.zcard(keys.leases) == 0 and queue.check() == []


def test_an_attempt_whose_lease_ran_out_before_its_start_is_not_started(
    redis_url: str, raw: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that stalls between its claim and the handler's start (here: waiting for
    a run-at, promoted ahead, while its heartbeats are held back) may wake after its
    lease ran out and the task went to another worker: it checks its lease first and
    does not start a second copy."""
    keys = QueueKeys(queue_name)

    async def heartbeats_held_back(self: Heartbeater) -> None:
        await self._state.closing.wait()

    monkeypatch.setattr(Heartbeater, "loop", heartbeats_held_back)
    t0 = server_ms(raw)
    clock = ManualClock(t0)
    started: list[object] = []
    settings = FAST.replace(promote_ahead=1.0)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        task_id = queue.schedule_task((t0 + 900) / 1000, {"a": 1})
        worker = Worker(App(default=started.append), queue_name, redis_url, settings=settings,
                        clock=clock)  # fmt: skip

        async def scenario() -> None:
            runner = AsyncRunner(redis_url, Settings())
            operations = QueueOperations(keys, clock)
            try:
                await runner.run(
                    operations.dispatcher.promote_due(10, 1000)
                )  # noted ahead of its run-at
                async with running(worker):
                    member = f"{worker.worker_id}|{task_id}"
                    await wait_until(lambda: raw.zscore(keys.leases, member) is not None)
                    await asyncio.sleep(settings.lease_duration)  # past half a lease, stalled
                    clock.advance(settings.lease_duration + 1)  # run-at and lease deadline pass
                    assert await runner.run(operations.dispatcher.reap_expired_leases(10)) == 1
                    await wait_until(lambda: worker.counters.fenced == 1, what="the check")
                    assert started == []
            finally:
                await runner.close()

        run(scenario())
        assert started == []
        assert queue.stats().counters.get("fenced") == 1
        assert scheduled_score(raw, keys, task_id) is not None  # it will run elsewhere


def test_a_heartbeat_that_crosses_an_ack_counts_nothing_as_fenced(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """A heartbeat built while an attempt ran reaches Redis after that attempt was acked:
    it reports the attempt gone (the worker has forgotten it by then), but a completed
    attempt is not a fenced one. Only dropped outcomes are counted, where dropped."""
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_now({"n": 1})
        clock = queue.core.queue.clock

        async def scenario() -> None:
            runner = AsyncRunner(redis_url, Settings())
            operations = QueueOperations(keys, clock)
            try:
                [claimed] = await runner.run(operations.worker.claim("w", 10_000, 1)) or []
                done = Outcome(claimed.task_id, claimed.attempt)
                assert await runner.run(operations.worker.ack("w", [done])) == [Ended.APPLIED]
                beat = await runner.run(
                    operations.worker.heartbeat(
                        "w", 10_000, [(claimed.task_id, claimed.attempt)], 2
                    )
                )
                assert beat.lost == [(claimed.task_id, claimed.attempt)]
            finally:
                await runner.close()

        run(scenario())
        counters = queue.stats().counters
        # 2: what this worker said it dropped itself; nothing for the crossed heartbeat.
        assert (counters.get("completed"), counters.get("fenced")) == (1, 2)


def test_a_lost_report_that_crosses_the_attempts_own_ack_is_not_a_fence(
    redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """A heartbeat names a running attempt; the attempt finishes and its ack removes the
    lease before that heartbeat reaches Redis, so the reply says the lease is gone while
    the ack's own reply is still on its way. That attempt was acknowledged, not fenced:
    no warning, nothing counted as fenced (under load this logged bursts of false
    "lost its lease" warnings)."""
    beat_gate, ack_gate = f"test:{queue_name}:beat", f"test:{queue_name}:ack"
    real_heartbeat, real_ack = WorkerPlans.heartbeat, WorkerPlans.ack
    held: list[str] = []

    def gated_heartbeat(
        self: WorkerPlans, worker_id: str, lease_ms: int, running: Any, *more: Any
    ) -> Plan[Any]:
        running = list(running)
        if running and "beat" not in held:
            held.append("beat")  # sent while the attempt runs; arrives after its ack
            yield Command(("BLPOP", beat_gate, 20), block=20)
        return (yield from real_heartbeat(self, worker_id, lease_ms, running, *more))

    def gated_ack(self: WorkerPlans, *arguments: Any) -> Plan[Any]:
        flags = yield from real_ack(self, *arguments)
        held.append("acked")  # applied in Redis; the worker has not heard back yet
        yield Command(("BLPOP", ack_gate, 20), block=20)
        return flags

    monkeypatch.setattr(WorkerPlans, "heartbeat", gated_heartbeat)
    monkeypatch.setattr(WorkerPlans, "ack", gated_ack)
    release = asyncio.Event()

    async def handler(data: object) -> str:
        await release.wait()
        return "ok"

    with Queue(queue_name, redis_url) as queue:
        queue.schedule_now({"n": 1})
        worker = Worker(App(default=handler), queue_name, redis_url, settings=FAST)
        raw = redis.Redis.from_url(redis_url)

        async def scenario() -> None:
            async with running(worker):
                await wait_until(lambda: "beat" in held, what="a heartbeat naming the attempt")
                release.set()
                await wait_until(lambda: "acked" in held, what="the ack applied")
                raw.rpush(beat_gate, 1)  # the heartbeat now finds no lease: "lost"
                await wait_until(lambda: raw.llen(beat_gate) == 0, what="the late heartbeat")
                await asyncio.sleep(3 * FAST.heartbeat_interval)  # its reply is handled
                raw.rpush(ack_gate, 1)
                await wait_until(lambda: worker.counters.succeeded == 1, what="the ack's reply")

        with caplog.at_level("WARNING", logger="duetime"):
            run(scenario())
        raw.close()
        assert not [r for r in caplog.records if "dropped" in r.getMessage()]
        assert worker.counters.fenced == 0
        assert queue.stats().counters.get("fenced") is None
        assert queue.check() == []


def test_a_batch_of_fenced_results_gives_one_warning_and_the_ids_at_debug(
    redis_url: str, raw: redis.Redis, queue_name: str, caplog: Any
) -> None:
    """A failover to a replica that had not seen the leases fences every running attempt
    at once. Before, each late result logged its own warning, worded as if its lease had
    expired (162 lines in a second); now a batch gives one warning with its count, and
    the ids at debug level only."""
    tasks = 6
    # No heartbeat while the attempts run: their acks are what finds the leases gone.
    settings = FAST.replace(heartbeat_interval=30.0, worker_ttl=90.0, lease_duration=120.0)
    release = asyncio.Event()
    started: list[object] = []

    async def handler(data: object) -> str:
        started.append(data)
        await release.wait()
        return "ok"

    with Queue(queue_name, redis_url) as queue:
        ids = [queue.schedule_now({"n": n}) for n in range(tasks)]
        worker = Worker(App(default=handler), queue_name, redis_url, settings=settings)

        async def scenario() -> None:
            async with running(worker):
                await wait_until(lambda: len(started) == tasks, what="every attempt running")
                raw.delete(QueueKeys(queue_name).leases)  # lost, as in a failover
                release.set()
                await wait_until(lambda: worker.counters.fenced == tasks, what="the acks")

        with caplog.at_level("DEBUG", logger="duetime"):
            run(scenario())
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    dropped = [m for m in warnings if "dropped" in m]
    assert dropped == [
        f"{tasks} result(s) dropped: their leases were gone (expired, or lost in a failover)"
    ]
    assert not [m for m in warnings if any(task_id in m for task_id in ids)]
    debug = [r.getMessage() for r in caplog.records if r.levelname == "DEBUG"]
    named = [m for m in debug if m.startswith("dropped result(s):")]
    assert len(named) == 1 and all(f"{task_id} attempt 1" in named[0] for task_id in ids)
