"""Reading the history (store/plans/history.py) from the replies its scripts give: a
page numbered from its first entry, with entries written by hand left out and where the
next page starts; one task's entries followed link by link; the size as the scripts
read it."""

from __future__ import annotations

from typing import Any

import pytest

from duetime import codec
from duetime.errors import DecodeError
from duetime.states import HistoryOutcome
from duetime.store.plans import scripts
from duetime.store.plans.history import (
    DEFAULT_HISTORY_SIZE,
    HistoryEntry,
    HistoryPlans,
    packed_record,
    read_entry,
)
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.requests import Batch, Command, Eval
from tests.unit.plans.scripted import NOW_MS, run_plan


def entry_blob(task_id: str, previous: int | None = None, *fields: Any) -> bytes:
    """An entry as history.lua stores it: "<previous>|<msgpack record>"."""
    record = fields or (task_id, "send", 2, 1, NOW_MS, "w1", 1500, 30)
    packed = codec.packed(list(record), use_bin_type=False)
    return (b"" if previous is None else str(previous).encode()) + b"|" + packed


def test_a_success_record_reads_back_as_an_entry() -> None:
    blob = b"7|" + packed_record("t", "send", 3, NOW_MS, "w1", -5, 250)
    assert read_entry(12, blob) == HistoryEntry(
        number=12, task_id="t", task="send", outcome=HistoryOutcome.SUCCEEDED, attempt=3,
        finished_ms=NOW_MS, worker="w1", duration_us=0, lateness_us=250, error=None,
        previous=7,
    )  # fmt: skip


def test_an_entry_for_a_run_of_snoozes_says_how_many_and_the_latest() -> None:
    fields = ("t", "", 4, 1, NOW_MS, "w1", False, False, False, 3, NOW_MS + 900)
    entry = read_entry(1, entry_blob("t", None, *fields))
    assert entry.outcome == HistoryOutcome.SNOOZED
    assert (entry.count, entry.last_ms) == (3, NOW_MS + 900)
    assert (entry.duration_us, entry.lateness_us, entry.error) == (None, None, None)
    assert entry.previous is None and entry.task == ""


@pytest.mark.parametrize(
    "blob",
    [
        b"no bar",
        b"|" + b"\xc1",  # not msgpack
        b"x|" + codec.packed(["t", "", 1, 1, 5], use_bin_type=False),  # link not a number
        b"|" + codec.packed(["t", "", 1, 1], use_bin_type=False),  # too short
        b"|" + codec.packed(["t", "", 9, 1, 5], use_bin_type=False),  # no such outcome
        b"|" + codec.packed(["t", "", 1, True, 5], use_bin_type=False),  # attempt a bool
        b"|" + codec.packed(["t", "", 1, 1, 5.5], use_bin_type=False),  # time a fraction
        b"|" + codec.packed([7, "", 1, 1, 5], use_bin_type=False),  # id not text
        b"|" + codec.packed(["t", "", 4, 1, 5, "w", 0, 0, False, 0, 5], use_bin_type=False),
    ],
    ids=["no bar", "not msgpack", "link", "short", "outcome", "bool", "fraction", "id",
         "no snoozes"],
)  # fmt: skip
def test_an_entry_duetime_did_not_write_is_refused(blob: bytes) -> None:
    with pytest.raises(DecodeError):
        read_entry(1, blob)


def page(keys: QueueKeys, below: int, count: int) -> Eval:
    return Eval(scripts.HISTORY_PAGE, [keys.history_state, keys.history], [below, count])


def test_a_page_numbers_its_entries_down_from_the_first_and_says_where_the_next_starts(
    history: HistoryPlans, keys: QueueKeys
) -> None:
    blobs = [entry_blob("a"), b"written by hand", entry_blob("c")]
    entries, onward = run_plan(history.history_run(0, 3), (page(keys, 0, 3), [b"40", blobs]))
    # The unreadable one is left out; the others keep their numbers.
    assert [(e.number, e.task_id) for e in entries] == [(40, "a"), (38, "c")]
    assert onward == 38  # read on below 38


def test_a_page_shorter_than_asked_ends_the_history(history: HistoryPlans, keys: QueueKeys) -> None:
    entries, onward = run_plan(
        history.history_run(20, 3), (page(keys, 20, 3), [19, [entry_blob("a")]])
    )
    assert [e.number for e in entries] == [19] and onward == 0


def test_a_full_page_that_reaches_entry_one_ends_the_history(
    history: HistoryPlans, keys: QueueKeys
) -> None:
    blobs = [entry_blob("a"), entry_blob("b")]
    entries, onward = run_plan(history.history_run(0, 2), (page(keys, 0, 2), [2, blobs]))
    assert [e.number for e in entries] == [2, 1] and onward == 0


def test_one_tasks_entries_are_followed_link_by_link_up_to_one_unreadable(
    history: HistoryPlans, keys: QueueKeys
) -> None:
    blobs = [entry_blob("t", 9), entry_blob("t", 4), b"garbage", entry_blob("t")]
    entries = run_plan(
        history.task_history("t", 10),
        (Eval(scripts.TASK_HISTORY, list(keys.history_keys), ["t", 10]), [b"15", blobs]),
    )
    assert [(e.number, e.previous) for e in entries] == [(15, 9), (9, 4)]


@pytest.mark.parametrize(
    ("size", "kept"),
    [(None, DEFAULT_HISTORY_SIZE), (b"50", 50), (b"0", 0), (b"-3", 0), (b"lots", 0)],
)
def test_the_size_is_read_as_the_scripts_read_it(
    history: HistoryPlans, keys: QueueKeys, size: bytes | None, kept: int
) -> None:
    """Absent: the default; a size that is not a whole number turns the history off."""
    reads = Batch((Command(("HGET", keys.history_state, "size")), Command(("LLEN", keys.history))))
    assert run_plan(history.history_size(), (reads, [size, 7])) == (kept, 7)


def test_setting_the_default_size_sends_minus_one(history: HistoryPlans, keys: QueueKeys) -> None:
    expected = Eval(scripts.SET_HISTORY, list(keys.history_keys), [-1])
    assert run_plan(history.set_history_size(None), (expected, b"1000")) == 1000
