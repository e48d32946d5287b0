"""Daemons never die or stall silently: supervised loops, poison cron records, an event
loop that is never blocked, redis-py errors translated, and the states and counters a
user reads (results of tasks that die unrun, finished tasks, reaped workers)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from duetime import App, Dispatcher, Queue, Settings, Worker, codec
from duetime.cli import EXIT_DAEMON_FAILED, EXIT_NOT_FOUND
from duetime.dispatcher import QueueDispatcher
from duetime.errors import (
    DaemonFailedError,
    RedisOutOfMemoryError,
    RedisUnavailableError,
    TaskFailedError,
    TaskStateError,
)
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operations import QueueOperations
from duetime.store.plans.working import WorkerPlans
from duetime.store.redis.runner import AsyncRunner
from duetime.supervisor import MAX_CRASHES
from tests.helpers import FAST, running, scheduled_score, wait_until
from tests.servers import Server, binary


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


# --- supervised loops ----------------------------------------------------------------


def test_an_unexpected_error_in_the_claimer_is_logged_and_the_claimer_restarts(
    redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    real_claim = WorkerPlans.claim
    calls = {"claim": 0}

    def claim_failing_once(self: WorkerPlans, *args: Any, **kwargs: Any) -> Any:
        calls["claim"] += 1
        if calls["claim"] == 1:
            raise ValueError("injected once")
        return real_claim(self, *args, **kwargs)

    monkeypatch.setattr(WorkerPlans, "claim", claim_failing_once)
    done: list[object] = []
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_now({"n": 1})
        worker = Worker(App(default=done.append), queue_name, redis_url, settings=FAST)

        async def scenario() -> None:
            async with running(worker):
                await wait_until(lambda: len(done) == 1, what="the task, after the restart")

        with caplog.at_level(logging.ERROR, logger="duetime"):
            run(scenario())
        assert queue.check() == []
    assert worker.supervisor.crashes == 1
    [record] = [r for r in caplog.records if "claimer failed unexpectedly" in r.getMessage()]
    assert record.exc_info is not None and "injected once" in str(record.exc_info[1])


def test_a_claimer_that_keeps_failing_stops_the_worker_which_deregisters(
    redis_url: str, raw: redis.Redis, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def claim_always_failing(self: WorkerPlans, *args: Any, **kwargs: Any) -> Any:
        raise ValueError("always broken")

    monkeypatch.setattr(WorkerPlans, "claim", claim_always_failing)
    worker = Worker(App(default=print), queue_name, redis_url, settings=FAST)

    async def scenario() -> None:
        await asyncio.wait_for(worker.run(), timeout=30)

    with pytest.raises(DaemonFailedError, match="claimer failed"):
        run(scenario())
    assert worker.supervisor.crashes == MAX_CRASHES + 1
    # It does not go on heartbeating while not working: it is gone from the registry.
    assert raw.zcard(QueueKeys(queue_name).workers) == 0


def test_a_dispatcher_loop_that_fails_once_restarts_and_one_that_keeps_failing_stops(
    redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_step = QueueDispatcher.step
    failures = {"left": 1}

    async def step_failing(self: QueueDispatcher) -> int | None:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise RuntimeError("injected step failure")
        return await real_step(self)

    monkeypatch.setattr(QueueDispatcher, "step", step_failing)
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_in(0.2, {"n": 1})
        dispatcher = Dispatcher(queue_name, redis_url, settings=FAST)

        async def promoted() -> None:
            async with running(dispatcher):
                await wait_until(lambda: queue.stats().ready == 1, what="the promotion")

        run(promoted())
        assert dispatcher.supervisor.crashes == 1

        failures["left"] = 10**6
        failing = Dispatcher(queue_name, redis_url, settings=FAST)
        with pytest.raises(DaemonFailedError, match=f"queue {queue_name} failed"):
            run(asyncio.wait_for(failing.run(), timeout=30))


def test_a_worker_process_that_cannot_work_exits_6_and_deregisters(
    raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    process = subprocess.run(
        [sys.executable, "-m", "duetime", "run", "tests.apps_failing:app", "-q", queue_name],
        env={**os.environ, "DUETIME_REDIS_URL": redis_url, "DUETIME_SHUTDOWN_GRACE": "1"},
        capture_output=True,
        timeout=60,
    )
    stderr = process.stderr.decode()
    assert process.returncode == EXIT_DAEMON_FAILED, stderr
    assert "claim is broken in this process" in stderr  # the traceback was logged
    assert "giving up" in stderr
    assert raw.zcard(QueueKeys(queue_name).workers) == 0


FROZEN_AFTER_START = """
import asyncio, gc, sys, time
import duetime

async def main(url, queue, freeze):
    settings = duetime.Settings(freeze_startup_objects=freeze)
    worker = duetime.Worker(duetime.App(), queue, url, settings=settings)
    running = asyncio.create_task(worker.run())
    async with duetime.AsyncQueue(queue, url) as client:
        while not (await client.stats()).workers:  # registered: started
            await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    print(gc.get_freeze_count())
    worker.stop()
    await running

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] == "freeze"))
"""


@pytest.mark.parametrize("freeze", [True, False])
def test_a_started_daemon_freezes_the_objects_it_started_with_unless_told_not_to(
    redis_url: str, queue_name: str, freeze: bool
) -> None:
    """Their full collections stopped the event loop 10-20 ms (bench_core punctuality)."""
    process = subprocess.run(
        [sys.executable, "-c", FROZEN_AFTER_START, redis_url, queue_name,
         "freeze" if freeze else "leave"],
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert process.returncode == 0, process.stderr.decode()
    frozen = int(process.stdout.split()[-1])
    assert (frozen > 10_000) if freeze else (frozen == 0)


# --- poison cron records ---------------------------------------------------------------


def test_a_cron_definition_this_host_cannot_use_is_paused_and_reported_alone(
    redis_url: str, raw: redis.Redis, queue_name: str, caplog: Any
) -> None:
    keys = QueueKeys(queue_name)
    other = f"{queue_name}-b"
    done: list[object] = []
    with Queue(queue_name, redis_url) as queue, Queue(other, redis_url) as second:
        queue.add_cron("healthy", "* * * * * *", {"job": "healthy"})  # every second
        # A definition as another host (or a newer version) may have written it: a zone
        # missing from this host's tz database.
        far = codec.pack(
            [1, "far", "* * * * * *", {}, "Mars/Olympus_Mons", "", "skip", "allow", 5, 300_000]
        )
        raw.hset(keys.cron, "far", far)
        raw.zadd(keys.cron_next, {"far": 0})  # due since long ago
        second.schedule_in(0.3, {"queue": "b"})
        workers = [
            Worker(App(default=done.append), q, redis_url, settings=FAST)
            for q in (queue_name, other)
        ]

        async def scenario() -> None:
            async with running(Dispatcher([queue_name, other], redis_url, settings=FAST), *workers):
                await wait_until(
                    lambda: {"job": "healthy"} in done and {"queue": "b"} in done,
                    what="the healthy job and the other queue served",
                )
                await asyncio.sleep(1.2)  # more passes: the poison record is logged once

        with caplog.at_level(logging.ERROR, logger="duetime"):
            run(scenario())
        assert raw.zscore(keys.cron_next, "far") is None  # paused
        logged = [r for r in caplog.records if "'far' paused" in r.getMessage()]
        assert len(logged) == 1 and "tz database" in logged[0].getMessage()
        assert [(v.kind, v.subject) for v in queue.check()] == [("poison cron", "far")]
        listed = {job.name: job for job in queue.list_cron()}
        assert listed["far"].paused and "tz database" in (listed["far"].problem or "")
        assert listed["healthy"].problem is None and not listed["healthy"].paused


# --- the event loop is never blocked ---------------------------------------------------


def test_the_dispatcher_never_blocks_its_event_loop(
    redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`duetime run` shares one loop between dispatcher and worker: a blocking sleep in
    the dispatcher would stall running handlers. No time.sleep on the loop's thread."""
    loop_thread = threading.get_ident()
    blocked: list[float] = []
    real_sleep = time.sleep

    def watched_sleep(seconds: float) -> None:
        if threading.get_ident() == loop_thread:
            blocked.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", watched_sleep)
    with Queue(queue_name, redis_url) as queue:
        for i in range(20):
            queue.schedule_in(0.05 + i * 0.02, {"n": i})

        async def scenario() -> None:
            async with running(Dispatcher(queue_name, redis_url, settings=FAST)):
                await wait_until(lambda: queue.stats().ready == 20, what="all promoted")

        run(scenario())
    assert blocked == []


# --- redis-py errors are translated ----------------------------------------------------


@pytest.fixture
def not_redis() -> Iterator[str]:
    """A TCP server that answers every request with a line that is not RESP."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(2)
                try:
                    while connection.recv(65536):
                        connection.sendall(b"hello, this is not redis\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    stop.set()
    thread.join(5)
    listener.close()


def test_a_reply_that_is_not_the_redis_protocol_is_a_duetime_error(not_redis: str) -> None:
    with (
        Queue("q", not_redis) as queue,
        pytest.raises(RedisUnavailableError, match="not the Redis protocol"),
    ):
        queue.stats()


# --- results and states ------------------------------------------------------------------


@pytest.mark.parametrize("result_ttl", [None, 60])
def test_result_raises_task_failed_for_a_task_that_dies_unrun(
    redis_url: str, raw: redis.Redis, queue_name: str, result_ttl: float | None
) -> None:
    keys = QueueKeys(queue_name)
    outcome: dict[str, BaseException | None] = {}
    with Queue(queue_name, redis_url) as queue:
        unknown = queue.schedule_in(
            0.5, {"n": 1}, task="nobody_registered_this", result_ttl=result_ttl
        )
        raw.hset(keys.tasks, "garbled", b"\xc1 not msgpack")
        raw.rpush(keys.ready, "garbled")

        def wait_forever() -> None:  # timeout=None: must end once the task is dead
            try:
                queue.result(unknown, timeout=None)
                outcome["unknown"] = None
            except BaseException as error:
                outcome["unknown"] = error

        waiter = threading.Thread(target=wait_forever, daemon=True)
        if result_ttl is None:  # nothing will be kept on success: no wait is offered
            with pytest.raises(TaskStateError, match="without result_ttl"):
                queue.result(unknown, timeout=None)
        else:
            waiter.start()

        async def scenario() -> None:
            worker = Worker(App(default=print), queue_name, redis_url, settings=FAST)
            async with running(Dispatcher(queue_name, redis_url, settings=FAST), worker):
                await wait_until(lambda: queue.stats().dead == 2, what="both dead")

        run(scenario())
        if result_ttl is not None:
            waiter.join(10)
            assert isinstance(outcome.get("unknown"), TaskFailedError)
            assert "nobody_registered_this" in str(outcome["unknown"])
        # Once dead, every task says why, whether or not it kept a result.
        with pytest.raises(TaskFailedError, match="nobody_registered_this"):
            queue.result(unknown, timeout=None)
        with pytest.raises(TaskFailedError, match="not a valid msgpack"):
            queue.result("garbled", timeout=1)


def test_status_of_a_finished_task_says_how_it_finished_and_a_forgotten_one_says_so(
    redis_url: str, queue_name: str
) -> None:
    calls: list[int] = []

    def flaky(data: object) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("first attempt fails")
        return "done"

    with Queue(queue_name, redis_url) as queue:
        kept = queue.schedule_now({"n": 1}, result_ttl=60)
        forgotten = queue.schedule_now({"n": 2}, task="quiet")
        app = App(default=flaky)
        app.task(lambda data: None, name="quiet")

        async def scenario() -> None:
            worker = Worker(app, queue_name, redis_url, settings=FAST)
            async with running(Dispatcher(queue_name, redis_url, settings=FAST), worker):
                await wait_until(lambda: queue.stats().counters.get("completed") == 2, what="both")

        run(scenario())
        status = queue.status(kept)
        assert status is not None
        assert (status.state, status.attempts, status.succeeded, status.result) == (
            "finished", 2, True, "done",
        )  # fmt: skip
        assert status.finished_at is not None
        assert queue.status(forgotten) is None
        message = str(queue.core.inspection.not_found(forgotten))
        assert "never existed" in message and "kept no result" in message


# --- counters count events, not observers ----------------------------------------------


def test_a_reaped_worker_is_counted_once_however_many_dispatchers_reap_it(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_now({"n": 1})
    raw.lmove(keys.ready, keys.active("ghost"), "LEFT", "RIGHT")
    raw.zadd(keys.workers, {"ghost": 1})  # last heard of in 1970

    async def four_dispatchers_reap() -> list[int]:
        runner = AsyncRunner(redis_url, Settings())
        try:
            operations = QueueOperations(keys, Queue(queue_name, redis_url).core.queue.clock)
            return [
                await runner.run(operations.dispatcher.reap_dead_workers(5000, 3000))
                for _ in range(4)
            ]
        finally:
            await runner.close()

    assert run(four_dispatchers_reap()) == [1, 0, 0, 0]
    counters = raw.hgetall(keys.stats)
    assert (counters[b"reaped_workers"], counters[b"reaped_tasks"]) == (b"1", b"1")
    assert scheduled_score(raw, keys, task_id) is not None


def test_a_starting_worker_clears_workers_that_were_killed_long_ago(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    raw.zadd(keys.workers, {"killed-yesterday": 1})
    worker = Worker(App(default=print), queue_name, redis_url, settings=FAST)

    async def start_and_stop() -> None:
        async with running(worker):
            await wait_until(lambda: raw.zscore(keys.workers, "killed-yesterday") is None)

    run(start_and_stop())  # no dispatcher ran
    assert raw.zcard(keys.workers) == 0


# --- a full server -----------------------------------------------------------------------


@pytest.fixture
def full_server(server: Server) -> Iterator[Server]:
    """A throwaway server of the same kind, filled up to its maxmemory."""
    executable = binary(server.kind)
    assert executable is not None
    instance = Server(server.kind, executable, extra=["--maxmemory", "4mb"])
    instance.start()
    client = instance.client()
    try:
        filler = "x" * 1000
        for start in range(0, 100_000, 500):
            pipe = client.pipeline(transaction=False)
            for i in range(start, start + 500):
                pipe.set(f"filler:{i}", filler)
            pipe.execute()
    except redis.exceptions.OutOfMemoryError:
        pass
    else:
        raise AssertionError("the server never reported being out of memory")
    finally:
        client.close()
    yield instance
    instance.stop()


def test_inspect_and_check_work_on_a_full_server_and_writes_say_why_they_fail(
    full_server: Server, queue_name: str
) -> None:
    with Queue(queue_name, full_server.url) as queue:
        assert queue.stats().scheduled == 0
        assert queue.check() == []
        with pytest.raises(RedisOutOfMemoryError, match=r"out of memory.*maxmemory"):
            queue.schedule_in(60, {"n": 1})
    inspect = subprocess.run(
        [sys.executable, "-m", "duetime", "inspect", "--check", "-q", queue_name,
         "--redis", full_server.url],
        capture_output=True, timeout=60,
    )  # fmt: skip
    # Its reads work: nothing was ever scheduled on this queue, and inspect says so.
    assert inspect.returncode == EXIT_NOT_FOUND, inspect.stderr.decode()
    assert f"no queue {queue_name!r} on this server".encode() in inspect.stderr
    cli_schedule = subprocess.run(
        [sys.executable, "-m", "duetime", "schedule", "--create", "-q", queue_name, "--in", "5",
         "{}", "--redis", full_server.url],
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert cli_schedule.returncode == 5
    assert b"out of memory" in cli_schedule.stderr
