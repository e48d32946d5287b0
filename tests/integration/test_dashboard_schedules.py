"""The dashboard's cron page shows a job's schedule options, its runs and failures, its
backfill, and that it ended (docs/dashboard.md)."""

from __future__ import annotations

import time
from datetime import timedelta

from duetime import Queue
from tests.integration.test_dashboard import dashboard


def test_the_cron_page_shows_schedule_options_runs_and_backfills(
    redis_url: str, queue_name: str
) -> None:
    now = time.time()
    with Queue(queue_name, redis_url) as queue:
        queue.add_cron(
            "poll", None, {}, every=timedelta(minutes=5), jitter=30, catch_up=3600,
            max_runs=10, pause_after_failures=3, end=now + 86400 * 365,
        )  # fmt: skip
        queue.add_cron("hourly", "0 * * * *", {})
        queue.backfill_cron("hourly", now - 5 * 3600, now - 3600, rate=2)
        with dashboard(redis_url, queue_name) as client:
            page = client.get(f"/q/{queue_name}/cron").text
    poll = page[page.index('data-cron="poll"') :]
    assert "every 5m" in poll
    window = poll[poll.index('data-field="window"') :]
    assert "catch-up 1h" in window and "jitter 30.0 s" in window and "until" in window
    runs = poll[poll.index('data-field="runs"') :]
    assert "0 of 10" in runs and "failed in a row 0 of 3" in runs
    hourly = page[page.index('data-cron="hourly"') :]
    backfill = hourly[hourly.index('data-field="backfill"') :]
    assert "0 of 4 ticks fired, at 2/s" in backfill or "0 of 5 ticks fired, at 2/s" in backfill
