"""The dashboard in a real headless Chromium (Debian's /usr/bin/chromium, driven by
Playwright): sign-in, live refresh without a reload, requeueing a dead task and pausing
and resuming a cron job by clicking, refusal without credentials, and a screenshot of
every page (desktop, and the overview on a phone-size screen).

Screenshots go to $DUETIME_ARTIFACTS/dashboard (else the test's tmp_path); with
DUETIME_UPDATE_SCREENSHOTS=1 they are also copied to docs/screenshots/. Without the
browser the test skips locally and fails in CI. It never downloads a browser: the
machine's network is closed.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from playwright.sync_api import Browser, Page, expect, sync_playwright

from duetime import App, Dispatcher, Job, ManualClock, Queue, Worker
from duetime.dashboard import create_app
from tests.browser.conftest import CHROMIUM_ARGS, publish
from tests.helpers import FAST, wait_until_sync

TOKEN = "browser-test-token-0123456789abcdef"
QUEUE = "emails"
OTHER_QUEUE = "reports"


def fail(data: Any) -> None:
    raise ValueError(f"image {data['image']} is not a PNG (got {data['kind']!r})")


@contextmanager
def daemons(*made: Dispatcher | Worker) -> Iterator[None]:
    """Daemons on one event loop in a thread, stopped gracefully on exit."""
    loop = asyncio.new_event_loop()

    async def run_all() -> None:
        await asyncio.gather(*(daemon.run() for daemon in made))

    thread = threading.Thread(target=loop.run_until_complete, args=(run_all(),))
    thread.start()
    try:
        yield
    finally:
        for daemon in made:
            loop.call_soon_threadsafe(daemon.stop)
        thread.join(20)
        loop.close()


def fill_history(redis_url: str, minutes: int = 40) -> None:
    """Completed and dead attempts in each of the last ``minutes`` minutes, so that the
    throughput chart has a history: a worker on a ManualClock (a supported test clock)
    runs each minute's tasks at that minute."""
    now_ms = int(time.time() * 1000)
    clock = ManualClock(now_ms - minutes * 60_000)
    app = App.coerce({"send_email": lambda data: None, "resize_image": fail})
    worker = Worker(app, QUEUE, redis_url, settings=FAST, clock=clock, worker_id="history")
    with Queue(QUEUE, redis_url, settings=FAST, clock=clock) as queue, daemons(worker):

        def finished() -> int:
            counters = queue.stats().counters
            return counters.get("completed", 0) + counters.get("dead", 0)

        def reaches(expected: int) -> Callable[[], bool]:
            return lambda: finished() == expected

        for minute in range(minutes):
            count = 6 + (minute * 7) % 11
            start = clock.now_ms() or 0
            jobs = [  # a few milliseconds late, as a busy queue is
                Job({"to": f"user{n}@example.com"}, at=(start - 1 - n % 7) / 1000)
                for n in range(count)
            ]
            jobs = [replace(job, task="send_email") for job in jobs]
            if minute % 9 == 4:  # now and then, one that dies
                data = {"image": f"upload-{minute}.png", "kind": "gif"}
                jobs.append(Job(data, at=start / 1000, task="resize_image", max_attempts=1))
            expected = finished() + len(jobs)
            queue.schedule_many(jobs)
            wait_until_sync(reaches(expected), what="the minute's tasks")
            clock.advance(60)


@contextmanager
def serving(redis_url: str, **options: Any) -> Iterator[str]:
    """The dashboard under uvicorn on a free loopback port, in a thread (``options``
    for ``create_app``, such as a viewer's token)."""
    app = create_app(
        [QUEUE, OTHER_QUEUE], redis_url, settings=FAST, token=TOKEN, refresh_seconds=1.0,
        **options,
    )  # fmt: skip
    config = uvicorn.Config(app, log_level="warning", ws="none", http="h11", lifespan="on")
    server = uvicorn.Server(config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        wait_until_sync(lambda: server.started, what="uvicorn to start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def shoot(page: Page, directory: Path, name: str, full_page: bool = True) -> None:
    page.screenshot(path=str(directory / f"{name}.png"), full_page=full_page)


@pytest.mark.parametrize("server", ["redis"], indirect=True)  # one server kind is enough here
def test_the_dashboard_in_a_real_browser(redis_url: str, chromium: str, shots: Path) -> None:
    fill_history(redis_url)
    gate = threading.Event()
    app = App.coerce(
        {
            "send_email": lambda data: None,
            "resize_image": fail,
            "generate_report": lambda data: gate.wait(30),
        }
    )
    workers = [
        Worker(app, QUEUE, redis_url, settings=FAST, concurrency=4, worker_id=f"web-{n}.4{n}17")
        for n in (1, 2)
    ]
    dispatcher = Dispatcher([QUEUE, OTHER_QUEUE], redis_url, settings=FAST)
    with (
        Queue(QUEUE, redis_url, settings=FAST) as queue,
        Queue(OTHER_QUEUE, redis_url, settings=FAST) as reports,
        daemons(dispatcher, *workers),
        serving(redis_url) as base,
        sync_playwright() as playwright,
    ):
        try:
            dead_id = fill_queues(queue, reports)
            browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                walk_through(browser, base, queue, dead_id, shots)
            finally:
                browser.close()
        finally:
            gate.set()
    publish(shots)


def fill_queues(queue: Queue, reports: Queue) -> str:
    """Running, dead, scheduled tasks and cron jobs in "emails" (served by the running
    workers), a paused "reports"; returns the id of a task that died."""
    now = time.time()
    for n in range(3):
        data = {"report": f"monthly-{n + 1}", "format": "pdf"}
        queue.schedule_now(data, task="generate_report")
    hostile = {"image": "avatar-7.png", "kind": "<svg onload=alert(1)>"}
    dead_id = queue.schedule_now(hostile, task="resize_image", max_attempts=1)
    soon = [
        Job({"to": f"user{n}@example.com", "template": "reminder"}, at=now + 40 + n * n * 9)
        for n in range(28)
    ]
    later = [
        Job({"to": f"team{n}@example.com", "template": "digest"}, at=now + 3600 + n * 2400)
        for n in range(20)
    ]
    queue.schedule_many([replace(job, task="send_email") for job in soon + later])
    queue.add_cron(
        "digest", "*/15 * * * *", {"template": "digest"}, tz="Europe/Paris", task="send_email",
        overlap="skip",
    )  # fmt: skip
    queue.add_cron(
        "nightly-cleanup", "30 2 * * *", {"older_than_days": 30}, tz="America/New_York",
        task="send_email",
    )  # fmt: skip
    reports.add_cron("weekly", "0 8 * * 1", {"kind": "weekly"}, tz="Europe/Paris")
    reports.schedule_many(Job({"n": n}, at=now + 300 * n) for n in range(1, 6))
    reports.pause()

    def died() -> bool:
        status = queue.status(dead_id)
        return status is not None and status.state == "dead"

    wait_until_sync(lambda: queue.stats().running == 3, what="three reports running")
    wait_until_sync(died, what="the task that fails to die")
    return dead_id


def walk_through(browser: Browser, base: str, queue: Queue, dead_id: str, shots: Path) -> None:
    context = browser.new_context(
        viewport={"width": 1280, "height": 860}, timezone_id="Europe/Berlin", locale="en-GB"
    )
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())

    # Without credentials: 401 and the sign-in form, and no queue named.
    refused = page.goto(f"{base}/")
    assert refused is not None and refused.status == 401
    expect(page.locator("input[name=token]")).to_be_visible()
    assert QUEUE not in page.content()
    shoot(page, shots, "login", full_page=False)
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    expect(page.locator(f"#queue-{QUEUE}")).to_be_visible()

    # Live refresh: a task scheduled through the API shows up without a reload.
    page.evaluate("window.__sameDocument = true")
    scheduled = page.locator(f'#queue-{QUEUE} [data-count="scheduled"]')
    queue.schedule_in(900, {"to": "late@example.com"}, task="send_email")
    expect(scheduled).to_have_text(f"{queue.stats().scheduled:,}", timeout=10_000)
    assert page.evaluate("window.__sameDocument") is True
    expect(page.locator("[data-live-status]")).to_contain_text("updated")
    shoot(page, shots, "overview")

    phone = context.new_page()
    phone.set_viewport_size({"width": 390, "height": 844})
    phone.goto(f"{base}/")
    expect(phone.locator(f"#queue-{QUEUE}")).to_be_visible()
    shoot(phone, shots, "overview-phone")
    phone.close()

    page.emulate_media(color_scheme="dark")
    shoot(page, shots, "overview-dark", full_page=False)
    page.emulate_media(color_scheme="light")

    for path, name in (  # long listings: the first screenful is enough to see
        (f"/q/{QUEUE}/timeline", "timeline"),
        (f"/q/{QUEUE}/tasks?state=scheduled", "tasks"),
        (f"/q/{QUEUE}/running", "running"),
        (f"/q/{QUEUE}/task?id={dead_id}", "task"),
        ("/workers", "workers"),
    ):
        page.goto(base + path)
        expect(page.locator("main h1")).to_be_visible()
        shoot(page, shots, name, full_page=False)
    expect(page.locator("main")).to_contain_text("web-1.4117")

    # Requeue a dead task by clicking its row's button.
    page.goto(f"{base}/q/{QUEUE}/dead")
    shoot(page, shots, "dead")
    requeued_before = queue.stats().counters.get("requeued", 0)
    page.click(f'button[name="requeue_one"][value="{dead_id}"]')
    expect(page.locator(".notice")).to_contain_text("Requeued 1 dead task.")
    assert queue.stats().counters.get("requeued", 0) == requeued_before + 1

    # Pause and resume a cron job by clicking.
    page.goto(f"{base}/q/{QUEUE}/cron")
    job = page.locator('[data-cron="digest"]')
    job.locator('[data-action="pause-cron"]').click()
    expect(page.locator(".notice")).to_contain_text("Paused cron job digest")
    assert next(j for j in queue.list_cron() if j.name == "digest").paused
    expect(job.locator(".badge").first).to_have_text("paused")  # the state; then its last run's
    job.locator('[data-action="resume-cron"]').click()
    expect(page.locator(".notice")).to_contain_text("Resumed cron job digest")
    assert not next(j for j in queue.list_cron() if j.name == "digest").paused
    shoot(page, shots, "cron")

    # A second browser with no session is refused, page and fragment alike.
    stranger = browser.new_context()
    answer = stranger.request.get(f"{base}/q/{QUEUE}/dead")
    assert answer.status == 401
    fragment = stranger.request.get(f"{base}/", headers={"X-Duetime-Fragment": "live"})
    assert fragment.status == 401
    stranger.close()
    context.close()
