"""The duetime command: client commands in-process, exit codes, masked secrets."""

from __future__ import annotations

import json
import time

import pytest
import redis
from click.testing import CliRunner

from duetime import Queue
from duetime.cli import EXIT_NOT_FOUND, EXIT_UNAVAILABLE, EXIT_USAGE, EXIT_VIOLATIONS, main
from duetime.store import QueueKeys


@pytest.fixture
def cli(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
    return CliRunner()


def test_schedule_prints_the_id_and_stores_the_task(
    cli: CliRunner, redis_url: str, queue_name: str
) -> None:
    at = int(time.time()) + 3600
    arguments = ["--at", str(at), "--id", "job-1", "--task", "send", "--max-attempts", "2"]
    result = cli.invoke(main, ["schedule", "-q", queue_name, *arguments, '{"to": "a@b"}'])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "job-1"
    with Queue(queue_name, redis_url) as queue:
        status = queue.status("job-1")
    assert status is not None
    assert (status.state, status.task, status.data, status.run_at) == (
        "scheduled",
        "send",
        {"to": "a@b"},
        at,
    )
    relative = cli.invoke(main, ["schedule", "-q", queue_name, "--in", "0", "[1, 2]"])
    assert relative.exit_code == 0 and len(relative.output.strip()) == 12


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--in", "5", "{not json"], "not valid JSON"),
        (["--in", "5", "--at", "5", "{}"], "exactly one of --at or --in"),
        (["{}"], "exactly one of --at or --in"),
        (["--at", "nan", "{}"], "finite"),
        (["--in", "5", "null"], "empty"),
        (["--in", "5", "--id", "a|b", "{}"], "task id"),
    ],
)
def test_bad_schedule_arguments_exit_2_and_write_nothing(
    cli: CliRunner, raw: redis.Redis, queue_name: str, arguments: list[str], message: str
) -> None:
    result = cli.invoke(main, ["schedule", "-q", queue_name, *arguments])
    assert result.exit_code == EXIT_USAGE
    assert message in result.output
    assert raw.dbsize() == 0


def test_inspect_reports_counts_and_check_fails_on_violation(
    cli: CliRunner, raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_in(3600, {"a": 1})
        queue.schedule_now({"a": 2})
    result = cli.invoke(main, ["inspect", "-q", queue_name, "--json", "--check"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["scheduled"], report["ready"], report["violations"]) == (1, 1, [])
    table = cli.invoke(main, ["inspect", "-q", queue_name, "--check"])
    assert table.exit_code == 0 and "invariants hold" in table.output
    raw.rpush(QueueKeys(queue_name).ready, "ghost")  # an id with no envelope
    broken = cli.invoke(main, ["inspect", "-q", queue_name, "--check"])
    assert broken.exit_code == EXIT_VIOLATIONS
    assert "orphan id: ghost" in broken.output


def test_dead_commands_list_show_requeue_purge(
    cli: CliRunner, raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        ids = [queue.schedule_now({"n": n}) for n in range(3)]
        for task_id in ids:  # what fail_task leaves for a dead task
            raw.lrem(keys.ready, 1, task_id)
            raw.zadd(keys.dead, {task_id: 1_795_000_000_000})
    listed = cli.invoke(main, ["dead", "list", "-q", queue_name, "--json"])
    assert listed.exit_code == 0
    assert sorted(entry["id"] for entry in json.loads(listed.stdout)) == sorted(ids)
    shown = cli.invoke(main, ["dead", "show", "-q", queue_name, ids[0]])
    assert shown.exit_code == 0 and json.loads(shown.stdout)["state"] == "dead"
    missing = cli.invoke(main, ["dead", "show", "-q", queue_name, "nope"])
    assert missing.exit_code == EXIT_NOT_FOUND
    assert cli.invoke(main, ["dead", "requeue", "-q", queue_name]).exit_code == EXIT_USAGE
    requeued = cli.invoke(main, ["dead", "requeue", "-q", queue_name, ids[0]])
    assert requeued.output.strip() == "requeued 1"
    purged = cli.invoke(main, ["dead", "purge", "-q", queue_name, "--all"])
    assert purged.output.strip() == "purged 2"
    assert raw.llen(keys.ready) == 1 and raw.zcard(keys.dead) == 0
    assert cli.invoke(main, ["inspect", "-q", queue_name, "--check"]).exit_code == 0


def test_status_and_cancel(cli: CliRunner, redis_url: str, queue_name: str) -> None:
    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_in(60, {"a": 1})
    status = cli.invoke(main, ["status", "-q", queue_name, task_id])
    assert json.loads(status.stdout)["state"] == "scheduled"
    assert cli.invoke(main, ["cancel", "-q", queue_name, task_id]).exit_code == 0
    assert cli.invoke(main, ["cancel", "-q", queue_name, task_id]).exit_code == EXIT_NOT_FOUND
    assert cli.invoke(main, ["status", "-q", queue_name, task_id]).exit_code == EXIT_NOT_FOUND


def test_unreachable_redis_exits_3_with_the_password_masked(queue_name: str) -> None:
    result = CliRunner().invoke(
        main, ["inspect", "-q", queue_name, "--redis", "redis://admin:hunter2@127.0.0.1:1/0"]
    )
    assert result.exit_code == EXIT_UNAVAILABLE
    assert "hunter2" not in result.output and "***" in result.output


def test_settings_from_the_environment_are_validated(cli: CliRunner, queue_name: str) -> None:
    result = CliRunner(env={"DUETIME_LEASE_DURATION": "soon"}).invoke(
        main, ["inspect", "-q", queue_name]
    )
    assert result.exit_code == EXIT_USAGE
    assert "DUETIME_LEASE_DURATION must be a number" in result.output


def test_cron_commands(cli: CliRunner, queue_name: str) -> None:
    options = ["--tz", "Europe/Paris", "--missed", "once"]
    added = cli.invoke(
        main,
        ["cron", "add", "-q", queue_name, "report", "0 9 * * 1-5", '{"kind": "daily"}', *options],
    )
    assert added.exit_code == 0 and added.stdout.strip() == "created report"
    bad = cli.invoke(main, ["cron", "add", "-q", queue_name, "x", "0 9 * * *", "{}", "--tz", "Q/Z"])
    assert bad.exit_code == EXIT_USAGE and "unknown time zone" in bad.output
    listed = cli.invoke(main, ["cron", "list", "-q", queue_name, "--json"])
    [job] = json.loads(listed.stdout)
    assert (job["name"], job["missed"], job["paused"], len(job["next_runs"])) == (
        "report", "once", False, 3,
    )  # fmt: skip
    assert cli.invoke(main, ["cron", "pause", "-q", queue_name, "report"]).exit_code == 0
    assert "paused" in cli.invoke(main, ["cron", "list", "-q", queue_name]).stdout
    assert cli.invoke(main, ["cron", "resume", "-q", queue_name, "report"]).exit_code == 0
    assert cli.invoke(main, ["cron", "remove", "-q", queue_name, "report"]).exit_code == 0
    missing = cli.invoke(main, ["cron", "remove", "-q", queue_name, "report"])
    assert missing.exit_code == EXIT_NOT_FOUND


def test_every_queue_command_takes_the_shard_count(
    cli: CliRunner, redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def invoke(*arguments: str) -> str:
        result = cli.invoke(main, list(arguments))
        assert result.exit_code == 0, result.output
        return str(result.output)

    ids = [invoke("schedule", "-q", queue_name, "--shards", "4", "--in", "3600", "{}").strip()
           for _ in range(40)]  # fmt: skip
    invoke("schedule", "-q", queue_name, "--shards", "4", "--in", "3600", "--id", "o-7", "{}")
    report = json.loads(invoke("inspect", "-q", queue_name, "--shards", "4", "--json"))
    assert report["scheduled"] == 41 and len(report["shards"]) == 4
    assert all(shard["scheduled"] > 0 for shard in report["shards"])
    assert "shard 3" in invoke("inspect", "-q", queue_name, "--shards", "4")
    assert '"state": "scheduled"' in invoke("status", "-q", queue_name, "--shards", "4", "o-7")
    invoke("cron", "add", "-q", queue_name, "--shards", "4", "nightly", "0 3 * * *", "{}")
    assert "nightly" in invoke("cron", "list", "-q", queue_name, "--shards", "4")
    monkeypatch.setenv("DUETIME_SHARDS", "4")
    assert "cancelled" in invoke("cancel", "-q", queue_name, ids[0])
    with Queue(queue_name, redis_url, shards=4) as queue:
        assert queue.status(ids[0]) is None and queue.stats().scheduled == 40
    fewer = cli.invoke(main, ["inspect", "-q", queue_name, "--shards", "2", "--check"])
    assert fewer.exit_code == EXIT_VIOLATIONS
    assert "tasks beyond the shards" in fewer.output
    bad = cli.invoke(main, ["inspect", "-q", queue_name, "--shards", "0"])
    assert bad.exit_code == EXIT_USAGE and "--shards" in bad.output
