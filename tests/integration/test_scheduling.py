"""The client API against a real server: state before and after each operation."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from collections import deque
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis

import duetime
from duetime import Job, Queue, Settings, codec
from duetime.client import ids as client_ids
from duetime.errors import (
    InvalidInputError,
    InvalidNameError,
    InvalidOptionError,
    InvalidPayloadError,
    InvalidTimestampError,
    NotDurableError,
    RedisUnavailableError,
    TaskNotFoundError,
    TaskStateError,
)
from duetime.store.plans.keys import QueueKeys
from tests.helpers import decoded, running, scheduled_count, scheduled_score, wait_until


def evalsha_calls(raw: redis.Redis) -> int:
    stats = raw.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def test_future_task_waits_in_scheduled_with_its_run_at(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        at = int(time.time()) + 3600
        task_id = queue.schedule_task(at, {"to": "a@example.com"})
        assert scheduled_score(raw, keys, task_id) == round(at * 1000)
        assert raw.llen(keys.ready) == 0
        assert raw.hexists(keys.tasks, task_id)
        status = queue.status(task_id)
        assert status is not None and status.state == "scheduled"
        assert status.data == {"to": "a@example.com"} and status.run_at == round(at * 1000) / 1000
        stats = queue.stats()
        assert (stats.scheduled, stats.ready, stats.running, stats.dead) == (1, 0, 0, 0)
        assert stats.next_due == round(at * 1000) / 1000
        assert queue.check() == []


def test_due_task_goes_straight_to_ready(redis_url: str, raw: redis.Redis, queue_name: str) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        past = queue.schedule_task(time.time() - 10, {"n": 1})
        now = queue.schedule_now({"n": 2})
        assert decoded(raw.lrange(keys.ready, 0, -1)) == [past, now]
        assert scheduled_count(raw, keys) == 0
        assert queue.status(now).state == "ready"  # type: ignore[union-attr]


def test_same_id_twice_is_one_task(redis_url: str, raw: redis.Redis, queue_name: str) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        at = int(time.time()) + 60
        assert queue.schedule_task(at, {"v": 1}, id="welcome-42") == "welcome-42"
        assert queue.schedule_task(at + 100, {"v": 2}, id="welcome-42") == "welcome-42"
        assert scheduled_count(raw, keys) == 1
        assert scheduled_score(raw, keys, "welcome-42") == round(at * 1000)
        assert queue.status("welcome-42").data == {"v": 1}  # type: ignore[union-attr]


def colliding_ids(monkeypatch: pytest.MonkeyPatch, live_id: str) -> list[int]:
    """Make the first batch of generated ids start with ``live_id``; later batches are
    real. Returns the sizes of the batches asked for."""
    real = client_ids.new_task_ids
    calls: list[int] = []

    def first_collides(count: int) -> list[str]:
        calls.append(count)
        ids = real(count)
        return [live_id, *ids[1:]] if len(calls) == 1 else ids

    monkeypatch.setattr(client_ids, "new_task_ids", first_collides)
    monkeypatch.setattr(client_ids, "_id_pool", deque())  # single calls draw from it
    return calls


def test_generated_ids_are_12_url_safe_characters() -> None:
    ids = client_ids.new_task_ids(1000)
    assert len(set(ids)) == 1000
    assert all(len(i) == 12 and re.fullmatch(r"[A-Za-z0-9._]+", i) for i in ids)


@pytest.mark.parametrize("many", [False, True])
def test_generated_id_that_collides_is_stored_under_a_fresh_id(
    redis_url: str, raw: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch, many: bool
) -> None:
    """A generated id that belongs to a live task must not make the new task a silent
    no-op (the "already live" answer is for ids the caller chose)."""
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        at = int(time.time()) + 60
        live = queue.schedule_task(at, {"v": "old"})
        before = (raw.hget(keys.tasks, live), scheduled_score(raw, keys, live))
        calls = colliding_ids(monkeypatch, live)
        if many:
            ids = queue.schedule_many([Job({"v": "new"}, at=at + 1), Job({"v": "other"}, delay=0)])
            task_id = ids[0]
            assert queue.status(ids[1]).data == {"v": "other"}  # type: ignore[union-attr]
        else:
            task_id = queue.schedule_task(at + 1, {"v": "new"})
        assert calls[1:] == [1]  # one fresh id, for the one collision
        assert task_id != live and len(task_id) == 12
        assert queue.status(task_id).data == {"v": "new"}  # type: ignore[union-attr]
        assert scheduled_score(raw, keys, task_id) == (at + 1) * 1000
        assert (raw.hget(keys.tasks, live), scheduled_score(raw, keys, live)) == before
        assert queue.status(live).data == {"v": "old"}  # type: ignore[union-attr]
        assert raw.hlen(keys.tasks) == (3 if many else 2)
        assert queue.check() == []


def test_given_id_that_is_live_stays_idempotent_beside_a_collision(
    redis_url: str, raw: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        at = int(time.time()) + 60
        queue.schedule_task(at, {"v": "given"}, id="welcome-42")
        live = queue.schedule_task(at, {"v": "generated"})
        colliding_ids(monkeypatch, live)
        ids = queue.schedule_many([Job({"v": "new"}, at=at), Job({"v": 2}, at=at, id="welcome-42")])
        assert ids[1] == "welcome-42" and ids[0] not in (live, "welcome-42")
        assert queue.status("welcome-42").data == {"v": "given"}  # type: ignore[union-attr]
        assert queue.status(live).data == {"v": "generated"}  # type: ignore[union-attr]
        assert queue.status(ids[0]).data == {"v": "new"}  # type: ignore[union-attr]
        assert raw.hlen(keys.tasks) == 3


def test_resent_schedule_of_a_generated_id_is_not_mistaken_for_a_collision(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """redis-py resends a call whose reply was lost: the task is then already live under
    its generated id with the very same envelope, and must not be written a second time."""
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        prepared = [
            queue.core.preparing.prepare(Job({"v": i}, at=time.time() + 60)) for i in range(3)
        ]
        first = queue.runner.run(queue.core.producing.schedule_plan(prepared))
        again = queue.runner.run(queue.core.producing.schedule_plan(prepared))
        assert again == first == [item[0] for item in prepared]
        assert raw.hlen(keys.tasks) == scheduled_count(raw, keys) == 3


def test_schedule_many_uses_one_script_call_per_thousand(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_now({"warm": True})  # loads the script
        before = evalsha_calls(raw)
        at = int(time.time()) + 60
        ids = queue.schedule_many([Job({"i": i}, at=at + i) for i in range(2500)])
        assert evalsha_calls(raw) - before == 3
        assert len(set(ids)) == 2500
        assert scheduled_count(raw, QueueKeys(queue_name)) == 2500
        assert queue.schedule_many([(at, {"pair": True})])  # (at, data) pairs work too


def test_schedule_many_writes_nothing_when_one_item_is_bad(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        jobs: list[Any] = [Job({"i": i}, at=time.time() + 60) for i in range(10)]
        jobs.insert(5, Job({"i": "bad"}, at=math.nan))
        with pytest.raises(InvalidTimestampError, match="item 5"):
            queue.schedule_many(jobs)
        with pytest.raises(InvalidInputError, match="same task id twice"):
            queue.schedule_many([Job({}, delay=1, id="x"), Job({}, delay=2, id="x")])
    assert raw.dbsize() == 0


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda q: q.schedule_task(datetime(2030, 1, 1), {"a": 1}), InvalidTimestampError),
        (lambda q: q.schedule_task(math.inf, {"a": 1}), InvalidTimestampError),
        (lambda q: q.schedule_task(-5, {"a": 1}), InvalidTimestampError),
        (lambda q: q.schedule_task(time.time(), None), InvalidPayloadError),
        (lambda q: q.schedule_task(time.time(), ""), InvalidPayloadError),
        (lambda q: q.schedule_task(time.time(), {"big": "x" * 2000}), InvalidPayloadError),
        (lambda q: q.schedule_task(time.time(), {"when": datetime.now()}), InvalidPayloadError),
        (lambda q: q.schedule_task(time.time(), {"a": 1}, id="has|bar"), InvalidNameError),
        (lambda q: q.schedule_task(time.time(), {"a": 1}, task="9bad"), InvalidNameError),
        (lambda q: q.schedule_task(time.time(), {"a": 1}, max_attempts=0), InvalidOptionError),
        (lambda q: q.schedule_task(time.time(), {"a": 1}, timeout=-1), InvalidOptionError),
        (lambda q: q.schedule_in(-3, {"a": 1}), InvalidOptionError),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(
    redis_url: str, raw: redis.Redis, queue_name: str, call: Any, error: type[Exception]
) -> None:
    settings = Settings(max_payload_bytes=1024)
    with Queue(queue_name, redis_url, settings=settings) as queue, pytest.raises(error):
        call(queue)
    assert raw.dbsize() == 0


def test_durations_may_be_timedeltas(redis_url: str, raw: redis.Redis, queue_name: str) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        before_ms = raw.time()[0] * 1000
        later = queue.schedule_in(timedelta(minutes=10), {"n": 1}, timeout=timedelta(seconds=2))
        now = queue.schedule_in(timedelta(0), {"n": 2}, result_ttl=timedelta(hours=1))
        run_at_ms = scheduled_score(raw, keys, later)
        assert run_at_ms is not None and before_ms + 600_000 <= run_at_ms <= before_ms + 602_000
        assert decoded(raw.lrange(keys.ready, 0, -1)) == [now]
        envelope = codec.decode_envelope(raw.hget(keys.tasks, later))  # type: ignore[arg-type]
        assert envelope.timeout_ms == 2000
        assert codec.decode_envelope(raw.hget(keys.tasks, now)).result_ttl_ms == 3_600_000  # type: ignore[arg-type]
        [job_id] = queue.schedule_many([Job({"n": 3}, delay=timedelta(seconds=30))])
        job_run_at_ms = scheduled_score(raw, keys, job_id)
        assert job_run_at_ms is not None and job_run_at_ms >= before_ms + 30_000
        with pytest.raises(InvalidOptionError, match="delay"):
            queue.schedule_in(timedelta(seconds=-1), {"n": 4})


def test_a_function_not_registered_with_an_app_is_named_in_the_refusal(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    def send_email(data: Any) -> None: ...

    with Queue(queue_name, redis_url) as queue:
        with pytest.raises(InvalidNameError, match="send_email is not registered with an App"):
            queue.schedule_now({"a": 1}, task=send_email)
        with pytest.raises(InvalidNameError, match="not registered with an App"):
            queue.schedule_many([Job({"a": 1}, delay=1, task=send_email)])
    assert raw.dbsize() == 0


def test_bad_queue_name_is_refused_before_connecting() -> None:
    with pytest.raises(InvalidNameError, match="queue name"):
        Queue("has{brace}", "redis://127.0.0.1:1/0")


def test_cancel_from_each_place_leaves_nothing(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        scheduled = queue.schedule_in(3600, {"a": 1})
        ready = queue.schedule_now({"a": 2})
        assert queue.cancel(scheduled) and queue.cancel(ready)
        assert queue.cancel(scheduled) is False
        assert queue.cancel("never-existed") is False
        assert queue.status(scheduled) is None
        assert queue.check() == []
    keys = QueueKeys(queue_name)
    # Counters, an unconsumed wake signal (one element at most), the registry of queues
    # (which lists it) and the history, which records the two cancels and is capped, are
    # all that remain.
    history = {key.encode() for key in keys.history_keys}
    allowed = {keys.stats.encode(), keys.wake.encode(), b"duetime:queues", *history}
    assert set(raw.keys("*")) <= allowed
    assert raw.llen(keys.wake) <= 1
    assert raw.llen(keys.history) == 2


def test_cancel_of_a_running_task_asks_and_leaves_it_to_its_worker(
    redis_url: str, queue_name: str
) -> None:
    """The running task stays where it is, marked, until its attempt ends (see
    test_cancel_running.py for every way that ends it)."""
    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_now({"a": 1})
        queue.runner.run(queue.core.queue.operations.worker.claim("w1", 10_000, 10))
        assert queue.status(task_id).state == "running"  # type: ignore[union-attr]
        assert queue.cancel(task_id) is True
        status = queue.status(task_id)
        assert status is not None and status.state == "running"
        assert status.cancel_asked_at is not None


def test_reschedule_moves_waiting_tasks_and_refuses_others(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_in(3600, {"a": 1})
        later = int(time.time()) + 7200
        queue.reschedule(task_id, later)
        assert scheduled_score(raw, keys, task_id) == round(later * 1000)
        assert queue.status(task_id).data == {"a": 1}  # type: ignore[union-attr]
        queue.reschedule(task_id, time.time() - 1)  # due: straight to ready
        assert raw.lrange(keys.ready, 0, -1) == [task_id.encode()]
        queue.reschedule(task_id, later)  # from ready back to scheduled
        assert raw.llen(keys.ready) == 0 and scheduled_score(raw, keys, task_id)
        with pytest.raises(TaskNotFoundError):
            queue.reschedule("nope", later)
        running = queue.schedule_now({"b": 1})
        queue.runner.run(queue.core.queue.operations.worker.claim("w1", 10_000, 10))
        with pytest.raises(TaskStateError, match="running"):
            queue.reschedule(running, later)


def test_earlier_task_rings_the_wake_list_once(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    wake = QueueKeys(queue_name).wake
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_in(3600, {"a": 1})
        assert raw.llen(wake) == 1
        raw.delete(wake)
        queue.schedule_in(7200, {"a": 2})  # not earlier: no wake
        assert raw.llen(wake) == 0
        queue.schedule_in(60, {"a": 3})
        queue.schedule_in(30, {"a": 4})
        assert raw.llen(wake) == 1  # one element at most


def test_scripts_reload_after_the_server_forgets_them(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_now({"a": 1})
        raw.script_flush()
        queue.schedule_now({"a": 2})
        raw.script_flush()
        queue.schedule_many([Job({"n": n}, delay=0) for n in range(2500)])  # pipelined calls
        raw.script_flush()  # after the first request of several calls: refused, sent again
        queue.schedule_many([Job({"n": n}, delay=0) for n in range(2500)])
        assert queue.stats().ready == 5002


@pytest.mark.parametrize("durable", [False, True])
def test_a_first_large_request_loads_its_script_before_sending_its_calls(
    redis_url: str, raw: redis.Redis, queue_name: str, durable: bool
) -> None:
    """A server without the batch script (one that has run only single calls, here one
    flushed): the first schedule_many loads it first, rather than have every call
    refused and sent again. Durable too (no replica here: the writes stand, unconfirmed)."""
    settings = Settings(durable_timeout=0.05)
    with Queue(queue_name, redis_url, settings=settings, durable=durable) as queue:
        raw.script_flush()
        raw.config_resetstat()
        with pytest.raises(NotDurableError) if durable else contextlib.nullcontext():
            queue.schedule_many([Job({"n": n}, delay=60) for n in range(5000)])
        calls = raw.info("commandstats")["cmdstat_evalsha"]
        assert (calls["calls"], calls.get("failed_calls", 0)) == (5, 0)
        assert scheduled_count(raw, QueueKeys(queue_name)) == 5000


def test_unreachable_server_error_masks_the_password(queue_name: str) -> None:
    url = "redis://user:s3cret@127.0.0.1:1/0"
    with Queue(queue_name, url) as queue, pytest.raises(RedisUnavailableError) as raised:
        queue.schedule_now({"a": 1})
    assert "s3cret" not in str(raised.value)
    assert "***" in str(raised.value)


def test_queue_accepts_a_redis_py_client(redis_url: str, queue_name: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    with Queue(queue_name, client) as queue:
        task_id = queue.schedule_now({"bytes": b"\x00\x01"})
        assert queue.status(task_id).data == {"bytes": b"\x00\x01"}  # type: ignore[union-attr]
    client.close()


def test_async_queue_shares_behaviour(redis_url: str, raw: redis.Redis, queue_name: str) -> None:
    keys = QueueKeys(queue_name)

    async def scenario() -> None:
        async with duetime.AsyncQueue(queue_name, redis_url) as queue:
            first = await queue.schedule_task(time.time() + 60, {"a": 1}, id="same")
            again = await queue.schedule_task(time.time() + 90, {"a": 2}, id="same")
            assert first == again == "same"
            ids = await queue.schedule_many([Job({"i": i}, delay=0) for i in range(3)])
            assert len(ids) == 3
            assert (await queue.status("same")).state == "scheduled"  # type: ignore[union-attr]
            assert await queue.cancel("same")
            stats = await queue.stats()
            assert (stats.scheduled, stats.ready) == (0, 3)
            assert await queue.check() == []
            with pytest.raises(InvalidPayloadError):
                await queue.schedule_now(None)

    asyncio.run(scenario())
    assert raw.llen(keys.ready) == 3


def test_a_sub_microsecond_run_at_never_reads_back_earlier(redis_url: str, queue_name: str) -> None:
    """Issue #29: 4000000000.061981 came back from status() as 4000000000.0619807."""
    given = 4000000000.061981
    with duetime.Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_task(given, {"n": 1})
        status = queue.status(task_id)
        listed = queue.tasks("scheduled")
    assert status is not None and status.run_at == given
    assert [(task.id, task.run_at) for task in listed] == [(task_id, given)]


def test_a_task_refused_as_not_durable_is_stored_and_runs_once_when_retried_with_its_id(
    redis_url: str, queue_name: str
) -> None:
    """No replica confirms here, so each durable call raises NotDurableError: the error
    names the task, says it may be stored and will run if it is, and tells the caller to
    schedule again with the same id, never a new one. Both hold: the task was stored,
    the retry with its id added nothing, and it runs once."""
    ran: list[str] = []

    async def handler(data: Any) -> None:
        ran.append(duetime.current_task().id)

    settings = Settings(durable_timeout=0.05)
    with Queue(queue_name, redis_url, settings=settings, durable=True) as queue:
        for _ in range(2):  # the call, then the caller's retry with the same id
            with pytest.raises(NotDurableError) as refused:
                queue.schedule_now({"order": 7}, id="order-7")
            assert refused.value.task_ids == ("order-7",)
            message = str(refused.value)
            assert "task order-7 may be stored, and runs if it is" in message
            assert "schedule it again with the same id, never a new one" in message
        assert queue.stats().ready == 1

        async def work() -> None:
            worker = duetime.Worker(duetime.App(default=handler), queue_name, redis_url)
            async with running(worker):
                await wait_until(lambda: ran == ["order-7"], what="the task to run")

        asyncio.run(work())
    assert ran == ["order-7"]
