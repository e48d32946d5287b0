"""Backfills over ticks the job's own schedule fired (docs/cron.md#backfill): those ticks
are known by the job's ``cron_fired`` spans, so a backfill runs only the ticks the
schedule missed, says how many had run, and the job's last run is not called
backfilled when the schedule ran it. Also the bound on those spans, and a sharded
queue."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from datetime import UTC, datetime

import pytest
import redis
from click.testing import CliRunner

from duetime import App, Dispatcher, ManualClock, Queue, Settings, Worker, cron, current_task
from duetime.cli import main
from duetime.dispatcher import QueueDispatcher
from duetime.store.plans.cron_jobs import parsed_fired
from duetime.store.plans.keys import QueueKeys
from duetime.store.redis.runner import AsyncRunner
from tests.helpers import FAST, wait_until_sync
from tests.integration.test_backfill import stepping
from tests.integration.test_cli_schedules import daemons_in_a_thread
from tests.integration.test_cron import T0, ready_ids
from tests.integration.test_dashboard import dashboard

SECOND = 1000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE


@pytest.fixture
def cli(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
    monkeypatch.setenv("COLUMNS", "200")
    return CliRunner()


def shown(tick_ms: int) -> str:
    return datetime.fromtimestamp(tick_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_backfill_over_ticks_the_schedule_ran_runs_only_those_it_missed(
    cli: CliRunner, redis_url: str, queue_name: str
) -> None:
    """A job ticking every second runs a few ticks, is paused a few seconds (those ticks
    are missed), resumed, runs a few more, all finished: a backfill over the ticks run
    since resuming runs none and says so, the job's last run (the schedule's) is not
    called backfilled; a backfill over the whole stretch runs only the missed ticks."""
    runs: list[str] = []  # appended from the worker's threads
    app = App(default=lambda data: runs.append(current_task().id))

    def backfill(first: int, last: int) -> re.Match[str]:
        arguments = ["--utc", "cron", "backfill", "-q", queue_name, "ticker", "--from",
                     shown(first), "--to", shown(last), "--rate", "100"]  # fmt: skip
        said = cli.invoke(main, arguments)
        assert said.exit_code == 0, said.output
        found = re.fullmatch(
            r"backfill of ticker: (\d+) tick\(s\) from .+\n(\d+) already ran, (\d+) to run.*\n",
            said.stdout,
        )
        assert found is not None, said.stdout
        return found

    def settled() -> bool:
        info = queue.cron_info("ticker")
        return info is not None and info.last_run is not None and info.last_run.succeeded is True

    with Queue(queue_name, redis_url, settings=FAST) as queue:
        queue.add_cron("ticker", None, {}, every=1)
        dispatcher = Dispatcher(queue_name, redis_url, settings=FAST)
        worker = Worker(app, queue_name, redis_url, settings=FAST, concurrency=4)
        with daemons_in_a_thread(dispatcher, worker):
            wait_until_sync(lambda: len(runs) >= 3, what="the schedule's first ticks")
            queue.pause_cron("ticker")
            wait_until_sync(settled, what="the ticks before the pause to run")
            before_pause = len(runs)
            paused_at = time.time() * 1000
            time.sleep(3.2)  # three ticks or more are missed while it is paused
            queue.resume_cron("ticker")
            wait_until_sync(lambda: len(runs) >= before_pause + 3, what="ticks after resuming")
            queue.pause_cron("ticker")
            wait_until_sync(settled, what="the ticks before the pause to run")
            fired = sorted(tick for i in runs if (tick := cron.tick_of_task(i)) is not None)
            assert len(fired) == len(set(fired))
            resumed = [tick for tick in fired if tick > paused_at]
            # The ticks run since resuming: all ran; the last run is the schedule's.
            again = backfill(resumed[0], resumed[-1])
            assert again.groups() == (str(len(resumed)), str(len(resumed)), "0")
            info = queue.cron_info("ticker")
            assert info is not None and info.last_run is not None
            assert info.last_run.tick * 1000 == resumed[-1] and not info.last_run.backfilled
            listed = cli.invoke(main, ["--utc", "cron", "list", "-q", queue_name]).stdout
            assert "ok, " in listed and "backfilled" not in listed, listed
            with dashboard(redis_url, queue_name) as client:
                card = client.get(f"/q/{queue_name}/cron").text
            card = card[card.index('data-cron="ticker"') :]
            assert "backfilled" not in card[: card.index("</article>")]
            # From two seconds before the first tick to the last: the missed ones run.
            whole = range(fired[0] - 2 * SECOND, fired[-1] + 1, SECOND)
            missed = sorted(set(whole) - set(fired))
            assert len(missed) >= 5  # two before the first tick, three while paused
            said = backfill(whole[0], whole[-1])
            assert said.groups() == (str(len(whole)), str(len(fired)), str(len(missed)))
            wait_until_sync(lambda: len(runs) == len(whole), what="the missed ticks to run")
            wait_until_sync(settled, what="the last backfilled tick to run")
    assert Counter(runs) == Counter(f"cron:ticker:{tick}" for tick in whole)
    assert queue.check() == []


def fired_record(raw: redis.Redis, queue_name: str, name: str) -> tuple[str, list[list[int]]]:
    """A job's cron_fired record: where its open span starts ('' none), its closed spans."""
    value = raw.hget(QueueKeys(queue_name).cron_fired, name)
    assert isinstance(value, bytes)
    open_low, _, spans = value.decode().partition("|")
    return open_low, [[int(t) for t in span.split(":")] for span in spans.split(",")]


def test_the_fired_spans_of_a_job_are_bounded_by_closing_the_narrowest_gap(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """Each gap in the ticks a job's schedule fired (here: it was paused) starts a new
    span; past 16 spans (15 closed ones and the open one) the narrowest gap, the oldest
    of those, is closed, so a job's record stays small and no tick that ran is
    forgotten: the ticks of a closed gap count as run."""
    clock = ManualClock(T0 - 500)
    widths = [1 if gap in (2, 9, 15) else 2 for gap in range(18)]  # ticks missed per gap
    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.add_cron("minutely", "* * * * *", {})
        fired = [T0]
        for width in widths:
            fired.append(fired[-1] + (width + 1) * MINUTE)
        for tick, width in zip(fired, [*widths, 0], strict=True):
            stepping(redis_url, queue_name, clock, [tick], count=1)
            queue.pause_cron("minutely")
            clock.set(tick + width * MINUTE)  # resumed then: its next tick comes after
            queue.resume_cron("minutely")
        assert ready_ids(raw, queue_name) == [f"cron:minutely:{tick}" for tick in fired]
        open_low, spans = fired_record(raw, queue_name, "minutely")
        assert open_low == ""  # the pause after the last tick closed its span
        # Gap k lies between fired[k] and fired[k + 1]: the three one-tick gaps were
        # closed, oldest first, then the oldest two-tick gap.
        closed = {0, 2, 9, 15}
        expected = [[fired[k], fired[k + 1] if k in closed else fired[k]]
                    for k in range(19) if k - 1 not in closed]  # fmt: skip
        assert spans == expected[::-1] and len(spans) == 15
        # A backfill over them all: the fired ticks and those of the closed gaps ran.
        info = queue.backfill_cron("minutely", T0 / 1000, fired[-1] / 1000, rate=100)
        assert (info.ticks, info.already_ran, info.to_run) == (52, 19 + 2 + 3, 28)
        assert queue.check() == []


def test_a_tick_the_schedule_fires_after_a_backfill_was_planned_is_not_run_again(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """A backfill up to now holds the tick the schedule is about to fire: once the
    schedule fired it (and its run ended), the backfill reaching it runs it not again."""
    clock = ManualClock(T0 - 500)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.add_cron("hourly", "0 * * * *", {})
        clock.set(T0)
        info = queue.backfill_cron("hourly", (T0 - 2 * HOUR) / 1000, T0 / 1000, rate=1)
        assert (info.already_ran, info.to_run) == (0, 3)
        runs: list[str] = []
        for moment in (T0, T0 + SECOND, T0 + 2 * SECOND, T0 + 3 * SECOND):
            [ready] = stepping(redis_url, queue_name, clock, [moment], count=2)
            for task_id in ready:  # each run ends
                runs.append(task_id)
                assert queue.cancel(task_id)
        assert sorted(runs) == [f"cron:hourly:{T0 - h * HOUR}" for h in (2, 1, 0)]
        backfill = queue.cron_info("hourly").backfill  # type: ignore[union-attr]
        assert backfill is not None and backfill.done
        assert (backfill.fired, backfill.already_ran) == (2, 1)
        assert queue.check() == []


def test_on_a_sharded_queue_each_shard_knows_the_ticks_its_jobs_fired(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    clock = ManualClock(T0 - 500)
    names = [f"user-{i}" for i in range(12)]
    with Queue(queue_name, redis_url, clock=clock, shards=3) as queue:
        queue.add_crons([queue.cron_job(n, "* * * * *", {}) for n in names])
        homes = {name: queue.core.queue.layout.of_cron(name) for name in names}
        assert len(set(homes.values())) == 3

        async def fire(moments: list[int]) -> None:
            runners = [AsyncRunner(redis_url, Settings()) for _ in range(2)]
            dispatchers = [QueueDispatcher(queue_name, runner, Settings(), clock, shard)
                           for runner in runners for shard in range(3)]  # fmt: skip
            try:
                for moment in moments:
                    clock.set(moment)
                    await asyncio.gather(*(d.step() for d in dispatchers))
            finally:
                for runner in runners:
                    await runner.close()

        def tags() -> list[str]:
            return [queue_name if shard == 0 else f"{queue_name}#{shard}" for shard in range(3)]

        asyncio.run(fire([T0, T0 + MINUTE]))
        for tag in tags():  # the runs end
            for task_id in ready_ids(raw, tag):
                assert queue.cancel(task_id)
        start, end = (T0 - 2 * MINUTE) / 1000, (T0 + MINUTE) / 1000
        for name in names:
            info = queue.backfill_cron(name, start, end, rate=100)
            assert (info.ticks, info.already_ran, info.to_run) == (4, 2, 2)
        asyncio.run(fire([T0 + MINUTE + 500, T0 + MINUTE + 520, T0 + MINUTE + 540]))
        fired = [task_id for tag in tags() for task_id in ready_ids(raw, tag)]
        expected = [f"cron:{n}:{T0 - m * MINUTE}" for n in names for m in (2, 1)]
        assert sorted(fired) == sorted(expected)
        assert queue.check() == []


def test_the_span_of_fired_ticks_grows_tick_after_tick_and_closes_where_the_run_breaks(
    redis_url: str, raw: redis.Redis, queue_name: str
) -> None:
    """The open span grows with each tick fired after the one before; an overlap skip,
    ticks dropped by the missed policy, a changed declaration and a backfill's run
    close it; a backfill over them all runs only the ticks none of them ran."""
    clock = ManualClock(T0 - 500)
    keys = QueueKeys(queue_name)

    def spans() -> tuple[tuple[int, int], ...]:
        return parsed_fired(raw.hget(keys.cron_fired, "job"), raw.hget(keys.cron_last, "job"))

    def at(*minutes: tuple[int, int]) -> tuple[tuple[int, int], ...]:
        return tuple((T0 + low * MINUTE, T0 + high * MINUTE) for low, high in minutes)

    def fire(minute: int, end_runs: bool = True, later_ms: int = 0) -> list[str]:
        moment = T0 + minute * MINUTE + later_ms
        [ready] = stepping(redis_url, queue_name, clock, [moment], count=2)
        if end_runs:
            for task_id in ready:
                assert queue.cancel(task_id)
        return ready

    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.add_cron("job", "* * * * *", {}, overlap="skip")
        fire(0)
        fire(1)
        assert spans() == at((0, 1))
        assert raw.hget(keys.cron_fired, "job") == f"{T0}|".encode()  # written once
        fire(2, end_runs=False)
        assert fire(3) == [f"cron:job:{T0 + 2 * MINUTE}"]  # minute 3 skipped: 2 is live
        fire(4)
        assert spans() == at((0, 2), (4, 4))
        fire(7)  # minutes 5 and 6 were missed (missed="skip")
        assert spans() == at((0, 2), (4, 4), (7, 7))
        assert queue.add_cron("job", "* * * * *", {"v": 2}, overlap="skip") == "updated"
        fire(8)
        assert spans() == at((0, 2), (4, 4), (7, 7), (8, 8))
        info = queue.backfill_cron("job", T0 / 1000, (T0 + 8 * MINUTE) / 1000, rate=100)
        assert (info.ticks, info.already_ran, info.to_run) == (9, 6, 3)
        backfilled = [fire(8, later_ms=20 * (step + 1)) for step in range(4)]
        assert [ids for ids in backfilled if ids] == [
            [f"cron:job:{T0 + m * MINUTE}"] for m in (3, 5, 6)
        ]
        fire(9)
        assert spans() == at((0, 2), (4, 4), (7, 7), (8, 8), (9, 9))
        again = queue.backfill_cron("job", T0 / 1000, (T0 + 9 * MINUTE) / 1000, rate=100)
        assert (again.ticks, again.already_ran, again.to_run) == (10, 10, 0)
        assert queue.check() == []
        assert queue.remove_cron("job")  # its record goes with it
        assert raw.hget(keys.cron_fired, "job") is None and queue.check() == []
