"""Hooks on a real server: what a worker and a queue report, in order, for success,
retry, dead and tasks that cannot start; a context variable set before an attempt is
seen by the handler; a hook that raises changes nothing about the task."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Sequence
from typing import Any

import pytest

from duetime import (
    App,
    AttemptInfo,
    AttemptOutcome,
    AttemptResult,
    DeadTaskInfo,
    Dispatcher,
    Hooks,
    Queue,
    ScheduledTask,
    Worker,
)
from duetime.errors import ConfigurationError
from tests.helpers import FAST, add_ok_flaky_broken, running, wait_until

RETRY_FAST = FAST.replace(retry_base=0.01, retry_max=0.02, max_attempts=2)
trace_id: contextvars.ContextVar[str] = contextvars.ContextVar("trace_id", default="")


class Recorder(Hooks):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def on_schedule(self, queue: str, tasks: Sequence[ScheduledTask]) -> None:
        self.events.append(("schedule", queue, list(tasks)))

    def before_attempt(self, attempt: AttemptInfo) -> None:
        trace_id.set(f"trace-{attempt.task_id}-{attempt.attempt}")
        self.events.append(("before", attempt.task_id, attempt.attempt))

    def after_attempt(self, attempt: AttemptInfo, result: AttemptResult) -> None:
        self.events.append(("after", attempt.task_id, attempt.attempt, result.outcome))
        self.events.append(("context after", trace_id.get()))

    def on_retry(self, attempt: AttemptInfo, error: str, delay: float) -> None:
        self.events.append(("retry", attempt.task_id, attempt.attempt, error))

    def on_dead(self, dead: DeadTaskInfo) -> None:
        self.events.append(("dead", dead.task_id, dead.task, dead.attempt is not None, dead.error))


def of(events: list[tuple[Any, ...]], task_id: str) -> list[tuple[Any, ...]]:
    return [event for event in events if task_id in event[1:3]]


def test_a_worker_reports_each_attempt_and_its_end(redis_url: str, queue_name: str) -> None:
    recorder = Recorder()
    app = App(hooks=[recorder])
    seen: dict[str, str] = {}
    ok, flaky, broken = add_ok_flaky_broken(
        app, lambda name: seen.__setitem__(name, trace_id.get())
    )

    with Queue(queue_name, redis_url, settings=RETRY_FAST, hooks=[recorder]) as queue:
        before = time.time()
        ok_id = queue.schedule_now({}, task=ok)
        flaky_id = queue.schedule_now({}, task=flaky)
        broken_id = queue.schedule_now({}, task=broken)
        unknown_id = queue.schedule_now({}, task="nobody")
        scheduled = [event for event in recorder.events if event[0] == "schedule"]
        assert [(e[1], [t.id for t in e[2]]) for e in scheduled] == [
            (queue_name, [ok_id]), (queue_name, [flaky_id]),
            (queue_name, [broken_id]), (queue_name, [unknown_id]),
        ]  # fmt: skip
        first = scheduled[0][2][0]
        assert first.task == "ok" and before - 1 <= first.run_at <= time.time() + 1

        async def scenario() -> None:
            worker = Worker(app, queue_name, redis_url, settings=RETRY_FAST)
            async with running(Dispatcher([queue_name], redis_url, settings=FAST), worker):
                await wait_until(lambda: queue.stats().dead == 2, what="two dead tasks")
                await wait_until(lambda: queue.stats().counters.get("completed") == 2)

        asyncio.run(scenario())

    events = recorder.events
    assert of(events, ok_id) == [
        ("before", ok_id, 1), ("after", ok_id, 1, AttemptOutcome.SUCCEEDED),
    ]  # fmt: skip
    assert seen == {"ok": f"trace-{ok_id}-1", "flaky": f"trace-{flaky_id}-2"}
    assert of(events, flaky_id) == [
        ("before", flaky_id, 1), ("after", flaky_id, 1, AttemptOutcome.RETRY),
        ("retry", flaky_id, 1, "ValueError: first time fails"),
        ("before", flaky_id, 2), ("after", flaky_id, 2, AttemptOutcome.SUCCEEDED),
    ]  # fmt: skip
    assert of(events, broken_id) == [
        ("before", broken_id, 1), ("after", broken_id, 1, AttemptOutcome.RETRY),
        ("retry", broken_id, 1, "RuntimeError: always"),
        ("before", broken_id, 2), ("after", broken_id, 2, AttemptOutcome.DEAD),
        ("dead", broken_id, "broken", True, "RuntimeError: always"),
    ]  # fmt: skip
    # An unknown handler never starts: no attempt, straight to dead.
    [dead] = of(events, unknown_id)
    assert dead[:4] == ("dead", unknown_id, "nobody", False)
    assert "no handler named 'nobody'" in dead[4]
    # after_attempt runs in the attempt's own context: it sees what before_attempt set.
    contexts = [event[1] for event in events if event[0] == "context after"]
    assert len(contexts) == 5 and all(context.startswith("trace-") for context in contexts)


class Broken(Hooks):
    def before_attempt(self, attempt: AttemptInfo) -> None:
        raise RuntimeError("hook bug")

    def on_schedule(self, queue: str, tasks: Sequence[ScheduledTask]) -> None:
        raise RuntimeError("hook bug")


def test_a_hook_that_raises_is_logged_once_and_changes_nothing(
    redis_url: str, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    done: list[int] = []
    recorder = Recorder()
    app = App(default=lambda data: done.append(data["n"]), hooks=[Broken(), recorder])
    with Queue(queue_name, redis_url, hooks=[Broken()]) as queue:
        ids = [queue.schedule_now({"n": n}) for n in range(3)]

        async def scenario() -> None:
            worker = Worker(app, queue_name, redis_url, settings=FAST)
            async with running(Dispatcher([queue_name], redis_url, settings=FAST), worker):
                await wait_until(lambda: len(done) == 3 and queue.stats().running == 0)

        with caplog.at_level(logging.DEBUG, logger="duetime"):
            asyncio.run(scenario())
        assert all(queue.status(task_id) is None for task_id in ids)  # done, no result kept
        assert queue.stats().counters["completed"] == 3
    raised = [r for r in caplog.records if "hook Broken.before_attempt raised" in r.message]
    assert [r.levelno for r in raised] == [logging.ERROR, logging.DEBUG, logging.DEBUG]
    assert [e[0] for e in recorder.events].count("after") == 3  # the next hook still ran
    # One line per attempt at debug, from duetime's own logging hook.
    lines = [r.message for r in caplog.records if "attempt 1 succeeded" in r.message]
    assert len(lines) == 3 and all("after its run-at" in line for line in lines)


def test_hooks_must_be_hooks() -> None:
    with pytest.raises(ConfigurationError, match=r"duetime\.Hooks"):
        App(hooks=[print])  # type: ignore[list-item]
