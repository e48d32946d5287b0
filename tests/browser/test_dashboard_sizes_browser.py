"""The listings at real sizes (#41, points 14 and 16), in a real headless Chromium
(Debian's /usr/bin/chromium, driven by Playwright). On a phone (390 px) every id is on
one line, the page never scrolls sideways and every link of the navigation is in view.
At 1280 and 1920 px an id is on one line whatever the other columns hold, the table
takes the page's width and Data the width the other columns leave.

Screenshots: dead-phone.png, finished-phone.png (see test_dashboard_browser)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from duetime import ManualClock, Queue, codec
from duetime.codec import ErrorRecord
from tests.browser.conftest import CHROMIUM_ARGS, publish, settled_box, signed_in_page
from tests.browser.test_dashboard_browser import OTHER_QUEUE, QUEUE, TOKEN, serving, shoot

NOW_MS = int(time.time() * 1000)
ERROR = "ConnectionError: the mail relay at smtp.example.com:587 refused the connection"
DATA = {"to": "someone@example.com", "template": "reminder", "order": 18_230}
CRON_ID = f"cron:nightly-cleanup:{NOW_MS - 3_600_000}"  # a cron tick's id: 39 characters


def fill(redis_url: str) -> list[str]:
    """Nine tasks that ran once and died (with an error; eight with generated ids, one a
    cron tick), so each is on the Dead page and in the Finished attempts; returns the ids."""
    clock = ManualClock(NOW_MS - 60_000)
    with Queue(QUEUE, redis_url, clock=clock) as queue, Queue(OTHER_QUEUE, redis_url):
        ids = [queue.schedule_now(DATA, task="send_email", max_attempts=1) for _ in range(8)]
        ids.append(queue.schedule_now(DATA, id=CRON_ID, task="send_email", max_attempts=1))
        ops, run = queue.core.queue.operations, queue.runner.run
        claimed = run(ops.worker.claim("web-1.4117", 60_000, len(ids))) or []
        assert len(claimed) == len(ids)
        clock.advance(1)
        for task in claimed:
            record = codec.encode_error(ErrorRecord(ERROR, "Traceback ...", 1, 0, "web-1.4117"))
            run(
                ops.worker.fail(
                    "web-1.4117", task.task_id, task.attempt, record, None, ran=(900, 0),
                    summary=ERROR,
                )
            )  # fmt: skip
    return ids


def line_height(page: Page, selector: str) -> float:
    """One line of the element's text, in px (its computed line height)."""
    value = page.eval_on_selector(
        selector,
        "e => { const s = getComputedStyle(e); return s.lineHeight === 'normal'"
        " ? parseFloat(s.fontSize) * 1.3 : parseFloat(s.lineHeight); }",
    )
    return float(value)


def ids_on_one_line(page: Page, ids: list[str]) -> None:
    links = page.locator("tbody a.id")
    expect(links).to_have_count(len(ids))
    assert sorted(links.all_inner_texts()) == sorted(ids)
    one_line = line_height(page, "tbody a.id")
    for n in range(len(ids)):
        box = settled_box(links.nth(n))
        assert box["height"] < 1.5 * one_line, (links.nth(n).inner_text(), box, one_line)


def no_sideways_scroll(page: Page, width: int) -> None:
    scroll_width = page.evaluate("document.documentElement.scrollWidth")
    assert scroll_width <= width, f"{page.url}: the page is {scroll_width} px wide"


def open_page(page: Page, base: str, path: str) -> None:
    page.goto(base + path)
    expect(page.locator("tbody tr").first).to_be_visible()


def phone(browser: Browser, base: str, ids: list[str], shots: Path) -> None:
    width = 390
    page = signed_in_page(browser, base, TOKEN)
    page.set_viewport_size({"width": width, "height": 844})
    for path, name in (
        (f"/q/{QUEUE}/dead", "dead-phone"),
        (f"/q/{QUEUE}/finished", "finished-phone"),
    ):
        open_page(page, base, path)
        # After a live refresh (the cards are built again), each cell still has its label.
        expect(page.locator("[data-live-status]")).to_contain_text("updated")
        error = page.locator("tbody td.error-text").first
        expect(error).to_have_attribute("data-label", "Error")
        ids_on_one_line(page, ids)
        no_sideways_scroll(page, width)
        # Every link of the navigation in view: the page's links and the queues'.
        for link in page.locator("header nav a").all():
            box = settled_box(link)
            assert box["x"] >= 0 and box["x"] + box["width"] <= width, (link.inner_text(), box)
        # A dead task's error and its buttons are on its card, in view.
        if name == "dead-phone":
            card = page.locator("tbody tr").first
            expect(error).to_contain_text("ConnectionError")
            for action in ("requeue-one", "delete-one"):
                box = settled_box(card.locator(f'[data-action="{action}"]'))
                assert box["x"] + box["width"] <= width, (action, box)
        shoot(page, shots, name)
    page.context.close()


def desktop(browser: Browser, base: str, ids: list[str], shots: Path) -> None:
    for width in (1280, 1920):
        page = signed_in_page(browser, base, TOKEN)
        page.set_viewport_size({"width": width, "height": 900})
        for path in (f"/q/{QUEUE}/dead", f"/q/{QUEUE}/finished"):
            open_page(page, base, path)
            ids_on_one_line(page, ids)
            no_sideways_scroll(page, width)
            # The table takes the page's width (the cards' padding aside).
            table = settled_box(page.locator("main table").first)
            assert table["x"] + table["width"] > width - 80, (path, width, table)
        # Data gets the width the other columns leave: the whole of this one, at 1920.
        open_page(page, base, f"/q/{QUEUE}/dead")
        data = page.locator("tbody td.wide").first
        if width == 1920:
            assert not data.evaluate("e => e.scrollWidth > e.clientWidth"), "Data cut at 1920"
            assert settled_box(data)["width"] > width / 4, settled_box(data)
        page.context.close()


@pytest.mark.parametrize("server", ["redis"], indirect=True)  # one server kind is enough here
def test_listings_at_phone_and_desktop_sizes(redis_url: str, chromium: str, shots: Path) -> None:
    ids = fill(redis_url)
    with serving(redis_url) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            phone(browser, base, ids, shots)
            desktop(browser, base, ids, shots)
        finally:
            browser.close()
    publish(shots)
