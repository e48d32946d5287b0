"""The Finished page and a task's attempts in a real headless Chromium (Debian's
/usr/bin/chromium, driven by Playwright) at 1280 px: the history's attempts listed,
filtered by handler and outcome through the form, the page never wider than the window
with a long id and a long error, a gone task's page showing its attempts, and "Run now"
on a task that ran meanwhile landing on them rather than on a 404."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from duetime import ManualClock, Queue, codec
from duetime.codec import ErrorRecord
from duetime.store.plans.working import Outcome
from tests.browser.conftest import CHROMIUM_ARGS, publish
from tests.browser.test_dashboard_browser import QUEUE, TOKEN, serving, shoot

NOW_MS = int(time.time() * 1000)  # the page's "x ago" reads as it would live
LONG_ID = "invoice-" + "x" * 120
LONG_ERROR = "ValueError: " + "/very/long/path/segment" * 6 + " " + "detail " * 12


def fill_history(redis_url: str) -> None:
    """Six succeeded sends, a resize that failed twice (retried, then dead, with a long
    error), and a cancelled report with a long id: nine entries."""
    clock = ManualClock(NOW_MS)
    with Queue(QUEUE, redis_url, clock=clock) as queue:
        ops, run = queue.core.queue.operations, queue.runner.run
        for n in range(6):
            queue.schedule_now({"to": f"user{n}@example.com"}, id=f"send-{n}", task="send_email")
        queue.schedule_now({"image": "a.png"}, id="resize-1", task="resize_image", max_attempts=2)
        claimed = run(ops.worker.claim("web-1.4117", 60_000, 10)) or []
        clock.advance(0.2)
        sent = [
            Outcome(c.task_id, c.attempt, duration_us=1_200, task="send_email") for c in claimed[:6]
        ]
        run(ops.worker.ack("web-1.4117", sent))
        for attempt, retry in ((1, 0), (2, None)):
            if attempt == 2:
                run(ops.dispatcher.promote_due(10))
                run(ops.worker.claim("web-2.4217", 60_000, 1))
            worker = "web-1.4117" if attempt == 1 else "web-2.4217"
            record = codec.encode_error(
                ErrorRecord(LONG_ERROR, "Traceback ...", attempt, 0, worker)
            )
            run(
                ops.worker.fail(
                    worker, "resize-1", attempt, record, retry, ran=(85_000, 0), summary=LONG_ERROR
                )
            )
        queue.cancel(queue.schedule_in(3600, {}, id=LONG_ID, task="generate_report"))


def sign_in(page: Page, base: str) -> None:
    page.goto(f"{base}/login")
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")


def fits(page: Page, width: int) -> bool:
    return bool(page.evaluate(f"document.documentElement.scrollWidth <= {width}"))


@pytest.mark.parametrize("server", ["redis"], indirect=True)  # one server kind is enough here
def test_the_finished_page_filters_and_a_gone_task_shows_its_attempts(
    redis_url: str, chromium: str, shots: Path
) -> None:
    fill_history(redis_url)
    with serving(redis_url) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(
                viewport={"width": 1280, "height": 860}, timezone_id="Europe/Berlin"
            )
            page = context.new_page()
            sign_in(page, base)
            page.click('nav.main a:has-text("Finished")')
            rows = page.locator('[data-testid="finished"] tbody tr')
            expect(rows).to_have_count(9)
            expect(rows.first.locator("a.id")).to_have_text(LONG_ID)
            assert fits(page, 1280), "the Finished page is wider than the window"
            shoot(page, shots, "finished")
            page.fill("input[name=task]", "resize_image")
            page.select_option("select[name=outcome]", "dead")
            page.click('form.filters button[type="submit"]')
            expect(rows).to_have_count(1)
            expect(rows.first.locator(".badge")).to_have_text("dead")
            error = rows.first.locator("td.error-text")
            assert error.get_attribute("title") == LONG_ERROR
            assert fits(page, 1280), "a long error widened the page"
            page.click('a:has-text("Clear")')
            page.select_option("select[name=outcome]", "cancelled")
            page.click('form.filters button[type="submit"]')
            expect(rows).to_have_count(1)
            rows.first.locator("a.id").click()  # the cancelled task: gone from the queue
            expect(page.locator('[data-testid="gone"]')).to_be_visible()
            expect(page.locator('[data-testid="task-history"] tbody tr')).to_have_count(1)
            page.goto(f"{base}/q/{QUEUE}/task?id=resize-1")  # dead: its two attempts
            attempts = page.locator('[data-testid="task-history"] tbody tr .badge')
            expect(attempts).to_have_text(["dead", "retried"])
            assert fits(page, 1280)
            shoot(page, shots, "task-attempts")
            context.close()
        finally:
            browser.close()
    publish(shots)


@pytest.mark.parametrize("server", ["redis"], indirect=True)
def test_run_now_on_a_task_that_ran_meanwhile_lands_on_its_attempts(
    redis_url: str, chromium: str
) -> None:
    clock = ManualClock(NOW_MS)
    with (
        Queue(QUEUE, redis_url, clock=clock) as queue,
        serving(redis_url) as base,
        sync_playwright() as playwright,
    ):
        task_id = queue.schedule_in(3600, {}, id="report-7", task="generate_report")
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            sign_in(page, base)
            page.goto(f"{base}/q/{QUEUE}/task?id={task_id}")
            run_now = page.locator('[data-action="run-now"]')
            expect(run_now).to_be_visible()
            page.click("[data-live-toggle]")  # the page as it was loaded: no refresh
            expect(page.locator("[data-live-label]")).to_have_text("Paused")
            # Before the click, the task is made due and a worker finishes it.
            queue.run_now(task_id)
            ops, run = queue.core.queue.operations, queue.runner.run
            run(ops.dispatcher.promote_due(10))
            claimed = run(ops.worker.claim("web-1.4117", 60_000, 1)) or []
            assert run(ops.worker.ack("web-1.4117", [Outcome(task_id, claimed[0].attempt)]))
            run_now.click()
            expect(page.locator(".notice.error")).to_contain_text("already ended (succeeded")
            expect(page.locator('[data-testid="task-history"] .badge')).to_have_text(["succeeded"])
            assert "Not found" not in page.content()
        finally:
            browser.close()
