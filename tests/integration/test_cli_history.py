"""The history from the command line: ``duetime tasks --state finished`` (filtered by
handler and outcome, as a table in 80 columns or JSON), a task's finished attempts in
``duetime task show`` and ``status`` once the task is gone, and ``history-size``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from duetime import ManualClock, Queue
from duetime.cli import EXIT_NOT_FOUND, EXIT_USAGE, main

NOW_MS = 1_800_000_000_000


@pytest.fixture
def cli(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
    return CliRunner()


def finish_some(redis_url: str, queue_name: str) -> None:
    """A retried and then dead attempt of "flaky-1" (handler send), a cancelled "later"
    (handler report), and a cancelled "other" of the default handler."""
    clock = ManualClock(NOW_MS)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        ops, run = queue.core.queue.operations, queue.runner.run
        queue.schedule_now({}, id="flaky-1", task="send", max_attempts=2)
        for attempt, retry in ((1, 0), (2, None)):
            run(ops.dispatcher.promote_due(10))
            run(ops.worker.claim("w1", 60_000, 1))
            clock.advance(0.01)
            run(
                ops.worker.fail(
                    "w1", "flaky-1", attempt, b"e", retry, ran=(12_000, 0), summary="E: no"
                )
            )
        queue.cancel(queue.schedule_in(60, {}, id="later", task="report"))
        queue.cancel(queue.schedule_in(60, {}, id="other"))


def test_tasks_finished_lists_the_history_filtered(
    cli: CliRunner, redis_url: str, queue_name: str
) -> None:
    finish_some(redis_url, queue_name)
    listed = cli.invoke(main, ["tasks", "-q", queue_name, "--state", "finished", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert [(r["task_id"], r["outcome"], r["attempt"]) for r in rows] == [
        ("other", "cancelled", 0), ("later", "cancelled", 0),
        ("flaky-1", "dead", 2), ("flaky-1", "retried", 1),
    ]  # fmt: skip
    assert rows[2]["duration"] == 0.012 and rows[2]["error"] == "E: no"
    dead = ["--state", "finished", "--task", "send", "--outcome", "dead", "--json"]
    rows = json.loads(cli.invoke(main, ["tasks", "-q", queue_name, *dead]).stdout)
    assert [(r["task_id"], r["attempt"]) for r in rows] == [("flaky-1", 2)]
    default = ["--state", "finished", "--task", "(default)", "--json"]
    rows = json.loads(cli.invoke(main, ["tasks", "-q", queue_name, *default]).stdout)
    assert [r["task_id"] for r in rows] == ["other"]
    refused = cli.invoke(main, ["tasks", "-q", queue_name, "--outcome", "dead"])
    assert refused.exit_code == EXIT_USAGE and "--state finished" in refused.output


def test_the_finished_table_fits_80_columns(redis_url: str, queue_name: str) -> None:
    finish_some(redis_url, queue_name)
    environment = {**os.environ, "COLUMNS": "80", "DUETIME_REDIS_URL": redis_url}
    listed = subprocess.run(
        [sys.executable, "-m", "duetime", "tasks", "-q", queue_name, "--state", "finished"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    assert max(len(line) for line in listed.stdout.splitlines()) <= 80
    words = listed.stdout.split()
    assert {"flaky-1", "later", "other", "dead", "retried", "cancelled", "12", "ms"} <= set(words)


def test_task_show_and_status_show_a_gone_tasks_attempts(
    cli: CliRunner, redis_url: str, queue_name: str
) -> None:
    finish_some(redis_url, queue_name)
    for command in (["task", "show"], ["status"]):
        shown = cli.invoke(main, [*command, "-q", queue_name, "flaky-1"])
        assert shown.exit_code == 0, shown.output
        report = json.loads(shown.stdout)
        assert report["state"] == "dead"  # still in the dead-letter set
        history = report["history"]
        assert [(h["outcome"], h["attempt"], h["worker"]) for h in history] == [
            ("dead", 2, "w1"), ("retried", 1, "w1"),
        ]  # fmt: skip
        assert history[0]["finished_at"].startswith("20")  # ISO 8601, as the status times
    gone = json.loads(cli.invoke(main, ["task", "show", "-q", queue_name, "later"]).stdout)
    assert (gone["state"], gone["outcome"]) == ("finished", "cancelled")
    assert gone["history"][0]["outcome"] == "cancelled"
    missing = cli.invoke(main, ["task", "show", "-q", queue_name, "never"])
    assert missing.exit_code == EXIT_NOT_FOUND and "history" in missing.output


def test_history_size_reads_and_sets_the_size(cli: CliRunner, queue_name: str) -> None:
    def size(*more: str) -> str:
        result = cli.invoke(main, ["history-size", "--create", "-q", queue_name, *more])
        assert result.exit_code == 0, result.output
        return str(result.stdout.strip())

    assert size() == f"{queue_name} keeps the last 1,000 finished attempts"
    assert size("20000") == f"{queue_name} keeps the last 20,000 finished attempts"
    assert size("0") == f"{queue_name} keeps no finished attempts"
    assert size("default") == f"{queue_name} keeps the last 1,000 finished attempts"
    for bad in ("-3", "many", "100001"):
        refused = cli.invoke(main, ["history-size", "--create", "-q", queue_name, "--", bad])
        assert refused.exit_code == EXIT_USAGE, (bad, refused.output)
