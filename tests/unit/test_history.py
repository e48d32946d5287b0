"""The history's format, without a server: the constants the Lua include and the Python
side share, a worker's packed record read back, and entries that are not duetime's
refused by the reader (the scripts' own records are read back in
tests/integration/test_history.py)."""

from __future__ import annotations

import re
from importlib import resources

import msgpack
import pytest

from duetime.errors import DecodeError
from duetime.states import HistoryOutcome
from duetime.store.plans.history import (
    DEFAULT_HISTORY_SIZE,
    HISTORY_TRIM_STEP,
    OUTCOME_CODES,
    packed_record,
    read_entry,
)

INCLUDE = (
    resources.files("duetime.store.plans").joinpath("lua", "include", "history.lua").read_text()
)


def lua_constants() -> dict[str, int]:
    found: dict[str, int] = {}
    for names, values in re.findall(r"^local (HISTORY_[\w, ]+) = ([\d, ]+)$", INCLUDE, re.M):
        found |= dict(zip(names.split(", "), map(int, values.split(", ")), strict=True))
    return found


def test_the_lua_include_and_python_agree_on_sizes_and_outcome_codes() -> None:
    constants = lua_constants()
    assert constants.pop("HISTORY_DEFAULT_SIZE") == DEFAULT_HISTORY_SIZE
    assert constants.pop("HISTORY_TRIM_STEP") == HISTORY_TRIM_STEP
    assert {code: f"HISTORY_{outcome.name}" for code, outcome in OUTCOME_CODES.items()} == {
        code: name for name, code in constants.items()
    }
    assert set(OUTCOME_CODES.values()) == set(HistoryOutcome)


def test_a_workers_record_reads_back_with_its_link() -> None:
    record = packed_record("t-1", "send", 2, 1_800_000_000_123, "w.1", 2_500, -3)
    entry = read_entry(41, b"17|" + record)
    assert (entry.number, entry.previous, entry.task_id, entry.task) == (41, 17, "t-1", "send")
    assert (entry.outcome, entry.attempt, entry.finished_ms) == ("succeeded", 2, 1_800_000_000_123)
    assert (entry.worker, entry.duration_us, entry.lateness_us, entry.error) == (
        "w.1",
        2_500,
        0,
        None,
    )
    first = read_entry(1, b"|" + record)
    assert first.previous is None


def test_a_short_record_leaves_its_trailing_fields_unknown() -> None:
    entry = read_entry(3, b"|" + msgpack.packb(["t", False, 6, 0, 5]))
    assert (entry.task, entry.outcome, entry.worker, entry.duration_us) == (
        None, "cancelled", None, None,
    )  # fmt: skip


@pytest.mark.parametrize(
    "blob",
    [
        b"no bar at all",
        b"x|" + msgpack.packb(["t", "", 1, 1, 5]),  # a link that is not a number
        b"|" + msgpack.packb({"t": 1}),
        b"|" + msgpack.packb(["t", "", 9, 1, 5]),  # no such outcome
        b"|" + msgpack.packb(["t", "", 1, "1", 5]),  # an attempt that is text
        b"|" + msgpack.packb(["t", "", 1, 1]),  # too short
        b"|\xc1",  # not msgpack
    ],
)
def test_what_duetime_does_not_write_is_refused(blob: bytes) -> None:
    with pytest.raises(DecodeError):
        read_entry(1, blob)


def test_an_id_that_is_not_utf8_round_trips_as_ids_are_read() -> None:
    task_id = b"\xff-task".decode("utf-8", "surrogateescape")  # as the store reads it
    entry = read_entry(1, b"|" + packed_record(task_id, "", 1, 5, "w", 0, 0))
    assert entry.task_id == task_id
