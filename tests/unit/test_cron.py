"""Cron tick computation: DST in two zones, leap days, month ends, policies, bad input."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from freezegun import freeze_time

from duetime import codec, cron
from duetime.cron import definitions as cron_definitions
from duetime.cron import firing as cron_firing
from duetime.errors import DecodeError, InvalidInputError, InvalidNameError, InvalidPayloadError


def ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def local_day(expression: str, zone: str, day: tuple[int, int, int]) -> list[str]:
    """The wall-clock times (with UTC offsets) a job fires on one local calendar day."""
    job = cron.define("job", expression, {}, timezone=zone)
    tz = ZoneInfo(zone)
    start = datetime(*day, tzinfo=tz)
    end = start + timedelta(days=1, hours=3)  # a day, plus margin; filtered by date below
    fired = []
    for tick in job.ticks_after(ms(start) - 1):
        if tick >= ms(end):
            break
        moment = datetime.fromtimestamp(tick / 1000, tz)
        if moment.date() == start.date():
            fired.append(moment.strftime("%H:%M%z"))
    return fired


ZONES = [
    # zone, spring-forward day, fall-back day (2026)
    ("Europe/Paris", (2026, 3, 29), (2026, 10, 25)),
    ("America/New_York", (2026, 3, 8), (2026, 11, 1)),
]


@pytest.mark.parametrize(("zone", "spring", "fall"), ZONES)
def test_hourly_job_follows_the_wall_clock_23_and_25_times(
    zone: str, spring: tuple[int, int, int], fall: tuple[int, int, int]
) -> None:
    assert len(local_day("0 * * * *", zone, spring)) == 23
    fall_back = local_day("0 * * * *", zone, fall)
    assert len(fall_back) == 25
    assert len(set(fall_back)) == 25  # the repeated hour fires at two distinct instants


@pytest.mark.parametrize(("zone", "spring", "fall"), ZONES)
def test_daily_job_in_the_changed_hour_runs_exactly_once(
    zone: str, spring: tuple[int, int, int], fall: tuple[int, int, int]
) -> None:
    # 02:30 does not exist on the spring day: shifted forward by the gap, once.
    assert [t[:5] for t in local_day("30 2 * * *", zone, spring)] == ["03:30"]
    # 01:30 happens twice on the fall day: the first one only.
    assert len(local_day("30 1 * * *", zone, fall)) == 1
    # And the days around are untouched.
    before = (spring[0], spring[1], spring[2] - 1)
    assert [t[:5] for t in local_day("30 2 * * *", zone, before)] == ["02:30"]


def test_repeated_hour_ticks_come_out_in_time_order() -> None:
    fired = local_day("*/30 * * * *", "Europe/Paris", (2026, 10, 25))
    assert fired[:8] == [
        "00:00+0200", "00:30+0200", "01:00+0200", "01:30+0200",
        "02:00+0200", "02:30+0200", "02:00+0100", "02:30+0100",
    ]  # fmt: skip


def test_leap_day_and_month_end() -> None:
    leap = cron.define("leap", "0 12 29 2 *", {}, timezone="UTC")
    after = ms(datetime(2026, 3, 1, tzinfo=UTC))
    assert datetime.fromtimestamp(leap.next_tick(after) / 1000, UTC) == datetime(  # type: ignore[operator]
        2028, 2, 29, 12, tzinfo=UTC
    )
    last_day = cron.define("eom", "0 0 L * *", {}, timezone="UTC")
    ticks = last_day.ticks_after(ms(datetime(2028, 1, 15, tzinfo=UTC)))
    days = [datetime.fromtimestamp(next(ticks) / 1000, UTC).day for _ in range(4)]
    assert days == [31, 29, 31, 30]  # January, leap February, March, April


def test_seconds_field_and_aliases() -> None:
    job = cron.define("fast", "* * * * * */15", {})
    start = ms(datetime(2026, 1, 1, tzinfo=UTC))
    ticks = job.ticks_after(start)
    assert [next(ticks) - start for _ in range(3)] == [15_000, 30_000, 45_000]
    hourly = cron.define("h", "@hourly", {}, timezone="Europe/Paris")
    assert hourly.wildcard_hour
    assert not cron.define("d", "@daily", {}).wildcard_hour


@freeze_time("2026-03-29 00:59:30", tz_offset=0)
def test_ticks_from_now_just_before_a_spring_forward() -> None:
    job = cron.define("hourly", "0 * * * *", {}, timezone="Europe/Paris")
    now = round(time.time() * 1000)  # 01:59:30 Paris, half a minute before 02:00 -> 03:00
    tz = ZoneInfo("Europe/Paris")
    tick = job.next_tick(now)
    assert tick is not None
    upcoming = [datetime.fromtimestamp(t / 1000, tz).strftime("%H:%M%z") for t in [tick]]
    assert upcoming == ["03:00+0200"]


def fired_ticks(job: cron.CronJob, first: int, now: int) -> list[int]:
    return [tick for tick, _ in cron_firing.plan(job, first, now).ticks]


def test_missed_tick_policies() -> None:
    base = ms(datetime(2026, 1, 1, tzinfo=UTC))
    minute = 60_000
    now = base + 10 * minute + 5_000  # ticks at base, +1 min ... +10 min are due
    for missed, expected in (
        ("skip", [base + 10 * minute]),
        ("once", [base + 9 * minute, base + 10 * minute]),
        ("all", [base + i * minute for i in range(11)]),
    ):
        job = cron.define("m", "* * * * *", {}, missed=missed)
        assert fired_ticks(job, base, now) == expected
    on_time = cron.define("m", "* * * * *", {}, missed="all")
    assert fired_ticks(on_time, base, base + 3) == [base]


def test_catch_up_is_bounded() -> None:
    base = ms(datetime(2026, 1, 1, tzinfo=UTC))
    job = cron.define("m", "* * * * * *", {}, missed="all")
    fired = fired_ticks(job, base, base + 3600_000)
    assert len(fired) == cron_firing.MAX_CATCH_UP + 1
    assert fired[-1] == base + 3600_000


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"expression": "* * *"}, InvalidInputError, "invalid cron expression"),
        ({"expression": "61 * * * *"}, InvalidInputError, "invalid cron expression"),
        ({"expression": "not cron"}, InvalidInputError, "invalid cron expression"),
        ({"expression": "@sometimes"}, InvalidInputError, "invalid cron expression"),
        ({"expression": "0 0 30 2 *"}, InvalidInputError, "never fires"),
        ({"timezone": "Mars/Olympus"}, InvalidInputError, "unknown time zone"),
        ({"timezone": ""}, InvalidInputError, "unknown time zone"),
        ({"missed": "sometimes"}, InvalidInputError, "missed must be one of"),
        ({"overlap": "maybe"}, InvalidInputError, "overlap must be one of"),
        ({"name": "has space"}, InvalidNameError, "cron job name"),
        ({"name": "a:b"}, InvalidNameError, "cron job name"),
        ({"data": None}, InvalidPayloadError, "empty"),
        ({"max_attempts": 0}, InvalidInputError, "max_attempts"),
    ],
)
def test_bad_declarations_are_refused(
    arguments: dict[str, object], error: type[Exception], message: str
) -> None:
    declaration: dict[str, object] = {"name": "job", "expression": "0 9 * * *", "data": {}}
    declaration.update(arguments)
    with pytest.raises(error, match=message):
        cron.define(
            str(declaration.pop("name")), str(declaration.pop("expression")),
            declaration.pop("data"), **declaration,  # type: ignore[arg-type]
        )  # fmt: skip


def tick_task(job: cron.CronJob, tick_ms: int, run_at_ms: int) -> tuple[str, int, bytes, str]:
    """A tick's task as a dispatcher makes it: from the stored definition."""
    name, data, template = cron_definitions.decode_parts(cron_definitions.encode_job(job))
    return template.tick_task(name, codec.pack(data), tick_ms, run_at_ms)


def test_definitions_round_trip_and_tick_ids() -> None:
    job = cron.define("report", "0 9 * * 1-5", {"k": [1, b"x"]}, timezone="Europe/Paris",
                      task="send", missed="once", overlap="skip")  # fmt: skip
    assert cron_definitions.decode_job(cron_definitions.encode_job(job)) == job
    assert job.tick_id(1_800_000_000_000) == "cron:report:1800000000000"


@pytest.mark.parametrize("run_at_ms", [1_800_000_000_000, 1_800_000_012_345, 7])
def test_a_tick_becomes_a_task_with_the_jobs_handler_data_and_limits(run_at_ms: int) -> None:
    job = cron.define(
        "report", "* * * * *", {"k": [1, "x"]}, task="send", max_attempts=7, timeout=12.5
    )
    task_id, run_at, envelope, record = tick_task(job, 1_800_000_000_000, run_at_ms)
    assert record == ""  # no flow control: the definition stays in format 1
    assert codec.unpack(cron_definitions.encode_job(job))[0] == 1
    assert (task_id, run_at) == ("cron:report:1800000000000", run_at_ms)
    # Byte for byte the task a triggered run is (cron.task_of), which workers decode.
    assert envelope == codec.encode_envelope(cron.task_of(job, run_at_ms))
    assert codec.decode_envelope(envelope) == codec.Envelope(
        "send", {"k": [1, "x"]}, run_at_ms, 7, 12_500, cron.RESULT_TTL_MS
    )


def test_a_job_with_flow_control_is_stored_in_format_2_and_read_back() -> None:
    job = cron.define("report", "* * * * *", {}, priority=-4, limit_key="acme", cost=2)
    assert codec.unpack(cron_definitions.encode_job(job))[0] == 2
    assert cron_definitions.decode_job(cron_definitions.encode_job(job)) == job
    assert tick_task(job, 1_800_000_000_000, 1_800_000_000_000)[3] == "-4|2||acme"
    garbled = codec.pack([2, "r", "* * * * *", {}, "UTC", "", "skip", "allow", 5, 9, 0, "", 1])
    with pytest.raises(DecodeError, match="flow control"):
        cron_definitions.decode_job(garbled)


def test_jobs_declared_alike_share_one_checked_template() -> None:
    first, second = (cron.define(f"user-{n}", "*/5 * * * *", {"user": n}) for n in (1, 2))
    parts = [cron_definitions.decode_parts(cron_definitions.encode_job(j)) for j in (first, second)]
    assert [(name, data) for name, data, _ in parts] == [
        ("user-1", {"user": 1}),
        ("user-2", {"user": 2}),
    ]
    assert parts[0][2] is parts[1][2]
    other = cron.define("user-3", "*/5 * * * *", {"user": 3}, timezone="Europe/Paris")
    assert cron_definitions.decode_parts(cron_definitions.encode_job(other))[2] is not parts[0][2]


@pytest.mark.parametrize(
    ("position", "garbage"), [(8, True), (8, 5.0), (2, ["* * * * *"]), (4, {"zone": 1}), (1, 7)]
)
def test_a_garbled_definition_is_refused_even_beside_a_sound_twin(
    position: int, garbage: object
) -> None:
    # The sound twin is decoded first: its cached template must not answer for a field
    # that is only equal to its own (True == 1 == 1.0 in Python) or not hashable.
    sound = [1, "r", "* * * * *", {}, "UTC", "", "skip", "allow", 5, 9]
    cron_definitions.decode_job(codec.pack(sound))
    garbled = list(sound)
    garbled[position] = garbage
    with pytest.raises(DecodeError, match="wrong types"):
        cron_definitions.decode_job(codec.pack(garbled))
