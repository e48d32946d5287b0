"""A backfill under a dispatcher kill -9 storm, on real processes (the machinery of
test_faults.py): three dispatchers race to fire a past range's ticks while one of them
is killed every second or two and restarted. Verdict: every tick of the range ran
exactly once (as attempt 1: no worker fault, so no second start is explained), none
outside the range, the backfill says it is done with every tick fired, and the checker
finds nothing."""

from __future__ import annotations

import random
import time

import pytest
import redis

from duetime import Queue
from tests.helpers import wait_until_sync
from tests.reliability.ledger import Ledger, compare
from tests.reliability.test_faults import (
    CALM_ENV,
    KINDS_IN_SOAK,
    SEED,
    Fleet,
    dump,
    pause_until,
    pick,
    report,
    shut_down,
    start_fleet,
    verdict_problems,
)
from tests.servers import Server

MINUTE_MS = 60_000


@KINDS_IN_SOAK
def test_dispatcher_kill_9_during_a_backfill_fires_each_tick_once(
    fleet: Fleet,
    server: Server,
    redis_url: str,
    raw: redis.Redis,
    queue_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rng = random.Random(SEED)
    env = {**CALM_ENV, "DUETIME_TEST_RECORD_URL": redis_url}
    ticks, rate = pick(120, 600), pick(30.0, 20.0)  # 4 s, then 30 s of firing
    dispatcher, workers = start_fleet(fleet, raw, queue_name, redis_url, env, 2, "20")
    more = [fleet.start("dispatcher", queue_name, redis_url, env) for _ in range(2)]
    dispatchers = [dispatcher, *more]  # three race to fire the backfill
    ledger = Ledger(raw)
    if time.time() % 60 > 58:  # declared and paused well within one minute: no own tick
        time.sleep(60 - time.time() % 60 + 0.1)
    now_ms = int(time.time() * 1000)
    last = (now_ms // MINUTE_MS - 1) * MINUTE_MS
    first = last - (ticks - 1) * MINUTE_MS
    with Queue(queue_name, redis_url) as queue:
        # Paused at once, so that only the backfill fires (it goes on while the job is
        # paused); overlap "allow", so that no tick is skipped for a previous live run.
        queue.add_cron("minutely", "* * * * *", {"work": 0.01}, task="ledger", overlap="allow")
        queue.pause_cron("minutely")
        info = queue.backfill_cron("minutely", first / 1000, last / 1000, rate=rate)
        assert info.ticks == ticks
        expected = {f"cron:minutely:{first + n * MINUTE_MS}": (first + n * MINUTE_MS) / 1000
                    for n in range(ticks)}  # fmt: skip
        kills = 0
        began = time.time()
        moment = began + rng.uniform(0.5, 1.5)
        while moment < began + ticks / rate:
            pause_until(moment)
            victim = rng.choice(dispatchers)
            fleet.kill(victim)
            kills += 1
            dispatchers.remove(victim)
            dispatchers.append(fleet.start("dispatcher", queue_name, redis_url, env))
            moment += rng.uniform(1.0, 2.0)
        wait_until_sync(
            lambda: ledger.all_done(expected),
            timeout=ticks / rate + 60,
            what="every tick of the backfill run",
        )
        [job] = [job for job in queue.list_cron() if job.name == "minutely"]
        shut_down(fleet, raw, queue_name, workers, dispatchers, reap_bound=30)
        dump(fleet, ledger)
        # No faults are passed: a tick that ran twice is unexplained.
        verdict = compare(ledger, expected)
        assert queue.remove_cron("minutely")
        # Each tick's outcome is kept an hour (a cron task's result_ttl): not a leak.
        problems = [
            problem
            for problem in verdict_problems(verdict, queue, raw, fleet)
            if f"{{{queue_name}}}:result:cron:minutely:" not in problem
        ]
        counters = queue.stats().counters
    ran = {run for run in ledger.runs_by_task() if run.startswith("cron:minutely:")}
    report(
        "dispatcher kill -9 during a backfill",
        capsys,
        kind=server.kind,
        ticks=ticks,
        rate=rate,
        kills=kills,
        counters=counters,
        **verdict.summary(),
    )
    assert problems == [], f"seed {SEED}:\n" + "\n".join(problems)
    assert ran == set(expected)
    assert job.backfill is not None and job.backfill.done and job.backfill.fired == ticks
    assert counters.get("cron_backfilled") == ticks, counters
