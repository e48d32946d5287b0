"""durable_fsync: durable mode that also waits for the append-only file (WAITAOF), on
real Valkey servers (a master and replicas started here). A server that cannot confirm
fsyncs (no WAITAOF, as Redis 7.0; appendonly off) is refused before anything is
written; one that stops confirming afterwards makes the call raise NotDurableError."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from duetime import App, Dispatcher, Queue, Worker
from duetime.errors import ConfigurationError, NotDurableError
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.layout import QueueLayout
from tests.conftest import require_binary
from tests.helpers import FAST, decoded, running, wait_until, wait_until_sync
from tests.servers import Server, command

AOF = ["--appendonly", "yes", "--appendfsync", "always"]
FSYNC = FAST.replace(durable_fsync=True, durable_timeout=2.0)


@dataclass
class Replicated:
    master: Server
    replica: Server


def start(kind: str, *extra: str) -> Server:
    server = Server(kind, require_binary(kind), list(extra))
    server.start()
    return server


@pytest.fixture
def replicated(request: pytest.FixtureRequest) -> Iterator[Replicated]:
    """A Valkey master with AOF and one replica; the replica's AOF is the param."""
    master = start("valkey", *AOF, "--repl-diskless-sync-delay", "0")
    replica_aof = AOF if request.param else []
    replica = start("valkey", "--replicaof", "127.0.0.1", str(master.port), *replica_aof)
    try:
        client = replica.client()
        online = lambda: client.info("replication")["master_link_status"] == "up"  # noqa: E731
        wait_until_sync(online, what="the replica")
        client.close()
        yield Replicated(master, replica)
    finally:
        replica.stop()
        master.stop()


@pytest.mark.parametrize("replicated", [True], indirect=True)
def test_a_write_returns_once_master_and_replica_wrote_it_to_disk(replicated: Replicated) -> None:
    settings = FSYNC.replace(durable_replicas=1)
    with Queue("orders", replicated.master.url, settings=settings, shards=3) as queue:
        one = queue.schedule_in(3600, {"n": 1})
        many = queue.schedule_many([(time.time() + 3600, {"n": n}) for n in range(30)])
    replica = replicated.replica.client()
    shards = QueueLayout("orders", 3).shards
    on_replica = {task_id for keys in shards for task_id in decoded(replica.hkeys(keys.tasks))}
    assert on_replica == {one, *many}
    fsynced = replica.info("persistence")
    assert fsynced["aof_enabled"] == 1


@pytest.mark.parametrize("replicated", [False], indirect=True)
def test_a_replica_without_aof_never_confirms_an_fsync(replicated: Replicated) -> None:
    """WAIT counts that replica, WAITAOF does not: the fsync mode says so and names the
    task, which is on the master as the error says."""
    received = FAST.replace(durable_replicas=1, durable_timeout=0.3)
    with Queue("orders", replicated.master.url, settings=received) as queue:
        queue.schedule_in(3600, {"n": "received"})
    with (
        Queue("orders", replicated.master.url, settings=received.replace(durable_fsync=True)) as q,
        pytest.raises(NotDurableError, match=r"0 of 1 replica.*append-only file") as refused,
    ):
        q.schedule_in(3600, {"n": "on disk"}, id="told")
    assert refused.value.task_ids == ("told",)
    master = replicated.master.client()
    assert master.hexists(QueueKeys("orders").tasks, "told")


def test_the_master_alone_fsyncs_without_replicas() -> None:
    master = start("valkey", *AOF)
    try:
        with Queue("orders", master.url, settings=FSYNC) as queue:
            task_id = queue.schedule_in(3600, {"n": 1})
            assert queue.status(task_id) is not None
    finally:
        master.stop()


@pytest.mark.parametrize(
    ("kind", "extra", "reason"),
    [
        ("valkey", [], "appendonly is disabled"),
        ("redis", AOF, "unknown command 'WAITAOF'"),
    ],
    ids=["valkey-without-aof", "redis-7.0"],
)
def test_a_server_that_cannot_confirm_fsyncs_is_refused_before_any_write(
    kind: str, extra: list[str], reason: str
) -> None:
    server = start(kind, *extra)
    if kind == "redis" and int(server.client().info("server")["redis_version"][0]) >= 8:
        server.stop()
        pytest.skip("this redis-server has WAITAOF")
    try:
        with Queue("orders", server.url, settings=FSYNC) as queue:
            with pytest.raises(ConfigurationError, match=rf"durable_fsync.*{reason}.*7\.2"):
                queue.schedule_in(3600, {"n": 1})
            with pytest.raises(ConfigurationError, match="durable_fsync"):
                queue.schedule_many([(time.time(), {"n": n}) for n in range(5)])
        assert server.client().dbsize() == 0  # nothing half-written
        worker = Worker(App(default=print), "orders", server.url, settings=FSYNC)
        with pytest.raises(ConfigurationError, match="durable_fsync"):
            asyncio.run(worker.run())
        assert server.client().dbsize() == 0  # the worker did not even register
    finally:
        server.stop()


def test_a_master_that_stops_fsyncing_makes_the_call_raise() -> None:
    """appendonly turned off after the first check: the write lands, WAITAOF is
    refused, and the caller hears that it may or may not survive."""
    master = start("valkey", *AOF)
    try:
        with Queue("orders", master.url, settings=FSYNC) as queue:
            queue.schedule_in(3600, {"n": 1})
            command(master.client(), "CONFIG", "SET", "appendonly", "no")
            refusal = r"refused to confirm.*WAITAOF.*appendonly"
            with pytest.raises(NotDurableError, match=refusal) as refused:
                queue.schedule_in(3600, {"n": 2}, id="after")
            assert refused.value.task_ids == ("after",)
        assert master.client().hexists(QueueKeys("orders").tasks, "after")
    finally:
        master.stop()


def test_a_worker_acks_with_fsync_confirmed() -> None:
    """A worker in fsync mode acks through WAITAOF: every task finishes once."""
    master = start("valkey", *AOF)
    done: list[int] = []
    app = App(default=lambda data: done.append(data["n"]))
    try:
        with Queue("orders", master.url, settings=FAST) as queue:
            for n in range(5):
                queue.schedule_now({"n": n})

            async def scenario() -> None:
                worker = Worker(app, "orders", master.url, settings=FSYNC)
                async with running(Dispatcher("orders", master.url, settings=FAST), worker):
                    await wait_until(
                        lambda: len(done) == 5 and queue.stats().running == 0, what="acks"
                    )

            asyncio.run(scenario())
            assert sorted(done) == list(range(5))
            assert queue.stats().counters.get("completed") == 5
        # The start-up check is one WAITAOF; the acks made the others.
        waits = master.client().info("commandstats")["cmdstat_waitaof"]["calls"]
        assert waits >= 2
    finally:
        master.stop()
