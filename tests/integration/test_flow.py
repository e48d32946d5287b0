"""Flow control on a real server, step by step with the clock driven by the test:
priorities, turns between limit keys, per-key and queue concurrency, rate limits, and
what each does to a task's state, its cancel and the invariants."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import duetime
from duetime import (
    App,
    Dispatcher,
    Job,
    KeyLimits,
    Limits,
    ManualClock,
    Queue,
    Rate,
    Settings,
    Worker,
)
from duetime.errors import InvalidOptionError
from duetime.states import TaskState
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operations import QueueOperations
from duetime.store.plans.working import Claimed, Outcome
from duetime.store.redis.runner import SyncRunner
from tests.helpers import run_with_only_a_worker, running, wait_until
from tests.integration.test_dispatch import dispatcher_steps

T0 = 1_800_000_000_000  # ms; the server time the test sets


class Harness:
    """A client, a dispatcher's promotion and workers' claims and acks, on one clock."""

    def __init__(self, redis_url: str, queue_name: str) -> None:
        self.clock = ManualClock(T0)
        self.runner = SyncRunner(redis_url, Settings())
        self.operations = QueueOperations(QueueKeys(queue_name), self.clock)
        self.queue = Queue(queue_name, redis_url, clock=self.clock)
        self.keys = QueueKeys(queue_name)
        self.redis_url = redis_url

    def promote(self) -> float | None:
        """One promotion pass; when the dispatcher would next wake for a run-at or a
        rate limit (ms)."""
        return self.runner.run(self.operations.dispatcher.promote_due(1000)).next_due_ms

    def claim(self, worker: str = "w1", most: int = 1, taken: tuple[str, ...] = ()) -> list[str]:
        claimed = self.runner.run(self.operations.worker.claim(worker, 60_000, most, taken)) or []
        return [item.task_id for item in claimed]

    def claimed(self, worker: str = "w1", most: int = 1) -> list[Claimed]:
        return self.runner.run(self.operations.worker.claim(worker, 60_000, most)) or []

    def ack(self, task_id: str, worker: str = "w1", attempt: int = 1) -> None:
        [acked] = self.runner.run(self.operations.worker.ack(worker, [Outcome(task_id, attempt)]))
        assert acked

    def close(self) -> None:
        self.queue.close()
        self.runner.close()


@pytest.fixture
def flow(redis_url: str, queue_name: str) -> Iterator[Harness]:
    harness = Harness(redis_url, queue_name)
    yield harness
    assert harness.queue.check() == []
    harness.close()


def test_among_due_tasks_a_higher_priority_starts_first(flow: Harness) -> None:
    flow.queue.set_limits(Limits())  # under flow control before the first task comes
    at = T0 / 1000
    ids = {p: flow.queue.schedule_task(at, {"p": p}, priority=p) for p in (0, 5, -3, 2)}
    flow.promote()
    order = [flow.claim()[0] for _ in ids]
    assert order == [ids[5], ids[2], ids[0], ids[-3]]


def test_a_priority_is_a_bounded_head_start_never_an_early_start(flow: Harness) -> None:
    flow.queue.set_limits(Limits())
    plain = flow.queue.schedule_task(T0 / 1000, "plain")
    urgent_soon = flow.queue.schedule_task((T0 + 3000) / 1000, "urgent", priority=5)
    urgent_later = flow.queue.schedule_task((T0 + 6000) / 1000, "later", priority=5)
    flow.promote()
    assert flow.claim() == [plain]  # the urgent ones are not due: a priority is no run-at
    flow.ack(plain)
    second = flow.queue.schedule_task(T0 / 1000, "second")
    flow.clock.set(T0 + 6000)
    flow.promote()
    # urgent_soon ranks at T0 - 2 s, ahead of second (T0); urgent_later at T0 + 1 s, after.
    assert [flow.claim()[0] for _ in range(3)] == [urgent_soon, second, urgent_later]


def test_limit_keys_take_turns_so_a_big_backlog_cannot_starve_a_small_key(flow: Harness) -> None:
    at = T0 / 1000
    flow.queue.schedule_many([Job(n, at=at, limit_key="big") for n in range(40)])
    small = {
        key: flow.queue.schedule_many([Job(key, at=at, limit_key=key) for _ in range(3)])
        for key in ("a", "b")
    }
    flow.promote()
    started = flow.claim(most=9)
    small_ids = {task_id for ids in small.values() for task_id in ids}
    # Three turns of three keys: every small task started among the first nine.
    assert small_ids <= set(started)
    assert len(started) == 9


def test_a_key_never_runs_more_than_its_concurrency_and_gets_its_slot_back(
    flow: Harness,
) -> None:
    flow.queue.set_limits(Limits(each_key=KeyLimits(concurrency=2)))
    at = T0 / 1000
    mine = flow.queue.schedule_many([Job(n, at=at, limit_key="k") for n in range(5)])
    other = flow.queue.schedule_task(at, "other", limit_key="other")
    flow.promote()
    first = flow.claim(most=10)
    assert len([i for i in first if i in mine]) == 2 and other in first
    assert flow.claim("w2", most=10) == []  # another worker gets none of k's either
    flow.ack(first[0] if first[0] in mine else first[1])
    assert len(flow.claim("w2", most=10)) == 1
    state = flow.queue.flow()
    [k] = [group for group in state.groups if group.key == "k"]
    assert (k.due, k.running) == (2, 2)
    stats = flow.queue.stats()
    assert stats.flow_control and stats.waiting == 2 and stats.ready == 2


def test_the_queue_cap_holds_over_every_worker(flow: Harness) -> None:
    flow.queue.set_limits(Limits(cap=3))
    flow.queue.schedule_many([(T0 / 1000, n) for n in range(10)])
    flow.promote()
    assert len(flow.claim("w1", most=2)) == 2
    assert len(flow.claim("w2", most=5)) == 1
    assert flow.claim("w3", most=5) == []


def test_a_rate_limited_key_waits_for_its_exact_time_without_spending_an_attempt(
    flow: Harness, raw: redis.Redis
) -> None:
    flow.queue.set_limits(Limits(each_key=KeyLimits(rate=Rate(2, per=1.0))))
    ids = flow.queue.schedule_many([Job(n, at=T0 / 1000, limit_key="api") for n in range(4)])
    flow.promote()
    assert len(flow.claim(most=4)) == 1
    # The next start is 500 ms on: the dispatcher sleeps until then, not a poll.
    assert flow.promote() == T0 + 500
    flow.clock.set(T0 + 499)
    flow.promote()
    assert flow.claim(most=4) == []
    flow.clock.set(T0 + 500)
    flow.promote()
    assert len(flow.claim(most=4)) == 1
    waiting = [i for i in ids if flow.queue.status(i).state == TaskState.READY]  # type: ignore[union-attr]
    assert len(waiting) == 2
    assert raw.hmget(flow.keys.attempts, waiting) == [None, None]  # no attempt spent


def test_a_killed_workers_slot_comes_back_when_its_lease_is_reaped(flow: Harness) -> None:
    flow.queue.set_limits(Limits(each_key=KeyLimits(concurrency=1)))
    ids = flow.queue.schedule_many([Job(n, at=T0 / 1000, limit_key="k") for n in range(2)])
    flow.promote()
    assert len(flow.claim("dies")) == 1
    assert flow.claim("w2") == []
    flow.clock.set(T0 + 61_000)  # its lease ran out: the worker is gone
    assert flow.runner.run(flow.operations.dispatcher.reap_expired_leases(100)) == 1
    flow.promote()
    started = flow.claim("w2", most=2)
    assert len(started) == 1 and started[0] in ids


def test_raising_a_limit_at_run_time_lets_waiting_tasks_start_at_once(flow: Harness) -> None:
    flow.queue.set_limits(Limits(each_key=KeyLimits(concurrency=1)))
    flow.queue.schedule_many([Job(n, at=T0 / 1000, limit_key="k") for n in range(3)])
    flow.promote()
    assert len(flow.claim(most=3)) == 1
    flow.queue.set_key_limits("k", KeyLimits(concurrency=3))
    assert len(flow.claim(most=3)) == 2
    assert flow.queue.limits() == Limits(
        each_key=KeyLimits(concurrency=1), keys={"k": KeyLimits(concurrency=3)}
    )


def test_a_due_task_waiting_for_its_turn_is_ready_and_can_be_cancelled(
    flow: Harness, raw: redis.Redis
) -> None:
    flow.queue.set_limits(Limits(each_key=KeyLimits(concurrency=1)))
    first, second = flow.queue.schedule_many(
        [Job(n, at=T0 / 1000, limit_key="k", priority=1) for n in range(2)]
    )
    flow.promote()
    flow.claim()
    waiting = second if flow.queue.status(first).state == TaskState.RUNNING else first  # type: ignore[union-attr]
    assert flow.queue.status(waiting).state == TaskState.READY  # type: ignore[union-attr]
    assert flow.queue.cancel(waiting)
    assert flow.queue.status(waiting) is None
    assert raw.zcard(flow.keys.due) == 0 and not raw.hexists(flow.keys.flow_records, waiting)


def test_a_failed_attempt_frees_its_slot_and_its_retry_keeps_its_key(flow: Harness) -> None:
    flow.queue.set_limits(Limits(each_key=KeyLimits(concurrency=1)))
    first, second = flow.queue.schedule_many(
        [Job(n, at=T0 / 1000, limit_key="k") for n in range(2)]
    )
    flow.promote()
    [claimed] = flow.claimed()
    retry_at = None
    applied = flow.runner.run(
        flow.operations.worker.fail("w1", claimed.task_id, 1, b"boom", retry_at or 0)
    )
    assert applied
    flow.promote()
    # The retry is due at once: both compete for k's one slot, one after the other.
    [next_one] = flow.claim(most=2)
    assert flow.claim(most=2) == []
    assert {next_one} <= {first, second}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"priority": 1001}, "priority must be an integer from -1000 to 1000"),
        ({"priority": 1.5}, "priority must be an integer"),
        ({"cost": 0}, "cost must be an integer from 1"),
        ({"limit_key": ""}, "limit_key must be a non-empty string"),
        ({"limit_key": "a\x00b"}, "control characters"),
        ({"limit_key": "x" * 10_000}, "at most 200"),
    ],
)
def test_bad_flow_options_are_refused_before_anything_is_written(
    flow: Harness, raw: redis.Redis, options: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        flow.queue.schedule_in(1, "x", **options)  # type: ignore[arg-type]
    assert raw.exists(flow.keys.tasks, flow.keys.limits) == 0


@pytest.mark.parametrize(
    "make",
    [
        lambda: Limits(cap=0),
        lambda: KeyLimits(concurrency=-1),
        lambda: Rate(0),
        lambda: Rate(10, per=float("nan")),
        lambda: Rate(10, per=0),
        lambda: Rate(10**12),
        lambda: Limits(keys={"": KeyLimits(concurrency=1)}),
    ],
)
def test_bad_limits_are_refused(make: object) -> None:
    with pytest.raises(InvalidOptionError):
        make()  # type: ignore[operator]


def test_rates_read_as_people_write_them() -> None:
    assert Rate.parse("10/s") == Rate(10, 1.0)
    assert Rate.parse("600/min") == Rate(600, 60.0)
    assert Rate.parse("5/2s", burst=3) == Rate(5, 2.0, 3)
    with pytest.raises(InvalidOptionError, match="like 10/s"):
        Rate.parse("ten per second")


def test_workers_and_a_dispatcher_keep_every_limit_and_run_everything(
    redis_url: str, queue_name: str
) -> None:
    """Two workers of 8 slots each, a dispatcher, 60 tasks over 5 keys (due now and
    soon, some with priorities): every task runs once, no key ever has more than 2
    running, the queue never more than 5, and the invariants hold after."""
    app = App()
    now_running: Counter[str] = Counter()
    peaks: Counter[str] = Counter()
    done: list[int] = []

    @app.default
    async def handler(data: dict[str, Any]) -> None:
        key = data["key"]
        now_running[key] += 1
        now_running["*"] += 1
        peaks[key] = max(peaks[key], now_running[key])
        peaks["*"] = max(peaks["*"], now_running["*"])
        await asyncio.sleep(0.005)
        now_running[key] -= 1
        now_running["*"] -= 1
        done.append(data["n"])

    settings = Settings(heartbeat_interval=0.1, lease_duration=2.0)
    with Queue(queue_name, redis_url) as queue:
        queue.set_limits(Limits(cap=5, each_key=KeyLimits(concurrency=2)))
        jobs = [
            Job({"n": n, "key": f"k{n % 5}"}, delay=0.1 * (n % 3), limit_key=f"k{n % 5}",
                priority=n % 4)
            for n in range(60)
        ]  # fmt: skip
        queue.schedule_many(jobs)

        async def scenario() -> None:
            workers = [
                Worker(app, queue_name, redis_url, settings=settings, concurrency=8)
                for _ in range(2)
            ]
            dispatcher = Dispatcher([queue_name], redis_url, settings=settings)
            async with running(*workers, dispatcher):
                await wait_until(lambda: len(done) == 60, timeout=30, what="all 60 tasks")

        asyncio.run(scenario())
        assert sorted(done) == list(range(60))
        assert max(peaks[f"k{n}"] for n in range(5)) <= 2
        assert peaks["*"] <= 5
        assert queue.check() == []
        assert queue.flow().running == 0 and queue.flow().due == 0


def test_a_waiting_tasks_status_says_what_holds_it(flow: Harness) -> None:
    flow.queue.set_limits(Limits(each_key=KeyLimits(concurrency=1, rate=Rate(1, per=10.0))))
    ids = flow.queue.schedule_many(
        [Job(n, at=T0 / 1000, limit_key="api", priority=3, cost=1) for n in range(3)]
    )
    flow.promote()
    [started] = flow.claim(most=3)
    waiting = [flow.queue.status(i) for i in ids if i != started]
    assert all(s is not None and s.state == TaskState.READY for s in waiting)
    first = waiting[0]
    assert first is not None and (first.priority, first.limit_key, first.cost) == (3, "api", 1)
    assert first.waiting_for == "a free slot of key 'api': 1 of 1 running"
    flow.ack(started)
    flow.claim(most=3)  # the slot is free, the rate is not: the key waits 10 s
    again = flow.queue.status(ids[1] if ids[1] != started else ids[2])
    assert again is not None
    assert again.waiting_for == "the rate limit of key 'api', until 2027-01-15T08:00:10.000+00:00"


def test_a_snoozed_task_runs_again_later_without_spending_an_attempt(
    redis_url: str, queue_name: str
) -> None:
    """A handler that raises Snooze runs again after the snooze, with its attempt given
    back (max_attempts=1 still lets it run twice) and no error; with whole_key, the
    other task of its key waits as long."""
    app = App()
    runs: list[tuple[str, int, float]] = []

    @app.default
    def handler(data: str) -> None:
        context = duetime.current_task()
        runs.append((data, context.attempt, time.monotonic()))
        if data == "first" and len(runs) == 1:
            raise duetime.Snooze(0.5, whole_key=True)

    settings = Settings(heartbeat_interval=0.1, lease_duration=2.0)
    with Queue(queue_name, redis_url) as queue:
        first = queue.schedule_now("first", limit_key="api", max_attempts=1)

        async def scenario() -> None:
            worker = Worker(app, queue_name, redis_url, settings=settings)
            dispatcher = Dispatcher([queue_name], redis_url, settings=settings)
            async with running(worker, dispatcher):
                await wait_until(
                    lambda: queue.stats().counters.get("snoozed") == 1, what="the snooze"
                )
                queue.schedule_now("second", limit_key="api")
                await wait_until(lambda: len(runs) == 3, what="three runs")

        asyncio.run(scenario())
        status = queue.status(first)
        assert status is None  # done, and no result kept: it succeeded on its second run
        assert runs[0][:2] == ("first", 1)
        assert {data for data, _, _ in runs[1:]} == {"first", "second"}
        assert all(attempt == 1 for _, attempt, _ in runs)  # the attempt was given back
        # The whole key waited: neither ran again before the snooze was over.
        assert min(at for _, _, at in runs[1:]) - runs[0][2] >= 0.45
        stats = queue.stats()
        assert stats.counters.get("snoozed") == 1 and stats.dead == 0
        assert stats.counters.get("failed", 0) == 0


@pytest.mark.parametrize("seconds", [-1, float("nan"), float("inf"), 31 * 24 * 3600, "5"])
def test_a_snooze_of_a_bad_length_is_refused(seconds: object) -> None:
    with pytest.raises(ValueError):
        duetime.Snooze(seconds)  # type: ignore[arg-type]


def test_flow_lists_keys_with_running_tasks_beside_many_due_ones(flow: Harness) -> None:
    flow.queue.set_limits(Limits())
    flow.queue.schedule_task(T0 / 1000, "a", limit_key="a")
    flow.promote()
    assert len(flow.claim()) == 1
    flow.queue.schedule_many([Job(n, at=T0 / 1000, limit_key=f"b{n:03}") for n in range(120)])
    flow.promote()
    groups = flow.queue.flow(50).groups
    assert groups[0].key == "a" and groups[0].running == 1
    assert [g.key for g in groups[1:]] == [f"b{n:03}" for n in range(49)]


def test_setting_the_queues_own_limits_keeps_the_keys_own(flow: Harness) -> None:
    flow.queue.set_limits(Limits(cap=3, keys={"vip": KeyLimits(concurrency=5)}))
    flow.queue.set_queue_limits(Limits(rate=Rate(5), each_key=KeyLimits(concurrency=1)))
    assert flow.queue.limits() == Limits(
        rate=Rate(5), each_key=KeyLimits(concurrency=1), keys={"vip": KeyLimits(concurrency=5)}
    )


def test_a_cron_jobs_ticks_carry_its_priority_and_limit_key(flow: Harness) -> None:
    flow.queue.add_cron("report", "* * * * * *", {"r": 1}, limit_key="reports", priority=2)
    [info] = flow.queue.list_cron()
    assert (info.priority, info.limit_key, info.cost) == (2, "reports", 1)
    assert flow.queue.limits() is None  # declaring it changes nothing yet
    flow.clock.set(T0 + 2000)
    with dispatcher_steps(flow.redis_url, flow.keys.queue, Settings(), flow.clock) as step:
        step()  # fires the due tick
    flow.promote()
    [tick] = flow.claim(most=5)
    status = flow.queue.status(tick)
    assert status is not None and (status.priority, status.limit_key) == (2, "reports")
    flow.ack(tick)
    triggered = flow.queue.trigger_cron("report")
    status = flow.queue.status(triggered)
    assert status is not None and status.limit_key == "reports"
    flow.promote()
    assert flow.claim(most=5) == [triggered]
    flow.ack(triggered)
    flow.queue.remove_cron("report")


def test_a_cron_job_with_a_bad_flow_option_is_refused(flow: Harness) -> None:
    with pytest.raises(InvalidOptionError, match="limit_key"):
        flow.queue.add_cron("bad", "* * * * *", {}, limit_key="")
    assert flow.queue.list_cron() == []


@pytest.mark.parametrize("batch", [False, True], ids=["one", "many"])
def test_a_task_due_now_on_a_flow_controlled_queue_runs_with_no_dispatcher(
    redis_url: str, queue_name: str, batch: bool
) -> None:
    """Issue #41, point 8: a due-now task joins the due set in its schedule call, as a
    plain one joins ready, so a worker starts it within its limits with no dispatcher
    pass (before, it stayed scheduled until a dispatcher promoted it)."""

    def schedule() -> None:
        if batch:
            queue.schedule_many([Job(n, delay=0, limit_key="k", priority=n) for n in range(3)])
        else:
            for n in range(3):
                queue.schedule_now(n, limit_key="k", priority=n)

    with Queue(queue_name, redis_url) as queue:
        queue.set_limits(Limits(each_key=KeyLimits(concurrency=1)))
        ran = run_with_only_a_worker(queue_name, redis_url, schedule, runs=3)
        assert sorted(ran) == [0, 1, 2]  # type: ignore[type-var]
        assert queue.stats().scheduled == 0
        assert queue.check() == []


def test_a_due_now_task_is_due_at_once_and_keeps_the_limits(flow: Harness) -> None:
    """Point 8, step by step: the schedule call files the task among the due (a worker
    claims it with no promotion), and the key's concurrency still holds."""
    flow.queue.set_limits(Limits(each_key=KeyLimits(concurrency=1)))
    first = flow.queue.schedule_task(T0 / 1000, "a", limit_key="k")
    second = flow.queue.schedule_task(T0 / 1000, "b", limit_key="k", priority=5)
    assert flow.queue.status(first).state == TaskState.READY  # type: ignore[union-attr]
    assert flow.claim(most=5) == [second]  # its priority holds: no promotion ran
    assert flow.claim("w2", most=5) == []  # and the key's concurrency of 1
    flow.ack(second)
    assert flow.claim("w2", most=5) == [first]


@pytest.mark.parametrize("how", ["lease", "worker"])
def test_a_task_taken_back_from_a_killed_worker_keeps_its_place(flow: Harness, how: str) -> None:
    """Issue #41, point 9: a task recovered from a killed worker (its lease reaped, or
    the worker reaped) keeps the rank it had, as a handed-back one does; before, it
    ranked from its re-entry and waited behind its key's whole backlog."""
    flow.queue.set_limits(Limits(each_key=KeyLimits(concurrency=1)))
    started = flow.queue.schedule_task(T0 / 1000, "first", limit_key="k")
    flow.promote()  # (a no-op since point 8: the task is due from its schedule call)
    assert flow.claim("dies") == [started]
    flow.clock.set(T0 + 1000)
    backlog = flow.queue.schedule_many([Job(n, delay=0, limit_key="k") for n in range(5)])
    flow.promote()
    flow.clock.set(T0 + 61_000)  # the lease ran out; the worker went silent
    if how == "lease":
        assert flow.runner.run(flow.operations.dispatcher.reap_expired_leases(100)) == 1
    else:
        assert flow.runner.run(flow.operations.dispatcher.reap_worker("dies", T0 + 60_000)) == 1
    flow.promote()
    assert flow.claim("w2", most=5) == [started]  # ahead of the backlog due after it
    flow.ack(started, "w2", attempt=2)
    assert flow.claim("w2", most=5)[0] in backlog


@pytest.mark.parametrize("batch", [False, True], ids=["one", "many"])
def test_an_explicit_priority_0_or_cost_1_keeps_a_queue_off_flow_control(
    flow: Harness, raw: redis.Redis, batch: bool
) -> None:
    """Point 10: priority=0 and cost=1 are the defaults, given or not: they write no flow
    record, and the queue keeps the plain path (due tasks straight to ready)."""
    if batch:
        flow.queue.schedule_many([Job("x", at=T0 / 1000, priority=0, cost=1)])
    else:
        flow.queue.schedule_task(T0 / 1000, "x", priority=0, cost=1)
    assert not flow.queue.stats().flow_control
    assert raw.exists(flow.keys.limits, flow.keys.flow_records, flow.keys.due) == 0
    assert raw.llen(flow.keys.ready) == 1
