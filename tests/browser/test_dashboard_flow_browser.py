"""Flow control in the dashboard, in a real headless Chromium at 1280 px (Debian's
/usr/bin/chromium, driven by Playwright): the flow page renders a queue's limits and
limit keys, a long key is cut to its cell with the whole key on hover, and changing a
key's limits and the queue's cap by filling the forms in applies them (read back with
the Queue API), while bad input is refused on the page with nothing written. The
overview's queue card says the queue is under flow control and links to the page.

Its screenshot (flow.png) goes where the other browser test's go (see conftest.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from duetime import Job, KeyLimits, Limits, ManualClock, Queue, Rate, Settings
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operations import QueueOperations
from duetime.store.redis.runner import SyncRunner
from tests.browser.conftest import CHROMIUM_ARGS, publish, signed_in_page
from tests.browser.test_dashboard_browser import QUEUE, TOKEN, serving, shoot

LONG_KEY = "customer-" + "-".join(f"region{n}" for n in range(20))  # 168 bytes
LIMITS = Limits(
    cap=40,
    rate=Rate(200, 1.0, burst=20),
    each_key=KeyLimits(concurrency=2, rate=Rate(10, 1.0, burst=5)),
    keys={"acme": KeyLimits(concurrency=3), "bulk-import": KeyLimits(rate=Rate(1, 60.0))},
)


def fill_flow(redis_url: str) -> None:
    """Due tasks of several limit keys, promoted and claimed as a dispatcher and a worker
    would (on a clock set to now), so that keys are at their limits, throttled, or idle."""
    clock = ManualClock(int(time.time() * 1000))
    runner = SyncRunner(redis_url, Settings())
    operations = QueueOperations(QueueKeys(QUEUE), clock)
    with Queue(QUEUE, redis_url, clock=clock) as queue:
        queue.set_limits(LIMITS)
        at = (clock.now_ms() - 2000) / 1000
        keys = {"acme": 5, "bulk-import": 4, "globex": 3, "initech": 1, LONG_KEY: 2}
        jobs = [
            Job({"n": n}, at=at, limit_key=k) for k, count in keys.items() for n in range(count)
        ]
        jobs += [Job({"n": n}, at=at, task="send_email") for n in range(2)]
        queue.schedule_many(jobs)
        runner.run(operations.dispatcher.promote_due(100))
        runner.run(operations.worker.claim("web-1.4117", 60_000, 12))
    runner.close()


@pytest.mark.parametrize("server", ["redis"], indirect=True)  # one server kind is enough here
def test_flow_control_in_a_real_browser(redis_url: str, chromium: str, shots: Path) -> None:
    fill_flow(redis_url)
    with (
        Queue(QUEUE, redis_url) as queue,
        serving(redis_url) as base,
        sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = signed_in_page(browser, base, TOKEN)
            expect(page.locator(f"#queue-{QUEUE} [data-flow-line]")).to_contain_text(
                "6 due waiting, 11 running"
            )
            page.click(f"#queue-{QUEUE} [data-flow-line] a")
            look(page, shots)
            change(page, queue)
        finally:
            browser.close()
    publish(shots)


def look(page: Page, shots: Path) -> None:
    expect(page.locator("#flow-control")).to_be_visible()
    expect(page.locator('[data-limit="cap"]')).to_have_text("40 running at once")
    acme = page.locator('tr[data-key="acme"]')
    expect(acme.locator('[data-col="running"]')).to_have_text("3 / 3")
    expect(page.locator('tr[data-key="bulk-import"] [data-col="turn"]')).to_have_text("rate limit")
    # The long key: cut to its cell, whole in the tooltip, and the page does not scroll
    # sideways at 1280 px.
    long_cell = page.locator(f'tr[data-key="{LONG_KEY}"] td.limit-key')
    expect(long_cell.locator("a")).to_have_attribute("title", LONG_KEY)
    assert long_cell.evaluate("cell => cell.scrollWidth > cell.clientWidth")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    shoot(page, shots, "flow", full_page=True)


def change(page: Page, queue: Queue) -> None:
    # Edit a key from its row: the key form is filled in with it.
    page.locator('tr[data-key="globex"] td.limit-key a').click()
    form = page.locator("#key-form")
    expect(form.locator("input[name=key]")).to_have_value("globex")
    form.locator("input[name=concurrency]").fill("4")
    form.locator("input[name=rate]").fill("30/min")
    form.locator('[data-action="set-key-limits"]').click()
    expect(page.locator(".notice")).to_have_text(
        "Limit key 'globex' now has concurrency 4, rate 30/min."
    )
    limits = queue.limits()
    assert limits is not None and limits.keys["globex"] == KeyLimits(4, Rate(30, 60.0))
    expect(page.locator('tr[data-override="globex"]')).to_be_visible()

    # Bad input: said on the page, nothing written.
    page.locator("#queue-form input[name=cap]").fill("0")
    page.locator('[data-action="set-queue-limits"]').click()
    expect(page.locator(".notice.error")).to_contain_text(
        "Nothing changed: cap must be an integer from 1 to 1000000, got 0"
    )
    assert queue.limits() == limits

    page.locator("#queue-form input[name=cap]").fill("25")
    page.locator('[data-action="set-queue-limits"]').click()
    expect(page.locator('[data-limit="cap"]')).to_have_text("25 running at once")
    assert queue.limits() == Limits(25, limits.rate, limits.each_key, limits.keys)
