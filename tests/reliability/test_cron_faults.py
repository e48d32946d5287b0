"""A backfill under a dispatcher kill -9 storm, on real processes (the machinery of
scenario.py): three dispatchers race to fire a past range's ticks while one of them
is killed every second or two and restarted. Verdict: every tick of the range ran
exactly once (as attempt 1: no worker fault, so no second start is explained), none
outside the range, the backfill says it is done with every tick fired, and the checker
finds nothing."""

from __future__ import annotations

import time

from tests.helpers import wait_until_sync
from tests.reliability.scenario import (
    CALM_ENV,
    KINDS_IN_SOAK,
    Scenario,
    leftovers,
    pause_until,
    pick,
)

MINUTE_MS = 60_000


@KINDS_IN_SOAK
def test_dispatcher_kill_9_during_a_backfill_fires_each_tick_once(scenario: Scenario) -> None:
    scenario.configure(CALM_ENV)
    rng, ledger = scenario.rng, scenario.ledger
    ticks, rate = pick(120, 600), pick(30.0, 20.0)  # 4 s, then 30 s of firing
    # Three dispatchers race to fire the backfill.
    dispatchers, workers = scenario.start_fleet(dispatchers=3, workers=2, concurrency=20)
    if time.time() % 60 > 58:  # declared and paused well within one minute: no own tick
        time.sleep(60 - time.time() % 60 + 0.1)
    now_ms = int(time.time() * 1000)
    last = (now_ms // MINUTE_MS - 1) * MINUTE_MS
    first = last - (ticks - 1) * MINUTE_MS
    with scenario.queue() as queue:
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
            scenario.fleet.replace(rng.choice(dispatchers), dispatchers)
            kills += 1
            moment += rng.uniform(1.0, 2.0)
        wait_until_sync(
            lambda: ledger.all_done(expected),
            timeout=ticks / rate + 60,
            what="every tick of the backfill run",
        )
        [job] = [job for job in queue.list_cron() if job.name == "minutely"]
        scenario.shut_down(workers, dispatchers)
        assert queue.remove_cron("minutely")
        # Each tick's outcome is kept an hour (a cron task's result_ttl): not a leak.
        results = f"{{{queue.name}}}:result:cron:minutely:"
        # No faults are passed: a tick that ran twice is unexplained.
        end = scenario.verdict(
            queue,
            expected,
            left_behind=lambda: [
                key for key in leftovers(scenario.client, queue.name) if results not in key
            ],
        )
    ran = {run for run in ledger.runs_by_task() if run.startswith("cron:minutely:")}
    end.judge(
        "dispatcher kill -9 during a backfill",
        kind=scenario.server.kind,
        ticks=ticks,
        rate=rate,
        kills=kills,
    )
    assert ran == set(expected)
    assert job.backfill is not None and job.backfill.done and job.backfill.fired == ticks
    assert end.counters.get("cron_backfilled") == ticks, end.counters
