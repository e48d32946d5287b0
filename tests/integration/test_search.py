"""Searching a queue and acting on many tasks at once, on a real server (both kinds):
tasks found by id prefix, handler, last error and a field of their data in every state;
a bounded walk that a cursor continues (on a sharded queue too) and says what it read;
bulk cancel, reschedule and run now, each task in its own step, with what was skipped
and why; choosing the tasks of a bulk action by a search; bad input refused first."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis

from duetime import App, AsyncQueue, Job, Queue, TaskSearch, Worker
from duetime.client import select_matching, select_matching_async
from duetime.errors import InvalidInputError, InvalidNameError
from duetime.states import TaskState
from tests.helpers import FAST, wait_until_sync

#: Failed attempts wait ten minutes for their retry: they stay scheduled for the test.
SLOW_RETRIES = FAST.replace(retry_base=600.0, retry_max=600.0)


def ids_of(found: Any) -> set[str]:
    return {status.id for status in found}


@contextmanager
def worker_thread(app: App, queue_name: str, redis_url: str) -> Iterator[Worker]:
    """A worker on its own event loop in a thread, stopped (gracefully) on exit."""
    loop = asyncio.new_event_loop()
    worker = Worker(app, queue_name, redis_url, settings=SLOW_RETRIES, concurrency=4)
    thread = threading.Thread(target=loop.run_until_complete, args=(worker.run(),))
    thread.start()
    try:
        yield worker
    finally:
        loop.call_soon_threadsafe(worker.stop)
        thread.join(20)
        loop.close()


@contextmanager
def every_state(redis_url: str, queue_name: str) -> Iterator[Queue]:
    """A queue with a task in each state: ``order-1``, ``order-2`` and ``invoice-1``
    scheduled, ``retry-1`` waiting out a back-off after an SMTP timeout, ``dead-1`` dead
    of a full disk, ``order-held`` running (held until the block ends) and ``order-3``
    ready (the queue is paused, so nothing more is claimed)."""
    release = threading.Event()
    app = App()

    @app.task
    def hold(data: Any) -> None:
        release.wait(20)

    @app.task
    def broken(data: Any) -> None:
        raise ValueError("disk full on /var")

    @app.task
    def flaky(data: Any) -> None:
        raise TimeoutError("SMTP timeout after 30 s")

    with Queue(queue_name, redis_url, settings=SLOW_RETRIES) as queue:
        queue.schedule_in(3600, {"customer": {"id": 42, "name": "acme"}, "items": [{"sku": "X-1"}]},
                          task="send_email", id="order-1")  # fmt: skip
        queue.schedule_in(3600, {"customer": {"id": "42"}}, task="send_email", id="order-2")
        queue.schedule_in(3600, {"customer": {"id": 7}}, task="report", id="invoice-1")
        with worker_thread(app, queue_name, redis_url):
            queue.schedule_now({"to": "a@example.com"}, task=flaky, id="retry-1")
            queue.schedule_now({"path": "/var"}, task=broken, id="dead-1", max_attempts=1)
            queue.schedule_now({"customer": {"id": 0}}, task=hold, id="order-held")
            wait_until_sync(
                lambda: (
                    (queue.stats().dead, queue.stats().running) == (1, 1)
                    and queue.tasks("scheduled", 10)[0].attempts == 1
                ),
                what="a dead task, a running one and a retry waiting",
            )
            queue.pause()
            queue.schedule_now({"customer": {"id": 42}}, task="report", id="order-3")
            # A BLMOVE the worker had blocked in before the pause takes it, and the claim
            # puts it back (paused): from then on it stays in ready.
            wait_until_sync(
                lambda: getattr(queue.status("order-3"), "state", None) == TaskState.READY,
                what="order-3 back in ready",
            )
            try:
                yield queue
            finally:
                release.set()
                queue.resume()


def test_a_search_finds_tasks_by_id_handler_error_and_data_in_every_state(
    redis_url: str, queue_name: str
) -> None:
    with every_state(redis_url, queue_name) as queue:
        by_id = queue.search(TaskSearch(id_prefix="order-"))
        assert ids_of(by_id.tasks) == {"order-1", "order-2", "order-3", "order-held"}
        states = {status.id: status.state for status in by_id.tasks}
        assert states["order-3"] == TaskState.READY and states["order-held"] == TaskState.RUNNING
        assert by_id.cursor is None and by_id.walked == "tasks"
        assert by_id.total == 7 and by_id.scanned == 7  # every live task, read once

        handler = queue.search(TaskSearch(task="send_email"))
        assert ids_of(handler.tasks) == {"order-1", "order-2"}
        assert {s.data["customer"]["id"] for s in handler.tasks} == {42, "42"}

        dead = queue.search(TaskSearch(error="DISK FULL"))
        [found] = dead.tasks
        assert (found.id, found.state, found.task) == ("dead-1", TaskState.DEAD, "broken")
        assert found.last_error == "ValueError: disk full on /var"
        # An error text is looked for among the last errors only: two tasks have one.
        assert (dead.walked, dead.total, dead.scanned) == ("errors", 2, 2)
        retry = queue.search(TaskSearch(error="smtp", state="scheduled")).tasks
        assert [(s.id, s.attempts) for s in retry] == [("retry-1", 1)]
        assert queue.search(TaskSearch(error="smtp", state="dead")).tasks == []

        customer = queue.search(TaskSearch(data_field="customer.id", data_value="42"))
        assert ids_of(customer.tasks) == {"order-1", "order-2", "order-3"}
        sku = queue.search(TaskSearch(data_field="items.0.sku", data_value="X-1"))
        assert ids_of(sku.tasks) == {"order-1"}
        named = queue.search(TaskSearch(data_field="customer.name"))
        assert ids_of(named.tasks) == {"order-1"}  # the field exists: any value

        both = TaskSearch(id_prefix="order-", data_field="customer.id", state="running")
        assert ids_of(queue.search(both).tasks) == {"order-held"}
        assert queue.search(TaskSearch(task="report", id_prefix="nothing")).tasks == []


def test_a_search_is_bounded_and_its_cursor_goes_on_where_it_stopped(
    redis_url: str, queue_name: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        jobs = [
            Job({"n": n}, delay=3600, id=f"t{n:05}", task="b" if n % 3 == 0 else "a")
            for n in range(3000)
        ]
        queue.schedule_many(jobs)
        wanted = {job.id for job in jobs if job.task == "b"}
        criteria = TaskSearch(task="b")
        found: set[str] = set()
        pages = scanned = 0
        cursor = None
        while True:
            page = queue.search(criteria, cursor=cursor, budget=1000)
            pages += 1
            scanned += page.scanned
            assert page.total == 3000 and page.scanned < 3000  # a page is one bounded part
            found |= ids_of(page.tasks)
            if page.cursor is None:
                break
            cursor = page.cursor
        assert found == wanted and pages >= 3
        assert scanned >= 3000  # every task read at least once

        first = queue.search(TaskSearch(task="a"), budget=10_000, limit=10)
        assert len(first.tasks) >= 10 and first.cursor is not None
        assert first.scanned < 3000  # it stopped at the limit, after its first page


def test_a_sharded_queue_is_walked_shard_by_shard(redis_url: str, queue_name: str) -> None:
    with Queue(queue_name, redis_url, shards=3) as queue:
        ids = queue.schedule_many([Job({"n": n}, delay=3600, task="s") for n in range(300)])
        found: set[str] = set()
        cursor = None
        cursors = []
        while True:
            page = queue.search(TaskSearch(task="s"), cursor=cursor, budget=50)
            found |= ids_of(page.tasks)
            if (cursor := page.cursor) is None:
                break
            cursors.append(cursor)
        assert found == set(ids)
        assert {cursor[:2] for cursor in cursors} >= {"t1", "t2"}  # shards 1 and 2 walked


def test_bulk_actions_act_on_waiting_tasks_and_say_what_they_skipped(
    redis_url: str, queue_name: str
) -> None:
    with every_state(redis_url, queue_name) as queue:
        everything = ["order-1", "order-3", "order-held", "dead-1", "never-there"]
        made_due = queue.run_now_many(everything)
        assert made_due.done == ["order-1"]
        assert made_due.skipped == {
            "order-3": "ready", "order-held": "running", "dead-1": "dead",
            "never-there": "gone",
        }  # fmt: skip
        assert made_due.summary == "made due now 1; skipped 4 (1 dead, 1 gone, 1 ready, 1 running)"
        status = queue.status("order-1")
        assert status is not None and status.state == TaskState.READY

        later = time.time() + 7200
        moved = queue.reschedule_many(["order-2", *everything], later)
        assert moved.done == ["order-2", "order-1", "order-3"]
        assert moved.skipped == {"order-held": "running", "dead-1": "dead", "never-there": "gone"}
        for task_id in ("order-1", "order-2", "order-3"):
            status = queue.status(task_id)
            assert status is not None and status.state == TaskState.SCHEDULED
            assert status.run_at == pytest.approx(later, abs=0.01)

        cancelled = queue.cancel_many(["order-2", "order-2", *everything])
        # Each id once; the running one's worker is asked to stop it.
        assert cancelled.done == ["order-2", "order-1", "order-3", "order-held"]
        assert cancelled.skipped == {"dead-1": "dead", "never-there": "gone"}
        held = queue.status("order-held")
        assert held is not None and held.cancel_asked_at is not None
        assert queue.status("order-2") is None
        dead = queue.status("dead-1")  # a dead task is not cancelled by a bulk action
        assert dead is not None and dead.state == TaskState.DEAD

        with pytest.raises(InvalidNameError, match="invalid task id"):
            queue.cancel_many(["invoice-1", "not an id!"])
        assert queue.status("invoice-1") is not None  # checked first: nothing was done
        with pytest.raises(InvalidInputError):
            queue.reschedule_many(["invoice-1"], "tomorrow")  # type: ignore[arg-type]
    assert queue.check() == []


def test_the_tasks_of_a_bulk_action_can_be_chosen_by_a_search(
    redis_url: str, queue_name: str, raw: redis.Redis
) -> None:
    with Queue(queue_name, redis_url) as queue:
        # More than a small hash holds in its compact form (512), which HSCAN reads whole.
        queue.schedule_many(
            [
                Job({"customer": "acme" if n % 2 else "other"}, delay=3600, id=f"order-{n:04}")
                for n in range(1200)
            ]
        )
        criteria = TaskSearch(data_field="customer", data_value="acme", state="scheduled")
        pages: list[int] = []
        chosen = select_matching(queue, criteria, budget=100, on_page=lambda p: pages.append(1))
        assert len(chosen.ids) == 600 and chosen.complete and len(chosen.sample) == 20
        assert len(pages) >= 10 and chosen.scanned >= 1200
        # A task written by hand under an id duetime refuses is found, and left out.
        envelope = raw.hget(f"duetime:{{{queue_name}}}:tasks", "order-0000")
        assert isinstance(envelope, bytes)
        raw.hset(f"duetime:{{{queue_name}}}:tasks", "by hand!", envelope)
        raw.zadd(f"duetime:{{{queue_name}}}:scheduled", {"by hand!": 1})
        found = select_matching(queue, TaskSearch(id_prefix="by hand"))
        assert (found.ids, found.unnameable) == ([], 1)
        raw.hdel(f"duetime:{{{queue_name}}}:tasks", "by hand!")
        raw.zrem(f"duetime:{{{queue_name}}}:scheduled", "by hand!")
        bounded = select_matching(queue, criteria, budget=100, most_scanned=200)
        assert not bounded.complete and len(bounded.ids) < 600
        outcome = queue.cancel_many(chosen.ids)
        assert len(outcome.done) == 600 and outcome.skipped == {}
        assert queue.stats().scheduled == 600
        assert queue.search(criteria).tasks == []

    async def scenario() -> None:
        async with AsyncQueue(queue_name, redis_url) as aqueue:
            others = TaskSearch(data_field="customer", data_value="other")
            picked = await select_matching_async(aqueue, others, budget=300)
            assert len(picked.ids) == 600 and picked.complete
            due = await aqueue.run_now_many(picked.ids)
            assert len(due.done) == 600
            assert (await aqueue.stats()).ready == 600
            page = await aqueue.search(TaskSearch(id_prefix=picked.ids[0]))
            assert [status.state for status in page.tasks] == [TaskState.READY]

    asyncio.run(scenario())


def test_bad_search_input_is_refused_with_the_reason(redis_url: str, queue_name: str) -> None:
    with pytest.raises(InvalidInputError, match="at least one of"):
        TaskSearch()
    with pytest.raises(InvalidInputError, match="data_value needs a data_field"):
        TaskSearch(data_value="42")
    with pytest.raises(InvalidInputError, match="none empty"):
        TaskSearch(data_field="customer..id")
    with pytest.raises(InvalidInputError, match="state must be one of"):
        TaskSearch(task="a", state="finished")
    with Queue(queue_name, redis_url) as queue:
        with pytest.raises(InvalidInputError, match="not a search cursor"):
            queue.search(TaskSearch(task="a"), cursor="garbage")
        with pytest.raises(InvalidInputError, match="another kind of criteria"):
            queue.search(TaskSearch(error="x"), cursor="t0.12")
        with pytest.raises(InvalidInputError, match="budget"):
            queue.search(TaskSearch(task="a"), budget=0)
