"""``duetime cron`` with schedules (docs/cli.md): interval jobs, the schedule's options,
how they are listed, backfills, and what is refused as a usage error."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from duetime.cli import EXIT_NOT_FOUND, EXIT_USAGE, main


@pytest.fixture
def cli(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
    monkeypatch.setenv("COLUMNS", "200")
    return CliRunner()


def test_an_interval_job_with_every_option_is_added_and_listed(
    cli: CliRunner, queue_name: str
) -> None:
    options = ["--every", "5m", "--jitter", "30s", "--catch-up", "1h", "--max-runs", "10",
               "--pause-after-failures", "3", "--start", "2026-01-01T00:00Z",
               "--end", "2099-01-01T00:00Z"]  # fmt: skip
    added = cli.invoke(
        main, ["cron", "add", "--create", "-q", queue_name, "poll", *options, '{"u": 7}']
    )
    assert added.exit_code == 0, added.output
    assert added.stdout.strip() == "created poll"
    [job] = json.loads(cli.invoke(main, ["cron", "list", "-q", queue_name, "--json"]).stdout)
    assert (job["expression"], job["every"], job["jitter"], job["catch_up"]) == ("", 300, 30, 3600)
    assert (job["max_runs"], job["runs"], job["pause_after_failures"], job["failures"]) == (
        10, 0, 3, 0,
    )  # fmt: skip
    assert (job["start"], job["end"]) == (1767225600, 4070908800)
    table = cli.invoke(main, ["--utc", "cron", "list", "-q", queue_name]).stdout
    for shown in ("every 5m", "jitter 30s", "catch-up 1h", "runs 0 of 10", "2099-01-01"):
        assert shown in table, shown


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--every", "5m", "* * * * *", "{}"], "DATA alone with --every"),
        (["{}"], "EXPRESSION and DATA"),
        (["* * * * *", "{}", "--catch-up", "0"], "catch_up must be a positive"),
        (["* * * * *", "{}", "--jitter", "-5s"], "cannot be negative"),
        (["--every", "0.5s", "{}"], "at least 1 second"),
        (["* * * * *", "{}", "--end", "2001-01-01T00:00Z"], "never fires again"),
        (["* * * * *", "{}", "--start", "tomorrow"], "cannot read 'tomorrow' as a time"),
        (["* * * * *", "{}", "--max-runs", "0"], "max_runs must be an integer from 1"),
    ],
)
def test_bad_schedules_are_usage_errors(
    cli: CliRunner, queue_name: str, arguments: list[str], message: str
) -> None:
    result = cli.invoke(main, ["cron", "add", "--create", "-q", queue_name, "job", *arguments])
    assert result.exit_code == EXIT_USAGE, result.output
    assert message in result.output


def test_backfill_runs_a_past_range_once_and_refuses_too_many_ticks(
    cli: CliRunner, queue_name: str
) -> None:
    assert (
        cli.invoke(
            main, ["cron", "add", "--create", "-q", queue_name, "hourly", "@hourly", "{}"]
        ).exit_code
        == 0
    )
    backfill = ["cron", "backfill", "-q", queue_name, "hourly", "--from", "5h", "--to", "1h"]
    first = cli.invoke(main, [*backfill, "--rate", "2"])
    assert first.exit_code == 0, first.output
    found = re.fullmatch(
        r"backfilling (\d) tick\(s\) of hourly at 2/s \(0 fired so far\)\n", first.stdout
    )
    assert found is not None and int(found[1]) in (4, 5), first.stdout
    again = cli.invoke(main, [*backfill, "--rate", "2"])
    assert again.stdout == first.stdout  # the same backfill, nothing started twice
    listed = cli.invoke(main, ["cron", "list", "-q", queue_name]).stdout
    assert f"backfill of {found[1]} tick(s)" in listed
    assert (
        cli.invoke(
            main, ["cron", "add", "--create", "-q", queue_name, "fast", "* * * * * *", "{}"]
        ).exit_code
        == 0
    )
    too_many = cli.invoke(
        main, ["cron", "backfill", "-q", queue_name, "fast", "--from", "3650d", "--to", "1s"]
    )
    assert too_many.exit_code == EXIT_USAGE and "at most 100,000 ticks" in too_many.output
    future = cli.invoke(main, [*backfill[:-1], "2099-01-01T00:00Z"])
    assert future.exit_code == EXIT_USAGE and "after now" in future.output
    unknown = cli.invoke(
        main, ["cron", "backfill", "-q", queue_name, "nobody", "--from", "2h", "--to", "1h"]
    )
    assert unknown.exit_code == EXIT_NOT_FOUND
