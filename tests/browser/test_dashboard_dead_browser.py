"""The dead-letter page at real sizes, in a real headless Chromium (Debian's
/usr/bin/chromium, driven by Playwright): with a long id and a long error, each row's
Requeue and Delete buttons stay in view at 1280, 1400 and 1920 px, and the long texts
are whole on hover."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from playwright.sync_api import expect, sync_playwright

from duetime import Job, Queue, codec
from duetime.codec import ErrorRecord
from duetime.store.plans.keys import QueueKeys
from tests.browser.conftest import CHROMIUM_ARGS, settled_box
from tests.browser.test_dashboard_browser import QUEUE, TOKEN, serving

LONG_ID = "invoice-" + "x" * 190  # 198 characters, near the 200 an id may have
LONG_ERROR = "ValueError: " + "/very/long/path/segment" * 8 + " " + "detail " * 20


def make_dead(redis_url: str) -> None:
    """Two dead tasks, one with a long id, both with a long error: scheduled, then moved
    to dead with an error record as a failed last attempt leaves them."""
    with Queue(QUEUE, redis_url) as queue:
        ids = queue.schedule_many(
            [Job({"n": 1}, delay=3600, id=LONG_ID), Job({"n": 2}, delay=3600, id="short-id")]
        )
    keys = QueueKeys(QUEUE)
    raw: Any = redis.Redis.from_url(redis_url)
    try:
        for task_id in ids:
            for bucket in raw.zrange(keys.delayed, 0, -1):
                raw.zrem(keys.delayed_bucket(bucket.decode()), task_id)
            raw.zadd(keys.dead, {task_id: 1_790_000_000_000})
            record = ErrorRecord(LONG_ERROR, "Traceback ...", 3, 1_790_000_000_000, "web-1")
            raw.hset(keys.errors, task_id, codec.encode_error(record))
        raw.delete(keys.delayed, keys.delayed_layout)  # no delayed task is left
    finally:
        raw.close()


@pytest.mark.parametrize("server", ["redis"], indirect=True)  # one server kind is enough here
def test_the_dead_pages_actions_stay_in_view_with_long_ids_and_errors(
    redis_url: str, chromium: str
) -> None:
    make_dead(redis_url)
    with serving(redis_url) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            for width in (1280, 1400, 1920):
                context = browser.new_context(viewport={"width": width, "height": 900})
                page = context.new_page()
                page.goto(f"{base}/login")
                page.fill("input[name=token]", TOKEN)
                page.click("button[type=submit]")
                page.goto(f"{base}/q/{QUEUE}/dead")
                rows = page.locator("tbody tr")
                expect(rows).to_have_count(2)
                for n in range(2):
                    for action in ("requeue-one", "delete-one"):
                        button = rows.nth(n).locator(f'[data-action="{action}"]')
                        expect(button).to_be_in_viewport()
                        box = settled_box(button)
                        assert box is not None and box["x"] + box["width"] <= width, (width, box)
                link = page.locator(f'a.id[title="{LONG_ID}"]')
                expect(link).to_have_text(LONG_ID)
                error = rows.first.locator("td.error-text")
                assert error.get_attribute("title") == LONG_ERROR
                context.close()
        finally:
            browser.close()
