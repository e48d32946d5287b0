"""A busy queue's slot moved to another master while its dispatcher and worker run (the
way `redis-cli --cluster reshard` moves it: IMPORTING/MIGRATING, MIGRATE in batches,
then SETSLOT NODE): redis-py follows ASK and MOVED, blocking commands are re-issued, the
scripts are loaded on the new owner, and no task is lost or started early."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from redis.crc import key_slot

from duetime import App, Dispatcher, Job, Queue, Worker, current_task
from duetime.cli import EXIT_OK, EXIT_UNAVAILABLE, main
from duetime.errors import RedisUnavailableError
from tests.conftest import require_binary
from tests.helpers import FAST, running, wait_until, wait_until_sync
from tests.servers import Cluster, Server, command, free_port

QUEUE = "qa"  # on master 0 of a 3-master test cluster


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    instance = Cluster("redis", require_binary("redis"))
    instance.start()
    yield instance
    instance.stop()


def node_id(node: Server) -> str:
    client = node.client()
    try:
        return str(command(client, "CLUSTER", "MYID").decode())
    finally:
        client.close()


def move_slot(cluster: Cluster, slot: int, source: Server, target: Server) -> int:
    """Move ``slot`` from ``source`` to ``target`` as a resharding tool does; returns the
    number of keys moved."""
    moved = migrate_keys(slot, source, target, between_batches=0.05)
    target_id = node_id(target)
    for node in cluster.nodes:
        client = node.client()
        command(client, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        client.close()
    return moved


def migrate_keys(slot: int, source: Server, target: Server, between_batches: float = 0.0) -> int:
    """Open ``slot`` from ``source`` to ``target`` (IMPORTING/MIGRATING) and MIGRATE its
    keys, leaving it open (not yet assigned); returns the number of keys moved."""
    source_id, target_id = node_id(source), node_id(target)
    src, dst = source.client(), target.client()
    moved = 0
    try:
        command(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        command(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        while keys := command(src, "CLUSTER", "GETKEYSINSLOT", slot, 10):
            command(src, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
            time.sleep(between_batches)  # with the daemons working in between
    finally:
        src.close()
        dst.close()
    return moved


def test_a_busy_queue_survives_its_slot_moving_to_another_master(cluster: Cluster) -> None:
    slot = key_slot(QUEUE.encode())
    source, target = cluster.node_of_slot(slot), cluster.nodes[1]
    assert source is not target
    count = 200
    starts: dict[str, list[tuple[int, float, float]]] = {}

    def handler(data: dict[str, int]) -> None:
        context = current_task()
        starts.setdefault(context.id, []).append((context.attempt, time.time(), context.run_at))

    with Queue(QUEUE, cluster.url, settings=FAST) as queue:
        begin = time.time() + 0.5
        ids = queue.schedule_many(
            [Job({"n": n}, at=begin + 3.0 * n / count, id=f"t{n}") for n in range(count)]
        )
        moved: dict[str, Any] = {}

        async def scenario() -> None:
            worker = Worker(App(default=handler), QUEUE, cluster.url, settings=FAST)
            async with running(Dispatcher(QUEUE, cluster.url, settings=FAST), worker):
                await wait_until(lambda: len(starts) > 20, what="work under way")
                moved["keys"] = await asyncio.to_thread(move_slot, cluster, slot, source, target)
                await wait_until(lambda: len(starts) == count, timeout=30, what="every task")

        asyncio.run(scenario())
        assert sorted(starts) == sorted(ids)  # none lost
        early = [task for task, runs in starts.items() for _, at, due in runs if at < due]
        assert early == []
        assert moved["keys"] > 0
        assert queue.check() == []
        assert queue.stats().counters.get("completed") == count
    owner = redis.Redis(port=target.port)
    try:
        assert command(owner, "CLUSTER", "COUNTKEYSINSLOT", slot) > 0  # the queue moved
    finally:
        owner.close()


def test_a_slot_between_its_keys_moving_and_its_owner_changing_is_a_pause_not_a_refusal(
    cluster: Cluster,
) -> None:
    """With the keys migrated but SETSLOT NODE not yet sent (a resharding tool moving a
    big slot in batches has such windows), redis-py runs out of redirections. That is
    a passing state: the caller is told to try again (RedisUnavailableError, which the
    worker retries within the lease), never that the command was refused, which made a
    worker drop a finished attempt's ack and run the task twice."""
    slot = key_slot(QUEUE.encode())
    source, target = cluster.node_of_slot(slot), cluster.nodes[1]
    with Queue(QUEUE, cluster.url) as queue:
        queue.schedule_in(60, {"n": 0})
        migrate_keys(slot, source, target)
        with pytest.raises(RedisUnavailableError, match="moving slots or failing over"):
            queue.schedule_in(60, {"n": 1})
        for node in cluster.nodes:
            client = node.client()
            command(client, "CLUSTER", "SETSLOT", slot, "NODE", node_id(target))
            client.close()
        queue.schedule_in(60, {"n": 2})
        assert queue.stats().scheduled == 2 and queue.check() == []


def add_empty_master(cluster: Cluster) -> Server:
    """A new master that owns no slot yet, joined as `redis-cli --cluster add-node` does."""
    bus = free_port()
    node = Server(
        cluster.kind, cluster.executable,
        extra=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
               "--cluster-node-timeout", "2000", "--cluster-port", str(bus)],
    )  # fmt: skip
    node.start()
    cluster.replica_nodes.append(node)  # so that the fixture stops it
    first = cluster.nodes[0].client()
    command(first, "CLUSTER", "MEET", "127.0.0.1", node.port, bus)
    first.close()
    new_id = node_id(node)

    def known_everywhere() -> bool:
        for member in cluster.nodes:
            client = member.client()
            nodes = command(client, "CLUSTER", "NODES").decode()
            client.close()
            if new_id not in nodes:
                return False
        client = node.client()
        state = command(client, "CLUSTER", "INFO").decode()
        client.close()
        return "cluster_state:ok" in state  # it has learned who serves every slot

    wait_until_sync(known_everywhere, what="the new master known to the cluster")
    return node


def test_a_slot_moving_to_a_new_empty_master_is_a_pause_not_a_crash(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """While a queue's slot migrates to a master that owns no slot yet, redis-py follows
    ASK to a node it does not know (it used to fail with AttributeError): reads, the CLI
    and a worker see at most RedisUnavailableError, which they retry or report as
    unavailable."""
    caplog.set_level(logging.DEBUG, logger="duetime")
    slot = key_slot(QUEUE.encode())
    source = cluster.node_of_slot(slot)
    with Queue(QUEUE, cluster.url) as queue:
        queue.schedule_many([(0, {"n": n}) for n in range(5)])
        queue.schedule_in(3600, {"n": 5})
        queue.stats()  # the client has learned the slots (without the new master)
        target = add_empty_master(cluster)
        migrate_keys(slot, source, target)
        for read in (queue.stats, queue.check, lambda: queue.tasks("scheduled")):
            try:
                read()
            except RedisUnavailableError as error:
                assert "moving slots" in str(error)
        inspected = CliRunner().invoke(main, ["inspect", "-q", QUEUE, "--redis", cluster.url])
        assert inspected.exit_code in (EXIT_OK, EXIT_UNAVAILABLE), inspected.output

        app = App()
        done: list[int] = []

        @app.default
        def record(data: dict[str, int]) -> None:
            done.append(data["n"])

        async def scenario() -> None:
            worker = Worker(app, QUEUE, cluster.url, settings=FAST)
            async with running(worker):
                # The worker meets the open slot first: it waits, it does not crash.
                await wait_until(
                    lambda: "moving slots" in caplog.text, what="the worker meeting the move"
                )
                for node in cluster.nodes:
                    client = node.client()
                    command(client, "CLUSTER", "SETSLOT", slot, "NODE", node_id(target))
                    client.close()
                client = target.client()
                command(client, "CLUSTER", "SETSLOT", slot, "NODE", node_id(target))
                client.close()
                await wait_until(lambda: sorted(done) == list(range(5)), what="5 tasks run")
                assert worker.counters.fenced == 0

        asyncio.run(scenario())
        assert queue.stats().scheduled == 1 and queue.check() == []
