"""``expires``: a task that has not started that long after its run-at is dropped unrun,
counted and recorded, whichever attempt it is; one that starts in time runs as always."""

from __future__ import annotations

import asyncio
import math
import time
from datetime import timedelta
from typing import Any

import pytest
import redis

from duetime import App, Debounce, Dispatcher, Job, Queue, Worker, codec
from duetime.errors import InvalidOptionError, TaskExpiredError
from duetime.states import HistoryOutcome
from duetime.store.plans.keys import QueueKeys
from tests.helpers import FAST, running, wait_until


def run_fleet(queue_name: str, redis_url: str, app: App, until: Any, **settings: Any) -> Worker:
    worker = Worker(app, queue_name, redis_url, settings=FAST.replace(**settings))
    dispatcher = Dispatcher(queue_name, redis_url, settings=FAST)

    async def main() -> None:
        async with running(dispatcher, worker):
            await wait_until(until, what="the tasks' ends")

    asyncio.run(main())
    return worker


def test_a_task_claimed_past_its_expiry_is_dropped_unrun_and_one_in_time_runs(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    ran: list[str] = []

    async def handler(data: dict[str, str]) -> str:
        ran.append(data["name"])
        return "ran"

    with Queue(queue_name, redis_url) as queue:
        late = queue.schedule_now({"name": "late"}, expires=0.2, result_ttl=60)
        timely = queue.schedule_now({"name": "timely"}, expires=timedelta(hours=1))
        envelope = codec.decode_envelope(raw.hget(QueueKeys(queue_name).tasks, late))  # type: ignore[arg-type]
        assert envelope.expires_after_ms == 200
        time.sleep(0.4)  # no worker yet: the late one's expiry passes while it waits

        def both_ended() -> bool:
            counters = queue.stats().counters
            return counters.get("expired") == 1 and counters.get("completed") == 1

        worker = run_fleet(queue_name, redis_url, App(default=handler), both_ended)
        assert ran == ["timely"]
        assert worker.counters.expired == 1
        assert queue.status(timely) is None
        status = queue.status(late)  # its result is kept: it says how the task ended
        assert status is not None and (status.state, status.result) == ("finished", "expired")
        [attempt] = queue.history(10, task_id=late)
        assert attempt.outcome == HistoryOutcome.EXPIRED and "expired" in (attempt.error or "")
        with pytest.raises(TaskExpiredError, match="expired before it could start"):
            queue.result(late, timeout=1)
        assert queue.check() == []


def test_a_retry_due_past_the_expiry_is_dropped_rather_than_run(
    redis_url: str, queue_name: str
) -> None:
    attempts: list[int] = []

    def fails_once(data: Any) -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails")

    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_now({}, expires=0.3, max_attempts=3)
        run_fleet(
            queue_name,
            redis_url,
            App(default=fails_once),
            lambda: queue.stats().counters.get("expired") == 1,
            retry_base=1.0,
            retry_max=1.0,
        )
        assert attempts == [1]  # the retry, due 0.5 to 1 s after, was past its 0.3 s
        outcomes = [a.outcome for a in queue.history(10, task_id=task_id)]
        assert outcomes == [HistoryOutcome.EXPIRED, HistoryOutcome.RETRIED]
        assert queue.stats().dead == 0


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, "soon", True, 10**12])
def test_a_bad_expires_is_refused_before_anything_is_written(
    redis_url: str, raw: redis.Redis, queue_name: str, bad: object
) -> None:
    with Queue(queue_name, redis_url) as queue:
        with pytest.raises(InvalidOptionError, match="expires"):
            queue.schedule_now({}, expires=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidOptionError, match="expires"):
            queue.schedule_many([Job({}, delay=1, expires=bad)])  # type: ignore[arg-type]
    assert raw.keys(f"duetime:{{{queue_name}}}:*") == []


def test_expires_goes_with_bulk_keyed_and_rescheduled_tasks(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)

    def expiry_of(task_id: str) -> int:
        return codec.decode_envelope(raw.hget(keys.tasks, task_id)).expires_after_ms  # type: ignore[arg-type]

    with Queue(queue_name, redis_url) as queue:
        [bulk] = queue.schedule_many([Job({"n": 1}, delay=60, expires=5)])
        keyed = queue.schedule_in(60, {"n": 2}, debounce=Debounce("k", 1), expires=7)
        plain = queue.schedule_in(60, {"n": 3})
        assert (expiry_of(bulk), expiry_of(keyed), expiry_of(plain)) == (5000, 7000, 0)
        assert raw.hget(keys.tasks, plain)[1] == 2  # type: ignore[index]  # still version 2
        queue.reschedule_in(bulk, 120)
        assert expiry_of(bulk) == 5000
        status = queue.status(keyed)
        assert status is not None and status.data == {"n": 2}
