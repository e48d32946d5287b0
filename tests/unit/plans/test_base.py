"""Sampling the server clock (store/plans/base.py): one TIME from the queue's node, read
to the microsecond, and asked again for as long as the clock refuses the sample."""

from __future__ import annotations

from duetime.clock import ManualClock, ServerClock
from duetime.store.plans.base import current_time, sample_clock
from duetime.store.plans.requests import Command
from tests.unit.plans.scripted import NOW_MS, run_plan


class Recording:
    """A clock that records each sample, and takes the first ``refused`` as too slow."""

    def __init__(self, refused: int = 0) -> None:
        self.samples: list[tuple[float, float]] = []
        self.refused = refused
        self.now: int | None = None

    def now_ms(self) -> int | None:
        return self.now

    def wants_sample(self) -> bool:
        return self.now is None

    def observe(self, server_ms: float, round_trip: float) -> None:
        self.samples.append((server_ms, round_trip))
        if len(self.samples) > self.refused:
            self.now = int(server_ms)

    def seconds_until(self, server_ms: float) -> float:
        return 0.0


TIME_ON_Q = Command(("TIME",), route="duetime:{q}:tasks")


def test_a_sample_keeps_the_microseconds() -> None:
    """Flooring to whole ms here and again in now_ms() made the estimate trail by ~1 ms."""
    clock = Recording()
    run_plan(sample_clock(clock, "duetime:{q}:tasks"), (TIME_ON_Q, [b"1800000000", b"123456"]))
    [(server_ms, round_trip)] = clock.samples
    assert server_ms == 1800000000123.456
    assert 0 <= round_trip < 1.0


def test_current_time_samples_until_the_clock_takes_one() -> None:
    clock = Recording(refused=1)
    now = run_plan(
        current_time(clock, "duetime:{q}:tasks"),
        (TIME_ON_Q, [b"1800000000", b"000500"]),
        (TIME_ON_Q, [b"1800000001", b"000000"]),
    )
    assert now == 1800000001000
    assert [ms for ms, _ in clock.samples] == [1800000000000.5, 1800000001000.0]


def test_current_time_asks_nothing_of_a_clock_that_knows_the_time() -> None:
    assert run_plan(current_time(ManualClock(NOW_MS), "duetime:{q}:tasks")) == NOW_MS


def test_a_server_clock_reads_the_sampled_time_on() -> None:
    clock = ServerClock(resync_interval=60)
    now = run_plan(
        current_time(clock, "duetime:{q}:tasks"), (TIME_ON_Q, [b"1800000000", b"250000"])
    )
    # Never ahead of the server: at most the time since the reply came back later.
    assert 1800000000250 <= now < 1800000000250 + 1000
