"""Snoozes on a real server: the snooze script counts them in the task's envelope, the
handler sees the count (sync and async), a task that snoozes past its limit goes to
dead with SnoozeLimitError, and a run of snoozes of one task is one history entry, so
it pushes no finished result out of the history."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import redis
from click.testing import CliRunner

import duetime
from duetime import App, Dispatcher, HistoryOutcome, ManualClock, Queue, Settings, Worker
from duetime.cli import main
from duetime.codec import Envelope, decode_envelope, encode_envelope
from duetime.errors import InvalidOptionError
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.working import Outcome
from tests.helpers import FAST, as_bytes, running, wait_until
from tests.integration.test_dashboard import dashboard
from tests.integration.test_dashboard_history import rows

NOW_MS = 1_800_000_000_000
LEASE_MS = 60_000


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_handler_that_snoozes_every_first_attempt_ends_in_dead_at_its_limit(
    redis_url: str, queue_name: str, kind: str
) -> None:
    """The loop of the issue (``if attempt == 1: raise Snooze``) never spends an attempt:
    it used to snooze for ever. It now ends after its limit, in dead, with an error that
    names the limit; the handler saw its count go up on every run."""
    seen: list[tuple[int, int, int]] = []

    def note() -> None:
        context = duetime.current_task()
        seen.append((context.attempt, context.snoozes, context.max_snoozes))
        if context.attempt == 1:
            raise duetime.Snooze(0)

    async def looping_async(data: object) -> None:
        note()

    def looping_sync(data: object) -> None:
        note()

    app = App(default=looping_async if kind == "async" else looping_sync)
    settings = dataclasses.replace(FAST, max_snoozes=4)
    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_now("x")

        async def scenario() -> None:
            worker = Worker(app, queue_name, redis_url, settings=settings)
            async with running(Dispatcher([queue_name], redis_url, settings=settings), worker):
                await wait_until(lambda: queue.stats().dead == 1, what="the task in dead")

        asyncio.run(scenario())
        assert seen == [(1, n, 4) for n in range(5)]  # 4 snoozes, then the fifth ends it
        [dead] = queue.dead_tasks()
        assert dead.id == task_id
        assert dead.error is not None and "SnoozeLimitError" in dead.error
        assert "snoozed 4 times" in dead.error and "Settings.max_snoozes = 4" in dead.error
        assert queue.stats().counters.get("snoozed") == 4
        status = queue.status(task_id)
        assert status is not None and status.snoozes == 4
        history = queue.history(task_id=task_id)
        assert [(a.outcome, a.count) for a in history] == [
            (HistoryOutcome.DEAD, 1),
            (HistoryOutcome.SNOOZED, 4),
        ]
        assert queue.check() == []


def test_a_handler_limit_comes_before_the_setting(redis_url: str, queue_name: str) -> None:
    app = App()
    counts: list[int] = []

    @app.task(max_snoozes=2)
    def poll(data: object) -> None:
        counts.append(duetime.current_task().snoozes)
        raise duetime.Snooze(0)

    with Queue(queue_name, redis_url) as queue:
        task_id = queue.schedule_now("x", task="poll")

        async def scenario() -> None:
            worker = Worker(app, queue_name, redis_url, settings=FAST)
            async with running(Dispatcher([queue_name], redis_url, settings=FAST), worker):
                await wait_until(lambda: queue.stats().dead == 1, what="the task in dead")

        asyncio.run(scenario())
        assert counts == [0, 1, 2]
        [dead] = queue.dead_tasks()
        assert dead.id == task_id and dead.error is not None
        assert "max_snoozes of the handler = 2" in dead.error


def test_the_default_limit_is_finite_and_a_bad_one_is_refused() -> None:
    assert Settings().max_snoozes == 100
    with pytest.raises(InvalidOptionError, match="max_snoozes"):
        App().task(lambda data: None, name="x", max_snoozes=-1)
    with pytest.raises(duetime.errors.ConfigurationError, match="max_snoozes"):
        Settings(max_snoozes=1.5)  # type: ignore[arg-type]


def test_the_snooze_script_counts_in_the_envelope_and_keeps_the_rest(
    redis_url: str, queue_name: str, raw: redis.Redis
) -> None:
    """Every envelope version counts: a plain one (version 2), one with all its limits
    and an expiry (version 3), a long task name (str8); the data and limits stay."""
    clock = ManualClock(NOW_MS)
    keys = QueueKeys(queue_name)
    long_name = "n" * 40
    with Queue(queue_name, redis_url, clock=clock) as queue:
        ops, run = queue.core.queue.operations, queue.runner.run
        plain = queue.schedule_now({"a": [1, 2.5, "é"]}, id="plain")
        limited = queue.schedule_now(
            b"\x00bytes", id="limited", task=long_name, max_attempts=7, timeout=9,
            result_ttl=60, expires=3600,
        )  # fmt: skip
        before = {i: _stored(raw, keys, i) for i in (plain, limited)}
        for round_ in range(1, 131):  # past 127: the count takes two bytes
            run(ops.dispatcher.promote_due(10))
            claimed = run(ops.worker.claim("w1", LEASE_MS, 10))
            assert claimed is not None and len(claimed) == 2
            for item in claimed:
                assert run(ops.worker.snooze("w1", item.task_id, item.attempt, 0, False))
            for task_id in (plain, limited):
                envelope = _stored(raw, keys, task_id)
                assert envelope == _snoozed(before[task_id], round_)
        assert queue.check() == []


def _stored(raw: redis.Redis, keys: QueueKeys, task_id: str) -> Envelope:
    blob = raw.hget(keys.tasks, task_id)
    assert isinstance(blob, bytes)
    return decode_envelope(blob)


def _snoozed(envelope: Envelope, snoozes: int) -> Envelope:
    return Envelope(
        envelope.task, envelope.data, envelope.run_at_ms, envelope.max_attempts,
        envelope.timeout_ms, envelope.result_ttl_ms, envelope.expires_after_ms, snoozes,
    )  # fmt: skip


def test_envelopes_of_every_version_decode_and_a_count_survives_a_reschedule(
    redis_url: str, queue_name: str, raw: redis.Redis
) -> None:
    old = Envelope("t", {"x": 1}, NOW_MS, 5, 300_000, 0)
    assert decode_envelope(encode_envelope(old)) == old  # no count: written as before
    assert encode_envelope(old)[1] == 2
    counted = _snoozed(old, 3)
    assert decode_envelope(encode_envelope(counted)) == counted
    clock = ManualClock(NOW_MS)
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        ops, run = queue.core.queue.operations, queue.runner.run
        task_id = queue.schedule_now("x")
        run(ops.worker.claim("w1", LEASE_MS, 10))
        assert run(ops.worker.snooze("w1", task_id, 1, 60_000, False))
        queue.reschedule(task_id, (NOW_MS + 120_000) / 1000)
        assert _stored(raw, keys, task_id).snoozes == 1


def test_a_run_of_snoozes_is_one_history_entry_and_pushes_no_result_out(
    redis_url: str, queue_name: str
) -> None:
    """A history of 5 entries: three successes, then one task snoozing 50 times. The
    snoozes take one entry (with their count, and the latest's time), the successes
    stay; a different ending of the task starts a new entry, and so does a snooze after
    it."""
    clock = ManualClock(NOW_MS)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        queue.set_history(5)
        ops, run = queue.core.queue.operations, queue.runner.run
        for n in range(3):
            queue.schedule_now({}, id=f"ok{n}", task="send")
        run(ops.worker.claim("w1", LEASE_MS, 10))
        run(ops.worker.ack("w1", [Outcome(f"ok{n}", 1, task="send") for n in range(3)]))
        queue.schedule_now({}, id="snoozy", task="poll", max_attempts=3)
        for _ in range(50):
            clock.advance(1)
            run(ops.dispatcher.promote_due(10))
            [item] = run(ops.worker.claim("w1", LEASE_MS, 10)) or []
            assert run(ops.worker.snooze("w1", "snoozy", item.attempt, 0, False, ran=(10, 0)))
        history = queue.history()
        assert [(a.task_id, a.outcome, a.count) for a in history] == [
            ("snoozy", HistoryOutcome.SNOOZED, 50),
            ("ok2", HistoryOutcome.SUCCEEDED, 1),
            ("ok1", HistoryOutcome.SUCCEEDED, 1),
            ("ok0", HistoryOutcome.SUCCEEDED, 1),
        ]
        snoozes = history[0]
        assert snoozes.finished_at == (NOW_MS + 1000) / 1000  # the first snooze's place
        assert snoozes.last_at == (NOW_MS + 50_000) / 1000
        # A failure ends the run; the next snooze is an entry of its own.
        clock.advance(1)
        run(ops.dispatcher.promote_due(10))
        [item] = run(ops.worker.claim("w1", LEASE_MS, 10)) or []
        assert run(ops.worker.fail("w1", "snoozy", item.attempt, b"e", 0, summary="E"))
        clock.advance(1)
        run(ops.dispatcher.promote_due(10))
        [item] = run(ops.worker.claim("w1", LEASE_MS, 10)) or []
        assert run(ops.worker.snooze("w1", "snoozy", item.attempt, 0, False))
        assert [(a.outcome, a.count) for a in queue.history(task_id="snoozy")] == [
            (HistoryOutcome.SNOOZED, 1),
            (HistoryOutcome.RETRIED, 1),
            (HistoryOutcome.SNOOZED, 50),
        ]
        assert queue.check() == []


def test_the_finished_page_and_the_cli_show_a_run_of_snoozes_as_one_row(
    redis_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DUETIME_REDIS_URL", redis_url)
    clock = ManualClock(NOW_MS)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        ops, run = queue.core.queue.operations, queue.runner.run
        queue.schedule_now({}, id="snoozy", task="poll")
        for _ in range(12):
            clock.advance(1)
            run(ops.dispatcher.promote_due(10))
            [item] = run(ops.worker.claim("w1", LEASE_MS, 10)) or []
            assert run(ops.worker.snooze("w1", "snoozy", item.attempt, 0, False))
    with dashboard(redis_url, queue_name) as client:
        page = client.get(f"/q/{queue_name}/finished").text
        assert rows(page) == ["snoozy"] and "snoozed \u00d712" in page and "last " in page
        task_page = client.get(f"/q/{queue_name}/task?id=snoozy").text
        assert "<dt>Snoozes</dt><dd>12</dd>" in task_page
    listed = CliRunner().invoke(main, ["tasks", "-q", queue_name, "--state", "finished"])
    assert listed.exit_code == 0 and "snoozed \u00d712" in listed.stdout


def test_a_requeue_counts_snoozes_afresh(redis_url: str, queue_name: str, raw: redis.Redis) -> None:
    """A task that died at its snooze limit and is requeued may snooze again as many
    times (as it may run as many attempts): its envelope is as before it snoozed."""
    clock = ManualClock(NOW_MS)
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url, clock=clock) as queue:
        ops, run = queue.core.queue.operations, queue.runner.run
        task_id = queue.schedule_now({"x": 1}, expires=3600)  # a version 3 envelope
        first = _stored(raw, keys, task_id)
        for _ in range(3):
            run(ops.dispatcher.promote_due(10))
            [item] = run(ops.worker.claim("w1", LEASE_MS, 10)) or []
            assert run(ops.worker.snooze("w1", task_id, item.attempt, 0, False))
        assert _stored(raw, keys, task_id).snoozes == 3
        run(ops.dispatcher.promote_due(10))
        [item] = run(ops.worker.claim("w1", LEASE_MS, 10)) or []
        assert run(ops.worker.fail("w1", task_id, item.attempt, b"e", None, summary="E"))
        assert queue.stats().dead == 1
        assert queue.requeue_dead([task_id]) == 1
        assert _stored(raw, keys, task_id) == first
        assert as_bytes(raw.hget(keys.tasks, task_id))[:2] == b"\x98\x03"  # version 3 again
        assert queue.check() == []
