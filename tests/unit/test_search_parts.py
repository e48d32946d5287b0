"""The parts of search and bulk actions that need no server: how criteria match an
envelope's data and an error record, the walk's cursor, a bulk outcome's summary, and
how the JSON API writes what msgpack data can hold."""

from __future__ import annotations

import math
from datetime import UTC

import pytest

from duetime import BulkOutcome, TaskSearch, codec
from duetime.client.matching import NOT_STARTED, MatchSelection, states_for
from duetime.client.searching import SearchCursor, value_text
from duetime.codec import ErrorRecord
from duetime.dashboard.api import jsonable
from duetime.errors import InvalidInputError
from duetime.states import TaskState


def envelope(data: object, task: str = "send") -> bytes:
    return codec.encode_envelope(codec.Envelope(task, data, 1_790_000_000_000, 5, 300_000, 0))


@pytest.mark.parametrize(
    ("value", "text"),
    [("42", "42"), (42, "42"), (4.5, "4.5"), (True, "true"), (None, "null"),
     (b"abc", "abc"), ({"a": 1}, None), ([1], None)],
)  # fmt: skip
def test_a_value_is_compared_as_text(value: object, text: str | None) -> None:
    assert value_text(value) == text


def test_a_data_field_is_a_path_of_keys_and_list_positions() -> None:
    data = {"customer": {"id": 42, "tags": ["vip", "eu"]}, 7: {"x": "int key"}}
    assert TaskSearch(data_field="customer.id", data_value="42").matches_envelope(envelope(data))
    assert TaskSearch(data_field="customer.tags.1", data_value="eu").matches_envelope(
        envelope(data)
    )
    assert TaskSearch(data_field="7.x", data_value="int key").matches_envelope(envelope(data))
    assert TaskSearch(data_field="customer.tags").matches_envelope(envelope(data))  # exists
    for path, value in (("customer.tags.2", None), ("customer.id.x", None),
                        ("customer", "42"), ("customer.tags", "vip")):  # fmt: skip
        criteria = TaskSearch(data_field=path, data_value=value)
        assert not criteria.matches_envelope(envelope(data)), path
    assert not TaskSearch(data_field="a").matches_envelope(envelope(["a"]))
    assert not TaskSearch(data_field="a").matches_envelope(b"\xc1 not msgpack")


def test_the_handler_and_the_error_text_match_exactly_and_in_any_case() -> None:
    assert TaskSearch(task="send").matches_envelope(envelope({}, "send"))
    assert not TaskSearch(task="sen").matches_envelope(envelope({}, "send"))
    assert TaskSearch(task="").matches_envelope(envelope({}, ""))  # the default handler
    record = codec.encode_error(ErrorRecord("TimeoutError: SMTP", "tb", 1, 0, "w"))
    assert TaskSearch(error="smtp").matches_error(record)
    assert not TaskSearch(error="disk").matches_error(record)
    assert not TaskSearch(error="smtp").matches_error(b"garbage")
    assert TaskSearch(error="x").walked == "errors" and TaskSearch(task="x").walked == "tasks"
    assert TaskSearch(task="x", state="dead").state == TaskState.DEAD


def test_a_cursor_names_the_hash_the_shard_and_the_place_in_it() -> None:
    start = SearchCursor.parse(None, "tasks", 3)
    assert (start.shard, start.position) == (0, 0)
    going = start.next(517, 3)
    assert going is not None and going.text == "t0.517"
    assert SearchCursor.parse("t0.517", "tasks", 3) == going
    following = going.next(0, 3)  # the end of shard 0: shard 1 from its start
    assert following is not None and following.text == "t1.0"
    assert SearchCursor("errors", 2, 9).next(0, 3) is None  # the end of the last shard
    inside = going.within(1034, "job-7")  # a call stopped at its limit inside a page
    assert inside.text == f"t0.517.1034.{b'job-7'.hex()}"
    assert SearchCursor.parse(inside.text, "tasks", 3) == inside
    for bad in ("t3.0", "x0.1", "t0.", "t0.1 "):
        with pytest.raises(InvalidInputError):
            SearchCursor.parse(bad, "tasks", 3)


def test_a_bulk_outcome_says_what_was_done_and_why_the_rest_was_skipped() -> None:
    outcome = BulkOutcome("cancel", ["a", "b"], {"c": "running", "d": "gone", "e": "running"})
    assert outcome.summary == "cancelled 2; skipped 3 (1 gone, 2 running)"
    assert BulkOutcome("run_now", ["a"], {}).summary == "made due now 1"
    moved = BulkOutcome("reschedule", ["a", "b"], {}, run_at=1_796_112_000.0)
    assert moved.summary == "rescheduled 2 to 2026-12-01 08:00:00+00:00"  # says to when
    picked = MatchSelection(["a", "b"], [], 5, True, 1, {"waiting": 2}, {"running": 3})
    assert moved.of_matches(picked, UTC) == (
        "6 matched: 2 rescheduled to 2026-12-01 08:00:00+00:00, 3 running (not touched), "
        "1 with an id duetime does not accept (not touched)"
    )
    assert states_for("cancel", None) == NOT_STARTED and states_for("cancel", "running")
    for action, state in (("run_now", "running"), ("cancel", "dead"), ("cancel", "later")):
        with pytest.raises(InvalidInputError):
            states_for(action, state)


def test_the_api_writes_what_task_data_can_hold_as_json() -> None:
    data = {"raw": b"\x00\xff", 3: [math.nan, math.inf], "state": TaskState.READY}
    assert jsonable(data) == {
        "raw": {"$bytes": "AP8="},
        "3": ["nan", "inf"],
        "state": "ready",
    }
    assert jsonable(BulkOutcome("cancel", ["a"], {})) == {
        "action": "cancel",
        "done": ["a"],
        "skipped": {},
        "run_at": None,
    }
