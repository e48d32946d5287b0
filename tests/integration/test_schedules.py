"""Schedules on a real server (docs/cron.md): the catch-up window, interval schedules,
jitter, start and end, max_runs, pause_after_failures, bulk declaration, a zone gone
from the stored definition, and their bad input. Ticks are driven by a ManualClock;
dispatchers race for them as in test_cron.py. Backfills are test_backfill.py's."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from datetime import timedelta

import pytest
import redis

from duetime import ManualClock, Queue, Settings, codec
from duetime.dispatcher import QueueDispatcher
from duetime.errors import InvalidInputError
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operations import QueueOperations
from duetime.store.redis.runner import AsyncRunner
from tests.integration.test_cron import T0, ready_ids, step_all, with_dispatchers

SECOND = 1000
MINUTE = 60 * SECOND


def field(raw: redis.Redis, key: str, name: str) -> bytes:
    value = raw.hget(key, name)
    assert isinstance(value, bytes), f"{key} has no {name}"
    return value


def counter(raw: redis.Redis, queue_name: str, name: str) -> int:
    return int(raw.hget(QueueKeys(queue_name).stats, name) or 0)


@pytest.mark.parametrize(
    ("expression", "missed", "fired", "outside"),
    [
        # Down from the first tick (T0) on for ten minutes: the ticks of the last 5
        # minutes are in the window (all of them fire with missed=all, the current one
        # with skip); the 6 older ones do not.
        ("* * * * *", "all", [T0 + m * MINUTE for m in range(6, 11)], 6),
        ("* * * * *", "skip", [T0 + 10 * MINUTE], 6),
        # A tick at T0 + 1 min only: older than the window when the dispatcher is back,
        # so nothing runs, whatever the policy.
        ("1 * * * *", "all", [], 1),
    ],
)
def test_ticks_older_than_the_catch_up_window_are_skipped_and_counted(
    redis_url: str,
    raw: redis.Redis,
    queue_name: str,
    expression: str,
    missed: str,
    fired: list[int],
    outside: int,
) -> None:
    clock = ManualClock(T0 - 500)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.add_cron("report", expression, {}, missed=missed, catch_up=timedelta(minutes=5))
        first = queue.list_cron()[0].next_runs[0] * 1000

        async def scenario(dispatchers: list[QueueDispatcher]) -> None:
            clock.set(T0 + 10 * MINUTE + 2 * SECOND)  # every dispatcher was down
            await step_all(dispatchers)
            await step_all(dispatchers)  # and nothing more on a second pass

        with_dispatchers(redis_url, queue_name, clock, 2)(scenario)
        assert first <= T0 + MINUTE
        assert ready_ids(raw, queue_name) == [f"cron:report:{tick}" for tick in fired]
        assert counter(raw, queue_name, "cron_skipped_outside_window") == outside
        [info] = queue.list_cron()
        assert info.catch_up == 300 and info.next_runs[0] * 1000 > T0 + 10 * MINUTE
        assert queue.check() == []


def test_an_interval_schedule_fires_each_tick_once_from_its_anchor(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0)
    start = (T0 + 30 * SECOND) / 1000
    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.add_cron("poll", None, {"n": 1}, every=timedelta(seconds=90), start=start)
        [info] = queue.list_cron()
        assert (info.expression, info.every, info.start) == ("", 90, start)
        expected = [T0 + 30 * SECOND + i * 90 * SECOND for i in range(6)]
        assert [round(t * 1000) for t in info.next_runs] == expected[:3]

        async def scenario(dispatchers: list[QueueDispatcher]) -> None:
            rng = random.Random(5)
            for tick in expected:
                clock.set(tick + rng.randrange(0, 300))
                order = dispatchers[:]
                rng.shuffle(order)
                await asyncio.gather(*(d.step() for d in order))

        with_dispatchers(redis_url, queue_name, clock, 3)(scenario)
        fired = ready_ids(raw, queue_name)
        assert fired == [f"cron:poll:{tick}" for tick in expected]
        assert max(Counter(fired).values()) == 1
        # Declared again, unchanged: the next tick is kept (the anchor is not "now").
        assert queue.add_cron("poll", None, {"n": 1}, every=90, start=start) == "unchanged"
        stored = codec.unpack(field(raw, QueueKeys(queue_name).cron, "poll"))
        assert stored[0] == 3  # format 3: it uses schedule options
        assert queue.check() == []


def test_jitter_puts_each_run_off_deterministically_and_never_before_its_tick(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0 - 500)
    names = [f"user-{i}" for i in range(40)]
    with Queue(queue_name, redis_url, clock=clock) as queue:
        jobs = [
            queue.cron_job(n, "* * * * *", {"u": n}, jitter=timedelta(seconds=30)) for n in names
        ]
        assert queue.add_crons(jobs) == {"created": 40, "updated": 0, "unchanged": 0}
        # Each run is due at the tick plus its offset: the same for any host, below 30 s.
        due = {job.name: job.run_at(T0, T0 + MINUTE) for job in jobs}
        assert all(T0 <= at < T0 + 30 * SECOND for at in due.values())
        assert len(set(due.values())) > 30  # spread, not bunched
        keys = QueueKeys(queue_name)

        async def scenario(dispatchers: list[QueueDispatcher]) -> None:
            for moment in sorted(set(due.values())):
                clock.set(moment - 1)
                await step_all(dispatchers)
                assert all(
                    codec.decode_envelope(field(raw, keys.tasks, task_id)).run_at_ms <= moment - 1
                    for task_id in ready_ids(raw, queue_name)
                ), "a run was enqueued before it was due"
                clock.set(moment)
                await step_all(dispatchers)

        with_dispatchers(redis_url, queue_name, clock, 2)(scenario)
        fired = ready_ids(raw, queue_name)
        assert sorted(fired) == sorted(f"cron:{n}:{T0}" for n in names)  # the tick's id
        for name in names:
            envelope = codec.decode_envelope(field(raw, keys.tasks, f"cron:{name}:{T0}"))
            assert envelope.run_at_ms == due[name]
        assert counter(raw, queue_name, "cron_fired") == 40
        assert queue.check() == []


def test_start_end_and_max_runs_bound_the_ticks_and_an_ended_job_says_so(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0 - 500)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        window = {"start": (T0 + 2 * MINUTE) / 1000, "end": (T0 + 4 * MINUTE) / 1000}
        queue.add_cron("window", "* * * * *", {}, **window)
        queue.add_cron("thrice", "* * * * *", {}, max_runs=3)

        async def scenario(dispatchers: list[QueueDispatcher]) -> None:
            for minute in range(7):
                clock.set(T0 + minute * MINUTE + 100)
                await step_all(dispatchers)

        with_dispatchers(redis_url, queue_name, clock, 2)(scenario)
        fired = Counter(task_id.split(":")[1] for task_id in ready_ids(raw, queue_name))
        assert fired == {"window": 3, "thrice": 3}
        assert f"cron:window:{T0 + 2 * MINUTE}" in ready_ids(raw, queue_name)
        infos = {info.name: info for info in queue.list_cron()}
        assert infos["thrice"].ended and infos["thrice"].runs == 3
        assert infos["window"].ended and not infos["window"].paused
        assert infos["thrice"].next_runs == []
        with pytest.raises(InvalidInputError, match="has ended"):
            queue.resume_cron("thrice")
        # Declared again with more runs: it goes on from its next tick, its runs counted.
        assert queue.add_cron("thrice", "* * * * *", {}, max_runs=4) == "updated"
        clock.set(T0 + 8 * MINUTE + 100)

        async def more(dispatchers: list[QueueDispatcher]) -> None:
            for minute in (8, 9, 10):
                clock.set(T0 + minute * MINUTE + 100)
                await step_all(dispatchers)

        with_dispatchers(redis_url, queue_name, clock, 1)(more)
        fired = Counter(task_id.split(":")[1] for task_id in ready_ids(raw, queue_name))
        assert fired["thrice"] == 4
        assert queue.check() == []


def test_a_job_pauses_after_its_runs_failed_in_a_row(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0 - 500)
    operations = QueueOperations(QueueKeys(queue_name), clock)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.add_cron("fragile", "* * * * *", {}, pause_after_failures=2, max_attempts=1)

        def end_run(tick: int, fails: bool) -> None:
            """The run of ``tick`` fails its last attempt (dead), or ends otherwise."""
            task_id = f"cron:fragile:{tick}"
            if fails:
                claimed = queue.runner.run(operations.worker.claim("w", 60_000, 1))
                assert claimed is not None and [c.task_id for c in claimed] == [task_id]
                queue.runner.run(operations.worker.fail("w", task_id, 1, b"error", None))
            else:
                assert queue.cancel(task_id)

        def run(minute: int) -> None:
            async def scenario(dispatchers: list[QueueDispatcher]) -> None:
                clock.set(T0 + minute * MINUTE + 100)
                await step_all(dispatchers)

            with_dispatchers(redis_url, queue_name, clock, 2)(scenario)

        outcomes = [True, False, True, True]  # failed, ended otherwise, failed, failed
        for minute, fails in enumerate(outcomes):
            run(minute)
            end_run(T0 + minute * MINUTE, fails)
            [info] = queue.list_cron()
            assert not info.paused and info.runs == minute + 1
        run(4)  # the run of minute 3 was the second failure in a row: paused, not fired
        [info] = queue.list_cron()
        assert info.paused and info.failures == 2 and info.runs == 4
        assert f"cron:fragile:{T0 + 4 * MINUTE}" not in ready_ids(raw, queue_name)
        assert counter(raw, queue_name, "cron_paused_after_failures") == 1
        assert queue.resume_cron("fragile")
        assert queue.list_cron()[0].failures == 0  # a resume forgets them
        assert queue.check() == []


def test_bulk_declaration_in_batches_is_idempotent_and_counts_outcomes(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    with Queue(queue_name, redis_url, shards=2) as queue:
        jobs = [queue.cron_job(f"u{i}", "0 * * * *", {"u": i}, jitter=600) for i in range(2500)]
        assert queue.add_crons(jobs) == {"created": 2500, "updated": 0, "unchanged": 0}
        jobs[7] = queue.cron_job("u7", "30 * * * *", {"u": 7}, jitter=600)
        assert queue.add_crons(jobs) == {"created": 0, "updated": 1, "unchanged": 2499}
        with pytest.raises(InvalidInputError, match="twice"):
            queue.add_crons([jobs[0], jobs[0]])
        stored = sum(raw.hlen(QueueKeys(f"{queue_name}#{s}" if s else queue_name).cron)
                     for s in range(2))  # fmt: skip
        assert stored == 2500
        assert queue.check() == []


def test_a_zone_missing_from_the_tz_database_pauses_a_cron_job_not_an_interval_job(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0 - 500)
    keys = QueueKeys(queue_name)
    # Format-3 definitions naming a zone this host's tz database lacks: a cron job with
    # a 30 s jitter, and an interval job (every minute), whose ticks need no zone.
    rest = ["Gone/Away", "", "skip", "allow", 5, 300_000, 0, None, 1]
    gone = [3, "gone", "* * * * *", {}, *rest, 0, None, 30_000, None, None, None, None]
    ticking = [3, "ticking", "", {}, *rest, 60_000, None, 0, None, None, None, None]
    raw.hset(keys.cron, mapping={"gone": codec.pack(gone), "ticking": codec.pack(ticking)})
    raw.zadd(keys.cron_next, {"gone": T0, "ticking": T0})

    async def scenario(dispatchers: list[QueueDispatcher]) -> None:
        clock.set(T0 + 100)
        await step_all(dispatchers)

    with_dispatchers(redis_url, queue_name, clock, 1)(scenario)
    assert ready_ids(raw, queue_name) == [f"cron:ticking:{T0}"]
    with Queue(queue_name, redis_url, clock=clock) as queue:
        infos = {info.name: info for info in queue.list_cron()}
        assert infos["gone"].paused and "tz database" in (infos["gone"].problem or "")
        assert infos["ticking"].problem is None and infos["ticking"].every == 60
        assert [(v.kind, v.subject) for v in queue.check()] == [("poison cron", "gone")]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"catch_up": 0}, "catch_up must be a positive number"),
        ({"catch_up": -5}, "catch_up must be a positive number"),
        ({"catch_up": float("nan")}, "catch_up must be a positive number"),
        ({"jitter": 0}, "jitter must be a positive number"),
        ({"jitter": float("inf")}, "jitter must be a positive number"),
        ({"every": 60}, "not both"),
        ({"max_runs": 0}, "max_runs must be an integer from 1"),
        ({"pause_after_failures": True}, "pause_after_failures must be an integer"),
        ({"end": 1_000_000_000}, "never fires again"),
        ({"start": T0 / 1000 + 60, "end": T0 / 1000}, "end .* is before start"),
        ({"start": "tomorrow"}, "start: "),
    ],
)
def test_bad_schedule_options_are_refused_with_nothing_stored(
    redis_url: str, raw: redis.Redis, queue_name: str, options: dict[str, object], message: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        with pytest.raises(InvalidInputError, match=message):
            queue.add_cron("job", "* * * * *", {}, **options)
        with pytest.raises(InvalidInputError, match="at least 1 second"):
            queue.add_cron("job", None, {}, every=0.5)
        assert raw.dbsize() == 0


def test_on_a_sharded_queue_each_shard_fires_its_jobs_ticks_once(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0 - 500)
    names = [f"user-{i}" for i in range(30)]
    with Queue(queue_name, redis_url, clock=clock, shards=3) as queue:
        jobs = [queue.cron_job(n, None, {}, every=60, jitter=20, max_runs=2) for n in names]
        queue.add_crons(jobs)
        homes = {name: queue.core.queue.layout.of_cron(name) for name in names}
        assert len(set(homes.values())) == 3  # the jobs are spread over the shards

        async def scenario() -> None:
            runners = [AsyncRunner(redis_url, Settings()) for _ in range(2)]
            dispatchers = [
                QueueDispatcher(queue_name, runner, Settings(), clock, shard)
                for runner in runners
                for shard in range(3)
            ]
            try:
                for second in range(0, 181, 5):
                    clock.set(T0 + second * SECOND)
                    await asyncio.gather(*(d.step() for d in dispatchers))
            finally:
                for runner in runners:
                    await runner.close()

        asyncio.run(scenario())
        fired: list[str] = []
        for shard in range(3):
            tag = queue_name if shard == 0 else f"{queue_name}#{shard}"
            ids = ready_ids(raw, tag)
            assert {i.split(":")[1] for i in ids} <= {n for n, h in homes.items() if h == shard}
            fired += ids
        # Two runs each (max_runs), the ticks at T0 and T0 + 1 min, each once.
        assert sorted(fired) == sorted(f"cron:{n}:{T0 + m * MINUTE}" for n in names for m in (0, 1))
        assert all(info.ended and info.runs == 2 for info in queue.list_cron())
        assert queue.check() == []
