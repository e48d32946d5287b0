"""Flow control in the web dashboard, on a real server through Starlette's TestClient:
the flow page shows a queue's limits, totals and limit keys as ``Queue.flow`` reads
them; its forms change the limits as ``set_limits`` / ``set_key_limits`` would (checked
with the Queue API), and bad input is refused with its reason and nothing written."""

from __future__ import annotations

import html as markup
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from duetime import Job, KeyLimits, Limits, ManualClock, Queue, Rate, Settings
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.layout import QueueLayout
from duetime.store.plans.operations import QueueOperations
from duetime.store.redis.runner import SyncRunner
from tests.integration.test_dashboard import ORIGIN, csrf_of, dashboard, post

HOSTILE_KEY = "<b onmouseover=alert(1)>tenant</b>"
LONG_KEY = "tenant-" + "x" * 190  # 197 bytes, near the 200 a key may have
LIMITS = Limits(
    cap=50,
    rate=Rate(100, 1.0, burst=10),
    each_key=KeyLimits(concurrency=2),
    keys={"slow": KeyLimits(rate=Rate(1, 60.0)), "vip": KeyLimits(concurrency=5)},
)


@dataclass
class FlowScene:
    queue: Queue
    name: str


@pytest.fixture
def flow_scene(redis_url: str, queue_name: str) -> Iterator[FlowScene]:
    """A queue under ``LIMITS`` with due tasks of several limit keys, promoted and then
    claimed as a dispatcher and a worker would (on a clock set to now): "acme" at its
    concurrency (2 running, 1 due), "slow" over its rate (1 running, 1 due, throttled
    for a minute), one task each of a long key, a hostile key and no key, running."""
    clock = ManualClock(int(time.time() * 1000))
    runner = SyncRunner(redis_url, Settings())
    operations = QueueOperations(QueueKeys(queue_name), clock)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.set_limits(LIMITS)
        at = (clock.now_ms() - 1000) / 1000
        keys = ["acme"] * 3 + ["slow"] * 2 + [LONG_KEY, HOSTILE_KEY, None]
        queue.schedule_many([Job(n, at=at, limit_key=key) for n, key in enumerate(keys)])
        runner.run(operations.dispatcher.promote_due(100))
        assert len(runner.run(operations.worker.claim("w1", 60_000, 20)) or []) == 6
        yield FlowScene(queue, queue_name)
        assert queue.check() == []
    runner.close()


def notice_of(page: str) -> str:
    """The one-shot notice an action left on the page it went back to, as text."""
    found = re.search(r'<div class="notice (?:ok|error)" role="status">(.*?)</div>', page, re.S)
    assert found, "no notice on the page"
    return markup.unescape(re.sub(r"\s+", " ", found.group(1))).strip()


def row_of(html: str, attribute: str, key: str) -> str:
    """The table row whose ``attribute`` is ``key`` (as the page escapes it)."""
    escaped = key.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    found = re.search(rf'<tr {attribute}="{re.escape(escaped)}">(.*?)</tr>', html, re.S)
    assert found, f"no row for {key!r}"
    return found.group(1)


def cell(row: str, column: str) -> str:
    found = re.search(rf'data-col="{column}">(.*?)</td>', row, re.S)
    assert found, f"no {column} cell"
    return re.sub(r"<[^>]+>", " ", found.group(1))


def test_the_flow_page_shows_limits_totals_and_keys(redis_url: str, flow_scene: FlowScene) -> None:
    state = flow_scene.queue.flow()
    assert (state.due, state.running) == (2, 6)
    with dashboard(redis_url, flow_scene.name) as client:
        page = client.get(f"/q/{flow_scene.name}/flow")
        assert page.status_code == 200
        html = page.text
        assert 'data-flow="on"' in html
        assert re.search(r'data-flow-total="due">2<', html)
        assert re.search(r'data-flow-total="running">6<', html)
        assert "50 running at once" in html and "100/s (burst 10)" in html
        assert 'data-limit="each">concurrency 2, rate none<' in html
        assert "1/min" in row_of(html, "data-override", "slow")
        assert ">5<" in row_of(html, "data-override", "vip")

        acme = row_of(html, "data-key", "acme")
        assert re.sub(r"\s+", " ", cell(acme, "running")).strip() == "2 / 2"
        assert "at concurrency" in cell(acme, "turn")
        slow = row_of(html, "data-key", "slow")
        assert re.sub(r"\s+", " ", cell(slow, "running")).strip() == "1 / 2"
        assert cell(slow, "rate").strip() == "1/min"  # its own rate
        assert "in " in cell(slow, "throttled") and "rate limit" in cell(slow, "turn")
        assert cell(row_of(html, "data-key", "acme"), "throttled").strip() == "-"
        long_row = row_of(html, "data-key", LONG_KEY)
        assert f'title="{LONG_KEY}"' in long_row  # cut on screen, whole on hover
        assert "(no limit key)" in row_of(html, "data-key", "")
        assert "<b onmouseover" not in html and "&lt;b onmouseover=alert(1)&gt;" in html

        overview = client.get("/").text
        assert "2 due waiting, 6 running" in overview
        fragment = client.get(f"/q/{flow_scene.name}/flow", headers={"x-duetime-fragment": "live"})
        assert "<html" not in fragment.text and 'data-key="acme"' in fragment.text
        assert 'id="key-form"' not in fragment.text  # the forms stay out of the refresh

        editing = client.get(f"/q/{flow_scene.name}/flow", params={"key": "slow"}).text
        assert re.search(r'name="key" value="slow"', editing)
        assert re.search(r'name="rate" value="1/min"', editing)


def test_a_queue_not_under_flow_control_says_so(redis_url: str, queue_name: str) -> None:
    with Queue(queue_name, redis_url) as queue, dashboard(redis_url, queue_name) as client:
        queue.schedule_now({"n": 1})
        html = client.get(f"/q/{queue_name}/flow").text
        assert 'data-flow="off"' in html and "is not under flow control" in html
        assert 'id="key-form"' not in html and 'id="queue-form"' in html
        assert "data-flow-line" not in client.get("/").text
        assert queue.limits() is None  # looking changes nothing


def test_key_limits_are_set_and_cleared(redis_url: str, flow_scene: FlowScene) -> None:
    queue, page = flow_scene.queue, f"/q/{flow_scene.name}/flow"
    with dashboard(redis_url, flow_scene.name) as client:
        form = {"do": "set", "key": "acme", "concurrency": "3", "rate": "10/s", "burst": "4"}
        done = post(client, page, f"{page}/key", form)
        assert (
            notice_of(done.text) == "Limit key 'acme' now has concurrency 3, rate 10/s (burst 4)."
        )
        limits = queue.limits()
        assert limits is not None
        assert limits.keys["acme"] == KeyLimits(3, Rate(10, 1.0, burst=4))
        assert limits.keys["slow"] == LIMITS.keys["slow"]  # the others are kept
        acme = row_of(client.get(page).text, "data-key", "acme")
        assert re.sub(r"\s+", " ", cell(acme, "running")).strip() == "2 / 3"

        # A key with limits of its own only for its rate: concurrency is each key's.
        done = post(client, page, f"{page}/key", {"do": "set", "key": LONG_KEY, "rate": "5/2min"})
        assert "now has concurrency none, rate 5/2min." in notice_of(done.text)
        assert queue.limits().keys[LONG_KEY] == KeyLimits(rate=Rate(5, 120.0))  # type: ignore[union-attr]

        done = post(client, page, f"{page}/key", {"do": "clear", "key": "acme", "rate": "junk"})
        assert notice_of(done.text) == (
            "Limit key 'acme' has no limits of its own now: each key's apply."
        )
        assert "acme" not in queue.limits().keys  # type: ignore[union-attr]
        # Setting nothing at all is clearing.
        post(client, page, f"{page}/key", {"do": "set", "key": "vip"})
        assert "vip" not in queue.limits().keys  # type: ignore[union-attr]
        assert queue.check() == []


def test_queue_limits_are_changed_and_named_keys_keep_theirs(
    redis_url: str, flow_scene: FlowScene
) -> None:
    queue, page = flow_scene.queue, f"/q/{flow_scene.name}/flow"
    with dashboard(redis_url, flow_scene.name) as client:
        # The form as shown, sent back unchanged, changes nothing.
        shown = client.get(page).text
        queue_form = shown[shown.index('id="queue-form"') : shown.index('id="key-form"')]
        as_shown = dict(re.findall(r'name="(\w+)" value="([^"]*)"', queue_form))
        del as_shown["csrf"]
        assert as_shown["rate"] == "100/s" and as_shown["burst"] == "10"
        post(
            client, page, f"{page}/queue", {key: markup.unescape(v) for key, v in as_shown.items()}
        )
        assert queue.limits() == LIMITS
        seen = re.search(r'name="seen" value="([^"]*)"', client.get(page).text)
        assert seen
        form = {"seen": seen.group(1), "cap": "7", "rate": "", "each_concurrency": "1"}
        done = post(client, page, f"{page}/queue", {**form, "each_rate": "3/s", "each_burst": "2"})
        assert notice_of(done.text) == (
            f"The limits of {flow_scene.name} are now: cap 7, rate none; "
            "each key: concurrency 1, rate 3/s (burst 2)."
        )
        expected = Limits(7, None, KeyLimits(1, Rate(3, 1.0, burst=2)), LIMITS.keys)
        assert queue.limits() == expected

        # A form shown before that change is refused: it would undo it.
        stale = post(client, page, f"{page}/queue", {"seen": seen.group(1), "cap": "9"})
        assert "changed after this page was loaded" in notice_of(stale.text)
        assert queue.limits() == expected


def test_a_queue_is_put_under_flow_control_from_the_dashboard(
    redis_url: str, queue_name: str
) -> None:
    with Queue(queue_name, redis_url) as queue, dashboard(redis_url, queue_name) as client:
        page = f"/q/{queue_name}/flow"
        done = post(client, page, f"{page}/queue", {"seen": "none", "cap": "4"})
        assert "cap 4, rate none" in notice_of(done.text) and 'data-flow="on"' in done.text
        assert queue.limits() == Limits(cap=4)


BAD_KEY_FORMS: list[tuple[dict[str, str], str]] = [
    ({"concurrency": "0"}, "concurrency must be an integer from 1 to 1000000, got 0"),
    ({"concurrency": "-3"}, "concurrency must be an integer from 1 to 1000000, got -3"),
    ({"concurrency": "NaN"}, "concurrency must be a whole number, or empty for no limit"),
    ({"concurrency": "2.5"}, "concurrency must be a whole number"),
    ({"concurrency": "9" * 30}, "concurrency must be an integer from 1 to 1000000"),
    ({"concurrency": "9" * 5000}, "concurrency is far too large"),
    ({"rate": "0/s"}, "a rate's count must be an integer from 1"),
    ({"rate": "NaN/s"}, "a rate is a count per period"),
    ({"rate": "10/0s"}, "a rate's period must be from 0.001 s to 30 days"),
    ({"rate": "1e400/s"}, "a rate is a count per period"),
    ({"rate": "10/s", "burst": "0"}, "a rate's burst must be an integer from 1"),
    ({"burst": "3"}, "a burst needs a rate"),
    ({"key": ""}, "limit_key must be a non-empty string"),
    ({"key": "k" * 10_000}, "limit_key is 10000 bytes; at most 200"),
    ({"key": "tab\there"}, "limit_key may not hold control characters"),
]


@pytest.mark.parametrize("server", ["redis"], indirect=True)  # input checks: one kind is enough
def test_bad_input_is_refused_with_its_reason_and_nothing_written(
    redis_url: str, flow_scene: FlowScene, raw: redis.Redis
) -> None:
    page = f"/q/{flow_scene.name}/flow"
    limits_key = QueueKeys(flow_scene.name).limits
    before = raw.hgetall(limits_key)
    with dashboard(redis_url, flow_scene.name) as client:
        token = csrf_of(client.get(page).text)

        def send(url: str, form: dict[str, Any]) -> str:
            response = client.post(url, data={"csrf": token, **form}, headers=ORIGIN)
            assert response.status_code == 200 and response.url.path == page
            assert 'class="notice error"' in response.text
            return notice_of(response.text)

        for fields, message in BAD_KEY_FORMS:
            said = send(f"{page}/key", {"do": "set", "key": "acme", **fields})
            assert said.startswith("Nothing changed: ") and message in said, (fields, said)
            assert len(said) < 300  # a 10 KB key is not echoed whole
        seen = re.search(r'name="seen" value="([^"]*)"', client.get(page).text)
        assert seen
        for fields, message in [
            ({"cap": "0"}, "cap must be an integer from 1 to 1000000, got 0"),
            ({"cap": "lots"}, "cap must be a whole number"),
            ({"rate": "fast"}, "a rate is a count per period"),
            ({"each_concurrency": "-1"}, "concurrency must be an integer from 1"),
            ({"each_rate": "5/s", "each_burst": "NaN"}, "each key's rate burst must be"),
        ]:
            said = send(f"{page}/queue", {"seen": seen.group(1), **fields})
            assert said.startswith("Nothing changed: ") and message in said, (fields, said)
        # Without the session's CSRF token: refused before anything is read.
        forged = client.post(
            f"{page}/key", data={"key": "acme", "concurrency": "1"}, headers=ORIGIN
        )
        assert forged.status_code == 403
        assert client.get(f"{page}/key").status_code == 405
    assert raw.hgetall(limits_key) == before


@pytest.mark.parametrize("server", ["redis"], indirect=True)  # shards: one kind is enough
def test_on_a_sharded_queue_a_change_reaches_every_shard(
    redis_url: str, queue_name: str, raw: redis.Redis
) -> None:
    with (
        Queue(queue_name, redis_url, shards=3) as queue,
        dashboard(redis_url, queue_name, shards=3) as client,
    ):
        page = f"/q/{queue_name}/flow"
        post(client, page, f"{page}/queue", {"seen": "none", "each_concurrency": "2"})
        post(client, page, f"{page}/key", {"do": "set", "key": "acme", "rate": "4/s"})
        assert queue.limits() == Limits(
            each_key=KeyLimits(concurrency=2), keys={"acme": KeyLimits(rate=Rate(4))}
        )
        for shard in QueueLayout(queue_name, 3).shards:
            assert raw.hgetall(shard.limits).keys() >= {b"each_concurrency", b"rate:acme"}, (
                shard.queue
            )
        assert "This queue has 3 shards" in client.get(page).text


def test_a_waiting_tasks_page_names_its_key_priority_and_what_holds_it(
    redis_url: str, flow_scene: FlowScene
) -> None:
    waiting = [
        t.id
        for t in flow_scene.queue.tasks("ready", limit=50)
        if (s := flow_scene.queue.status(t.id)) is not None and s.limit_key == "acme"
    ]
    assert len(waiting) == 1  # acme's third task: its two slots are taken
    with dashboard(redis_url, flow_scene.name) as client:
        for task_id in waiting:
            page = markup.unescape(client.get(f"/q/{flow_scene.name}/task?id={task_id}").text)
            assert "Limit key" in page and f"/q/{flow_scene.name}/flow?key=acme" in page
            assert "a free slot of key 'acme': 2 of 2 running" in page
