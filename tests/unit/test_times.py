"""Human times and durations: what the command line reads, and how it shows instants."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from duetime.errors import InvalidInputError
from duetime.times import (
    TIME_WIDTH,
    format_duration,
    format_time,
    parse_duration,
    parse_moment,
    parse_time,
)

# 2026-12-01T08:00:00Z: winter in Paris (+01:00).
WINTER = datetime(2026, 12, 1, 8, tzinfo=UTC).timestamp()
# 2026-07-01T08:00:00Z: summer in Paris (+02:00).
SUMMER = datetime(2026, 7, 1, 8, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30.0),
        ("0", 0.0),
        ("2.5", 2.5),
        ("90s", 90.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("1.5h", 5400.0),
        ("2d", 172_800.0),
        ("1w", 604_800.0),
        ("250ms", 0.25),
        ("1m30s", 90.0),
        (" 5m ", 300.0),
    ],
)
def test_durations_people_write(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("soon", "cannot read 'soon' as a duration: write 90s, 5m, 1h30m"),
        ("5m30", "cannot read '5m30'"),  # a number without its unit, after a part
        ("5x", "cannot read '5x'"),
        ("", "cannot read ''"),
        ("5M", "cannot read '5M'"),  # minutes or months? not guessed
        ("1e3", "cannot read '1e3'"),
        ("-5m", "cannot be negative"),
        ("-5", "cannot be negative"),
        ("9" * 400 + "d", "too long"),
    ],
)
def test_durations_refused_say_what_to_write(text: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message.replace("(", r"\(")):
        parse_duration(text)


def test_a_refused_value_is_echoed_cut_short() -> None:
    with pytest.raises(InvalidInputError) as refused:
        parse_duration("x" * 5000)
    assert len(str(refused.value)) < 300


@pytest.mark.parametrize(
    "text",
    [
        "2026-12-01T09:00+01:00",
        "2026-12-01T08:00Z",
        "2026-12-01T08:00z",
        "2026-12-01T08:00:00.000+00:00",
        "2026-12-01 03:00-05:00",
        "1796112000",
        "1796112000.0",
    ],
)
def test_times_in_iso_8601_with_a_zone_or_epoch_seconds(text: str) -> None:
    assert parse_time(text) == WINTER


def test_a_time_without_a_zone_is_refused_with_the_zones_to_add(in_paris: None) -> None:
    with pytest.raises(InvalidInputError) as refused:
        parse_time("2026-12-01T09:00")
    message = str(refused.value)
    assert "has no time zone: add one" in message
    assert "2026-12-01T09:00Z for UTC" in message
    assert "2026-12-01T09:00+01:00 for this host's zone" in message
    with pytest.raises(InvalidInputError, match="no time zone"):
        parse_time("2026-12-01")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nan", "not a finite time"),
        ("inf", "not a finite time"),
        ("tomorrow", "cannot read 'tomorrow' as a time: give ISO 8601 with a zone"),
        ("2026-13-01T00:00Z", "cannot read"),
    ],
)
def test_unreadable_times_are_refused(text: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        parse_time(text)


def test_moments_are_a_time_or_a_duration_ago() -> None:
    now = WINTER
    assert parse_moment("2h", now) == now - 7200
    assert parse_moment("1d12h", now) == now - 129_600
    assert parse_moment("2026-12-01T09:00+01:00", now) == WINTER
    with pytest.raises(InvalidInputError, match=r"'30' is ambiguous: .*\(30s, 5m"):
        parse_moment("30", now)
    with pytest.raises(InvalidInputError, match="no time zone"):
        parse_moment("2026-12-01T09:00", now)
    with pytest.raises(InvalidInputError, match="a duration ago"):
        parse_moment("yesterday", now)


def test_times_are_shown_with_their_offset_in_the_zone_given() -> None:
    paris = ZoneInfo("Europe/Paris")
    assert format_time(WINTER, paris) == "2026-12-01 09:00:00+01:00"
    assert format_time(SUMMER, paris) == "2026-07-01 10:00:00+02:00"  # DST
    assert format_time(WINTER, UTC) == "2026-12-01 08:00:00+00:00"
    assert format_time(WINTER + 0.25, UTC, precise=True) == "2026-12-01T08:00:00.250+00:00"
    assert format_time(None) == "-"
    assert len(format_time(WINTER, ZoneInfo("America/St_Johns"))) == TIME_WIDTH  # -03:30


def test_times_are_shown_in_the_local_zone_by_default(in_paris: None) -> None:
    assert format_time(WINTER) == "2026-12-01 09:00:00+01:00"
    assert format_time(SUMMER) == "2026-07-01 10:00:00+02:00"  # the offset of that day


def test_a_time_shown_round_trips_through_the_parser() -> None:
    shown = format_time(WINTER, ZoneInfo("Asia/Kolkata"), precise=True)
    assert parse_time(shown) == WINTER


def test_durations_are_shown_short() -> None:
    assert [format_duration(s) for s in (0.012, 1.5, 59.94, 60, 250, 3600, 3725, 187_205)] == [
        "12 ms", "1.5 s", "59.9 s", "1m", "4m 10s", "1h", "1h 2m", "2d 4h",
    ]  # fmt: skip
