"""The dashboard's view of the history on a real server, through Starlette's TestClient:
the Finished page lists finished attempts newest first, filtered by handler and outcome
and paged; a task that is gone shows its attempts instead of a 404; and "Run now" on a
task that ran meanwhile lands on its attempts, with a notice saying so."""

from __future__ import annotations

import re

from duetime import ManualClock, Queue
from duetime.dashboard.history_view import FINISHED_PAGE
from duetime.store.plans.working import Outcome
from tests.integration.test_cli_history import NOW_MS, finish_some
from tests.integration.test_dashboard import ORIGIN, csrf_of, dashboard


def rows(html: str) -> list[str]:
    """The task ids of a table's rows, in order."""
    return re.findall(r'<a class="mono id" href="[^"]*" title="([^"]*)"', html)


def test_the_finished_page_lists_filters_and_pages_the_history(
    redis_url: str, queue_name: str
) -> None:
    finish_some(redis_url, queue_name)
    page = f"/q/{queue_name}/finished"
    with dashboard(redis_url, queue_name) as client:
        everything = client.get(page)
        assert everything.status_code == 200
        assert rows(everything.text) == ["other", "later", "flaky-1", "flaky-1"]
        assert "keeps its last 1,000 finished attempts" in everything.text
        assert f'href="/q/{queue_name}/finished" aria-current="page"' in everything.text
        assert rows(client.get(f"{page}?task=send").text) == ["flaky-1", "flaky-1"]
        assert rows(client.get(f"{page}?task=%28default%29").text) == ["other"]
        dead = client.get(f"{page}?task=send&outcome=dead").text
        assert rows(dead) == ["flaky-1"] and "E: no" in dead and "12 ms" in dead
        assert rows(client.get(f"{page}?outcome=cancelled").text) == ["other", "later"]
        refused = client.get(f"{page}?outcome=exploded").text
        assert "outcome must be one of" in refused and rows(refused) == []
        assert "No finished attempt kept matches." in client.get(f"{page}?task=nobody").text
    clock = ManualClock(NOW_MS)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        for n in range(FINISHED_PAGE):
            queue.cancel(queue.schedule_in(60, {}, id=f"c{n:02d}"))
    with dashboard(redis_url, queue_name) as client:
        first = client.get(page).text
        assert rows(first)[:2] == ["c49", "c48"] and len(rows(first)) == FINISHED_PAGE
        assert "page=1" in first and "Newer" not in first
        second = client.get(f"{page}?page=1").text
        assert rows(second) == ["other", "later", "flaky-1", "flaky-1"] and "Newer" in second


def test_a_gone_task_shows_its_attempts_and_an_unknown_id_is_not_found(
    redis_url: str, queue_name: str
) -> None:
    finish_some(redis_url, queue_name)
    with dashboard(redis_url, queue_name) as client:
        gone = client.get(f"/q/{queue_name}/task?id=later")
        assert gone.status_code == 200
        assert "no longer in the queue" in gone.text and "cancelled" in gone.text
        dead = client.get(f"/q/{queue_name}/task?id=flaky-1").text
        assert 'data-testid="task-history"' in dead and "retried" in dead
        assert client.get(f"/q/{queue_name}/task?id=never").status_code == 404


def test_run_now_on_a_task_that_ran_meanwhile_lands_on_its_attempts(
    redis_url: str, queue_name: str
) -> None:
    clock = ManualClock(NOW_MS)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        task_id = queue.schedule_in(3600, {}, id="report-7", task="report")
        here = f"/q/{queue_name}/task?id={task_id}"
        with dashboard(redis_url, queue_name) as client:
            shown = client.get(here).text
            assert 'data-action="run-now"' in shown  # the page shows it waiting
            # Meanwhile someone else runs it now, and a worker finishes it.
            queue.run_now(task_id)
            ops, run = queue.core.queue.operations, queue.runner.run
            run(ops.dispatcher.promote_due(10))
            claimed = run(ops.worker.claim("w1", 60_000, 1))
            assert claimed is not None and len(claimed) == 1
            assert run(
                ops.worker.ack("w1", [Outcome(task_id, claimed[0].attempt, duration_us=4_000)])
            )
            form = {"csrf": csrf_of(shown), "id": task_id, "back": here}
            answer = client.post(f"/q/{queue_name}/task/run-now", data=form, headers=ORIGIN)
            assert answer.status_code == 200 and answer.url.path.endswith("/task")
            assert "already ended (succeeded, attempt 1)" in answer.text
            assert 'data-testid="task-history"' in answer.text and "4 ms" in answer.text


def test_the_live_refresh_of_attempts_renders_them(redis_url: str, queue_name: str) -> None:
    """The live refresh renders a page's live block alone: the attempts' cells come from
    a macro imported there (on main they were imported outside it: every refresh of the
    Finished page or a task's page answered 500)."""
    finish_some(redis_url, queue_name)
    live = {"X-Duetime-Fragment": "live"}
    with dashboard(redis_url, queue_name) as client:
        for page in (f"/q/{queue_name}/finished", f"/q/{queue_name}/task?id=flaky-1"):
            fragment = client.get(page, headers=live)
            assert fragment.status_code == 200, page
            assert "<html" not in fragment.text and "E: no" in fragment.text
