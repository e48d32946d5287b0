"""Settings, back-off, clocks and the handler registry."""

from __future__ import annotations

import asyncio

import pytest
from freezegun import freeze_time

from duetime import App, ManualClock, ServerClock, Settings
from duetime.backoff import Backoff, retry_delay
from duetime.errors import ConfigurationError, UnknownHandlerError


def test_settings_refuse_non_positive_and_incoherent_values() -> None:
    with pytest.raises(ConfigurationError, match="lease_duration"):
        Settings(lease_duration=0)
    with pytest.raises(ConfigurationError, match="twice heartbeat_interval"):
        Settings(lease_duration=1.0, heartbeat_interval=1.0)
    assert Settings().replace(max_attempts=2).max_attempts == 2


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
