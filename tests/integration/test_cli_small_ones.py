"""Issue 41, point 18: the small things an operator met. ``status`` of a finished task
says how it ended; an expired task names its handler and the attempts that started; a
ready task shows when it was due; the dashboard answers a bad page or state with 400; a
URL of the wrong scheme (Sentinel or not) says which to use."""

from __future__ import annotations

import asyncio
import html
import json
import time
from typing import Any

import pytest
from click.testing import CliRunner

from duetime import App, Dispatcher, Queue, Worker
from duetime.cli import main
from duetime.errors import RedisCommandError
from tests.conftest import require_binary
from tests.helpers import FAST, running, wait_until
from tests.servers import Sentinels

app = App()


@app.task(name="send")
def send(data: Any) -> str:
    return "sent"


@pytest.fixture
def cli(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
    return CliRunner()


def _run_until(queue_name: str, redis_url: str, done: Any) -> None:
    async def main_loop() -> None:
        worker = Worker(app, queue_name, redis_url, settings=FAST)
        async with running(Dispatcher(queue_name, redis_url, settings=FAST), worker):
            await wait_until(done, what="the tasks' ends")

    asyncio.run(main_loop())


def _status(cli: CliRunner, queue_name: str, task_id: str) -> dict[str, Any]:
    shown = cli.invoke(main, ["status", "-q", queue_name, task_id])
    assert shown.exit_code == 0, shown.output
    report: dict[str, Any] = json.loads(shown.stdout)
    return report


def test_status_of_finished_and_expired_tasks_says_how_they_ended(
    cli: CliRunner, redis_url: str, queue_name: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        done = queue.task(send).schedule_now({})  # keeps no result: the history knows it
        kept = queue.task(send).schedule_now({}, result_ttl=60)
        late = queue.task(send).schedule_now({}, expires=0.2, result_ttl=60)
        time.sleep(0.4)  # no worker yet: the late one's expiry passes while it waits
        _run_until(queue_name, redis_url, lambda: queue.stats().counters.get("completed", 0) == 2)
    finished = _status(cli, queue_name, done)
    assert (finished["state"], finished["outcome"], finished["task"]) == (
        "finished",
        "succeeded",
        "send",
    )
    assert finished["attempts"] == 1 and finished["finished_at"] is not None
    stored = _status(cli, queue_name, kept)
    assert (stored["state"], stored["outcome"], stored["task"]) == ("finished", "succeeded", "send")
    expired = _status(cli, queue_name, late)
    assert (expired["state"], expired["outcome"]) == ("finished", "expired")
    assert (expired["task"], expired["attempts"]) == ("send", 0)  # it never started


def test_a_ready_task_shows_when_it_was_due(
    cli: CliRunner, redis_url: str, queue_name: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        before = time.time()
        task_id = queue.schedule_now({})  # no dispatcher, no worker: it stays ready
        status = queue.status(task_id)
    assert status is not None and status.state == "ready"
    assert status.run_at is not None and before - 5 < status.run_at < time.time() + 5
    assert _status(cli, queue_name, task_id)["run_at"] is not None


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tasks?page=-1", "page must be a whole number from 0 to 10,000, got '-1'"),
        ("tasks?page=two", "page must be a whole number from 0 to 10,000, got 'two'"),
        ("dead?page=-1", "page must be a whole number"),
        ("finished?page=-1", "page must be a whole number"),
        ("tasks?state=bogus", "There is no state 'bogus': choose one of scheduled, ready"),
    ],
)
def test_the_dashboard_answers_a_bad_page_or_state_with_400(
    redis_url: str, queue_name: str, path: str, message: str
) -> None:
    from tests.integration.test_dashboard import dashboard

    with dashboard(redis_url, queue_name) as client:
        page = client.get(f"/q/{queue_name}/{path}")
        api = client.get(f"/api/q/{queue_name}/{path}")
        served = client.get(f"/q/{queue_name}/tasks?page=0&state=ready")
    assert page.status_code == 400 and message in html.unescape(page.text)
    assert served.status_code == 200
    if path in ("dead?page=-1", "tasks?state=bogus"):  # the API's tasks take limit/offset
        assert api.status_code == 400, api.text


def test_a_url_of_the_wrong_scheme_says_which_to_use(redis_url: str) -> None:
    """redis:// at a Sentinel's port, and redis+sentinel:// at a plain server: the
    refusal ("unknown command 'TIME'", "... 'SENTINEL'") comes with the other scheme."""
    group = Sentinels("redis", require_binary("redis"))
    group.start()
    try:
        with (
            pytest.raises(RedisCommandError, match=r"looks like a Sentinel.*redis\+sentinel://"),
            Queue("q", f"redis://127.0.0.1:{group.ports[0]}/0") as at_sentinel,
        ):
            at_sentinel.schedule_in(60, {})
    finally:
        group.stop()
    port = redis_url.rsplit(":", 1)[1].split("/")[0]
    with (
        pytest.raises(RedisCommandError, match=r"not a Sentinel: connect to it with redis://"),
        Queue("q", f"redis+sentinel://127.0.0.1:{port}/duetime") as at_server,
    ):
        at_server.schedule_in(60, {})
