"""The cron page with the schedule's options, in a real headless Chromium at 1280 px
(Debian's /usr/bin/chromium, driven by Playwright): an interval job with jitter, a job
with a start, an end, a catch-up window, a run limit and a pause after failures, a
backfill under way, and a definition this host cannot use each show what they are;
"Trigger now" (confirmed in the browser's dialog) enqueues one run of the job's task
now, its schedule left alone; a trigger of a job that does not exist is refused.

Its screenshot (cron-options.png) goes where the other browser tests' go (see
conftest.py)."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from playwright.sync_api import Page, expect, sync_playwright

from duetime import Queue
from duetime.store.plans.keys import QueueKeys
from tests.browser.conftest import CHROMIUM_ARGS, publish, signed_in_page
from tests.browser.test_dashboard_browser import QUEUE, TOKEN, serving, shoot

DAY = 86400.0


def fill_cron(queue: Queue, raw: redis.Redis) -> None:
    now = time.time()
    queue.add_cron(
        "heartbeat", None, {"ping": True}, every=timedelta(minutes=10),
        jitter=timedelta(seconds=90), task="send_email",
    )  # fmt: skip
    queue.add_cron(
        "trial-reminder", "0 9 * * *", {"template": "trial"}, tz="Europe/Paris",
        start=now - DAY, end=now + 30 * DAY, catch_up=timedelta(hours=2), max_runs=14,
        pause_after_failures=3, missed="once", overlap="skip",
    )  # fmt: skip
    queue.add_cron("hourly-report", "0 * * * *", {"format": "pdf"}, tz="America/New_York")
    # A day of missed hours, run back at one tick a minute (no dispatcher runs here, so
    # none has fired yet).
    queue.backfill_cron("hourly-report", now - 2 * DAY, now - DAY, rate=1 / 60)
    raw.hset(QueueKeys(QUEUE).cron, "legacy-export", b"\x93not a definition")


@pytest.mark.parametrize("server", ["redis"], indirect=True)  # one server kind is enough here
def test_the_cron_page_shows_schedule_options_and_triggers_a_run(
    redis_url: str, raw: redis.Redis, chromium: str, shots: Path
) -> None:
    with (
        Queue(QUEUE, redis_url) as queue,
        serving(redis_url) as base,
        sync_playwright() as playwright,
    ):
        fill_cron(queue, raw)
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = signed_in_page(browser, base, TOKEN)
            page.goto(f"{base}/q/{QUEUE}/cron")
            look(page)
            trigger(page, queue)
            shoot(page, shots, "cron-options")
            refused(page, base)
        finally:
            browser.close()
    publish(shots)


def look(page: Page) -> None:
    heartbeat = page.locator('[data-cron="heartbeat"]')
    expect(heartbeat).to_contain_text("every 10m")
    expect(heartbeat.locator('[data-field="window"]')).to_contain_text("jitter 1m 30s")
    reminder = page.locator('[data-cron="trial-reminder"]')
    window = reminder.locator('[data-field="window"]')
    expect(window).to_contain_text(re.compile(r"^catch-up 2h · from \w{3} \S+ \S+ CET · until "))
    expect(window.locator("time")).to_have_count(2)  # the start and the end, UTC on hover
    expect(reminder.locator('[data-field="runs"]')).to_have_text(
        "0 of 14 · failed in a row 0 of 3 (then paused)"
    )
    expect(reminder).to_contain_text("missed once, overlap skip")
    report = page.locator('[data-cron="hourly-report"]')
    # 25 ticks when the range starts on the hour.
    backfill = report.locator('[data-field="backfill"]')
    expect(backfill).to_contain_text(re.compile(r"0 of 2[45] ticks fired, one every 1m$"))
    legacy = page.locator('[data-cron="legacy-export"]')
    expect(legacy.locator(".badge")).to_have_text("unusable")
    # Neither triggered nor resumed: its ticks cannot be worked out on this host.
    expect(legacy.locator('[data-action="trigger-cron"]')).to_have_count(0)
    expect(legacy.locator('[data-action="resume-cron"]')).to_have_count(0)


def trigger(page: Page, queue: Queue) -> None:
    """A triggered run is a task of its own, due now, with the job's handler and data;
    the job's schedule and last run are left as they were."""
    heartbeat = page.locator('[data-cron="heartbeat"]')
    before = next(job for job in queue.list_cron() if job.name == "heartbeat")
    heartbeat.locator('[data-action="trigger-cron"]').click()
    notice = page.locator("[role=status].notice")
    expect(notice).to_contain_text("Triggered heartbeat: task")
    task_id = notice.inner_text().split("task ", 1)[1].split(" ", 1)[0]
    status = queue.status(task_id)
    assert status is not None and status.state in ("ready", "scheduled")
    assert (status.task, status.data) == ("send_email", {"ping": True})
    expect(heartbeat).to_contain_text("not fired yet")
    after = next(job for job in queue.list_cron() if job.name == "heartbeat")
    assert (after.next_runs, after.last_run) == (before.next_runs, None)


def refused(page: Page, base: str) -> None:
    """A trigger of a job that does not exist is refused with a notice, nothing made."""
    before = page.request.get(f"{base}/q/{QUEUE}/cron").text()
    csrf = page.locator('[data-cron="heartbeat"] input[name=csrf]').first.get_attribute("value")
    reply = page.request.post(
        f"{base}/q/{QUEUE}/cron/trigger", form={"csrf": csrf or "", "name": "no-such-job"}
    )
    assert reply.ok
    assert "No cron job" in reply.text() and "no-such-job" in reply.text()
    assert before.count('data-cron="') == reply.text().count('data-cron="')
