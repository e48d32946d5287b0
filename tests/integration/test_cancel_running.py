"""Cancelling a running task: the cancel marks it, the heartbeat tells its worker, and
whichever step ends its attempt (ack, fail, snooze, a hand-back, a reaped lease or
worker) ends it as cancelled, so once a cancel said yes the task never completes, is
never retried and never goes to dead. Each step is driven to the exact point first, then
real workers with async and plain handlers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from duetime import App, AsyncQueue, Dispatcher, KeyLimits, Queue, Worker, current_task
from duetime.client import TaskSearch
from duetime.errors import TaskCancelledError
from duetime.hooks import AttemptInfo, AttemptOutcome, AttemptResult, Hooks
from duetime.states import HistoryOutcome, TaskState
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.working import Ended, Outcome
from tests.helpers import FAST, running, wait_until

WORKER = "w1"


def claimed(queue: Queue, lease_ms: int = 60_000, **options: Any) -> str:
    """A task scheduled now and claimed by WORKER, as a worker would."""
    task_id = queue.schedule_now({"n": 1}, **options)
    queue.runner.run(
        queue.core.queue.operations.dispatcher.promote_due(10)
    )  # files it under flow control
    [item] = queue.runner.run(queue.core.queue.operations.worker.claim(WORKER, lease_ms, 1)) or []
    assert item.task_id == task_id
    return task_id


def ended_as_cancelled(queue: Queue, task_id: str, raw: redis.Redis, before: int = 0) -> None:
    """The task is gone (its result, if kept, says cancelled), counted and recorded as
    cancelled, with no mark left behind."""
    status = queue.status(task_id)
    if status is not None:
        assert (status.state, status.succeeded, status.result) == ("finished", False, "cancelled")
    assert queue.stats().counters.get("cancelled") == before + 1
    newest = queue.history(10, task_id=task_id)[0]
    assert newest.outcome == HistoryOutcome.CANCELLED
    assert raw.hlen(QueueKeys(queue.name).cancelling) == 0
    assert queue.check() == []


def test_a_running_tasks_cancel_is_marked_and_its_ack_ends_it_as_cancelled(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        task_id = claimed(queue, result_ttl=60)
        assert queue.cancel(task_id) is True
        status = queue.status(task_id)
        assert status is not None and status.state == TaskState.RUNNING
        assert status.cancel_asked_at == pytest.approx(time.time(), abs=5)
        assert queue.cancel(task_id) is True  # asked again: still running, still yes
        reply = queue.runner.run(
            queue.core.queue.operations.worker.heartbeat(WORKER, 60_000, [(task_id, 1)])
        )
        assert reply.cancelling == [task_id] and reply.lost == []
        flags = queue.runner.run(
            queue.core.queue.operations.worker.ack(
                WORKER, [Outcome(task_id, 1, 60_000, b"\x92\xc3\x01")]
            )
        )
        assert flags == [Ended.CANCELLED]
        ended_as_cancelled(queue, task_id, raw)
        assert queue.stats().counters.get("completed") is None
        with pytest.raises(TaskCancelledError, match="was cancelled"):
            queue.result(task_id, timeout=1)


@pytest.mark.parametrize("final", [False, True])
def test_a_failure_after_the_cancel_neither_retries_nor_kills_the_task(
    redis_url: str, raw: redis.Redis, queue_name: str, final: bool
) -> None:
    with Queue(queue_name, redis_url) as queue:
        task_id = claimed(queue)
        assert queue.cancel(task_id)
        ended = queue.runner.run(
            queue.core.queue.operations.worker.fail(
                WORKER, task_id, 1, b"error", None if final else 10, ran=(5, 1), summary="boom"
            )
        )
        assert ended == Ended.CANCELLED
        ended_as_cancelled(queue, task_id, raw)
        assert queue.stats().dead == 0 and queue.stats().scheduled == 0
        with pytest.raises(TaskCancelledError):
            queue.result(task_id, timeout=1)  # known from the history: no result was kept


def test_a_snooze_after_the_cancel_ends_it(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        task_id = claimed(queue)
        assert queue.cancel(task_id)
        ended = queue.runner.run(
            queue.core.queue.operations.worker.snooze(WORKER, task_id, 1, 60_000, whole_key=False)
        )
        assert ended == Ended.CANCELLED
        ended_as_cancelled(queue, task_id, raw)
        assert queue.stats().scheduled == 0


def test_a_reaped_lease_or_worker_ends_a_cancelled_task_rather_than_running_it_again(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """A worker that dies (or hangs past its lease) after the cancel: the dispatcher's
    reap ends the task as cancelled, the others of the same reap re-enter as always."""
    with Queue(queue_name, redis_url) as queue:
        operations = queue.core.queue.operations
        cancelled = claimed(queue, lease_ms=1)
        kept = claimed(queue, lease_ms=1)
        assert queue.cancel(cancelled)
        time.sleep(0.01)
        assert queue.runner.run(operations.dispatcher.reap_expired_leases(100)) == 1
        ended_as_cancelled(queue, cancelled, raw)
        kept_status = queue.status(kept)
        assert kept_status is not None and kept_status.state != TaskState.RUNNING

        silent = claimed(queue)
        assert queue.cancel(silent)
        assert queue.runner.run(operations.dispatcher.reap_worker(WORKER, 2**62)) == 0
        ended_as_cancelled(queue, silent, raw, before=1)


def test_a_stopping_workers_hand_back_ends_a_cancelled_task(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        operations = queue.core.queue.operations
        cancelled = claimed(queue)
        kept = claimed(queue)
        assert queue.cancel(cancelled)
        assert queue.runner.run(operations.worker.release_worker(WORKER, 1000)) == 1
        ended_as_cancelled(queue, cancelled, raw)
        status = queue.status(kept)
        assert status is not None and status.state == TaskState.READY

        # The one handed back, taken by BLMOVE but not leased yet (the worker had no
        # free slot): in a worker's list, its cancel is asked as a running one's.
        assert queue.runner.run(operations.worker.take_ready("w2", 1)) == kept
        assert queue.cancel(kept)
        assert queue.runner.run(operations.worker.give_back("w2", kept))
        ended_as_cancelled(queue, kept, raw, before=1)


def test_a_cancel_frees_the_running_tasks_slot_under_a_key_limit(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        queue.set_key_limits("acme", KeyLimits(concurrency=1))
        first = claimed(queue, limit_key="acme")
        second = queue.schedule_now({"n": 2}, limit_key="acme")
        queue.runner.run(queue.core.queue.operations.dispatcher.promote_due(10))
        assert queue.runner.run(queue.core.queue.operations.worker.claim("w2", 60_000, 1)) == []
        assert queue.cancel(first)
        ended = queue.runner.run(
            queue.core.queue.operations.worker.fail(
                WORKER, first, 1, b"error", 10, summary="stopped"
            )
        )
        assert ended == Ended.CANCELLED
        [item] = queue.runner.run(queue.core.queue.operations.worker.claim("w2", 60_000, 1)) or []
        assert item.task_id == second  # the key's only slot came back with the cancel
        assert queue.check() == []


class Outcomes(Hooks):
    """The outcome of every attempt, as hooks hear it."""

    def __init__(self) -> None:
        self.seen: dict[str, AttemptOutcome] = {}

    def after_attempt(self, attempt: AttemptInfo, result: AttemptResult) -> None:
        self.seen[attempt.task_id] = result.outcome


def run_worker_until(
    queue_name: str,
    redis_url: str,
    app: App,
    scenario: Callable[[AsyncQueue, Worker], Any],
    **settings: Any,
) -> Worker:
    worker = Worker(app, queue_name, redis_url, settings=FAST.replace(**settings))
    # The dispatcher judges the worker alive by the worker's heartbeat settings.
    dispatcher = Dispatcher(queue_name, redis_url, settings=worker.settings)

    async def main() -> None:
        async with AsyncQueue(queue_name, redis_url) as client, running(dispatcher, worker):
            await scenario(client, worker)

    asyncio.run(main())
    return worker


def none_completed(queue_name: str, redis_url: str, cancelled: int) -> None:
    """The queue counted ``cancelled`` cancels, no completion, and its invariants hold."""
    with Queue(queue_name, redis_url) as queue:
        assert queue.stats().counters.get("cancelled") == cancelled
        assert queue.stats().counters.get("completed") is None
        assert queue.check() == []


def test_an_async_handler_is_cancelled_and_its_task_ends_as_cancelled(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    started = asyncio.Event()
    stopped: list[float] = []
    outcomes = Outcomes()

    async def forever(data: object) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.append(time.monotonic())
            raise

    app = App(default=forever, hooks=[outcomes])

    async def scenario(client: AsyncQueue, worker: Worker) -> None:
        task_id = await client.schedule_now({"n": 1})
        await asyncio.wait_for(started.wait(), 10)
        asked = time.monotonic()
        assert await client.cancel(task_id)
        await wait_until(lambda: worker.counters.cancelled == 1, what="the cancel")
        assert stopped and stopped[0] - asked < 5 * FAST.heartbeat_interval + 1
        assert outcomes.seen[task_id] == AttemptOutcome.CANCELLED
        assert await client.status(task_id) is None

    run_worker_until(queue_name, redis_url, app, scenario)
    none_completed(queue_name, redis_url, cancelled=1)


def test_a_plain_function_sees_the_flag_and_one_that_ignores_it_is_let_go_after_the_grace(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """A plain function that looks at ``current_task().cancelled`` returns; one that
    never looks is left running in its thread after ``cancel_grace``: its task ends as
    cancelled then, and what it returns later is dropped."""
    release = threading.Event()
    started = threading.Semaphore(0)
    saw: list[bool] = []

    def polite(data: object) -> None:
        started.release()
        while not current_task().cancelled:
            time.sleep(0.01)
        saw.append(True)
        current_task().raise_if_cancelled()

    def stubborn(data: object) -> str:
        started.release()
        release.wait(30)
        return "too late"

    app = App()
    app.task(polite)
    app.task(stubborn)

    async def scenario(client: AsyncQueue, worker: Worker) -> None:
        first = await client.schedule_now({}, task="polite")
        second = await client.schedule_now({}, task="stubborn")
        for _ in range(2):
            assert await asyncio.to_thread(started.acquire, True, 10)
        assert await client.cancel(first) and await client.cancel(second)
        await wait_until(lambda: saw == [True], what="the polite handler to see the flag")
        await wait_until(lambda: worker.counters.cancelled == 2, timeout=15, what="both ended")
        for task_id in (first, second):
            assert await client.status(task_id) is None
        release.set()

    run_worker_until(queue_name, redis_url, app, scenario, cancel_grace=0.5)
    none_completed(queue_name, redis_url, cancelled=2)


def test_cancel_many_asks_running_tasks_to_stop_too(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        running_id = claimed(queue)
        waiting = queue.schedule_in(3600, {"n": 2})
        outcome = queue.cancel_many([running_id, waiting, "gone-one"])
        assert outcome.done == [running_id, waiting]
        assert outcome.skipped == {"gone-one": "gone"}
        status = queue.status(running_id)
        assert status is not None and status.cancel_asked_at is not None
        assert queue.status(waiting) is None


def test_every_running_task_of_a_limit_key_is_found_and_asked_to_stop(
    redis_url: str, queue_name: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        ours = [queue.schedule_now({"n": n}, limit_key="acme") for n in range(3)]
        theirs = queue.schedule_now({"n": 9}, limit_key="other")
        waiting = queue.schedule_in(3600, {"n": 10}, limit_key="acme")
        queue.runner.run(queue.core.queue.operations.dispatcher.promote_due(10))
        claimed_ids = (
            queue.runner.run(queue.core.queue.operations.worker.claim(WORKER, 60_000, 10)) or []
        )
        assert {item.task_id for item in claimed_ids} == {*ours, theirs}
        page = queue.search(TaskSearch(limit_key="acme", state="running"))
        assert page.walked == "keys" and page.cursor is None
        assert sorted(task.id for task in page.tasks) == sorted(ours)
        assert queue.cancel_many([task.id for task in page.tasks]).done
        for task_id in ours:
            status = queue.status(task_id)
            assert status is not None and status.cancel_asked_at is not None
        for task_id in (theirs, waiting):
            status = queue.status(task_id)
            assert status is not None and status.cancel_asked_at is None
