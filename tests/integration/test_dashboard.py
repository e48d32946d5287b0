"""The web dashboard on a real server, through Starlette's TestClient: every page renders
real data, every action changes the queue as the library would (checked with the Queue
API), and the security model holds: credentials (401), CSRF and origin (403), POST-only
actions (405), the bind-address check, loopback-only hosts without auth, escaping of
hostile task data, and the security headers."""

from __future__ import annotations

import asyncio
import base64
import re
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.exceptions import StarletteDeprecationWarning

with warnings.catch_warnings():
    # Starlette 1.10 asks for httpx2 and warns when its TestClient falls back to httpx,
    # which is what the dev extra installs.
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

from duetime import App, Queue, Worker
from duetime.dashboard import create_app, serve
from duetime.errors import ConfigurationError
from duetime.states import TaskState
from tests.helpers import FAST, wait_until_sync

HOSTILE = "<script>alert('owned')</script>"
TOKEN = "a-long-enough-test-token-0123456789"
ORIGIN = {"origin": "http://127.0.0.1"}


def fail(data: Any) -> None:
    raise ValueError(f"disk full <{data['n']}>")


@contextmanager
def worker_thread(app: App, queue_name: str, redis_url: str) -> Iterator[Worker]:
    """A worker on its own event loop in a thread, stopped (gracefully) on exit."""
    loop = asyncio.new_event_loop()
    worker = Worker(app, queue_name, redis_url, settings=FAST, concurrency=4)
    thread = threading.Thread(target=loop.run_until_complete, args=(worker.run(),))
    thread.start()
    try:
        yield worker
    finally:
        loop.call_soon_threadsafe(worker.stop)
        thread.join(20)
        loop.close()


@dataclass
class Scene:
    queue: Queue
    scheduled: list[str]
    ready: list[str]
    dead: list[str]
    hostile: str  # a scheduled task with hostile data


@pytest.fixture
def scene(redis_url: str, queue_name: str) -> Iterator[Scene]:
    """Three dead tasks (two of handler "resize"), three scheduled ones (one with hostile
    data), two ready ones, and a cron job with hostile data."""
    with Queue(queue_name, redis_url, settings=FAST) as queue:
        app = App.coerce({"resize": fail, "render": fail})
        with worker_thread(app, queue_name, redis_url):
            dead = [queue.schedule_now({"n": n}, task="resize", max_attempts=1) for n in (1, 2)]
            dead.append(queue.schedule_now({"n": 3}, task="render", max_attempts=1))
            wait_until_sync(lambda: queue.stats().dead == 3, what="three dead tasks")
        now = time.time()
        hostile = queue.schedule_task(now + 600, {"html": HOSTILE}, task="send_email")
        scheduled = [
            hostile,
            queue.schedule_task(now + 1200, {"to": "a@example.com"}, task="send_email"),
            queue.schedule_task(now + 7200, {"to": "b@example.com"}, task="report"),
        ]
        ready = [queue.schedule_now({"n": n}, task="send_email") for n in (1, 2)]
        queue.add_cron("nightly", "0 3 * * *", {"html": HOSTILE}, tz="Europe/Paris", task="report")
        yield Scene(queue, scheduled, ready, dead, hostile)


@contextmanager
def dashboard(redis_url: str, queue_name: str, **options: Any) -> Iterator[TestClient]:
    app = create_app([queue_name], redis_url, settings=FAST, **options)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield client


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def post(client: TestClient, page: str, url: str, data: dict[str, Any]) -> httpx.Response:
    """Submit a form the way a browser does: token from the page, Origin set."""
    token = csrf_of(client.get(page).text)
    response: httpx.Response = client.post(url, data={"csrf": token, **data}, headers=ORIGIN)
    return response


def test_every_page_renders_real_data(redis_url: str, queue_name: str, scene: Scene) -> None:
    q = f"/q/{queue_name}"
    with dashboard(redis_url, queue_name) as client:
        overview = client.get("/")
        assert overview.status_code == 200
        assert queue_name in overview.text and 'data-count="dead">3<' in overview.text
        assert 'data-count="scheduled">3<' in overview.text and "<svg" in overview.text
        headers = overview.headers
        assert "script-src 'self'" in headers["content-security-policy"]
        assert "unsafe-inline" not in headers["content-security-policy"]
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["cache-control"] == "no-store"

        hour = client.get(f"{q}/timeline").text
        assert "Due in the next hour" in hour and scene.hostile in hour
        assert scene.scheduled[2] not in hour  # due in two hours
        assert scene.scheduled[2] in client.get(f"{q}/timeline?window=day").text

        for state, ids in (("scheduled", scene.scheduled), ("ready", scene.ready)):
            listing = client.get(f"{q}/tasks?state={state}").text
            assert all(task_id in listing for task_id in ids), state
        dead_listing = client.get(f"{q}/tasks?state=dead&error=DISK+FULL&task=resize").text
        assert "2 of the 3 dead tasks searched match" in dead_listing
        assert scene.dead[0] in dead_listing and scene.dead[2] not in dead_listing
        prefix = client.get(f"{q}/tasks?state=scheduled&id={scene.scheduled[1][:6]}").text
        assert scene.scheduled[1] in prefix

        task_page = client.get(f"{q}/task?id={scene.dead[0]}").text
        assert "disk full &lt;1&gt;" in task_page and "Traceback" in task_page
        assert 'name="requeue_one"' in task_page and "run-now" not in task_page
        scheduled_page = client.get(f"{q}/task", params={"id": scene.scheduled[1]}).text
        assert "a@example.com" in scheduled_page and "/task/run-now" in scheduled_page
        assert client.get(f"{q}/task?id=nosuchtask").status_code == 404
        assert client.get("/q/otherqueue/tasks").status_code == 404

        dead = client.get(f"{q}/dead").text
        assert all(task_id in dead for task_id in scene.dead) and 'name="ids"' in dead
        filtered = client.get(f"{q}/dead?task=render&since=1h").text
        assert scene.dead[2] in filtered and scene.dead[0] not in filtered
        assert "Died after" in client.get(f"{q}/dead?since=yesterday").text  # an error, shown
        confirm = client.get(f"{q}/dead/confirm?action=delete&task=resize").text
        assert "matches <strong>2</strong>" in confirm

        cron = client.get(f"{q}/cron").text
        assert "nightly" in cron and "Europe/Paris" in cron and "03:00:00 CE" in cron
        assert "Running" in client.get(f"{q}/running").text
        assert "No worker is registered" in client.get("/workers").text


def test_a_live_fragment_is_the_live_block_only(
    redis_url: str, queue_name: str, scene: Scene
) -> None:
    with dashboard(redis_url, queue_name) as client:
        fragment = client.get("/", headers={"x-duetime-fragment": "live"})
        assert fragment.status_code == 200 and "<html" not in fragment.text
        assert 'data-count="ready">2<' in fragment.text
        scene.queue.schedule_now({"n": 3})
        fragment = client.get("/", headers={"x-duetime-fragment": "live"})
        assert 'data-count="ready">3<' in fragment.text


def test_running_tasks_show_their_worker_and_heartbeat(redis_url: str, queue_name: str) -> None:
    gate = threading.Event()
    app = App.coerce({"hold": lambda data: gate.wait(10)})
    with (
        Queue(queue_name, redis_url, settings=FAST) as queue,
        dashboard(redis_url, queue_name) as client,
        worker_thread(app, queue_name, redis_url) as worker,
    ):
        try:
            task_id = queue.schedule_now({"n": 1}, task="hold")
            wait_until_sync(lambda: queue.stats().running == 1, what="the task running")
            running = client.get(f"/q/{queue_name}/running").text
            assert task_id in running and worker.worker_id in running and " ago" in running
            task_page = client.get(f"/q/{queue_name}/task?id={task_id}").text
            assert worker.worker_id in task_page and "Lease until" in task_page
            workers = client.get("/workers").text
            assert worker.worker_id in workers and "alive" in workers
        finally:
            gate.set()


def test_task_and_queue_actions(redis_url: str, queue_name: str, scene: Scene) -> None:
    queue, q = scene.queue, f"/q/{queue_name}"
    with dashboard(redis_url, queue_name) as client:
        task_page = f"{q}/task?id={scene.scheduled[1]}"
        done = post(client, task_page, f"{q}/task/run-now", {"id": scene.scheduled[1]})
        assert done.status_code == 200 and "is due now" in done.text
        status = queue.status(scene.scheduled[1])
        assert status is not None and status.state == TaskState.READY

        done = post(client, task_page, f"{q}/task/cancel", {"id": scene.scheduled[2]})
        assert "Cancelled task" in done.text and queue.status(scene.scheduled[2]) is None
        # The task page refuses what does not apply, with the library's reason.
        done = post(client, task_page, f"{q}/task/run-now", {"id": scene.ready[0]})
        assert "only a waiting task can be run now" in done.text

        post(client, "/", f"{q}/pause", {"back": "/"})
        assert queue.is_paused()
        assert "paused</span>" in client.get("/").text
        post(client, "/", f"{q}/resume", {"back": "/"})
        assert not queue.is_paused()
        assert queue.check() == []


def test_dead_task_actions(redis_url: str, queue_name: str, scene: Scene) -> None:
    queue, q = scene.queue, f"/q/{queue_name}"
    dead_page = f"{q}/dead"
    with dashboard(redis_url, queue_name) as client:
        done = post(client, dead_page, dead_page, {"requeue_one": scene.dead[0]})
        assert "Requeued 1 dead task." in done.text
        assert queue.stats().dead == 2 and queue.stats().ready == 3

        done = post(client, dead_page, dead_page, {"selected": "delete", "ids": [scene.dead[1]]})
        assert "Deleted 1 dead task." in done.text and queue.status(scene.dead[1]) is None
        done = post(client, dead_page, dead_page, {"selected": "delete"})
        assert "No task selected" in done.text

        confirm = f"{dead_page}/confirm?action=requeue&error=full+%3C3"
        form = {"action": "requeue", "task": "", "error": "full <3", "since": "", "until": ""}
        done = post(client, confirm, f"{dead_page}/matching", form)
        assert "Requeued 1 dead task." in done.text and queue.stats().dead == 0
        assert {entry.id for entry in queue.tasks("ready", 10)} >= {scene.dead[0], scene.dead[2]}
        assert queue.check() == []


def test_cron_actions(redis_url: str, queue_name: str, scene: Scene) -> None:
    queue, page = scene.queue, f"/q/{queue_name}/cron"
    with dashboard(redis_url, queue_name) as client:
        post(client, page, f"{page}/pause", {"name": "nightly"})
        assert queue.list_cron()[0].paused
        assert "none while paused" in client.get(page).text
        post(client, page, f"{page}/resume", {"name": "nightly"})
        assert not queue.list_cron()[0].paused

        ready_before = {entry.id for entry in queue.tasks("ready", 100)}
        done = post(client, page, f"{page}/trigger", {"name": "nightly"})
        assert "Triggered nightly" in done.text
        (triggered,) = [e for e in queue.tasks("ready", 100) if e.id not in ready_before]
        assert (triggered.task, triggered.data) == ("report", {"html": HOSTILE})
        done = post(client, page, f"{page}/pause", {"name": "nosuchjob"})
        assert "no cron job" in done.text


def test_state_changes_need_post_csrf_and_the_same_origin(
    redis_url: str, queue_name: str, scene: Scene
) -> None:
    queue, q = scene.queue, f"/q/{queue_name}"
    with dashboard(redis_url, queue_name) as client:
        assert client.get(f"{q}/pause").status_code == 405
        assert client.get(f"{q}/dead/matching?action=delete").status_code == 405
        no_token = client.post(f"{q}/pause", data={}, headers=ORIGIN)
        assert no_token.status_code == 403 and "CSRF" in no_token.text
        wrong = client.post(f"{q}/pause", data={"csrf": "forged"}, headers=ORIGIN)
        assert wrong.status_code == 403
        token = csrf_of(client.get("/").text)
        elsewhere = {"origin": "https://evil.example"}
        cross_site = client.post(f"{q}/pause", data={"csrf": token}, headers=elsewhere)
        assert cross_site.status_code == 403
        referer = {"referer": "https://evil.example/page"}
        assert client.post(f"{q}/pause", data={"csrf": token}, headers=referer).status_code == 403
        assert not queue.is_paused()
        # Another browser (no session cookie) cannot reuse this session's token.
        with dashboard(redis_url, queue_name) as stranger:
            assert stranger.post(f"{q}/pause", data={"csrf": token}).status_code == 403
        assert not queue.is_paused()


def test_credentials_are_required_when_configured(
    redis_url: str, queue_name: str, scene: Scene
) -> None:
    q = f"/q/{queue_name}"
    with dashboard(redis_url, queue_name, token=TOKEN) as client:
        refused = client.get("/")
        assert refused.status_code == 401 and 'name="token"' in refused.text
        assert queue_name not in refused.text
        assert client.get(f"{q}/dead").status_code == 401
        assert client.get("/", headers={"x-duetime-fragment": "live"}).status_code == 401
        assert client.post(f"{q}/pause", data={}).status_code == 401
        assert client.get("/static/dashboard.css").status_code == 200  # public package file
        bearer = client.get("/", headers={"authorization": f"Bearer {TOKEN}"})
        assert bearer.status_code == 200 and queue_name in bearer.text
        bad = client.get("/", headers={"authorization": "Bearer wrong-token-wrong-token"})
        assert bad.status_code == 401

        login = client.get("/login")
        signed_in = client.post(
            "/login",
            data={"csrf": csrf_of(login.text), "token": "nope", "next": "/"},
            headers=ORIGIN,
        )
        assert signed_in.status_code == 401 and "not right" in signed_in.text
        signed_in = client.post(
            "/login",
            data={"csrf": csrf_of(login.text), "token": TOKEN, "next": f"{q}/dead"},
            headers=ORIGIN,
        )
        assert signed_in.status_code == 200 and scene.dead[0] in signed_in.text
        cookie = signed_in.history[0].headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie
        post(client, "/", f"{q}/pause", {})
        assert scene.queue.is_paused()
        post(client, "/", "/logout", {})
        assert client.get("/").status_code == 401

    with dashboard(redis_url, queue_name, basic_auth="ops:secret-pass") as client:
        refused = client.get("/")
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith(
            "Basic"
        )
        good = base64.b64encode(b"ops:secret-pass").decode()
        assert client.get("/", headers={"authorization": f"Basic {good}"}).status_code == 200
        wrong = base64.b64encode(b"ops:guess").decode()
        assert client.get("/", headers={"authorization": f"Basic {wrong}"}).status_code == 401


def test_an_exposed_dashboard_needs_credentials() -> None:
    with pytest.raises(ConfigurationError, match="token"):
        serve(["jobs"], "redis://127.0.0.1:1/0", host="0.0.0.0", port=1)
    with pytest.raises(ConfigurationError, match="at least 16"):
        create_app(["jobs"], token="short")
    with pytest.raises(ConfigurationError, match="user:password"):
        create_app(["jobs"], basic_auth="nopassword")
    # Without credentials only loopback names are answered (no DNS rebinding).
    app = create_app(["jobs"], "redis://127.0.0.1:1/0")
    with TestClient(app, base_url="http://dashboard.example.com") as client:
        assert client.get("/").status_code == 421


def test_hostile_task_data_is_escaped(redis_url: str, queue_name: str, scene: Scene) -> None:
    q = f"/q/{queue_name}"
    with dashboard(redis_url, queue_name) as client:
        pages = [
            client.get(f"{q}/task?id={scene.hostile}").text,
            client.get(f"{q}/tasks?state=scheduled").text,
            client.get(f"{q}/timeline").text,
            client.get(f"{q}/cron").text,
            client.get(f"{q}/tasks?state=scheduled&task={HOSTILE}").text,
        ]
        for html in pages:
            assert "<script>alert" not in html
            assert "&lt;script&gt;" in html
