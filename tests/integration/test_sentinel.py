"""duetime behind Sentinel, on a real master, replica and three sentinels started by the
test: a redis+sentinel:// URL and a Sentinel master_for() client work, and when the
master is killed every process follows the new master and tasks keep flowing."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis.sentinel

from duetime import App, AsyncQueue, Dispatcher, Queue, Worker, current_task
from duetime.errors import NotDurableError, RedisUnavailableError
from duetime.store.plans.keys import QueueKeys
from tests.conftest import require_binary
from tests.helpers import FAST, SLOW_HEARTBEAT, running, subscribers, wait_until, wait_until_sync
from tests.servers import SERVICE, Sentinels, command


@pytest.fixture(params=["redis", "valkey"])
def sentinels(request: pytest.FixtureRequest) -> Iterator[Sentinels]:
    group = Sentinels(request.param, require_binary(request.param))
    group.start()
    yield group
    group.stop()


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def schedule_through_a_failover(queue: Queue, data: dict[str, int], deadline: float) -> str:
    """A schedule call that retries while the master is being replaced, as a caller
    would: an unreachable master is a clean error, never a half-written task."""
    while True:
        try:
            return queue.schedule_now(data)
        except RedisUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_tasks_keep_flowing_when_the_master_is_killed(sentinels: Sentinels) -> None:
    done: list[int] = []
    assert sentinels.master is not None and sentinels.replica is not None
    with Queue("orders", sentinels.url, settings=FAST) as queue:
        before = [queue.schedule_now({"n": n}) for n in range(5)]
        # Let the replica acknowledge them, so the failover cannot lose them (without a
        # durable mode, replication is asynchronous).
        master = redis.Redis(port=sentinels.master.port)
        assert command(master, "WAIT", 1, 5000) == 1
        master.close()

        async def scenario() -> None:
            worker = Worker(App(default=lambda data: done.append(data["n"])), "orders",
                            sentinels.url, settings=FAST)  # fmt: skip
            async with running(Dispatcher("orders", sentinels.url, settings=FAST), worker):
                await wait_until(lambda: set(done) == set(range(5)), what="before")
                old_port = sentinels.master_port()
                assert sentinels.master is not None and sentinels.master.process is not None
                os.kill(sentinels.master.process.pid, signal.SIGKILL)
                await wait_until(
                    lambda: sentinels.master_port() != old_port, timeout=30, what="a failover"
                )
                deadline = time.monotonic() + 30
                for n in range(5, 10):
                    await asyncio.to_thread(schedule_through_a_failover, queue, {"n": n}, deadline)
                # At least once: an ack the old master took but had not yet replicated is
                # lost with it, so its task may run again (the lease brings it back): wait
                # for that run too, not only for the tasks to have run once.
                await wait_until(
                    lambda: (
                        set(done) == set(range(10))
                        and queue.stats().running == 0
                        and all(queue.status(task_id) is None for task_id in before)
                    ),
                    timeout=30,
                    what="every task run after the failover",
                )

        run(scenario())
        assert sentinels.master_port() == sentinels.replica.port
        assert queue.check() == []
        assert all(queue.status(task_id) is None for task_id in before)


def test_the_cancel_listener_follows_the_new_master(sentinels: Sentinels) -> None:
    """After the master is killed, the worker's cancel listener subscribes on the new
    one, and a running task's cancel stops it long before a heartbeat (30 s apart)
    could have told the worker."""
    settings = FAST.replace(**SLOW_HEARTBEAT)
    channel = QueueKeys("orders").cancel_channel
    started: list[str] = []
    stopped: list[str] = []

    async def waits(data: Any) -> None:
        started.append(current_task().id)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.append(current_task().id)
            raise

    def listeners(port: int) -> int:
        with redis.Redis(port=port) as client:
            return subscribers([client], channel)

    async def scenario() -> None:
        worker = Worker(App(default=waits), "orders", sentinels.url, settings=settings)
        async with (
            AsyncQueue("orders", sentinels.url) as queue,
            running(Dispatcher("orders", sentinels.url, settings=settings), worker),
        ):
            old_port = sentinels.master_port()
            await wait_until(lambda: listeners(old_port) == 1, what="the listener")
            assert sentinels.master is not None and sentinels.master.process is not None
            os.kill(sentinels.master.process.pid, signal.SIGKILL)
            await wait_until(lambda: sentinels.master_port() != old_port, timeout=30)
            new_port = sentinels.master_port()
            await wait_until(lambda: listeners(new_port) == 1, timeout=30, what="it on the new")
            deadline = time.monotonic() + 30
            task_id = await asyncio.to_thread(schedule_through_a_failover, producer, {}, deadline)
            await wait_until(lambda: task_id in started, timeout=30, what="it to start")
            assert await queue.cancel(task_id)
            await wait_until(lambda: stopped == [task_id], timeout=10, what="it to stop")

    with Queue("orders", sentinels.url, settings=FAST) as producer:
        run(scenario())


def test_a_sentinel_managed_client_is_accepted(sentinels: Sentinels) -> None:
    # redis-py leaves the Sentinel API unannotated.
    manager = redis.sentinel.Sentinel([("127.0.0.1", port) for port in sentinels.ports])  # type: ignore[no-untyped-call]
    client = manager.master_for(SERVICE)  # type: ignore[no-untyped-call]
    with Queue("orders", client) as queue:
        task_id = queue.schedule_in(60, {"n": 1})
        status = queue.status(task_id)
        assert status is not None and status.state == "scheduled"
        assert queue.check() == []
    client.close()


def test_durable_mode_confirms_writes_and_says_when_it_cannot(sentinels: Sentinels) -> None:
    """Without durable mode, a schedule acknowledged by the master but not yet on the
    replica is lost when the master dies; in durable mode the call returns only once the
    replica has it, and when the replica cannot confirm, the caller is told so."""
    assert sentinels.master is not None and sentinels.replica is not None
    assert sentinels.replica.process is not None and sentinels.master.process is not None
    settings = FAST.replace(durable_timeout=0.5)
    with (
        Queue("orders", sentinels.url, settings=settings, durable=True) as durable,
        Queue("orders", sentinels.url, settings=settings) as plain,
    ):
        confirmed = [durable.schedule_in(3600, {"n": n}) for n in range(20)]
        os.kill(sentinels.replica.process.pid, signal.SIGSTOP)
        # Cut the replication link: writes from now on stay on the master alone (a
        # stopped replica would still find them in its socket's buffer when resumed).
        master = redis.Redis(port=sentinels.master.port)
        command(master, "CLIENT", "KILL", "TYPE", "replica")
        master.close()
        try:
            unconfirmed = plain.schedule_in(3600, {"n": "plain"})  # acknowledged at once
            with pytest.raises(NotDurableError, match="0 of 1 replica") as refused:
                durable.schedule_in(3600, {"n": "durable"}, id="told")
            assert refused.value.task_ids == ("told",)
            old_port = sentinels.master_port()
            os.kill(sentinels.master.process.pid, signal.SIGKILL)
        finally:
            os.kill(sentinels.replica.process.pid, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while sentinels.master_port() == old_port:
            assert time.monotonic() < deadline, "no failover"
            time.sleep(0.1)
        lost = [task_id for task_id in [*confirmed, unconfirmed] if plain.status(task_id) is None]
        # Every confirmed write survived; the one acknowledged without confirmation did not.
        assert lost == [unconfirmed]


def test_a_demoted_master_answering_readonly_is_left_for_the_new_one_quietly(
    sentinels: Sentinels, caplog: pytest.LogCaptureFixture
) -> None:
    """A graceful failover (SENTINEL FAILOVER) turns the old master into a replica that
    answers READONLY: every process re-resolves the master and carries on, logging the
    outage once per loop rather than a line per retry."""
    done: list[int] = []
    settings = FAST
    with Queue("orders", sentinels.url, settings=settings) as queue:

        async def scenario() -> None:
            worker = Worker(App(default=lambda data: done.append(data["n"])), "orders",
                            sentinels.url, settings=settings)  # fmt: skip
            async with running(Dispatcher("orders", sentinels.url, settings=settings), worker):
                queue.schedule_now({"n": 0})
                await wait_until(lambda: done == [0], what="before")
                old_port = sentinels.master_port()
                manager = redis.Redis(port=sentinels.ports[0])
                command(manager, "SENTINEL", "FAILOVER", SERVICE)
                manager.close()
                await wait_until(lambda: sentinels.master_port() != old_port, timeout=30)
                deadline = time.monotonic() + 30
                for n in range(1, 6):
                    await asyncio.to_thread(schedule_through_a_failover, queue, {"n": n}, deadline)
                await wait_until(lambda: set(done) == set(range(6)), timeout=30, what="after")

        with caplog.at_level(logging.WARNING, logger="duetime"):
            run(scenario())
        assert queue.check() == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    # A few lines per loop (outage, recovery, fenced attempts), never a flood.
    assert len(warnings) < 40, warnings
    # The failover held the worker's heartbeats for longer than its 0.5 s TTL, and the
    # dispatcher's commands too: a worker silent only while held is not reaped.
    assert not [w for w in warnings if "presumed dead" in w or "reaped" in w], warnings


def produce_until(url: str, stop: threading.Event, acknowledged: list[str]) -> None:
    """Schedule as fast as one caller can until ``stop``; acknowledged ids go into
    ``acknowledged``. A refusal (a clean error) is retried, as a caller would."""
    with Queue("orders", url) as queue:
        n = 0
        while not stop.is_set():
            with contextlib.suppress(RedisUnavailableError):
                acknowledged.append(queue.schedule_in(3600, {"n": n}))
            n += 1


async def produce_until_async(url: str, stop: threading.Event, acknowledged: list[str]) -> None:
    async with AsyncQueue("orders", url) as queue:
        n = 0
        while not stop.is_set():
            with contextlib.suppress(RedisUnavailableError):
                acknowledged.append(await queue.schedule_in(3600, {"n": n}))
            n += 1


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "asyncio"])
def test_a_planned_failover_loses_no_acknowledged_schedule(
    sentinels: Sentinels, asynchronous: bool
) -> None:
    """SENTINEL FAILOVER with a producer writing all along: the old master answers as a
    master until Sentinel reconfigures it, seconds after the switch, so a client that
    goes on writing to it loses those writes once it becomes a replica. Every
    acknowledged schedule must be on the new master."""
    old_port = sentinels.master_port()
    acknowledged: list[str] = []
    stop = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        if asynchronous:
            producer = pool.submit(run, produce_until_async(sentinels.url, stop, acknowledged))
        else:
            producer = pool.submit(produce_until, sentinels.url, stop, acknowledged)
        try:
            wait_until_sync(lambda: len(acknowledged) > 200, what="writes before the failover")
            manager = redis.Redis(port=sentinels.ports[0])
            command(manager, "SENTINEL", "FAILOVER", SERVICE)
            manager.close()
            wait_until_sync(lambda: sentinels.master_port() != old_port, timeout=30, what="switch")
            # Go on writing after the switch, as a real producer does.
            switched_at = len(acknowledged)
            wait_until_sync(lambda: len(acknowledged) > switched_at + 500, timeout=30,
                            what="writes after the switch")  # fmt: skip
        finally:
            stop.set()
            producer.result()
    with Queue("orders", sentinels.url) as queue:
        lost = [task_id for task_id in acknowledged if queue.status(task_id) is None]
        assert lost == [], f"{len(lost)} of {len(acknowledged)} acknowledged schedules lost"
        assert queue.check() == []


@pytest.mark.parametrize("durable_replicas", [1, 2])
def test_durable_writes_survive_a_failover_only_when_every_replica_confirms(
    durable_replicas: int,
) -> None:
    """Two replicas, and the one Sentinel promotes is the one that lagged (the other is
    never promoted: replica-priority 0). WAIT with ``durable_replicas=1`` is satisfied by
    the replica that was not promoted, so acknowledged durable writes are lost; with
    ``durable_replicas`` equal to the number of replicas the same writes are refused
    (NotDurableError), and nothing acknowledged is lost."""
    group = Sentinels("redis", require_binary("redis"), replica_count=2,
                      replica_options={0: ["--replica-priority", "0"]})  # fmt: skip
    group.start()
    try:
        assert group.master is not None and group.master.process is not None
        lagging = group.replicas[1]  # replica 0 has priority 0: never promoted
        assert lagging.process is not None
        # Short waits: Sentinel passes over a replica whose link to the master went down
        # more than 10 down-after periods (10 s) before the master did, and the stopped
        # one's link is down from here until the master is killed. 20 refused writes wait
        # 20 durable timeouts: 10 s at 0.5 s (the failover sometimes never came), 6 s now.
        settings = FAST.replace(durable_timeout=0.3, durable_replicas=durable_replicas)
        with (
            Queue("orders", group.url, settings=settings) as durable,
            Queue("orders", group.url, settings=FAST) as plain,
        ):
            before = [durable.schedule_in(3600, {"n": n}) for n in range(5)]
            os.kill(lagging.process.pid, signal.SIGSTOP)
            master = redis.Redis(port=group.master.port)
            try:
                # Cut both links: the running replica reconnects at once, the stopped one
                # cannot (a stopped replica would find the writes in its socket later).
                command(master, "CLIENT", "KILL", "TYPE", "replica")
                wait_until_sync(
                    lambda: confirmed_by(master) == 1, timeout=20, what="one replica back"
                )
                acknowledged: list[str] = []
                refused: list[str] = []
                for n in range(5, 25):
                    try:
                        acknowledged.append(durable.schedule_in(3600, {"n": n}))
                    except NotDurableError as error:
                        refused.extend(error.task_ids)
                old_port = group.master.port
                os.kill(group.master.process.pid, signal.SIGKILL)
            finally:
                master.close()
                os.kill(lagging.process.pid, signal.SIGCONT)
            wait_until_sync(lambda: group.master_port() != old_port, timeout=40, what="a failover")
            assert group.master_port() == lagging.port
            lost = [
                task_id for task_id in [*before, *acknowledged] if plain.status(task_id) is None
            ]
            # Refused writes were stored on the old master and may be gone: never lost
            # silently, as the caller was told.
            if durable_replicas == 1:
                assert refused == [] and len(acknowledged) == 20
                assert lost == acknowledged  # confirmed by the replica that was not promoted
            else:
                assert acknowledged == [] and len(refused) == 20
                assert lost == []
    finally:
        group.stop()


def confirmed_by(master: redis.Redis) -> int:
    """How many replicas are online on ``master``."""
    info = master.info("replication")
    return sum(
        1 for key, value in info.items()
        if key.startswith("slave") and isinstance(value, dict) and value.get("state") == "online"
    )  # fmt: skip


def blocked_clients(port: int) -> int:
    with redis.Redis(port=port) as client:
        return int(client.info("clients")["blocked_clients"])


def listeners_on(port: int, channel: str) -> int:
    with redis.Redis(port=port) as client:
        return subscribers([client], channel)


def test_a_planned_failover_moves_blocked_claims_and_cancel_listening_at_once(
    sentinels: Sentinels,
) -> None:
    """A worker waits in BLMOVE (block_timeout 30 s) and listens for cancels on the
    master when SENTINEL FAILOVER replaces it. The old master goes on answering as a
    master for seconds after the switch, so a call left blocked there would wait out
    its block (or the demotion). Within a few seconds of the switch, the worker claims
    a task due then from the new master, listens there, and stops a cancelled task
    (its heartbeat is 30 s apart, so the cancel came by the new master's channel)."""
    settings = FAST.replace(block_timeout=30.0, socket_timeout=5.0, **SLOW_HEARTBEAT)
    channel = QueueKeys("orders").cancel_channel
    started: dict[str, float] = {}
    stopped: list[str] = []

    async def handler(data: Any) -> None:
        started[current_task().id] = time.monotonic()
        if data.get("wait"):
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                stopped.append(current_task().id)
                raise

    async def scenario(producer: Queue) -> None:
        worker = Worker(App(default=handler), "orders", sentinels.url, concurrency=2,
                        settings=settings)  # fmt: skip
        async with running(worker):
            old_port = sentinels.master_port()
            waiting = producer.schedule_now({"wait": True})
            await wait_until(lambda: waiting in started, what="the waiting task to start")
            await wait_until(lambda: listeners_on(old_port, channel) == 1, what="the listener")
            await wait_until(lambda: blocked_clients(old_port) >= 1, what="the claim to block")
            manager = redis.Redis(port=sentinels.ports[0])
            command(manager, "SENTINEL", "FAILOVER", SERVICE)
            manager.close()
            await wait_until(lambda: sentinels.master_port() != old_port, timeout=30)
            switched = time.monotonic()
            new_port = sentinels.master_port()
            deadline = time.monotonic() + 30
            due = await asyncio.to_thread(schedule_through_a_failover, producer, {}, deadline)
            # Well inside both the block (30 s) and the old master's demotion (about 10 s
            # after the switch, when it would unblock the call itself).
            within = 5.0 - (time.monotonic() - switched)
            await wait_until(lambda: due in started, timeout=within, what="the claim to move")
            within = 5.0 - (time.monotonic() - switched)
            await wait_until(lambda: listeners_on(new_port, channel) == 1, timeout=within,
                             what="the listener to move")  # fmt: skip
            async with AsyncQueue("orders", sentinels.url) as queue:
                assert await queue.cancel(waiting)
            await wait_until(lambda: stopped == [waiting], timeout=5, what="the cancel heard")

    with Queue("orders", sentinels.url, settings=FAST) as producer:
        run(scenario(producer))
