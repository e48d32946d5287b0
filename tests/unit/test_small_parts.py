"""Settings, back-off, clocks, the handler registry and stopping loops."""

from __future__ import annotations

import asyncio
import logging

import pytest
from freezegun import freeze_time

from duetime import App, ManualClock, ServerClock, Settings
from duetime.backoff import Backoff, Outage, retry_delay
from duetime.clock import wait_until
from duetime.errors import ConfigurationError, RedisCommandError, UnknownHandlerError
from duetime.store.plans.requests import Durability, MadeOnDemand
from duetime.supervisor import cancel_and_wait


def test_settings_refuse_non_positive_and_incoherent_values() -> None:
    with pytest.raises(ConfigurationError, match="lease_duration"):
        Settings(lease_duration=0)
    with pytest.raises(ConfigurationError, match="twice heartbeat_interval"):
        Settings(lease_duration=1.0, heartbeat_interval=1.0)
    assert Settings().replace(max_attempts=2).max_attempts == 2


def test_promote_ahead_may_be_zero_but_not_negative_or_long() -> None:
    assert Settings(promote_ahead=0).promote_ahead == 0
    with pytest.raises(ConfigurationError, match="promote_ahead"):
        Settings(promote_ahead=-0.001)
    with pytest.raises(ConfigurationError, match=r"up to 1 \(a task promoted ahead holds"):
        Settings(promote_ahead=2.0)
    assert Settings.from_env({"DUETIME_PROMOTE_AHEAD": "0"}).promote_ahead == 0


def test_stage_ahead_may_be_zero_but_not_negative_or_past_an_hour() -> None:
    assert Settings(stage_ahead=0).stage_ahead == 0
    for wrong in (-0.5, 3601.0, float("nan")):
        with pytest.raises(ConfigurationError, match="stage_ahead"):
            Settings(stage_ahead=wrong)
    assert Settings.from_env({"DUETIME_STAGE_AHEAD": "10"}).stage_ahead == 10


def test_durable_fsync_is_a_switch_read_from_words_in_the_environment() -> None:
    for word, value in (("1", True), ("yes", True), ("On", True), ("false", False), ("0", False)):
        assert Settings.from_env({"DUETIME_DURABLE_FSYNC": word}).durable_fsync is value
    with pytest.raises(ConfigurationError, match="DUETIME_DURABLE_FSYNC must be true or false"):
        Settings.from_env({"DUETIME_DURABLE_FSYNC": "sometimes"})
    with pytest.raises(ConfigurationError, match="durable_fsync must be true or false, got 1"):
        Settings(durable_fsync=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("replicas", "fsync", "durable", "wanted"),
    [
        (0, False, None, None),
        (0, False, True, (1, False)),  # durable=True asks for a replica where none is set
        (2, False, None, (2, False)),
        (2, False, False, None),
        (0, True, None, (0, True)),  # the master's own fsync, no replica
        (0, True, True, (0, True)),
        (1, True, None, (1, True)),
    ],
)
def test_durability_follows_the_settings_and_the_per_queue_switch(
    replicas: int, fsync: bool, durable: bool | None, wanted: tuple[int, bool] | None
) -> None:
    settings = Settings(durable_replicas=replicas, durable_fsync=fsync)
    durability = Durability.wanted(settings, durable)
    assert (durability and (durability.replicas, durability.fsync)) == wanted


@pytest.mark.parametrize("durable", [True, None])
def test_a_durable_wait_that_could_outlast_the_socket_timeout_is_refused_at_the_door(
    durable: bool | None,
) -> None:
    """The confirmation is read within socket_timeout: a longer wait would report Redis
    unavailable for a write that went through, and a retry would store the task twice."""
    settings = Settings(durable_replicas=1 if durable is None else 0, socket_timeout=1.0)
    with pytest.raises(ConfigurationError, match=r"durable_timeout \(1s\) must be at least 0.5s"):
        Durability.wanted(settings, durable)
    assert Durability.wanted(settings, False) is None  # not durable: no wait to read
    assert Durability.wanted(settings.replace(durable_timeout=0.5), durable) is not None


def test_a_durable_confirmation_names_what_fell_short() -> None:
    wait = Durability(2, 500)
    assert wait.commands == [("WAIT", 2, 500)]
    assert wait.shortfall([2, 3]) == (2, None)
    assert wait.shortfall([3, 1]) == (1, "only 1 of 2 replica(s) confirmed it in 0.5s")
    assert wait.shortfall(None)[1] == (
        "the slot map changed during the call, so no wait covered every write"
    )
    fsync = Durability(1, 500, fsync=True)
    # WAIT first, so that the replica's fsync report follows the write (see commands).
    assert fsync.commands == [("WAIT", 1, 500), ("WAITAOF", 1, 1, 500)]
    assert Durability(0, 500, fsync=True).commands == [("WAITAOF", 1, 0, 500)]
    assert fsync.shortfall([[1, 1]]) == (1, None)
    assert fsync.shortfall([[1, 0]])[1] == (
        "only 0 of 1 replica(s) wrote it to their append-only file in 0.5s"
    )
    assert fsync.shortfall([[0, 1]])[1] == (
        "the master did not write it to its append-only file within 0.5s"
    )
    refused = RedisCommandError("no AOF")
    assert fsync.shortfall([[1, 1], refused]) == (0, "the server refused to confirm (no AOF)")


def test_wait_until_never_returns_before_the_clock_reads_the_moment() -> None:
    """Several waiters on the shared timer thread, one of them cancelled: each of the
    others wakes, in order, no earlier than its moment by the clock it waits on."""
    clock = ServerClock()
    clock.observe(1_000_000.0, round_trip=0.0)

    async def scenario() -> list[tuple[float, float]]:
        woke: list[tuple[float, float]] = []

        async def waiter(moment: float) -> None:
            await wait_until(clock, moment)
            woke.append((moment, clock.seconds_until(moment)))

        base = float(clock.now_ms() or 0)
        moments = [base + offset for offset in (305.0, 102.5, 200.0, 200.0, 0.0)]
        tasks = [asyncio.create_task(waiter(moment)) for moment in moments]
        doomed = asyncio.create_task(waiter(base + 150.0))
        # Cancelled once every waiter waits on the timer, long before its moment (a loaded
        # machine may hold this thread a few ms, never 150).
        await asyncio.sleep(0.001)
        doomed.cancel()
        await asyncio.gather(*tasks)
        return woke

    woke = asyncio.run(scenario())
    assert [moment for moment, _ in woke] == sorted(moment for moment, _ in woke)
    assert len(woke) == 5
    assert all(remaining <= 0 for _, remaining in woke)  # never early


def test_wait_until_a_driven_clock_waits_until_the_test_moves_it() -> None:
    clock = ManualClock(1000)

    async def scenario() -> None:
        waiting = asyncio.create_task(wait_until(clock, 1000.5))
        await asyncio.sleep(0.12)  # real time passes; the driven clock does not
        assert not waiting.done()
        clock.set(1001)
        await asyncio.wait_for(waiting, 5)

    asyncio.run(scenario())


def test_retry_delay_grows_exponentially_is_capped_and_jittered() -> None:
    for attempt, full in ((1, 1.0), (2, 2.0), (5, 16.0), (40, 600.0)):
        delays = [retry_delay(attempt, 1.0, 600.0) for _ in range(200)]
        assert all(full / 2 <= d <= full for d in delays)
        assert len(set(delays)) > 1


def test_backoff_resets() -> None:
    backoff = Backoff(cap=5.0)
    first = [backoff.next() for _ in range(10)]
    assert first[-1] <= 5.0 and max(first) > first[0]
    backoff.reset()
    assert backoff.next() <= 0.05


def test_server_clock_needs_a_sample_then_extrapolates_and_expires() -> None:
    with freeze_time("2026-11-22 00:00:00") as frozen:
        clock = ServerClock(resync_interval=5.0)
        assert clock.now_ms() is None
        clock.observe(1_000_000, round_trip=0.0001)
        assert clock.now_ms() == 1_000_000
        frozen.tick(2.5)
        assert clock.now_ms() == 1_002_500
        frozen.tick(3.0)
        assert clock.wants_sample() and clock.now_ms() == 1_005_500  # stale: resample soon
        frozen.tick(15.0)
        assert clock.now_ms() is None  # expired: must sample TIME before any use


def test_server_clock_keeps_the_better_sample_over_a_slow_one() -> None:
    with freeze_time("2026-11-22 00:00:00") as frozen:
        clock = ServerClock(resync_interval=5.0)
        clock.observe(1_000_000, round_trip=0.0001)
        frozen.tick(1.0)
        # A reply that took 50 ms trails by up to 50 ms; it must not move us back.
        clock.observe(1_000_950, round_trip=0.05)
        assert clock.now_ms() == 1_001_000


def test_manual_clock() -> None:
    clock = ManualClock(1000)
    clock.advance(1.5)
    assert clock.now_ms() == 2500
    clock.set(10)
    assert clock.now_ms() == 10


def test_app_registry_names_defaults_and_errors() -> None:
    app = App()

    @app.task
    def send(data: object) -> None: ...

    @app.task(name="reports.daily")
    async def daily(data: object) -> None: ...

    @app.default
    def fallback(data: object) -> None: ...

    assert app.handler("send").function is send and not app.handler("send").is_async
    assert app.handler("reports.daily").is_async
    assert app.handler("").function is fallback
    assert send.duetime_name == "send"  # type: ignore[attr-defined]
    with pytest.raises(UnknownHandlerError, match=r"'nope'.*registered: 'reports\.daily', 'send'"):
        app.handler("nope")
    with pytest.raises(ConfigurationError, match="two handlers"):
        app.task(lambda d: None, name="send")


def test_app_coerce_from_mapping_and_function() -> None:
    def handler(data: object) -> None: ...

    assert App.coerce({"x": handler}).handler("x").function is handler
    assert App.coerce(handler).handler("").function is handler
    with pytest.raises(UnknownHandlerError, match="no default handler"):
        App.coerce({"x": handler}).handler("")
    with pytest.raises(ConfigurationError):
        App.coerce(42)


def test_async_detection_uses_coroutine_functions() -> None:
    async def coroutine(data: object) -> None:
        await asyncio.sleep(0)

    assert App(default=coroutine).handler("").is_async


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("duetime.test-outage")
    outage = Outage(log, "queue q")
    with caplog.at_level(logging.DEBUG, logger="duetime.test-outage"):
        outage.succeeded()  # nothing to report
        for _ in range(25):
            outage.failed(ConnectionError("READONLY You can't write against a replica"), 0.05)
        outage.succeeded()
        outage.failed(ConnectionError("down again"), 0.05)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3
    assert "READONLY" in warnings[0]
    assert "working again" in warnings[1] and "25 failed" in warnings[1]
    assert "down again" in warnings[2]
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 24


def test_a_loop_that_swallows_a_cancellation_is_cancelled_again() -> None:
    """Python 3.11's asyncio.wait_for (redis-py sends commands with it) drops a
    cancellation that arrives as its wait ends; the loop then blocks in its next command.
    Modelled here by a loop that swallows the first cancellation, then blocks."""
    swallowed: list[bool] = []

    async def loop() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.append(True)
        await asyncio.sleep(3600)  # the next "command", as a blocking read

    async def scenario() -> tuple[bool, bool]:
        task = asyncio.create_task(loop())
        await asyncio.sleep(0)
        ended = await cancel_and_wait(task, timeout=5)
        return ended, task.cancelled()

    assert asyncio.run(scenario()) == (True, True)
    assert swallowed == [True]


def test_a_loop_that_does_not_end_is_left_after_the_timeout() -> None:
    async def scenario() -> tuple[bool, int]:
        stubborn = True
        cancellations = 0

        async def loop() -> None:
            nonlocal cancellations
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    cancellations += 1
                    if not stubborn:
                        raise

        task = asyncio.create_task(loop())
        await asyncio.sleep(0)
        ended = await cancel_and_wait(task, timeout=0.3)
        stubborn = False
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return ended, cancellations

    ended, cancellations = asyncio.run(scenario())
    assert not ended
    assert cancellations >= 3  # cancelled again and again while it was waited for


def test_calls_made_on_demand_are_made_once_each_in_order() -> None:
    made: list[int] = []

    def make(number: int) -> str:
        made.append(number)
        return f"call {number}"

    calls = MadeOnDemand(4, make)
    assert len(calls) == 4 and made == []
    assert calls[2] == "call 2" and made == [0, 1, 2]  # each may depend on the one before
    assert list(calls) == ["call 0", "call 1", "call 2", "call 3"]
    assert calls[-1] == "call 3" and calls[1:3] == ["call 1", "call 2"]
    assert made == [0, 1, 2, 3]
    with pytest.raises(IndexError):
        calls[4]


def test_a_worker_waits_for_the_later_of_a_note_and_the_run_at() -> None:
    """A re-entry or hand-back notes its own time, which may come before the run-at of
    a task promoted ahead and claimed once already: the note must not make it early."""
    from duetime.codec import Envelope
    from duetime.store.plans.working import Claimed
    from duetime.worker.attempt import not_before

    clock = ManualClock(1_000_000)
    ahead = Envelope("", {}, 1_000_500, 5, 1000, 0)
    due = Envelope("", {}, 999_000, 5, 1000, 0)
    assert not_before(clock, Claimed("a", 2, b"", 999_990), ahead) == 1_000_500
    assert not_before(clock, Claimed("a", 2, b"", 1_000_700), ahead) == 1_000_700
    assert not_before(clock, Claimed("a", 1, b""), ahead) == 1_000_500
    assert not_before(clock, Claimed("a", 2, b"", 999_990), due) == 999_990
    assert not_before(clock, Claimed("a", 1, b""), due) is None
