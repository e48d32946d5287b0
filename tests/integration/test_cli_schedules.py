"""``duetime cron`` with schedules (docs/cli.md): interval jobs, the schedule's options,
how they are listed, backfills, and what is refused as a usage error."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from click.testing import CliRunner

from duetime import App, Dispatcher, Queue, Worker, current_task
from duetime.cli import EXIT_NOT_FOUND, EXIT_USAGE, main
from tests.helpers import FAST, wait_until_sync
from tests.integration.test_dashboard import dashboard


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
        r"backfill of hourly: (\d) tick\(s\) from [-\d :+]+ to [-\d :+]+\n"
        r"0 already ran, \1 to run at 2/s\n",
        first.stdout,
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


@contextmanager
def daemons_in_a_thread(*daemons: Any) -> Iterator[None]:
    """Dispatchers and workers on an event loop of their own, stopped on exit."""
    loop = asyncio.new_event_loop()

    async def run_all() -> None:
        await asyncio.gather(*(daemon.run() for daemon in daemons))

    thread = threading.Thread(target=loop.run_until_complete, args=(run_all(),))
    thread.start()
    try:
        yield
    finally:
        for daemon in daemons:
            loop.call_soon_threadsafe(daemon.stop)
        thread.join(30)
        loop.close()


def hourly_away_from_now() -> str:
    """An hourly expression whose ticks fall 25 minutes past the current minute: far from
    every bound of the tests' ranges (whole hours, or 10 minutes, before now), so a range
    holds the same ticks however long the test takes, and the job's own schedule does not
    fire meanwhile."""
    return f"{(datetime.now(UTC).minute + 25) % 60} * * * *"


BACKFILLED = re.compile(
    r"(?:replaced the unfinished backfill of hourly from (?P<old>.+)\n)?"
    r"backfill of hourly: (?P<ticks>\d+) tick\(s\) from (?P<first>[-\d: ]+)\+00:00 "
    r"to (?P<last>[-\d: ]+)\+00:00\n"
    r"(?P<ran>\d+) already ran, (?P<to_run>\d+) to run(?: at [\d.]+/s)?\n"
)


def hour_marks(said: re.Match[str]) -> set[int]:
    """The ticks (ms) of an hourly job's backfill as a call printed it: first to last."""
    first, last = (
        int(datetime.strptime(said[part], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp())
        for part in ("first", "last")
    )
    return {tick * 1000 for tick in range(first, last + 1, 3600)}


def test_backfills_run_again_shifted_overlapping_replacing_or_at_once_run_each_tick_once(
    redis_url: str, queue_name: str
) -> None:
    """The documented command with relative times, issued again once its ticks ran (and
    a few seconds later: the same range shifted), then an overlapping range, one that
    replaces an unfinished backfill, and two calls at once, through the CLI with a
    dispatcher and a worker running: each tick runs exactly once, and each call says how
    many of its ticks had run already and how many it runs."""
    runs: list[str] = []  # appended from the worker's threads
    app = App(default=lambda data: runs.append(current_task().id))
    env = {**os.environ, "DUETIME_REDIS_URL": redis_url, "COLUMNS": "200",
           "PYTHONPATH": os.pathsep.join(sys.path)}  # fmt: skip

    def backfill(*arguments: str) -> subprocess.Popen[str]:
        command = [sys.executable, "-m", "duetime", "--utc", "cron", "backfill", "-q",
                   queue_name, "hourly", *arguments]  # fmt: skip
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)

    def said(call: subprocess.Popen[str]) -> re.Match[str]:
        out, _ = call.communicate(timeout=60)
        assert call.returncode == 0, out
        found = BACKFILLED.fullmatch(out)
        assert found is not None, out
        return found

    def ran_all(ticks: set[int]) -> None:
        wanted = {f"cron:hourly:{tick}" for tick in ticks}
        wait_until_sync(lambda: wanted <= set(runs), timeout=30, what="the backfill to run")

    with Queue(queue_name, redis_url, settings=FAST) as queue:
        queue.add_cron("hourly", hourly_away_from_now(), {})
        dispatcher = Dispatcher(queue_name, redis_url, settings=FAST)
        worker = Worker(app, queue_name, redis_url, settings=FAST, concurrency=4)
        with daemons_in_a_thread(dispatcher, worker):
            first = said(backfill("--from", "4h", "--to", "10m", "--rate", "100"))
            ticks = hour_marks(first)
            assert (int(first["ran"]), int(first["to_run"])) == (0, len(ticks))
            ran_all(ticks)
            # Again, and again as if 3 s later (the relative range shifted): nothing runs.
            for again in (("4h", "10m"), ("14397s", "597s")):
                repeated = said(backfill("--from", again[0], "--to", again[1], "--rate", "100"))
                assert (repeated["ran"], repeated["to_run"]) == (str(len(ticks)), "0")
            # Overlapping: only the ticks not run yet run.
            overlapping = said(backfill("--from", "6h", "--to", "2h", "--rate", "100"))
            wider = hour_marks(overlapping)
            assert int(overlapping["ran"]) == len(wider & ticks)
            assert int(overlapping["to_run"]) == len(wider - ticks)
            ran_all(ticks := ticks | wider)
            # One tick every 100 s, replaced at once by a range holding all of it.
            slow = said(backfill("--from", "9h", "--to", "1h", "--rate", "0.01"))
            assert int(slow["to_run"]) == len(hour_marks(slow) - ticks)
            replacing = said(backfill("--from", "9h", "--to", "10m", "--rate", "100"))
            assert replacing["old"] is not None
            whole = hour_marks(replacing)
            assert int(replacing["ran"]) + int(replacing["to_run"]) == len(whole)
            ran_all(ticks := ticks | whole)
            # Two calls at once, each for ticks none ran.
            together = [backfill("--from", "12h", "--to", "10m", "--rate", "100") for _ in "ab"]
            outcomes = [said(call) for call in together]
            ran_all(ticks := ticks | hour_marks(outcomes[0]))
            for outcome in outcomes:
                assert int(outcome["ran"]) + int(outcome["to_run"]) == int(outcome["ticks"])
    assert Counter(runs) == Counter({f"cron:hourly:{tick}": 1 for tick in ticks})


def test_backfill_to_now_is_accepted_and_a_reversed_range_is_told_in_readable_times(
    cli: CliRunner, queue_name: str
) -> None:
    """``--to now`` is the server's now (a range up to now was refused as unreadable),
    and an end before the start names both as times, not as milliseconds or floats."""
    assert (
        cli.invoke(
            main,
            ["cron", "add", "--create", "-q", queue_name, "hourly", hourly_away_from_now(), "{}"],
        ).exit_code
        == 0
    )
    backfill = ["--utc", "cron", "backfill", "-q", queue_name, "hourly"]
    to_now = cli.invoke(main, [*backfill, "--from", "3h", "--to", "now"])
    assert to_now.exit_code == 0, to_now.output
    assert re.match(r"backfill of hourly: 3 tick\(s\) from ", to_now.stdout), to_now.stdout
    reversed_range = cli.invoke(
        main, [*backfill, "--from", "2026-01-02T00:00Z", "--to", "2026-01-01T00:00Z"]
    )
    assert reversed_range.exit_code == EXIT_USAGE
    assert (
        "backfill end (2026-01-01 00:00:00+00:00) is before its start (2026-01-02 00:00:00+00:00)"
        in reversed_range.output
    )


def test_a_backfilled_last_run_is_not_called_late_by_cron_list_or_the_dashboard(
    cli: CliRunner, redis_url: str, queue_name: str
) -> None:
    """A backfill's run starts when the backfill fires it, hours after its tick: the job's
    last run says it was backfilled, not that it "started 3h late" (docs/cron.md)."""
    runs: list[str] = []
    app = App(default=lambda data: runs.append(current_task().id))
    with Queue(queue_name, redis_url, settings=FAST) as queue:
        queue.add_cron("hourly", hourly_away_from_now(), {})
        now = time.time()
        backfill = queue.backfill_cron("hourly", now - 4 * 3600, now - 2 * 3600, rate=100)
        dispatcher = Dispatcher(queue_name, redis_url, settings=FAST)
        worker = Worker(app, queue_name, redis_url, settings=FAST, concurrency=4)
        with daemons_in_a_thread(dispatcher, worker):
            wait_until_sync(lambda: len(runs) == backfill.ticks, what="the backfill to run")
            info = queue.cron_info("hourly")
            assert info is not None and info.last_run is not None
            wait_until_sync(lambda: queue.cron_info("hourly").last_run.succeeded is True,  # type: ignore[union-attr]
                            what="the last run to succeed")  # fmt: skip
    listed = cli.invoke(main, ["--utc", "cron", "list", "-q", queue_name]).stdout
    assert "ok, backfilled" in listed and " late" not in listed, listed
    with dashboard(redis_url, queue_name) as client:
        card = client.get(f"/q/{queue_name}/cron").text
    card = card[card.index('data-cron="hourly"') :]
    assert "backfilled" in card and " late<" not in card
