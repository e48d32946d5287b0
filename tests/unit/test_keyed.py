"""Debounce, Throttle and Unique checked where they are made, the one-mode rule of a
schedule call, the envelope parts the keyed scripts write around a run-at, and the
records they keep as status reads them. No server."""

from __future__ import annotations

import math
from datetime import timedelta

import msgpack
import pytest

from duetime import Debounce, Job, Queue, Throttle, Unique, codec
from duetime.errors import InvalidInputError, InvalidOptionError
from duetime.keyed import (
    KEY_BYTES,
    KeyedState,
    checked_mode,
    field_of,
    keyed_state,
    record_task_ids,
)


@pytest.mark.parametrize(
    "window", [0, -1, math.nan, math.inf, -math.inf, 10**12, "5", None, True, timedelta(0)]
)
def test_a_window_that_is_not_a_positive_finite_duration_is_refused(window: object) -> None:
    with pytest.raises(InvalidOptionError, match="window"):
        Debounce("k", window)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="window"):
        Throttle("k", window)  # type: ignore[arg-type]


def test_durations_are_whole_milliseconds_rounded_up() -> None:
    debounce = Debounce("k", 0.0001, max_wait=timedelta(seconds=2.5))
    assert (debounce.window_ms, debounce.max_wait_ms) == (1, 2500)
    assert Throttle("k", 1.2345).window_ms == 1235


@pytest.mark.parametrize("max_wait", [0, -5, math.nan, math.inf, 9.999])
def test_max_wait_must_be_a_duration_of_at_least_the_window(max_wait: float) -> None:
    with pytest.raises(InvalidOptionError, match="max_wait"):
        Debounce("k", 10, max_wait=max_wait)
    assert Debounce("k", 10, max_wait=10).max_wait_ms == 10_000


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "non-empty"),
        (None, "non-empty"),
        (b"k", "non-empty"),
        ("a\nb", "control"),
        ("a\x00b", "control"),
        ("é" * (KEY_BYTES // 2 + 1), "bytes"),
    ],
)
def test_keys_are_1_to_200_bytes_without_control_characters(key: object, message: str) -> None:
    for make in (lambda: Debounce(key, 1), lambda: Throttle(key, 1), lambda: Unique(key)):  # type: ignore[arg-type]
        with pytest.raises(InvalidOptionError, match=message):
            make()
    assert Unique("é" * (KEY_BYTES // 2)).key  # 200 bytes: the longest allowed


def test_collect_most_trailing_and_until_take_only_their_values() -> None:
    with pytest.raises(InvalidOptionError, match="collect"):
        Debounce("k", 1, collect="first")
    for most in (0, 10_001, 1.5, True):
        with pytest.raises(InvalidOptionError, match="most"):
            Debounce("k", 1, collect="all", most=most)  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="trailing"):
        Throttle("k", 1, trailing="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidOptionError, match="until"):
        Unique("k", until="done")


def test_a_call_takes_at_most_one_mode_of_the_right_kind_and_no_id() -> None:
    assert checked_mode() is None
    with pytest.raises(InvalidOptionError, match="debounce and throttle"):
        checked_mode(Debounce("k", 1), Throttle("k", 1))
    with pytest.raises(InvalidOptionError, match=r"duetime\.Unique"):
        checked_mode(unique="k")
    with pytest.raises(InvalidOptionError, match="leave out id"):
        checked_mode(debounce=Debounce("k", 1), task_id="mine")


def test_a_queue_refuses_a_bad_keyed_call_before_it_connects() -> None:
    # Port 1 refuses connections: each error here comes from the checks at the door.
    with Queue("q", "redis://127.0.0.1:1/0") as queue:
        with pytest.raises(InvalidOptionError, match="leave out id"):
            queue.schedule_now({"a": 1}, debounce=Debounce("k", 1), id="mine")
        with pytest.raises(InvalidOptionError, match="at most one"):
            queue.schedule_keyed({"a": 1}, unique=Unique("k"), throttle=Throttle("k", 1))
        with pytest.raises(InvalidOptionError, match="needs one of"):
            queue.schedule_keyed({"a": 1})
        with pytest.raises(InvalidInputError, match="exactly one"):
            queue.schedule_keyed({"a": 1}, at=1, delay=1, unique=Unique("k"))
        with pytest.raises(InvalidOptionError, match="leave out id"):
            queue.schedule_many([Job({"a": 1}, delay=0, id="x", throttle=Throttle("k", 1))])
        with pytest.raises(TypeError, match="unexpected keyword argument 'debounced'"):
            queue.schedule_now({"a": 1}, debounced=Debounce("k", 1))  # type: ignore[call-arg]


def test_each_mode_has_its_own_field_so_their_keys_never_meet() -> None:
    fields = {field_of(Debounce("k", 1)), field_of(Throttle("k", 1)), field_of(Unique("k"))}
    assert fields == {"d:k", "t:k", "u:k"}


@pytest.mark.parametrize(
    "limits", [(5, 300_000, 0), (3, 300_000, 0), (5, 60_000, 0), (5, 300_000, 9), (1, 2, 3)]
)
@pytest.mark.parametrize("task", ["", "send_email"])
def test_envelope_parts_around_a_whole_ms_run_at_make_the_envelope(
    limits: tuple[int, int, int], task: str
) -> None:
    head, tail = codec.envelope_parts(task, *limits)
    data, run_at = codec.pack({"to": "a"}), 1_795_631_019_642
    assembled = head + data + b"\xcf" + run_at.to_bytes(8, "big") + tail
    assert assembled == codec.envelope_from_packed_data(task, data, run_at, *limits)
    decoded = codec.decode_envelope(assembled)
    assert (decoded.task, decoded.data, decoded.run_at_ms) == (task, {"to": "a"}, run_at)
    # A collected list (collect="all") in the data's place reads as a list.
    collected = msgpack.packb([{"n": 1}, {"n": 2}])
    listed = codec.decode_envelope(head + collected + b"\xcf" + run_at.to_bytes(8, "big") + tail)
    assert listed.data == [{"n": 1}, {"n": 2}]


def test_records_read_as_status_shows_them_and_garbage_reads_as_none() -> None:
    debounce = keyed_state("d:user:1", "id1|1800000020000|1800000025000|3|40|4|9|all")
    assert debounce == KeyedState("debounce", "user:1", 3, 1_800_000_025.0, collect="all")
    no_wait = keyed_state("d:k", "id1|1800000020000||1|40|4|9|last")
    assert no_wait is not None and no_wait.until is None
    throttle = keyed_state("t:k", "lead|1800000010000|4|trail|30|4|9")
    assert throttle == KeyedState("throttle", "k", 4, 1_800_000_010.0)
    assert keyed_state("u:k", "id9|finished|2") == KeyedState(
        "unique", "k", 2, unique_until="finished"
    )
    for field, record in [
        ("d:k", "x|y"),
        ("t:k", "a|b|c|d|e|f|g"),
        ("x:k", "a"),
        ("u:k", "a|b|c|d"),
    ]:
        assert keyed_state(field, record) is None
    assert record_task_ids("t:k", "lead|1|4|trail|30|4|9") == ["lead", "trail"]
    assert record_task_ids("t:k", "lead|1|1||||") == ["lead"]
    assert record_task_ids("d:k", "id1|1||1|40|4|9|last") == ["id1"]
