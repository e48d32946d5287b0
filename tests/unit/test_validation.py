from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from fractions import Fraction
from functools import partial
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime import validation
from duetime.client import QueueCore
from duetime.client import ids as client_ids
from duetime.errors import (
    InvalidInputError,
    InvalidNameError,
    InvalidOptionError,
    InvalidPayloadError,
    InvalidTimestampError,
)
from duetime.settings import Settings


@pytest.mark.parametrize(
    ("value", "expected_ms"),
    [
        (0, 0),
        (1795320000, 1795320000000),
        (1795320000.25, 1795320000250),
        (1795320000.000125, 1795320000000.125),  # microseconds kept
        (1795320000.1234567, 1795320000123.457),  # rounded up: never before the exact time
        (0.0000001, 0.001),
        (1800000001.003, 1800000001003),  # the decimal written, though the double lies above
        (datetime(2026, 11, 22, 12, 0, tzinfo=UTC), 1795348800000),
        (datetime(2026, 11, 22, 13, 0, tzinfo=timezone(timedelta(hours=1))), 1795348800000),
        (datetime(2026, 11, 22, 12, 0, 0, 123456, tzinfo=UTC), 1795348800123.456),
    ],
)
def test_accepted_timestamps_become_milliseconds(value: object, expected_ms: float) -> None:
    assert validation.timestamp_ms(value) == expected_ms


@pytest.mark.parametrize(
    "value",
    [
        1795320000.1234567,
        1795320000.0000001,
        1.9999999,
        1763800000.9876543,
        1795320000.123,  # a decimal a float cannot hold: at most 1 µs later, never earlier
        144115188076.25,  # year 6536: a double has no exact microseconds there
        253402300000.999999,
        datetime(3085, 5, 1, 0, 0, 0, 126, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 0, 0, 999999, tzinfo=UTC),
    ],
)
def test_run_at_is_never_before_the_time_written_and_at_most_a_microsecond_after(
    value: float | datetime,
) -> None:
    if isinstance(value, datetime):
        exact = Fraction((value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1))
        exact /= 1000
    else:
        exact = Fraction(repr(value)) * 1000  # the decimal written, not the nearest double
    stored = Fraction(validation.timestamp_ms(value))
    assert exact <= stored
    # A microsecond of rounding, plus a double's spacing far in the future.
    assert stored - exact <= Fraction(1, 1000) + Fraction(1, 16)


@given(st.floats(min_value=0, max_value=2**33, allow_nan=False))
def test_epoch_seconds_become_the_first_microsecond_not_before_the_decimal_written(
    seconds: float,
) -> None:
    """Up to the year 2242 (through the fast path below 2**32 s and the exact one above)."""
    assert validation.timestamp_us(seconds) == math.ceil(Fraction(repr(seconds)) * 10**6)


def test_a_run_at_comes_back_as_the_microsecond_it_was_given_in() -> None:
    # The double of ...241.094 ms lies a hair above it: ceil(x * 1000) made it ...095 µs.
    assert validation.whole_microseconds(validation.timestamp_ms(1795638684.2410932)) == (
        1795638684241094
    )


#: Up to here (the year 2248) a double in ms tells every µs apart; the delayed buckets
#: keep run-ats to 2**53 µs (2255), later ones wait in ms.
DISTINCT_MICROSECONDS = 2**43
MOST_MICROSECONDS = 2**53


def stored_ms(micros: int) -> float:
    """What ``timestamp_ms`` makes of a time given to the µs."""
    return validation.timestamp_ms(
        datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)
    )


@given(st.integers(min_value=0, max_value=DISTINCT_MICROSECONDS * 1000))
def test_whole_microseconds_undo_timestamp_ms(micros: int) -> None:
    assert validation.whole_microseconds(stored_ms(micros)) == micros


@given(st.floats(min_value=0, max_value=MOST_MICROSECONDS / 1000, allow_nan=False))
def test_whole_microseconds_are_never_before_the_run_at(run_at_ms: float) -> None:
    micros = validation.whole_microseconds(run_at_ms)
    assert Fraction(micros, 1000) >= Fraction(run_at_ms) or stored_ms(micros) == run_at_ms
    assert stored_ms(micros) >= run_at_ms
    # The first µs whose double is not below, or the last whose double is this one.
    assert micros == 0 or stored_ms(micros - 1) < run_at_ms or stored_ms(micros + 1) > run_at_ms


@given(st.integers(min_value=DISTINCT_MICROSECONDS * 1000, max_value=MOST_MICROSECONDS))
def test_past_2248_a_microsecond_given_comes_back_never_earlier(micros: int) -> None:
    """Doubles in ms lie up to 2 µs apart there: several µs share one, and the last of
    them is taken, so a task never runs before the time it was given."""
    found = validation.whole_microseconds(stored_ms(micros))
    assert micros <= found <= micros + 2
    assert stored_ms(found) == stored_ms(micros)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (datetime(2026, 11, 22, 12, 0), "naive datetime"),
        (math.nan, "finite"),
        (math.inf, "finite"),
        (-math.inf, "finite"),
        (-1, "negative"),
        (True, "epoch seconds"),
        ("1795320000", "epoch seconds"),
        (None, "epoch seconds"),
        (1795320000000, "year 9999"),
    ],
)
def test_refused_timestamps_say_why(value: object, message: str) -> None:
    with pytest.raises(InvalidTimestampError, match=message):
        validation.timestamp_ms(value)


@pytest.mark.parametrize("name", ["emails", "a", "x" * 64, "team.jobs-v2_b"])
def test_queue_names_accepted(name: str) -> None:
    assert validation.queue_name(name) == name


@pytest.mark.parametrize("name", ["", "x" * 65, "a{b}", "a:b", "a b", "é", None, 3])
def test_queue_names_refused(name: object) -> None:
    with pytest.raises(InvalidNameError, match="queue name"):
        validation.queue_name(name)


@pytest.mark.parametrize("task_id", ["a|b", "", "x" * 201, "with space", "new\nline"])
def test_task_ids_refused(task_id: str) -> None:
    # "|" separates worker and task in lease members, so it must never enter an id.
    with pytest.raises(InvalidNameError, match="task id"):
        validation.task_id(task_id)


@pytest.mark.parametrize("data", [None, "", b""])
def test_empty_payload_refused(data: object) -> None:
    with pytest.raises(InvalidPayloadError, match="empty"):
        validation.payload(data, 1, 100)


def test_oversized_payload_refused_with_the_limit_named() -> None:
    with pytest.raises(InvalidPayloadError, match="over the limit of 100"):
        validation.payload({"a": 1}, 101, 100)


def test_empty_mapping_is_a_valid_payload() -> None:
    validation.payload({}, 1, 100)


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, True, "5"])
def test_positive_seconds_refuses_non_positive_or_non_numbers(value: object) -> None:
    with pytest.raises(InvalidOptionError):
        validation.positive_seconds(value, "timeout")


@pytest.mark.parametrize("value", [0, 1001, 2.5, True, None])
def test_attempts_bounds(value: object) -> None:
    with pytest.raises(InvalidOptionError, match="max_attempts"):
        validation.attempts(value)


def _core() -> QueueCore:
    return QueueCore("pairs", Settings(max_payload_bytes=64), None, result_ttl=30)


def _checked(check: Callable[[], object]) -> object:
    """What a check returns, or the type and text of what it raises."""
    try:
        return check()
    except InvalidInputError as error:
        return type(error), str(error)


# Odd parts included: a pair checked in line by schedule_many must end as one checked by
# prepare_fields (a single call's path) does, item by item.
_TIMES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.datetimes(timezones=st.none() | st.just(UTC)),
    st.sampled_from([None, "5", True, Fraction(3, 2), 10**30]),
)
_DATA = st.one_of(
    st.none(),
    st.binary(max_size=80),
    st.text(max_size=80),
    st.integers(),
    st.floats(),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=12),
    st.sampled_from([{"when": datetime(2030, 1, 1)}, {(1, 2): 3}, [object()], {}, 2**70]),
)


@given(st.lists(st.tuples(_TIMES, _DATA), min_size=1, max_size=5))
def test_an_at_data_pair_is_checked_as_a_single_call_checks_it(pairs: list[Any]) -> None:
    core = _core()
    ids = iter(f"id-{n}" for n in range(len(pairs)))
    with patch.object(client_ids, "new_task_ids", lambda count: [next(ids) for _ in range(count)]):
        many = _checked(lambda: core.preparing.prepare_all(pairs))
    expected: list[object] = []
    for position, (at, data) in enumerate(pairs):
        one = _checked(
            partial(core.preparing.prepare_fields, data, at, None, None, None, None, None, None,
                    f"id-{position}")
        )  # fmt: skip
        if isinstance(one, tuple) and len(one) == 2:  # refused: so is the whole call
            kind, text = one
            assert many == (kind, f"item {position}: {text}")
            return
        expected.append(one)
    assert many == expected


@given(st.floats(min_value=0, max_value=2**33, allow_nan=False))
def test_a_run_at_in_seconds_reads_back_never_below_the_one_given(seconds: float) -> None:
    micros = validation.timestamp_us(seconds)
    assert micros >= Fraction(repr(seconds)) * 10**6  # stored: not before what was written
    reported = validation.seconds_of_ms(validation.milliseconds_not_below(micros))
    assert reported >= seconds
    if Fraction(seconds) * 10**6 == micros:  # a whole number of µs reads back as it was
        assert reported == seconds


@given(st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2255, 1, 1)))
def test_a_run_at_datetime_reads_back_to_its_microsecond(moment: datetime) -> None:
    aware = moment.replace(tzinfo=UTC)
    micros = validation.timestamp_us(aware)
    assert micros == (aware - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    reported = validation.seconds_of_ms(validation.milliseconds_not_below(micros))
    if moment < datetime(2248, 1, 1):  # a double in ms tells every µs apart until then
        assert reported == micros / 1_000_000  # the double nearest that microsecond
    else:  # later, at most a double's spacing (2 µs) late, never early
        assert micros / 1_000_000 <= reported <= (micros + 2) / 1_000_000


def test_the_run_at_of_issue_29_reads_back_as_given() -> None:
    stored = validation.milliseconds_not_below(validation.timestamp_us(4000000000.061981))
    assert validation.seconds_of_ms(stored) == 4000000000.061981


@pytest.mark.parametrize(
    ("text", "signed", "whole"),
    [("0", False, True), ("120", False, True), ("-4", True, True), ("-4", False, False),
     ("--4", True, False), ("-", True, False), ("", False, False), ("\u00b2", False, False),
     ("\u0663", False, False), ("1.5", False, False), (" 1", False, False)],
)  # fmt: skip
def test_a_whole_number_is_ascii_digits_only(text: str, signed: bool, whole: bool) -> None:
    """What int() takes of duetime's own writing; "²" passes str.isdigit but not int()."""
    assert validation.is_whole(text, signed=signed) is whole
    if whole:
        int(text)
