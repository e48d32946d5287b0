"""The command line against hostile state: unreadable records in Redis, and server errors
whose text looks like a URL with a password (issue #29, points 10 and 12)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner

from duetime import AsyncQueue, Queue
from duetime.cli import EXIT_ERROR, main
from duetime.client import TaskStatus
from duetime.store.plans.keys import QueueKeys
from tests.servers import Server, command


@pytest.fixture
def cli(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
    return CliRunner()


def _dead_task(raw: redis.Redis, redis_url: str, queue_name: str) -> str:
    """A task put in the dead set the way fail_task leaves it."""
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_now({"n": 1})
    raw.lrem(keys.ready, 1, task_id)
    raw.zadd(keys.dead, {task_id: 1_795_000_000_000})
    return task_id


def test_dead_show_names_an_unreadable_error_record(
    cli: CliRunner, raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    task_id = _dead_task(raw, redis_url, queue_name)
    raw.hset(QueueKeys(queue_name).errors, task_id, b"\xc1 not msgpack")
    listed = cli.invoke(main, ["dead", "list", "-q", queue_name, "--json"])
    assert [entry["id"] for entry in json.loads(listed.stdout)] == [task_id]
    shown = cli.invoke(main, ["dead", "show", "-q", queue_name, task_id])
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.stdout)
    assert (report["id"], report["state"], report["data"]) == (task_id, "dead", {"n": 1})
    assert "error record unreadable" in report["problem"]
    with Queue(queue_name, redis_url) as queue:
        status = queue.status(task_id)
    assert status is not None and status.problem is not None
    assert "error record unreadable" in status.problem

    async def read_async() -> TaskStatus | None:  # the dashboard's path
        async with AsyncQueue(queue_name, redis_url) as queue:
            return await queue.status(task_id)

    from_async = asyncio.run(read_async())
    assert from_async is not None and from_async.problem == status.problem


def test_dead_show_names_an_unreadable_envelope(
    cli: CliRunner, raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    task_id = _dead_task(raw, redis_url, queue_name)
    raw.hset(QueueKeys(queue_name).tasks, task_id, b"\xc1 not an envelope")
    shown = cli.invoke(main, ["dead", "show", "-q", queue_name, task_id])
    assert shown.exit_code == 0, shown.output
    report = json.loads(shown.stdout)
    assert (report["id"], report["state"]) == (task_id, "dead")
    assert "envelope is unreadable" in report["problem"]


@pytest.fixture
def replica(server: Server, redis_url: str) -> Iterator[Server]:
    """A read-only replica of the throwaway server, in sync with it."""
    follower = Server(server.kind, server.executable)
    follower.start()
    client = follower.client()
    try:
        command(client, "REPLICAOF", "127.0.0.1", str(server.port))
        deadline = time.monotonic() + 20
        while client.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.02)
        yield follower
    finally:
        client.close()
        follower.stop()


def test_a_readonly_replica_error_reaches_the_user_whole(replica: Server, queue_name: str) -> None:
    url = f"redis://127.0.0.1:{replica.port}"  # no /db: nothing stops a greedy mask
    result = CliRunner().invoke(
        main, ["schedule", "--create", "-q", queue_name, "--in", "60", "--redis", url, "{}"]
    )
    assert result.exit_code == EXIT_ERROR, result.output
    printed = " ".join(result.output.split())  # click wraps long lines
    assert "You can't write against a read only replica" in printed, printed
    assert "***" not in printed and "on @user_script" in printed, printed


def test_a_password_in_a_url_inside_a_message_is_still_masked() -> None:
    from duetime.store.redis.connections import mask_urls_in

    message = (
        "Redis at redis://admin:hunter2@10.0.0.1:6379/0 refused a command: READONLY You "
        "can't write against a read only replica. script: abc, on @user_script:120."
    )
    masked = mask_urls_in(message)
    assert "hunter2" not in masked and "redis://admin:***@10.0.0.1:6379/0" in masked
    assert masked.endswith("on @user_script:120.")
    query = mask_urls_in("bad rediss://h:1/0?password=s3cret&x=1 (no)")
    assert query == "bad rediss://h:1/0?password=***&x=1 (no)"
