"""Single schedule calls from many coroutines or threads on one queue object, against
a real server: fewer round trips than calls, and each caller still gets its own id,
its own error and the same guarantees as a call of its own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import pytest
import redis

from duetime import AsyncQueue, Queue, Settings
from duetime.errors import InvalidPayloadError, NotDurableError, RedisCommandError
from duetime.settings import DEFAULT_SETTINGS
from duetime.store.plans.keys import QueueKeys
from tests.helpers import decoded, scheduled_count, wait_until_sync

CALLERS = 100
CALLS_EACH = 20


def evalsha_calls(raw: redis.Redis) -> int:
    return int(raw.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def at_once(
    redis_url: str,
    queue_name: str,
    calls: Callable[[AsyncQueue], Iterable[Awaitable[str]]],
    settings: Settings = DEFAULT_SETTINGS,
    before: Callable[[], object] = lambda: None,
    warm_up: bool = True,
) -> list[Any]:
    """The outcomes (ids or errors) of ``calls`` made at once on one AsyncQueue, after a
    warm-up call (which loads the script) and ``before``."""

    async def scenario() -> list[Any]:
        queue = AsyncQueue(queue_name, redis_url, settings=settings)
        if warm_up:
            await queue.schedule_in(3600, {"warm": True}, id="warm-up")
        before()
        try:
            return await asyncio.gather(*calls(queue), return_exceptions=True)
        finally:
            await queue.close()

    return asyncio.run(scenario())


@pytest.mark.parametrize("coalesce", [True, False])
def test_many_coroutines_share_round_trips_and_each_gets_its_own_id(
    redis_url: str, raw: redis.Redis, queue_name: str, coalesce: bool
) -> None:
    keys = QueueKeys(queue_name)
    settings = Settings(coalesce_schedules=coalesce)

    async def scenario() -> list[tuple[int, int, str]]:
        queue = AsyncQueue(queue_name, redis_url, settings=settings)
        await queue.schedule_in(3600, {"warm": True})  # loads the script, samples TIME
        made: list[tuple[int, int, str]] = []

        async def caller(who: int) -> None:
            for n in range(CALLS_EACH):
                made.append((who, n, await queue.schedule_in(3600, {"who": who, "n": n})))

        await asyncio.gather(*(caller(who) for who in range(CALLERS)))
        await queue.close()
        return made

    before = evalsha_calls(raw)
    made = asyncio.run(scenario())
    round_trips = evalsha_calls(raw) - before - 1
    calls = CALLERS * CALLS_EACH
    assert len({task_id for _, _, task_id in made}) == calls
    assert scheduled_count(raw, keys) == calls + 1
    stored = raw.hmget(keys.tasks, [task_id for _, _, task_id in made[:50]])
    assert all(stored)
    with Queue(queue_name, redis_url) as queue:
        for who, n, task_id in made[::97]:  # each id holds its own caller's data
            status = queue.status(task_id)
            assert status is not None and status.data == {"who": who, "n": n}
        assert queue.check() == []
    if coalesce:
        assert round_trips < calls / 5, round_trips
    else:
        assert round_trips == calls


def test_a_bad_call_fails_alone_and_a_repeated_id_stays_idempotent(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    data: list[Any] = [{"n": n} for n in range(30)]
    data[7] = None  # empty data: refused at the door
    data[8], data[9] = {"first": True}, {"second": True}
    outcomes = at_once(
        redis_url,
        queue_name,
        lambda queue: (
            queue.schedule_in(3600, item, id="order-1" if n in (8, 9) else None)
            for n, item in enumerate(data)
        ),
    )
    assert isinstance(outcomes[7], InvalidPayloadError)
    assert outcomes[8] == outcomes[9] == "order-1"
    good = [o for i, o in enumerate(outcomes) if i not in (7, 8, 9)]
    assert all(isinstance(o, str) for o in good) and len(set(good)) == 27
    assert scheduled_count(raw, keys) == 1 + 27 + 1
    with Queue(queue_name, redis_url) as queue:
        status = queue.status("order-1")
        assert status is not None and status.data == {"first": True}


def test_a_refused_round_trip_reaches_every_caller_in_it(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)

    def break_the_queue() -> None:
        raw.delete(keys.tasks)
        raw.set(keys.tasks, "not a hash")  # every write to the queue is refused now

    outcomes = at_once(
        redis_url,
        queue_name,
        lambda queue: (queue.schedule_in(3600, {"n": n}) for n in range(20)),
        before=break_the_queue,
    )
    assert all(isinstance(outcome, RedisCommandError) for outcome in outcomes)
    assert len({id(outcome) for outcome in outcomes}) == len(outcomes)  # each its own


def test_durable_calls_that_fall_short_each_name_their_own_task(
    redis_url: str, queue_name: str
) -> None:
    # The test server has no replica: a durable write is never confirmed.
    settings = Settings(durable_replicas=1, durable_timeout=0.05)
    outcomes = at_once(
        redis_url,
        queue_name,
        lambda queue: (queue.schedule_in(3600, {"n": n}, id=f"d-{n}") for n in range(10)),
        settings,
        warm_up=False,  # it would fall short too
    )
    assert all(isinstance(outcome, NotDurableError) for outcome in outcomes)
    assert [outcome.task_ids for outcome in outcomes] == [(f"d-{n}",) for n in range(10)]


def test_many_threads_share_round_trips_on_one_queue(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    made: list[str] = []
    lock = threading.Lock()
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_in(3600, {"warm": True})
        before = evalsha_calls(raw)

        def caller(who: int) -> None:
            for n in range(100):
                task_id = queue.schedule_in(3600, {"who": who, "n": n})
                with lock:
                    made.append(task_id)

        threads = [threading.Thread(target=caller, args=(who,)) for who in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        round_trips = evalsha_calls(raw) - before
        assert len(set(made)) == 800 and scheduled_count(raw, keys) == 801
        assert round_trips <= 800  # never more than one per call; fewer when they overlap
        assert queue.check() == []


def test_a_due_task_scheduled_together_with_others_is_ready_at_once(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    ids = at_once(
        redis_url,
        queue_name,
        lambda queue: (queue.schedule_in(0 if n % 2 else 3600, {"n": n}) for n in range(40)),
    )
    ready = set(decoded(raw.lrange(keys.ready, 0, -1)))
    assert ready == {task_id for n, task_id in enumerate(ids) if n % 2}
    assert scheduled_count(raw, keys) == 21


def waits_blocked(raw: redis.Redis) -> int:
    """Clients blocked in WAIT on the server now."""
    return sum(
        1 for client in raw.client_list()
        if client.get("cmd") == "wait" and "b" in client.get("flags", "")
    )  # fmt: skip


def wait_calls(raw: redis.Redis) -> int:
    return int(raw.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


#: No replica here, so every WAIT runs its whole timeout: long enough to see them all.
UNCONFIRMED = Settings(durable_replicas=1, durable_timeout=3.0, socket_timeout=5.0)
DURABLE_CALLERS = 5


@pytest.mark.parametrize("asynchronous", [False, True], ids=["threads", "coroutines"])
def test_concurrent_durable_calls_on_one_queue_each_wait_for_their_own_confirmation_only(
    redis_url: str, raw: redis.Redis, queue_name: str, asynchronous: bool
) -> None:
    """Durable calls made at once on one Queue (threads) or AsyncQueue (coroutines), none
    confirmed: each call's WAIT is on the server at the same time as the others', so no
    call waits behind another's wait before its own (which made a call wait twice
    durable_timeout). Then each call raises its own NotDurableError, one WAIT each."""
    before = wait_calls(raw)
    outcomes: list[Any] = []

    def all_blocked_at_once() -> None:
        wait_until_sync(lambda: waits_blocked(raw) == DURABLE_CALLERS, timeout=30,
                        what="every call's WAIT on the server at once")  # fmt: skip

    if asynchronous:

        async def scenario() -> None:
            async with AsyncQueue(queue_name, redis_url, settings=UNCONFIRMED) as queue:
                calls = asyncio.gather(
                    *(queue.schedule_in(3600, {}, id=f"d-{n}") for n in range(DURABLE_CALLERS)),
                    return_exceptions=True,
                )
                await asyncio.to_thread(all_blocked_at_once)
                outcomes.extend(await calls)

        asyncio.run(scenario())
    else:
        with Queue(queue_name, redis_url, settings=UNCONFIRMED) as queue:

            def call(n: int) -> None:
                try:
                    queue.schedule_in(3600, {}, id=f"d-{n}")
                except NotDurableError as error:
                    outcomes.append(error)

            threads = [threading.Thread(target=call, args=(n,)) for n in range(DURABLE_CALLERS)]
            for thread in threads:
                thread.start()
            all_blocked_at_once()
            for thread in threads:
                thread.join()
    assert all(isinstance(outcome, NotDurableError) for outcome in outcomes)
    named = sorted(task_id for outcome in outcomes for task_id in outcome.task_ids)
    assert named == [f"d-{n}" for n in range(DURABLE_CALLERS)]
    assert wait_calls(raw) - before == DURABLE_CALLERS


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "asyncio"])
def test_a_first_durable_call_waits_once_on_a_server_without_its_script(
    redis_url: str, raw: redis.Redis, queue_name: str, asynchronous: bool
) -> None:
    """A queue object's first durable call, on a server that does not have the script
    yet: the script is loaded before the call, so the call waits for replicas once. Sent
    as it was, it was refused (NOSCRIPT) with its WAIT, which ran its whole timeout for
    nothing, then sent again with another: twice durable_timeout."""
    settings = Settings(durable_replicas=1, durable_timeout=0.05)
    raw.script_flush()
    before = wait_calls(raw)
    if asynchronous:

        async def scenario() -> None:
            async with AsyncQueue(queue_name, redis_url, settings=settings) as queue:
                with pytest.raises(NotDurableError):
                    await queue.schedule_in(3600, {}, id="first")

        asyncio.run(scenario())
    else:
        with (
            Queue(queue_name, redis_url, settings=settings) as queue,
            pytest.raises(NotDurableError),
        ):
            queue.schedule_in(3600, {}, id="first")
    assert wait_calls(raw) - before == 1
