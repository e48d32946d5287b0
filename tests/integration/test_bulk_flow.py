"""Bulk actions on a queue under flow control, on a real server (both kinds), with the
clock driven by the test: a search chooses every task of a limit key that has not
started (scheduled, and due but waiting for a free slot) and says which matches it
leaves alone; cancel, reschedule and run now reach each one, and keep flow control's
bookkeeping exact (the due set counts each key's waiting tasks, keys take turns, ready
holds one task for a blocked worker) so that other keys still run and the checker finds
nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner

from duetime import (
    App,
    AsyncQueue,
    BulkOutcome,
    Dispatcher,
    Job,
    KeyLimits,
    Limits,
    Queue,
    TaskSearch,
    Worker,
    current_task,
)
from duetime.cli import EXIT_NOTHING_DONE, main
from duetime.client import NOT_STARTED, select_matching, select_matching_async
from duetime.errors import InvalidInputError
from duetime.states import TaskState
from tests.helpers import FAST, decoded, running, wait_until
from tests.integration.test_dashboard_search import ORIGIN, dashboard, post
from tests.integration.test_flow import T0, Harness

NOW = T0 / 1000


@pytest.fixture
def backlog(redis_url: str, queue_name: str) -> Iterator[Harness]:
    """Key ``big`` may run one task at a time: one runs (on w1), 19 are due and wait for
    its slot, 2 are scheduled an hour on; key ``small`` (five at a time) has 3 due
    tasks, one running."""
    flow = Harness(redis_url, queue_name)
    flow.queue.set_limits(
        Limits(each_key=KeyLimits(concurrency=1), keys={"small": KeyLimits(concurrency=5)})
    )
    flow.queue.schedule_many([Job(n, at=NOW, limit_key="big", id=f"big-{n:02}") for n in range(20)])
    flow.queue.schedule_many(
        [Job(n, at=NOW + 3600, limit_key="big", id=f"later-{n}") for n in range(2)]
    )
    flow.queue.schedule_many([Job(n, at=NOW, limit_key="small", id=f"small-{n}") for n in range(3)])
    flow.promote()
    started = flow.claim("w1", most=2)
    assert {task_id.split("-")[0] for task_id in started} == {"big", "small"}
    yield flow
    assert flow.queue.check() == []
    flow.close()


def key_flow(flow: Harness, key: str) -> tuple[int, int]:
    """(due, running) of a limit key, as ``Queue.flow`` counts them."""
    found = {group.key: (group.due, group.running) for group in flow.queue.flow().groups}
    return found.get(key, (0, 0))


def test_a_search_chooses_every_task_of_a_key_not_started_and_counts_the_others(
    backlog: Harness,
) -> None:
    picked = select_matching(backlog.queue, TaskSearch(limit_key="big"), states=NOT_STARTED)
    assert len(picked.ids) == 21 and picked.complete
    assert picked.chosen == {"waiting": 19, "scheduled": 2}
    assert picked.left_alone == {"running": 1}
    waiting = select_matching(backlog.queue, TaskSearch(limit_key="big"), states=["waiting"])
    assert len(waiting.ids) == 19 and waiting.left_alone == {"running": 1, "scheduled": 2}
    [status] = backlog.queue.search(TaskSearch(id_prefix="big-", state="waiting"), limit=1).tasks
    assert status.waiting_for == "a free slot of key 'big': 1 of 1 running"
    with pytest.raises(InvalidInputError, match="states must be some of"):
        select_matching(backlog.queue, TaskSearch(limit_key="big"), states=["finished"])


def test_bulk_cancel_reaches_the_waiting_backlog_and_other_keys_still_run(
    backlog: Harness, raw: redis.Redis
) -> None:
    picked = select_matching(backlog.queue, TaskSearch(limit_key="big"), states=NOT_STARTED)
    outcome = backlog.queue.cancel_many(picked.ids)
    assert len(outcome.done) == 21 and outcome.skipped == {}
    assert key_flow(backlog, "big") == (0, 1)
    assert key_flow(backlog, "small") == (1, 1)  # and one in ready, for a blocked worker
    assert raw.llen(backlog.keys.ready) == 1 and backlog.queue.stats().scheduled == 0
    # The other key still runs.
    second = backlog.claim("w2", most=5)
    assert len(second) == 2 and all(task_id.startswith("small-") for task_id in second)


def test_a_cancel_of_the_task_ready_holds_wakes_a_dispatcher_to_put_another(
    backlog: Harness, raw: redis.Redis
) -> None:
    [fed] = decoded(raw.lrange(backlog.keys.ready, 0, -1))
    raw.delete(backlog.keys.wake)
    assert backlog.queue.cancel_many([fed]).done == [fed]
    assert raw.llen(backlog.keys.wake) == 1  # rung: other tasks are due
    backlog.promote()
    assert raw.llen(backlog.keys.ready) == 1


def test_bulk_reschedule_to_now_files_tasks_by_key_and_turn_not_into_ready(
    backlog: Harness, raw: redis.Redis
) -> None:
    backlog.clock.set(T0 + 5000)
    picked = select_matching(backlog.queue, TaskSearch(limit_key="big"), states=NOT_STARTED)
    raw.delete(backlog.keys.wake)
    outcome = backlog.queue.reschedule_many(picked.ids, NOW)  # in the past: due now
    assert len(outcome.done) == 21
    assert outcome.summary == "rescheduled 21 to 2027-01-15 08:00:00+00:00"
    # Back in scheduled at their run-at, as a task scheduled due now on such a queue is,
    # with a dispatcher woken to file them (never into ready: they would skip the turns).
    assert backlog.queue.stats().scheduled == 21 and raw.llen(backlog.keys.wake) == 1
    backlog.promote()
    # Every one waits in the due set, counted for its key; ready holds one task at most
    # (small's: big's slot is taken), as it does for promoted tasks.
    assert key_flow(backlog, "big") == (21, 1)
    assert raw.llen(backlog.keys.ready) <= 1
    assert backlog.queue.stats().scheduled == 0
    # Keys still take turns: small's next tasks start, big's wait for their slot.
    second = backlog.claim("w2", most=5)
    assert len(second) == 2 and all(task_id.startswith("small-") for task_id in second)

    later = backlog.queue.reschedule_many(picked.ids[:3], NOW + 7200)
    assert len(later.done) == 3 and key_flow(backlog, "big") == (18, 1)
    assert backlog.queue.stats().scheduled == 3


def test_bulk_run_now_makes_scheduled_tasks_due_in_turn_and_says_why_it_skips_the_waiting(
    backlog: Harness, raw: redis.Redis
) -> None:
    picked = select_matching(backlog.queue, TaskSearch(limit_key="big"), states=NOT_STARTED)
    outcome = backlog.queue.run_now_many(picked.ids)
    assert sorted(outcome.done) == ["later-0", "later-1"]
    assert set(outcome.skipped.values()) == {"waiting"} and len(outcome.skipped) == 19
    assert outcome.summary == "made due now 2; skipped 19 (19 waiting)"
    backlog.promote()  # the dispatcher woken files them among their key's due tasks
    assert key_flow(backlog, "big") == (21, 1)  # the two joined their key's due tasks
    assert raw.llen(backlog.keys.ready) <= 1
    for task_id in ("later-0", "later-1"):
        status = backlog.queue.status(task_id)
        assert status is not None and status.state == TaskState.READY
        assert status.waiting_for is not None


def test_a_task_that_starts_after_the_selection_is_skipped_and_runs_never_both(
    backlog: Harness, raw: redis.Redis
) -> None:
    picked = select_matching(backlog.queue, TaskSearch(limit_key="small"), states=NOT_STARTED)
    assert len(picked.ids) == 2 and picked.left_alone == {"running": 1}
    started = backlog.claim("w2", most=5)  # a worker claims them between look and step
    assert sorted(started) == sorted(picked.ids)
    outcome = backlog.queue.cancel_many(picked.ids, stop_running=False)
    assert outcome.done == [] and set(outcome.skipped.values()) == {"running"}
    assert raw.hlen(backlog.keys.cancelling) == 0  # no stop asked: they run to their end
    for task_id in started:
        backlog.ack(task_id, "w2")
        assert [entry.outcome for entry in backlog.queue.history(task_id=task_id)] == ["succeeded"]


def cli_runner(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
    return CliRunner()


def test_the_cli_reaches_the_waiting_backlog_and_says_what_it_left_alone(
    backlog: Harness, queue_name: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli = cli_runner(redis_url, monkeypatch)
    dry = cli.invoke(main, ["bulk", "cancel", "-q", queue_name, "--limit-key", "big", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.splitlines()[0] == (
        f"would cancel 21 of 22 matching tasks in {queue_name} (2 scheduled, 19 waiting); "
        "not touched: 1 running"
    )
    for state, count in (("ready", 19), ("waiting", 19), ("scheduled", 2)):
        narrowed = ["bulk", "cancel", "-q", queue_name, "--limit-key", "big", "--state", state]
        report = json.loads(cli.invoke(main, [*narrowed, "--dry-run", "--json"]).stdout)
        assert (report["selected"], report["matched"]) == (count, 22), state
    found = cli.invoke(
        main, ["search", "-q", queue_name, "--limit-key", "big", "--state", "waiting"]
    )
    assert found.exit_code == 0 and "19 matches" in found.stderr

    cancelled = cli.invoke(main, ["bulk", "cancel", "-q", queue_name, "--limit-key", "big", "-y"])
    assert cancelled.exit_code == 0, cancelled.output
    assert cancelled.stdout.strip() == "22 matched: 21 cancelled, 1 running (not touched)"
    assert key_flow(backlog, "big") == (0, 1) and backlog.queue.stats().scheduled == 0
    again = cli.invoke(main, ["bulk", "cancel", "-q", queue_name, "--limit-key", "big", "-y"])
    assert again.exit_code == EXIT_NOTHING_DONE
    assert again.stdout.strip() == "1 matched: 0 cancelled, 1 running (not touched)"

    skipped = cli.invoke(main, ["bulk", "run-now", "-q", queue_name, "small-1", "small-2"])
    assert skipped.exit_code == EXIT_NOTHING_DONE
    assert "skipped 2 (" in skipped.stdout and "waiting" in skipped.stdout


def test_the_api_and_the_search_page_reach_the_waiting_backlog(
    backlog: Harness, queue_name: str, redis_url: str
) -> None:
    q = f"/q/{queue_name}"
    with dashboard(redis_url, queue_name) as client:
        html = client.get(f"{q}/search", params={"key": "big"}).text
        assert 'name="ids" value="big-05"' in html and "data-waiting" in html
        assert 'name="ids" value="later-0"' in html
        confirm = client.get(f"{q}/search/confirm", params={"action": "cancel", "key": "big"})
        assert 'data-count="matched">22<' in confirm.text
        assert 'data-count="matching">21<' in confirm.text
        assert 'data-count="not-touched">1 running<' in confirm.text
        ticked = post(client, f"{q}/search?key=big", f"{q}/search/act",
                      {"action": "cancel", "ids": ["big-05", "big-06"]})  # fmt: skip
        assert "Cancelled 2." in ticked.text

        token = client.get("/api/session").json()["csrf"]
        headers = {"x-duetime-csrf": token, **ORIGIN}
        refused = client.post(f"/api{q}/tasks/run-now", headers=headers,
                              json={"search": {"key": "big", "state": "running"}})  # fmt: skip
        assert refused.status_code == 400 and "only a cancel takes running" in refused.text
        answer = client.post(f"/api{q}/tasks/cancel", headers=headers,
                             json={"search": {"key": "big"}}).json()  # fmt: skip
    assert (answer["matched"], answer["selected"], len(answer["done"])) == (20, 19, 19)
    assert answer["not_touched"] == {"running": 1}
    assert answer["chosen"] == {"scheduled": 2, "waiting": 17}
    assert answer["summary"] == "20 matched: 19 cancelled, 1 running (not touched)"
    assert key_flow(backlog, "big") == (0, 1)


def backlog_on_shards(queue: Queue) -> list[str]:
    """60 tasks of key ``big`` (one at a time) on every shard of ``queue``, made due by a
    bulk reschedule to a time past (back to scheduled, at their run-at, for a dispatcher
    to file among their key's due tasks: one promotion pass per shard here), and 3 of
    key ``small`` left scheduled."""
    queue.set_limits(Limits(each_key=KeyLimits(concurrency=1)))
    ids = queue.schedule_many([Job(n, delay=3600, limit_key="big") for n in range(60)])
    queue.schedule_many([Job(n, delay=3600, limit_key="small") for n in range(3)])
    homes = {queue.core.queue.layout.of_task(task_id) for task_id in ids}
    assert homes == set(range(len(queue.core.queue.shards)))
    moved = queue.reschedule_many(ids, 0)
    assert len(moved.done) == 60 and queue.stats().scheduled == 63
    for shard in queue.core.queue.shards:
        queue.runner.run(shard.dispatcher.promote_due(1000))
    stats = queue.stats()
    assert (stats.scheduled, stats.ready) == (3, 60)
    assert stats.ready - stats.waiting == len(queue.core.queue.shards)  # one fed to each ready
    return ids


def assert_reached_on_every_shard(queue: Queue, ids: list[str]) -> None:
    picked = select_matching(queue, TaskSearch(limit_key="big"), states=NOT_STARTED, budget=20)
    assert sorted(picked.ids) == sorted(ids) and picked.left_alone == {}
    assert sum(picked.chosen.values()) == 60 and picked.chosen.get("waiting", 0) > 0
    outcome = queue.cancel_many(picked.ids, stop_running=False)
    assert len(outcome.done) == 60 and outcome.of_matches(picked, None) == (
        "60 matched: 60 cancelled"
    )
    stats = queue.stats()
    assert (stats.scheduled, stats.ready, stats.waiting) == (3, 0, 0)
    assert queue.check() == []


def test_a_sharded_queue_under_flow_control_is_reached_on_every_shard(
    redis_url: str, queue_name: str
) -> None:
    with Queue(queue_name, redis_url, shards=3) as queue:
        assert_reached_on_every_shard(queue, backlog_on_shards(queue))


def test_a_bulk_cancel_racing_real_workers_cancels_or_runs_each_task_never_both(
    redis_url: str, queue_name: str
) -> None:
    ran: list[str] = []

    async def handler(data: object) -> None:
        ran.append(current_task().id)
        await asyncio.sleep(0.002)

    app = App(default=handler)
    worker = Worker(app, queue_name, redis_url, concurrency=4, settings=FAST)
    dispatcher = Dispatcher(queue_name, redis_url, settings=FAST)
    outcomes: list[BulkOutcome] = []

    async def scenario() -> list[str]:
        async with AsyncQueue(queue_name, redis_url, settings=FAST) as client:
            await client.set_limits(Limits(each_key=KeyLimits(concurrency=2)))
            ids = await client.schedule_many(
                [Job(n, delay=0, limit_key=f"key-{n % 3}", id=f"t-{n:03}") for n in range(300)]
            )
            async with running(dispatcher, worker):
                await wait_until(lambda: len(ran) >= 10, what="the first starts")
                for key in ("key-0", "key-1", "key-2"):  # while the workers go on
                    picked = await select_matching_async(
                        client, TaskSearch(limit_key=key), states=NOT_STARTED, budget=50
                    )
                    outcomes.append(await client.cancel_many(picked.ids, stop_running=False))

                async def settled() -> bool:
                    stats = await client.stats()
                    return stats.scheduled + stats.ready + stats.running == 0

                await wait_until(settled, timeout=30, what="every task to end")
            assert await client.check() == []
            return ids

    ids = asyncio.run(scenario())
    cancelled = {task_id for outcome in outcomes for task_id in outcome.done}
    assert cancelled and len(ran) == len(set(ran))  # none ran twice
    assert not cancelled & set(ran)  # none both cancelled and run
    assert cancelled | set(ran) == set(ids)  # none lost
    skipped = {task_id for outcome in outcomes for task_id in outcome.skipped}
    assert skipped <= set(ran)  # a task skipped as started did run
