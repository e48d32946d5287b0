"""``current_task().queue`` on a real server: a handler schedules follow-up work on its
own queue, a plain function through a ``Queue`` and an async handler through an
``AsyncQueue``, both on the worker's own connection (no client of their own); the app's
hooks hear of what they schedule; closing the lent queue leaves the worker working; and
the queue refuses callers it cannot serve (another event loop, a stopped worker)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

import duetime
from duetime import App, AsyncQueue, Dispatcher, Hooks, Queue, ScheduledTask, Worker
from duetime.errors import QueueNotLentError
from duetime.store.redis.bridge import LoopRunner
from tests.helpers import FAST, running, wait_until


class ScheduleRecorder(Hooks):
    def __init__(self) -> None:
        self.scheduled: list[tuple[str, str, str]] = []  # (queue, task id, handler name)

    def on_schedule(self, queue: str, tasks: Sequence[ScheduledTask]) -> None:
        self.scheduled += [(queue, task.id, task.task) for task in tasks]


@pytest.mark.parametrize("shards", [1, 2])
def test_plain_and_async_handlers_schedule_follow_ups_on_the_workers_connection(
    redis_url: str, queue_name: str, shards: int
) -> None:
    recorder = ScheduleRecorder()
    app = App(hooks=[recorder])
    lent: dict[str, list[Any]] = {"plain": [], "async": []}
    follow_ups: dict[str, str] = {}  # follow-up id -> the id of the task that made it
    done: dict[str, dict[str, Any]] = {}  # follow-up id -> its data

    @app.task
    def finish(data: dict[str, Any]) -> None:
        done[duetime.current_task().id] = data

    @app.task
    def start_plain(data: dict[str, int]) -> None:
        context = duetime.current_task()
        queue = context.queue
        assert isinstance(queue, Queue)
        lent["plain"].append(queue)
        follow_up = queue.task(finish).schedule_in(0.05, {"from": "plain", "n": data["n"]})
        follow_ups[follow_up] = context.id

    @app.task
    async def start_async(data: dict[str, int]) -> None:
        context = duetime.current_task()
        queue = context.queue
        assert isinstance(queue, AsyncQueue)
        lent["async"].append(queue)
        follow_up = await queue.schedule_now({"from": "async", "n": data["n"]}, task="finish")
        follow_ups[follow_up] = context.id

    async def scenario() -> None:
        worker = Worker(app, queue_name, redis_url, settings=FAST, shards=shards)
        dispatcher = Dispatcher([queue_name], redis_url, settings=FAST, shards=shards)
        async with AsyncQueue(queue_name, redis_url, shards=shards) as queue:
            starts = [await queue.schedule_now({"n": n}, task=start_plain) for n in range(3)]
            starts += [await queue.schedule_now({"n": n}, task=start_async) for n in range(3)]
            async with running(dispatcher, worker):
                await wait_until(lambda: len(done) == 6, what="the six follow-ups")
            assert sorted(follow_ups.values()) == sorted(starts)
            assert await queue.check() == []
            assert (await queue.stats()).counters["completed"] == 12

        assert sorted((data["from"], data["n"]) for data in done.values()) == [
            (kind, n) for kind in ("async", "plain") for n in range(3)
        ]
        assert set(done) == set(follow_ups)
        # One client of each kind for the whole worker, on the worker's own runner.
        plain, asynchronous = lent["plain"][0], lent["async"][0]
        assert all(each is plain for each in lent["plain"])
        assert all(each is asynchronous for each in lent["async"])
        assert asynchronous.runner is worker.runner
        assert isinstance(plain.runner, LoopRunner) and plain.runner._runner is worker.runner
        assert plain.core is asynchronous.core
        assert plain.core.queue.layout.count == shards
        # The app's hooks hear of the follow-ups, as a queue's hooks would.
        assert sorted(recorder.scheduled) == sorted(
            (queue_name, follow_up, "finish") for follow_up in follow_ups
        )

    asyncio.run(scenario())


def test_closing_the_lent_queue_leaves_the_worker_and_its_connection_alone(
    redis_url: str, queue_name: str
) -> None:
    app = App()
    scheduled: list[str] = []
    ran: list[str] = []

    @app.task
    def close_plain(data: dict[str, str]) -> None:
        queue = duetime.current_task().queue
        assert isinstance(queue, Queue)
        queue.close()
        with queue:  # leaving a with-block closes it too
            scheduled.append(queue.schedule_now({}, task="record"))

    @app.task
    async def close_async(data: dict[str, str]) -> None:
        queue = duetime.current_task().queue
        assert isinstance(queue, AsyncQueue)
        await queue.close()
        async with queue:
            scheduled.append(await queue.schedule_now({}, task="record"))

    @app.task
    def record(data: dict[str, str]) -> None:
        ran.append(duetime.current_task().id)

    async def scenario() -> None:
        async with AsyncQueue(queue_name, redis_url) as queue:
            await queue.schedule_now({}, task=close_plain)
            await queue.schedule_now({}, task=close_async)
            async with running(
                Dispatcher([queue_name], redis_url, settings=FAST),
                Worker(app, queue_name, redis_url, settings=FAST),
            ):
                await wait_until(lambda: len(ran) == 2, what="both follow-ups to run")
            assert (await queue.stats()).counters["completed"] == 4

    asyncio.run(scenario())
    assert sorted(scheduled) == sorted(ran)


def test_the_lent_queue_refuses_another_event_loop_and_a_stopped_worker(
    redis_url: str, queue_name: str
) -> None:
    app = App()
    outcomes: list[BaseException | Queue] = []

    async def on_a_loop_of_its_own() -> object:
        return duetime.current_task().queue

    @app.task
    def runs_its_own_loop(data: dict[str, str]) -> None:
        try:
            asyncio.run(on_a_loop_of_its_own())
        except QueueNotLentError as refused:
            outcomes.append(refused)
        queue = duetime.current_task().queue
        assert isinstance(queue, Queue)  # a plain function's thread runs no event loop
        outcomes.append(queue)

    async def scenario() -> None:
        async with AsyncQueue(queue_name, redis_url) as queue:
            await queue.schedule_now({}, task=runs_its_own_loop)
            async with running(
                Dispatcher([queue_name], redis_url, settings=FAST),
                Worker(app, queue_name, redis_url, settings=FAST),
            ):
                await wait_until(lambda: len(outcomes) == 2, what="the handler")
            assert (await queue.stats()).counters["completed"] == 1

    asyncio.run(scenario())
    refused, kept = outcomes
    assert isinstance(refused, QueueNotLentError)
    assert "event loop of its own" in str(refused)
    assert isinstance(kept, Queue)
    with pytest.raises(QueueNotLentError, match="has stopped"):
        kept.schedule_now({})


def test_a_task_context_made_by_hand_has_no_queue() -> None:
    context = duetime.TaskContext("id", "emails", "send", 1, 3, 0.0, "worker")
    assert context.queue_name == "emails"
    with pytest.raises(QueueNotLentError, match="not made by a worker"):
        _ = context.queue
