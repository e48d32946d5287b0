"""Choosing dead tasks by filters (duetime.client.selection) and the `duetime dead` commands
that act on them: dry runs, confirmation, JSON, batches, on a real server."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from duetime import AsyncQueue, Job, Queue
from duetime.cli import EXIT_DECLINED, EXIT_USAGE, main
from duetime.client import (
    DeadFilter,
    DeadTask,
    dead_matching,
    dead_matching_async,
    in_batches,
    select_dead,
)
from duetime.codec import ErrorRecord, encode_error
from duetime.errors import InvalidInputError
from duetime.store.plans.layout import QueueLayout
from tests.helpers import decoded

HOUR = 3600.0


@dataclass(frozen=True)
class Death:
    task: str | None
    error: str
    hours_ago: float


def dead_task(**fields: Any) -> DeadTask:
    defaults: dict[str, Any] = {"id": "a", "died_at": 1000.0, "task": "send", "data": None}
    defaults |= {"error": "ValueError: boom", "traceback": "", "attempts": 5}
    return DeadTask(**(defaults | fields))


def test_a_filter_takes_what_meets_every_criterion() -> None:
    assert DeadFilter().selects_everything and DeadFilter().matches(dead_task())
    assert DeadFilter(task="send").matches(dead_task())
    assert not DeadFilter(task="send").matches(dead_task(task="other"))
    assert DeadFilter(task="").matches(dead_task(task=""))  # the default handler
    assert DeadFilter(task="").matches(dead_task(task=None))  # no envelope left
    assert DeadFilter(error="BOOM").matches(dead_task())  # a part, in any case
    assert not DeadFilter(error="bang").matches(dead_task())
    assert DeadFilter(since=1000.0, until=1000.0).matches(dead_task())  # both included
    assert not DeadFilter(since=1000.5).matches(dead_task())
    assert not DeadFilter(until=999.5).matches(dead_task())
    assert DeadFilter(ids=frozenset({"a"})).matches(dead_task())
    assert not DeadFilter(ids=frozenset({"b"}), task="send").matches(dead_task())
    assert not DeadFilter(task="send").selects_everything
    with pytest.raises(InvalidInputError, match="since is later than until"):
        DeadFilter(since=2.0, until=1.0)


def test_in_batches_calls_the_action_once_per_batch() -> None:
    calls: list[list[str]] = []

    def action(ids: list[str]) -> int:
        calls.append(ids)
        return len(ids) - 1  # as if one of each batch was no longer dead

    done: list[int] = []
    ids = [f"t{n}" for n in range(10)]
    assert in_batches(ids, action, batch_size=4, on_batch=done.append) == 7
    assert calls == [ids[0:4], ids[4:8], ids[8:10]] and done == [4, 4, 2]
    assert in_batches([], action) == 0 and len(calls) == 3
    with pytest.raises(InvalidInputError, match="batch_size"):
        in_batches(ids, action, batch_size=0)


def kill(
    raw: redis.Redis, redis_url: str, queue_name: str, deaths: Sequence[Death], shards: int = 1
) -> list[str]:
    """Schedule one task per death and move it to the dead set as fail_task would, dead
    ``hours_ago`` with ``error``; returns the ids in the order given."""
    with Queue(queue_name, redis_url, shards=shards) as queue:
        ids = queue.schedule_many(
            [Job({"n": n}, delay=0, task=d.task) for n, d in enumerate(deaths)]
        )
    layout = QueueLayout(queue_name, shards)
    now = time.time()
    pipe = raw.pipeline()
    for task_id, death in zip(ids, deaths, strict=True):
        keys = layout.shards[layout.of_task(task_id)]
        died_ms = int((now - death.hours_ago * HOUR) * 1000)
        record = ErrorRecord(death.error, "Traceback ...", 5, died_ms, "w1")
        pipe.lrem(keys.ready, 1, task_id)
        pipe.zadd(keys.dead, {task_id: died_ms})
        pipe.hset(keys.errors, task_id, encode_error(record))
    pipe.execute()
    return ids


#: Six dead tasks, newest first: two handlers, two kinds of error, 0.5 to 5.5 hours old.
DEATHS = [
    Death("send", "TimeoutError: took too long", 0.5),
    Death(None, "ValueError: bad address", 1.5),
    Death("send", "ValueError: bad address", 2.5),
    Death("send", "timeouterror: upstream", 3.5),
    Death(None, "TimeoutError: took too long", 4.5),
    Death("report", "KeyError: 'x'", 5.5),
]


@pytest.fixture
def cli(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
    return CliRunner(env={"COLUMNS": "80"})


def dead_ids(raw: redis.Redis, queue_name: str) -> set[str]:
    return set(decoded(raw.zrange(QueueLayout(queue_name).shards[0].dead, 0, -1)))


def run(cli: CliRunner, *arguments: str, answer: str | None = None) -> Result:
    return cli.invoke(main, list(arguments), input=answer)


def test_dead_list_filters(
    cli: CliRunner, raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    ids = kill(raw, redis_url, queue_name, DEATHS)

    def listed(*filters: str) -> list[str]:
        result = run(cli, "dead", "list", "-q", queue_name, "--json", *filters)
        assert result.exit_code == 0, result.output
        return [entry["id"] for entry in json.loads(result.stdout)]

    assert listed() == ids  # most recent death first
    assert listed("--task", "send") == [ids[0], ids[2], ids[3]]
    assert listed("--task", "(default)") == [ids[1], ids[4]]
    assert listed("--error", "TIMEOUTerror") == [ids[0], ids[3], ids[4]]
    assert listed("--since", "3h") == ids[:3]
    assert listed("--until", "3h", "--task", "send") == [ids[3]]
    assert listed("--since", "4h", "--until", "2h") == [ids[2], ids[3]]
    assert listed("--error", "timeout", "--limit", "2") == [ids[0], ids[3]]
    assert listed("--task", "nobody") == []
    empty = run(cli, "dead", "list", "-q", queue_name, "--since", "1h", "--until", "2h")
    assert empty.exit_code == EXIT_USAGE and "since is later than until" in empty.output
    naive = run(cli, "dead", "list", "-q", queue_name, "--since", "2026-12-01T09:00")
    assert naive.exit_code == EXIT_USAGE and "no time zone: add one" in naive.output


def test_requeue_with_filters_takes_only_the_matching_tasks(
    cli: CliRunner, raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    ids = kill(raw, redis_url, queue_name, DEATHS)
    result = run(cli, "dead", "requeue", "-q", queue_name, "--error", "timeout", "--since", "4h")
    assert result.exit_code == 0, result.output  # a subset: no question asked
    assert result.stdout.strip() == "requeued 2"
    assert dead_ids(raw, queue_name) == set(ids) - {ids[0], ids[3]}
    ready = QueueLayout(queue_name).shards[0].ready
    assert set(decoded(raw.lrange(ready, 0, -1))) == {ids[0], ids[3]}
    assert run(cli, "inspect", "-q", queue_name, "--check").exit_code == 0


def test_a_dry_run_says_how_many_and_which_and_changes_nothing(
    cli: CliRunner, raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    ids = kill(raw, redis_url, queue_name, DEATHS)
    for verb in ("requeue", "purge"):
        shown = run(cli, "dead", verb, "-q", queue_name, "--task", "send", "--dry-run")
        assert shown.exit_code == 0, shown.output
        assert f"would {verb} 3 dead tasks in queue {queue_name}" in shown.stdout
        assert all(task_id in shown.stdout for task_id in (ids[0], ids[2], ids[3]))
        assert ids[1] not in shown.stdout
    as_json = run(cli, "dead", "purge", "-q", queue_name, "--all", "--dry-run", "--json")
    report = json.loads(as_json.stdout)
    assert (report["dry_run"], report["selected"], report["ids"]) == (True, 6, ids)
    named = run(cli, "dead", "purge", "-q", queue_name, ids[5], "nope", "--dry-run", "--json")
    assert json.loads(named.stdout)["ids"] == [ids[5]]  # only the named ids that are dead
    assert dead_ids(raw, queue_name) == set(ids)


def test_destructive_actions_ask_first_unless_yes(
    cli: CliRunner, raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    ids = kill(raw, redis_url, queue_name, DEATHS)
    # No answer (stdin is not a terminal and empty) is a no: nothing changes, exit 7.
    for arguments in (["purge", "--task", "send"], ["purge", ids[0]], ["requeue", "--all"]):
        declined = run(cli, "dead", *arguments, "-q", queue_name)
        assert declined.exit_code == EXIT_DECLINED, declined.output
        assert "not confirmed" in declined.stderr and "--yes" in declined.stderr
    refused = run(cli, "dead", "purge", "-q", queue_name, "--task", "send", answer="n\n")
    assert refused.exit_code == EXIT_DECLINED
    assert dead_ids(raw, queue_name) == set(ids)

    agreed = run(cli, "dead", "purge", "-q", queue_name, "--task", "send", answer="y\n")
    assert agreed.exit_code == 0, agreed.output
    assert f"Purge 3 dead tasks in queue {queue_name} for good?" in agreed.stderr
    assert agreed.stdout.strip() == "purged 3"
    forced = run(cli, "dead", "purge", "-q", queue_name, ids[1], "--yes")
    assert forced.stdout.strip() == "purged 1"
    everything = run(cli, "dead", "requeue", "-q", queue_name, "--all", "-y", "--json")
    report = json.loads(everything.stdout)
    assert (report["dry_run"], report["selected"], report["requeued"]) == (False, 2, 2)
    assert sorted(report["ids"]) == sorted([ids[4], ids[5]])
    assert dead_ids(raw, queue_name) == set()
    assert run(cli, "inspect", "-q", queue_name, "--check").exit_code == 0


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([], "name task ids, pass --all, or choose with --task"),
        (["--all", "some-id"], "give task ids or --all, not both"),
        (["bad id"], "invalid task id"),
        (["--since", "30"], "'30' is ambiguous"),
        (["--batch-size", "0"], "--batch-size"),
    ],
)
def test_requeue_and_purge_refuse_unclear_requests(
    cli: CliRunner, raw: redis.Redis, queue_name: str, arguments: list[str], message: str
) -> None:
    for verb in ("requeue", "purge"):
        result = run(cli, "dead", verb, "-q", queue_name, "--yes", *arguments)
        assert result.exit_code == EXIT_USAGE, result.output
        assert message in result.output
    assert raw.dbsize() == 0


def test_many_dead_tasks_are_read_and_acted_on_in_batches(
    cli: CliRunner,
    raw: redis.Redis,
    redis_url: str,
    queue_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The 100,000-task path at a small scale: pages and batches of 4 over 22 tasks,
    every other one chosen. Acting while paging would shift the offsets and skip some."""
    deaths = [Death("send" if n % 2 else "other", "boom", n * 0.01) for n in range(22)]
    ids = kill(raw, redis_url, queue_name, deaths)
    pages: list[tuple[int, int]] = []
    batches: list[int] = []
    real_dead_tasks, real_requeue = Queue.dead_tasks, Queue.requeue_dead

    def dead_tasks(self: Queue, limit: int = 100, offset: int = 0) -> list[DeadTask]:
        pages.append((limit, offset))
        return real_dead_tasks(self, limit, offset)

    def requeue_dead(self: Queue, task_ids: Any = None) -> int:
        assert isinstance(task_ids, list)  # never None: that would take every dead task
        batches.append(len(task_ids))
        return real_requeue(self, task_ids)

    monkeypatch.setattr(Queue, "dead_tasks", dead_tasks)
    monkeypatch.setattr(Queue, "requeue_dead", requeue_dead)
    result = run(cli, "dead", "requeue", "-q", queue_name, "--task", "send", "--batch-size", "4")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "requeued 11"
    assert pages == [(4, offset) for offset in range(0, 24, 4)]
    assert batches == [4, 4, 3]
    assert dead_ids(raw, queue_name) == set(ids[0::2])
    assert result.stderr == ""  # no progress bar: stderr is not a terminal


def test_the_progress_bar_shows_on_a_terminal(
    cli: CliRunner, raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    kill(raw, redis_url, queue_name, DEATHS)
    result = CliRunner(env={"FORCE_COLOR": "1", "COLUMNS": "80"}).invoke(
        main, ["dead", "requeue", "-q", queue_name, "--all", "--yes", "--batch-size", "2"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "requeued 6"
    assert "requeuing" in result.stderr and "6/6" in result.stderr


def test_a_dead_id_duetime_would_refuse_is_left_alone_and_reported(
    cli: CliRunner, raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    ids = kill(raw, redis_url, queue_name, DEATHS[:2])
    raw.zadd(QueueLayout(queue_name).shards[0].dead, {"written by hand": 1})
    result = run(cli, "dead", "purge", "-q", queue_name, "--all", "--yes")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "purged 2"
    assert "1 matching dead task(s) have ids duetime does not accept" in result.stderr
    assert dead_ids(raw, queue_name) == {"written by hand"}
    assert ids[0] not in dead_ids(raw, queue_name)


def test_filters_work_across_the_shards_of_a_queue(
    cli: CliRunner, raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    ids = kill(raw, redis_url, queue_name, DEATHS, shards=3)
    with Queue(queue_name, redis_url, shards=3) as queue:
        found = [d.id for d in dead_matching(queue, DeadFilter(error="TIMEOUT"), page_size=2)]
        assert found == [ids[0], ids[3], ids[4]]
        picked = select_dead(queue, DeadFilter(task="send", until=time.time() - HOUR))
        assert (picked.ids, [d.id for d in picked.sample]) == ([ids[2], ids[3]], [ids[2], ids[3]])
    result = run(cli, "dead", "purge", "-q", queue_name, "--shards", "3", "--task", "send", "-y")
    assert result.stdout.strip() == "purged 3"
    with Queue(queue_name, redis_url, shards=3) as queue:
        assert sorted(d.id for d in queue.dead_tasks()) == sorted([ids[1], ids[4], ids[5]])


def test_the_async_scan_matches_the_same_tasks(
    raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    ids = kill(raw, redis_url, queue_name, DEATHS)
    read: list[int] = []

    async def scan() -> list[str]:
        async with AsyncQueue(queue_name, redis_url) as queue:
            chosen = DeadFilter(since=time.time() - 3 * HOUR)
            found = dead_matching_async(queue, chosen, page_size=2, on_page=read.append)
            return [dead.id async for dead in found]

    assert asyncio.run(scan()) == ids[:3]
    # Newest first: the scan stops at the first task that died before --since.
    assert read == [2, 2]
