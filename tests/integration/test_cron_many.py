"""Many cron jobs due at one tick, on a real server: a pass reads several script calls'
worth and fires them a batch at a time (each worked out while the one before runs);
racing dispatchers still fire each job's tick once, a poison record among them is paused
alone, and the metrics tally stays bounded in jobs."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import cast

import redis

from duetime import ManualClock, Queue, Settings, codec
from duetime.dispatcher import CRON_BATCH, QueueDispatcher
from duetime.dispatcher.cron import CRON_READ, CronFirer
from duetime.dispatcher.tally import JOBS_NAMED, OTHER_JOBS
from duetime.states import CronFireOutcome
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operations import QueueOperations
from duetime.store.redis.runner import AsyncRunner
from tests.helpers import decoded

T0 = 1_800_000_000_000  # a whole minute
MINUTE = 60_000


def test_racing_dispatchers_fire_each_of_thousands_of_jobs_once(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    plain = CRON_READ + CRON_BATCH + 7  # more than a pass reads, and a partial batch
    clock = ManualClock(T0 - 30_000)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        jobs = [queue.cron_job(f"user-{n}", "* * * * *", {"user": n}) for n in range(plain)]
        jobs += [queue.cron_job(f"spread-{n}", "* * * * *", n, jitter=20) for n in range(50)]
        queue.add_crons(jobs)
    keys = QueueKeys(queue_name)
    raw.hset(keys.cron, "user-13", b"\x93garbage")  # a poison record among them
    clock.set(T0 + 20_000)  # every jittered run is due too

    async def race() -> list[dict[tuple[str, str], int]]:
        runners = [AsyncRunner(redis_url, Settings()) for _ in range(2)]
        dispatchers = [QueueDispatcher(queue_name, r, Settings(), clock) for r in runners]
        try:
            for _ in range(20):  # a pass fires CRON_READ jobs at most: several passes
                await asyncio.gather(*(d.step() for d in dispatchers))
            return [d.cron_ticks for d in dispatchers]
        finally:
            for r in runners:
                await r.close()

    tallies = asyncio.run(race())
    fired = decoded(raw.lrange(keys.ready, 0, -1))
    expected = {f"cron:user-{n}:{T0}" for n in range(plain) if n != 13}
    expected |= {f"cron:spread-{n}:{T0}" for n in range(50)}
    assert max(Counter(fired).values()) == 1
    assert set(fired) == expected
    assert int(raw.hget(keys.stats, "cron_fired") or 0) == len(expected)
    # Every job fired moved on to its next tick (a jittered one within the next minute);
    # the poison record is paused, the rest are not.
    next_scores = cast(
        list[tuple[bytes, float]], raw.zrange(keys.cron_next, 0, -1, withscores=True)
    )
    scores = {name.decode(): score for name, score in next_scores}
    assert "user-13" not in scores and len(scores) == len(expected)
    assert all(T0 + MINUTE <= score < T0 + 2 * MINUTE for score in scores.values())
    assert raw.hget(keys.cron_last, "user-7") == f"cron:user-7:{T0}".encode()
    # Both dispatchers' tallies: every tick fired counted once, under at most JOBS_NAMED
    # names each and the rest together.
    assert sum(n for t in tallies for (_, outcome), n in t.items() if outcome == "fired") == len(
        expected
    )
    for tally in tallies:
        names = {job for job, _ in tally}
        assert len(names - {OTHER_JOBS}) <= JOBS_NAMED


def test_a_job_named_twice_in_one_call_fires_once(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0 - 30_000)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.add_cron("report", "* * * * *", {"n": 1})

    async def fire_twice() -> list[CronFireOutcome | int]:
        runner = AsyncRunner(redis_url, Settings())
        operations = QueueOperations(QueueKeys(queue_name), clock)
        try:
            [entry] = await runner.run(operations.cron.due_cron(T0, 10))
            firing = CronFirer._firing(entry, T0, {})
            row = firing.row(T0 + 1000)
            later = list(row)
            later[9] = f"cron:report:{T0 + MINUTE}"  # another tick under the same name
            return await runner.run(operations.cron.fire_cron([row, later]))
        finally:
            await runner.close()

    assert asyncio.run(fire_twice()) == [1, CronFireOutcome.STALE]
    keys = QueueKeys(queue_name)
    assert decoded(raw.lrange(keys.ready, 0, -1)) == [f"cron:report:{T0}"]
    assert raw.zscore(keys.cron_next, "report") == T0 + MINUTE
    assert codec.decode_envelope(cast(bytes, raw.hget(keys.tasks, f"cron:report:{T0}"))).data == {
        "n": 1
    }


def test_calls_on_one_job_read_that_job_only(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """Among thousands of jobs, info, pause, resume, trigger and backfill of one read its
    records alone (no HGETALL, no whole-set ZRANGE: on a million jobs those are
    hundreds of MB), and the info is what list_cron says of it."""
    with Queue(queue_name, redis_url) as queue:
        queue.add_crons(
            [queue.cron_job(f"user-{n}", "0 9 * * *", {"user": n}) for n in range(3000)]
        )
        listed = next(job for job in queue.list_cron() if job.name == "user-7")
        raw.config_resetstat()  # the test's own server
        assert queue.cron_info("user-7") == listed
        assert queue.cron_info("nobody") is None
        assert queue.pause_cron("user-7") and queue.resume_cron("user-7")
        assert queue.trigger_cron("user-7")
        now = time.time()
        assert queue.backfill_cron("user-7", now - 3 * 86400, now - 86400).ticks >= 2
        calls = cast(dict[str, dict[str, int]], raw.info("commandstats"))
        assert "cmdstat_hgetall" not in calls and "cmdstat_hkeys" not in calls
        ranges = calls.get("cmdstat_zrange", {}).get("calls", 0)
        assert ranges == 0, calls
        assert queue.cron_info("user-7") is not None
