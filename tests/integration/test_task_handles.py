"""Typed handles on a real server: ``queue.task(handler)`` schedules that handler's tasks
(its name, the data, the options given) with ``Queue`` and ``AsyncQueue`` alike, refuses
a function no ``App`` registered before anything is written, and leaves the handler
callable as before. (That a type checker checks the data: tests/unit/test_handle_typing.py.)"""

from __future__ import annotations

import asyncio
import time
from typing import TypedDict

import pytest
import redis

from duetime import App, AsyncQueue, AsyncTaskHandle, Queue, TaskHandle
from duetime.errors import InvalidNameError
from duetime.states import TaskState

app = App()


class Email(TypedDict):
    to: str
    subject: str


@app.task(name="mail.send")
def send_email(data: Email) -> str:
    return f"sent to {data['to']}"


@app.task
async def resize(data: list[int]) -> int:
    return sum(data)


def test_a_handle_schedules_its_handler_with_the_options_given(
    redis_url: str, queue_name: str
) -> None:
    email: Email = {"to": "ada@example.com", "subject": "hello"}
    with Queue(queue_name, redis_url) as queue:
        handle = queue.task(send_email)
        assert isinstance(handle, TaskHandle)
        now = handle.schedule_now(email)
        at = time.time() + 3600
        later = handle.schedule_task(at, email, priority=3, limit_key="ada")
        soon = handle.schedule_in(60, email, id="welcome-ada", max_attempts=2)
        many = handle.schedule_many([(at, email), (at + 1, email)])
        assert handle.schedule_in(60, email, id="welcome-ada") == soon  # a live id stays

        statuses = {task_id: queue.status(task_id) for task_id in [later, soon, now, *many]}
        assert len(statuses) == 5
        for status in statuses.values():
            assert status is not None
            assert (status.task, status.data) == ("mail.send", email)
        first, second, third = statuses[later], statuses[soon], statuses[now]
        assert first is not None and second is not None and third is not None
        assert (first.state, first.priority, first.limit_key) == (TaskState.SCHEDULED, 3, "ada")
        assert first.run_at == pytest.approx(at, abs=0.001)
        assert (second.id, second.state) == ("welcome-ada", TaskState.SCHEDULED)
        assert third.state == TaskState.READY
        assert queue.check() == []
    assert send_email(email) == "sent to ada@example.com"  # still the plain function


def test_an_async_handle_schedules_its_handler(redis_url: str, queue_name: str) -> None:
    async def scenario() -> None:
        async with AsyncQueue(queue_name, redis_url) as queue:
            handle = queue.task(resize)
            assert isinstance(handle, AsyncTaskHandle)
            ids = [
                await handle.schedule_task(time.time() + 60, [1, 2]),
                await handle.schedule_in(60, [3], cost=2),
                await handle.schedule_now([4]),
                *await handle.schedule_many([(time.time() + 60, [5])]),
            ]
            statuses = [await queue.status(task_id) for task_id in ids]
            assert [(s.task, s.data) for s in statuses if s is not None] == [
                ("resize", [1, 2]),
                ("resize", [3]),
                ("resize", [4]),
                ("resize", [5]),
            ]
            assert statuses[1] is not None and statuses[1].cost == 2
            assert await queue.check() == []
        assert await resize([1, 2, 3]) == 6  # still the coroutine function

    asyncio.run(scenario())


def test_a_function_no_app_registered_is_refused_before_anything_is_written(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    def stray(data: int) -> None: ...

    with (
        Queue(queue_name, redis_url) as queue,
        pytest.raises(InvalidNameError, match="stray is not registered with an App"),
    ):
        queue.task(stray)
    assert raw.keys("*") == []
