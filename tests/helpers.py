"""Test helpers: wait on a condition with a deadline (never a bare sleep), run daemons
in the test's event loop, and read a plain client's replies as the bytes they are."""

from __future__ import annotations

import asyncio
import inspect
import io
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import redis

from duetime import App, Settings, Worker, validation
from duetime.store.plans.keys import QueueKeys

#: Settings that make retries, heartbeats, leases and shutdown quick enough for tests.
FAST = Settings(
    retry_base=0.02,
    retry_max=0.1,
    heartbeat_interval=0.1,
    worker_ttl=0.5,
    lease_duration=1.0,
    shutdown_grace=2.0,
)
#: Heartbeats 30 s apart (as ``Settings`` fields): within a test's waits, what a worker
#: hears did not come by its heartbeat.
SLOW_HEARTBEAT: dict[str, float] = {"heartbeat_interval": 30.0, "lease_duration": 90.0,
                                    "worker_ttl": 90.0}  # fmt: skip


def as_bytes(reply: object) -> bytes:
    """A reply from a plain client (decode_responses=False), which is bytes: redis-py
    annotates it ``bytes | str`` since its types cannot see that flag."""
    assert isinstance(reply, bytes), reply
    return reply


def decoded(replies: Iterable[object]) -> list[str]:
    """The members a plain client returned (LRANGE, ZRANGE...), decoded as UTF-8."""
    return [as_bytes(reply).decode() for reply in replies]


async def wait_until(
    condition: Callable[[], bool | Awaitable[bool]], timeout: float = 10.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        outcome = condition()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


def wait_until_sync(
    condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


@asynccontextmanager
async def running(*daemons: Any) -> AsyncIterator[None]:
    """Run dispatchers/workers for the body of a with-block, then stop them gracefully."""
    tasks = [asyncio.create_task(d.run()) for d in daemons]
    try:
        yield
    finally:
        for daemon in daemons:
            daemon.stop()
        _, pending = await asyncio.wait(tasks, timeout=30)
        if pending:
            stacks = io.StringIO()
            for task in asyncio.all_tasks():
                task.print_stack(limit=20, file=stacks)
            for task in pending:
                task.cancel()
            raise AssertionError(f"daemons did not stop within 30 s:\n{stacks.getvalue()}")
        done = [task.exception() for task in tasks]
        for outcome in done:
            if isinstance(outcome, BaseException):
                raise outcome


def run_with_only_a_worker(
    queue_name: str, redis_url: str, schedule: Callable[[], object], runs: int
) -> list[object]:
    """Start a worker on the queue, and no dispatcher at all; once it runs, ``schedule``
    (a call that makes tasks due now); wait until ``runs`` tasks succeeded. The data each
    ran with, in the order they ran."""
    ran: list[object] = []

    async def handler(data: object) -> None:
        ran.append(data)

    worker = Worker(App(default=handler), queue_name, redis_url, settings=FAST)

    async def scenario() -> None:
        async with running(worker):
            await wait_until(lambda: worker.counters.succeeded == 0, what="the worker")
            schedule()
            await wait_until(lambda: worker.counters.succeeded == runs, what=f"{runs} run(s)")

    asyncio.run(scenario())
    return ran


def add_ok_flaky_broken(app: App, seen: Callable[[str], None] = lambda name: None) -> Any:
    """The three tasks the hook, metrics and tracing tests run: ``ok`` (async) succeeds,
    ``flaky`` (a plain function, so it runs on the worker's threads) fails its first
    attempt only, ``broken`` (plain) always fails. ``seen(name)`` is called as ok and
    flaky start, in the attempt's own context. Returns the three, to schedule them."""
    failures = {"flaky": 1}

    @app.task
    async def ok(data: Any) -> None:
        seen("ok")

    @app.task
    def flaky(data: Any) -> None:
        seen("flaky")
        if failures["flaky"]:
            failures["flaky"] -= 1
            raise ValueError("first time fails")

    @app.task
    def broken(data: Any) -> None:
        raise RuntimeError("always")

    return ok, flaky, broken


def delayed_buckets(raw: redis.Redis, keys: QueueKeys) -> list[str]:
    """The keys of the queue's delayed buckets, as its index names them."""
    return [
        keys.delayed_bucket(as_bytes(name).decode()) for name in raw.zrange(keys.delayed, 0, -1)
    ]


def _waiting_score(
    raw: redis.Redis, keys: QueueKeys, task_id: str | bytes
) -> tuple[float, bool] | None:
    """A waiting task's score and whether it is a delayed bucket's (µs; `scheduled` keeps
    ms), or None. The buckets are read first: a running dispatcher stages tasks from
    them into `scheduled`, never the other way, so a task that moves meanwhile is
    still found."""
    for bucket in delayed_buckets(raw, keys):
        if (score := raw.zscore(bucket, task_id)) is not None:
            return float(score), True
    score = raw.zscore(keys.scheduled, task_id)
    if score is not None:
        return float(score), False
    return None


def scheduled_score(raw: redis.Redis, keys: QueueKeys, task_id: str | bytes) -> float | None:
    """A waiting task's due time in ms wherever it waits (`scheduled`, or a
    delayed bucket, which keeps µs), or None."""
    found = _waiting_score(raw, keys, task_id)
    if found is None:
        return None
    score, in_bucket = found
    return score / 1000 if in_bucket else score


def scheduled_microseconds(raw: redis.Redis, keys: QueueKeys, task_id: str | bytes) -> int | None:
    """A waiting task's due time in whole µs, as a delayed bucket keeps it (read from
    the ms of `scheduled` as the buckets would keep it), or None."""
    found = _waiting_score(raw, keys, task_id)
    if found is None:
        return None
    score, in_bucket = found
    return int(score) if in_bucket else validation.whole_microseconds(score)


def scheduled_count(raw: redis.Redis, keys: QueueKeys) -> int:
    """How many tasks wait in `scheduled` and the delayed buckets."""
    buckets = delayed_buckets(raw, keys)
    return int(raw.zcard(keys.scheduled)) + sum(int(raw.zcard(bucket)) for bucket in buckets)


def take_waiting(raw: redis.Redis, keys: QueueKeys, task_id: str) -> None:
    """Take a waiting task out of where it waits, as a fault or a test would find it gone
    from there: from `scheduled`, or from its delayed bucket, keeping the
    bucket index and the layout as the scripts keep them. Tests then put the id where
    they want it (a processing list, dead)."""
    if raw.zrem(keys.scheduled, task_id):
        return
    for bucket in delayed_buckets(raw, keys):
        if raw.zrem(bucket, task_id):
            name = bucket.removeprefix(keys.delayed_bucket(""))
            head = raw.zrange(bucket, 0, 0, withscores=True)
            if head:
                raw.zadd(keys.delayed, {name: head[0][1]})
            else:
                raw.zrem(keys.delayed, name)
            raw.hincrby(keys.delayed_layout, "tasks", -1)
            if not raw.zcard(keys.delayed):
                raw.delete(keys.delayed_layout)
            return
    raise AssertionError(f"task {task_id} is not waiting")


def subscribers(clients: Iterable[redis.Redis], channel: str) -> int:
    """How many connections listen on ``channel`` on these servers (each node of a
    cluster counts its own)."""
    return sum(int(count) for client in clients for _, count in client.pubsub_numsub(channel))
