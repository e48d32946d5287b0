"""The dashboard's Search page, its bulk actions, the viewer role and the JSON API, on a
real server (both kinds) through Starlette's TestClient: matches by every criterion,
a bounded view with a link that goes on; run now, reschedule and cancel on ticked tasks
and on every match, with what was skipped; a viewer sees every page without a form
that acts and is refused every POST; the API answers what the pages show and keeps
their rules (roles, CSRF or bearer token, JSON bodies)."""

from __future__ import annotations

import base64
import re
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from starlette.exceptions import StarletteDeprecationWarning

with warnings.catch_warnings():
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient

from duetime import Job, Queue
from duetime.dashboard import create_app, search_view
from duetime.errors import ConfigurationError
from duetime.states import TaskState
from tests.helpers import FAST

TOKEN = "operator-token-0123456789abcdef"
VIEWER = "viewer-token-0123456789abcdef"
ORIGIN = {"origin": "http://127.0.0.1"}


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


def sign_in(client: TestClient, token: str) -> None:
    login = client.get("/login")
    done = client.post(
        "/login", data={"csrf": csrf_of(login.text), "token": token, "next": "/"}, headers=ORIGIN
    )
    assert done.status_code == 200, done.text


@pytest.fixture
def orders(redis_url: str, queue_name: str) -> Iterator[Queue]:
    """1,200 scheduled orders (``order-0000`` ...; customer acme for even ones), and two
    ready ones of acme's (``ready-0``, ``ready-1``)."""
    with Queue(queue_name, redis_url, settings=FAST) as queue:
        queue.schedule_many(
            [
                Job({"customer": "acme" if n % 2 == 0 else "zeta", "n": n}, delay=3600,
                    id=f"order-{n:04}", task="invoice")
                for n in range(1200)
            ]
        )  # fmt: skip
        for n in range(2):
            queue.schedule_now({"customer": "acme"}, id=f"ready-{n}", task="invoice")
        yield queue


def test_the_search_page_finds_tasks_and_goes_on_where_it_stopped(
    redis_url: str, queue_name: str, orders: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = f"/q/{queue_name}/search"
    with dashboard(redis_url, queue_name) as client:
        empty = client.get(page)
        assert (
            empty.status_code == 200
            and "Data field" in empty.text
            and "data-results" not in empty.text
        )
        found = client.get(page, params={"id": "order-0042"}).text
        assert "order-0042" in found and "1 match among the 1,202 tasks read, of 1,202" in found
        by_data = client.get(page, params={"field": "n", "value": "7"}).text
        assert "order-0007" in by_data and "order-0070" not in by_data
        ready = client.get(page, params={"field": "customer", "value": "acme", "state": "ready"})
        assert {"ready-0", "ready-1"} <= set(re.findall(r'data-task="([^"]+)"', ready.text))
        assert len(re.findall(r'data-task="', ready.text)) == 2
        refused = client.get(page, params={"field": "a..b"}).text
        assert "none empty" in refused

        monkeypatch.setattr(search_view, "SEARCH_BUDGET", 300)
        first = client.get(page, params={"task": "invoice", "state": "scheduled"}).text
        assert "The search stopped there" in first
        seen = set(re.findall(r'data-task="([^"]+)"', first))
        further = re.search(r'href="\?([^"]+)" data-action="search-further"', first)
        while further is not None:  # follow "search further" to the end of the walk
            following = client.get(f"{page}?{further.group(1).replace('&amp;', '&')}").text
            seen |= set(re.findall(r'data-task="([^"]+)"', following))
            further = re.search(r'href="\?([^"]+)" data-action="search-further"', following)
        assert "That was the end of the walk" in following
        assert seen == {f"order-{n:04}" for n in range(1200)}


def test_bulk_actions_on_ticked_tasks_and_on_every_match(
    redis_url: str, queue_name: str, orders: Queue
) -> None:
    queue, q = orders, f"/q/{queue_name}"
    page = f"{q}/search?id=order-000"
    with dashboard(redis_url, queue_name) as client:
        html = client.get(page).text
        assert 'name="ids" value="order-0001"' in html
        back = re.search(r'name="back" value="([^"]+)"', html)
        assert back is not None and back.group(1).replace("&amp;", "&") == page  # this search
        chosen = {"action": "run_now", "ids": ["order-0001", "ready-0"], "back": page}
        done = post(client, page, f"{q}/search/act", chosen)
        assert "Made due now 1; skipped 1 (1 ready)." in done.text
        status = queue.status("order-0001")
        assert status is not None and status.state == TaskState.READY

        later = time.time() + 7200
        chosen = {"action": "reschedule", "to": "2h", "ids": ["order-0002"], "back": page}
        done = post(client, page, f"{q}/search/act", chosen)
        assert "Rescheduled 1 to 20" in done.text  # says to when
        status = queue.status("order-0002")
        assert status is not None and status.run_at == pytest.approx(later, abs=5)
        done = post(client, page, f"{q}/search/act",
                    {"action": "reschedule", "to": "soonish", "ids": ["order-0002"]})  # fmt: skip
        assert "reschedule to what?" in done.text
        done = post(client, page, f"{q}/search/act", {"action": "cancel"})
        assert "No task selected" in done.text

        criteria = "field=customer&value=zeta&id=order-00"
        confirm = client.get(f"{q}/search/confirm?action=cancel&{criteria}").text
        assert 'data-count="matching">50<' in confirm  # order-0001 (ready now) too
        fields = {"action": "cancel", "field": "customer", "value": "zeta", "id": "order-00"}
        done = post(client, f"{q}/search/confirm?action=cancel&{criteria}",
                    f"{q}/search/matching", fields)  # fmt: skip
        assert "50 matched: 50 cancelled." in done.text
        assert queue.stats().scheduled == 1200 - 1 - 49 and queue.stats().ready == 2
        assert queue.status("order-0003") is None and queue.status("order-0004") is not None
        assert queue.check() == []


def test_a_viewer_sees_everything_and_can_act_on_nothing(
    redis_url: str, queue_name: str, orders: Queue
) -> None:
    q = f"/q/{queue_name}"
    orders.add_cron("nightly", "0 3 * * *", {"n": 1}, task="report")
    with dashboard(redis_url, queue_name, token=TOKEN, viewer_token=VIEWER) as client:
        sign_in(client, VIEWER)
        pages = {
            "/": "Overview",
            f"{q}/search?task=invoice": "order-",
            f"{q}/task?id=order-0000": "order-0000",
            f"{q}/dead": "Dead tasks",
            f"{q}/cron": "nightly",
            f"{q}/flow": "Flow control",
            f"{q}/search/confirm?action=cancel&task=invoice": "matches",
        }
        for url, expected in pages.items():
            html = client.get(url).text
            assert expected in html, url
            assert "viewer · read only" in html
            # No form that acts: the only POST form left is signing out.
            assert re.findall(r'<form method="post" action="([^"]+)"', html) == ["/logout"], url
            assert 'name="ids"' not in html and 'data-action="run-now' not in html
        token = csrf_of(client.get("/").text)  # the session's own, valid token
        for url, data in (
            (f"{q}/pause", {}),
            (f"{q}/search/act", {"action": "cancel", "ids": ["order-0000"]}),
            (f"{q}/search/matching", {"action": "cancel", "task": "invoice"}),
            (f"{q}/task/cancel", {"id": "order-0000"}),
            (f"{q}/cron/pause", {"name": "nightly"}),
        ):
            refused = client.post(url, data={"csrf": token, **data}, headers=ORIGIN)
            assert refused.status_code == 403 and "viewer" in refused.text, url
        api = client.post(f"/api/q/{queue_name}/pause", json={},
                          headers={"x-duetime-csrf": token, **ORIGIN})  # fmt: skip
        assert api.status_code == 403 and "viewer" in api.json()["error"]
        assert not orders.is_paused() and orders.status("order-0000") is not None
        assert client.get(f"/api/q/{queue_name}/stats").json()["scheduled"] == 1200

        viewer = {"authorization": f"Bearer {VIEWER}"}
        assert client.get("/api/session", headers=viewer).json()["role"] == "viewer"
        bearer_post = client.post(f"/api/q/{queue_name}/pause", json={}, headers=viewer)
        assert bearer_post.status_code == 403
        # The operator's token, on the same client, acts.
        operator = {"authorization": f"Bearer {TOKEN}"}
        paused = client.post(f"/api/q/{queue_name}/pause", json={}, headers=operator)
        assert paused.status_code == 200 and paused.json() == {"changed": True}

    pair = base64.b64encode(b"look:only-looking").decode()
    with dashboard(redis_url, queue_name, basic_auth="ops:secret-pass",
                   viewer_basic_auth="look:only-looking") as client:  # fmt: skip
        headers = {"authorization": f"Basic {pair}"}
        html = client.get("/", headers=headers).text
        assert "viewer · read only" in html and "resume-queue" not in html
        token = client.get("/api/session", headers=headers).json()["csrf"]
        refused = client.post(f"{q}/resume", data={"csrf": token}, headers={**headers, **ORIGIN})
        assert refused.status_code == 403
    assert orders.is_paused()


def test_viewer_credentials_are_checked_when_the_app_is_made() -> None:
    with pytest.raises(ConfigurationError, match="viewer token must be at least 16"):
        create_app(["jobs"], token=TOKEN, viewer_token="short")
    with pytest.raises(ConfigurationError, match="must differ"):
        create_app(["jobs"], token=TOKEN, viewer_token=TOKEN)
    with pytest.raises(ConfigurationError, match="must differ"):
        create_app(["jobs"], basic_auth="ops:a-password", viewer_basic_auth="ops:another")


def test_the_json_api_answers_what_the_pages_show_and_keeps_their_rules(
    redis_url: str, queue_name: str, orders: Queue
) -> None:
    api = f"/api/q/{queue_name}"
    bearer = {"authorization": f"Bearer {TOKEN}"}
    with dashboard(redis_url, queue_name, token=TOKEN) as client:
        assert client.get(f"{api}/stats").status_code == 401  # no credentials
        assert client.get(f"{api}/stats").json() == {"error": "Sign-in needed."}
        stats = client.get(f"{api}/stats", headers=bearer).json()
        assert (stats["scheduled"], stats["ready"]) == (1200, 2)
        [listed] = client.get("/api/queues", headers=bearer).json()
        assert listed["name"] == queue_name and listed["stats"]["ready"] == 2
        tasks = client.get(f"{api}/tasks?state=ready&limit=5", headers=bearer).json()
        assert [task["id"] for task in tasks] == ["ready-0", "ready-1"]
        task = client.get(f"{api}/task?id=order-0004", headers=bearer).json()
        assert (task["state"], task["data"]) == ("scheduled", {"customer": "acme", "n": 4})
        missing = client.get(f"{api}/task?id=nothing-here", headers=bearer)
        assert missing.status_code == 404 and "nothing is known" in missing.json()["error"]
        assert client.get(f"{api}/tasks?limit=0", headers=bearer).status_code == 400
        assert client.get("/api/q/other/stats", headers=bearer).status_code == 404
        for part in ("throughput", "dead", "flow", "cron"):
            assert client.get(f"{api}/{part}", headers=bearer).status_code == 200, part

        found = client.get(f"{api}/search?field=n&value=11&budget=100000", headers=bearer).json()
        assert [task["id"] for task in found["tasks"]] == ["order-0011"]
        assert (found["scanned"], found["total"], found["cursor"]) == (1202, 1202, None)
        part = client.get(f"{api}/search?task=invoice&budget=300", headers=bearer).json()
        assert part["cursor"] and part["scanned"] < 1202
        assert client.get(f"{api}/search", headers=bearer).status_code == 400

        moved = client.post(f"{api}/tasks/reschedule", headers=bearer,
                            json={"ids": ["order-0000", "ready-0", "ghost"], "in": 60})  # fmt: skip
        assert moved.status_code == 200
        assert moved.json()["skipped"] == {"ghost": "gone"}
        assert moved.json()["done"] == ["order-0000", "ready-0"]
        by_search = client.post(f"{api}/tasks/run-now", headers=bearer,
                                json={"search": {"field": "n", "value": "5"}})  # fmt: skip
        assert by_search.json()["done"] == ["order-0005"] and by_search.json()["selected"] == 1
        bad = client.post(f"{api}/tasks/cancel", headers=bearer, json={"ids": ["no good!"]})
        assert bad.status_code == 400 and "invalid task id" in bad.json()["error"]
        limits = client.post(f"{api}/limits/queue", headers=bearer, json={"cap": 5, "rate": "10/s"})
        assert limits.json()["limits"]["cap"] == 5
        key = client.post(f"{api}/limits/key", headers=bearer, json={"key": "acme", "rate": "0/s"})
        assert key.status_code == 400

        # Without the bearer token: the session's CSRF token and a JSON body are needed.
        sign_in(client, TOKEN)
        assert client.post(f"{api}/pause", json={}, headers=ORIGIN).status_code == 403
        token = client.get("/api/session").json()["csrf"]
        with_token = {"x-duetime-csrf": token, **ORIGIN}
        form = client.post(f"{api}/pause", data={"a": "b"}, headers=with_token)
        assert form.status_code == 415
        paused = client.post(f"{api}/pause", json={}, headers=with_token)
        assert paused.json() == {"changed": True} and orders.is_paused()
        elsewhere = {"x-duetime-csrf": token, "origin": "https://evil.example"}
        assert client.post(f"{api}/resume", json={}, headers=elsewhere).status_code == 403
        assert client.get(f"{api}/pause").status_code == 405
    assert orders.check() == []
