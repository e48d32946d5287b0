"""Search, bulk actions and the viewer role in a real headless Chromium (Debian's
/usr/bin/chromium, driven by Playwright) at 1280 px: an operator finds tasks by a field
of their data, ticks two and runs them now, then cancels every match not started after
the confirmation page; a viewer signed in with the viewer token sees the same results
with no box to tick and no button that acts, and the server refuses the viewer's POST.
Screenshots: search.png and search-viewer.png (see test_dashboard_browser)."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from duetime import Job, Queue, TaskSearch
from duetime.states import TaskState
from tests.browser.conftest import CHROMIUM_ARGS, publish, settled_box
from tests.browser.test_dashboard_browser import QUEUE, TOKEN, serving, shoot
from tests.helpers import FAST

VIEWER_TOKEN = "browser-viewer-token-0123456789"
WIDTH = 1280
SEARCH = f"/q/{QUEUE}/search"


def fill(queue: Queue) -> None:
    """600 scheduled orders (more than a hash keeps compact: the walk takes pages), a
    third of them for customer acme; and one ready order of acme's."""
    customers = ("acme", "globex", "initech")
    queue.schedule_many(
        Job({"customer": customers[n % 3], "order": 1000 + n, "total": n * 3.5},
            delay=3600 + n * 60, id=f"order-{1000 + n}", task="send_invoice")
        for n in range(600)
    )  # fmt: skip
    queue.schedule_now({"customer": "acme", "order": 999}, id="order-999", task="send_invoice")


def sign_in(page: Page, base: str, token: str) -> None:
    page.goto(f"{base}/login")
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    expect(page.locator("main h1")).to_be_visible()


def search_acme(page: Page, base: str) -> None:
    page.goto(base + SEARCH)
    page.fill("input[name=field]", "customer")
    page.fill("input[name=value]", "acme")
    page.click('[data-action="search"]')
    # A view keeps to its 200 matches (the first in id order), and offers to go on.
    expect(page.locator("[data-summary]")).to_contain_text("200 matches among the 601 tasks")
    expect(page.locator('[data-action="search-further"]')).to_be_visible()


@pytest.mark.parametrize("server", ["redis"], indirect=True)  # one server kind is enough here
def test_search_bulk_actions_and_the_viewer_role_in_a_browser(
    redis_url: str, chromium: str, shots: Path
) -> None:
    with (
        Queue(QUEUE, redis_url, settings=FAST) as queue,
        serving(redis_url, viewer_token=VIEWER_TOKEN) as base,
        sync_playwright() as playwright,
    ):
        fill(queue)
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": WIDTH, "height": 900})
            page = context.new_page()
            page.on("dialog", lambda dialog: dialog.accept())
            sign_in(page, base, TOKEN)
            search_acme(page, base)
            rows = page.locator("tbody tr")
            expect(rows).to_have_count(200)
            for action in ("run-now-selected", "reschedule-selected", "cancel-selected"):
                button = page.locator(f'[data-action="{action}"]')
                expect(button).to_be_in_viewport()
                box = settled_box(button)
                assert box is not None and box["x"] + box["width"] <= WIDTH, (action, box)
            shoot(page, shots, "search", full_page=False)

            page.check('tr[data-task="order-1000"] input[name=ids]')
            page.check('tr[data-task="order-1003"] input[name=ids]')
            page.click('[data-action="run-now-selected"]')
            expect(page.locator(".notice")).to_contain_text("Made due now 2.")
            for task_id in ("order-1000", "order-1003"):
                status = queue.status(task_id)
                assert status is not None and status.state == TaskState.READY
                badge = page.locator(f'tr[data-task="{task_id}"] .badge')
                expect(badge).to_have_text("ready")
                # A ready task has a box too: every task that has not started is chosen.
                tick = page.locator(f'tr[data-task="{task_id}"] input[name=ids]')
                expect(tick).to_have_count(1)

            page.click('[data-action="matching-cancel"]')  # every match not started
            expect(page.locator('[data-count="matching"]')).to_have_text("201")
            page.click('[data-action="confirm-cancel"]')
            expect(page.locator(".notice")).to_contain_text("201 matched: 201 cancelled.")
            acme = TaskSearch(data_field="customer", data_value="acme")
            assert queue.search(acme).tasks == []
            assert (queue.stats().scheduled, queue.stats().ready) == (400, 0)
            context.close()

            viewer = browser.new_context(viewport={"width": WIDTH, "height": 900})
            page = viewer.new_page()
            sign_in(page, base, VIEWER_TOKEN)
            expect(page.locator('[data-role="viewer"]')).to_be_visible()
            expect(page.locator('[data-action="pause-queue"]')).to_have_count(0)
            page.goto(f"{base}{SEARCH}?field=customer&value=globex&state=scheduled")
            expect(page.locator("tbody tr")).to_have_count(200)
            expect(page.locator("input[name=ids]")).to_have_count(0)
            expect(page.locator('[data-action="run-now-selected"]')).to_have_count(0)
            expect(page.locator('[data-action="matching-cancel"]')).to_have_count(0)
            shoot(page, shots, "search-viewer", full_page=False)
            refused = page.evaluate(
                """async () => {
                    const session = await (await fetch("/api/session")).json();
                    const answer = await fetch("/api/q/emails/pause", {
                        method: "POST", body: "{}",
                        headers: {"content-type": "application/json",
                                  "x-duetime-csrf": session.csrf},
                    });
                    return [session.role, answer.status];
                }"""
            )
            assert refused == ["viewer", 403]
            assert not queue.is_paused()
            viewer.close()
        finally:
            browser.close()
    publish(shots)
