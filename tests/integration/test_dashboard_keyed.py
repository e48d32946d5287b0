"""The dashboard's task page shows the debounce, throttle or unique key of the key's
current task: the key (escaped), its calls, and the max_wait deadline or window end."""

from __future__ import annotations

from duetime import Debounce, ManualClock, Queue, Throttle, Unique
from tests.integration.test_dashboard import HOSTILE, dashboard

T0 = 1_800_000_000_000


def test_the_task_page_shows_the_key_of_a_keyed_task(redis_url: str, queue_name: str) -> None:
    clock = ManualClock(T0)
    with (
        Queue(queue_name, redis_url, clock=clock) as queue,
        dashboard(redis_url, queue_name) as client,
    ):
        debounce = Debounce(HOSTILE, 10, max_wait=60)
        debounced = [queue.schedule_keyed({"n": n}, debounce=debounce) for n in range(3)][-1]
        throttled = queue.schedule_keyed({"n": 1}, throttle=Throttle("api", 30))
        unique = queue.schedule_keyed({"n": 1}, unique=Unique("nightly", until="finished"))
        plain = queue.schedule_now({"n": 1})
        page = client.get(f"/q/{queue_name}/task?id={debounced.id}").text
        assert "Debounce key" in page and "3 calls" in page and "Max wait until" in page
        assert HOSTILE not in page and "&lt;script&gt;" in page
        page = client.get(f"/q/{queue_name}/task?id={throttled.id}").text
        assert "Throttle key" in page and "Window ends" in page and ">api<" in page
        page = client.get(f"/q/{queue_name}/task?id={unique.id}").text
        assert "Unique key" in page and "until finished" in page
        page = client.get(f"/q/{queue_name}/task?id={plain}").text
        assert 'data-testid="task-keyed"' not in page
