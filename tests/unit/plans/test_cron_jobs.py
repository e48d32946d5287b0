"""The plans of cron jobs (store/plans/cron_jobs.py), without a server: declarations and
pauses sent as their scripts take them, the due jobs read (a held tick written by hand
made the job's problem), the table read with records duetime did not write left out, a
backfill's record written and read back (and one of the six fields written before
backfills kept what earlier ones covered), the spans of ticks a schedule enqueued, and
the firings' replies read as counts or outcomes."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from duetime.states import CronFireOutcome
from duetime.store.plans import scripts
from duetime.store.plans.cron_jobs import (
    MOST_DUE_CRON,
    CronBackfill,
    CronPlans,
    CronState,
    CronTable,
    DueBackfill,
    DueCron,
    covering,
    merged_spans,
    parsed_backfill,
    parsed_fired,
)
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.requests import Batch, Command, Eval, Request
from tests.unit.plans.scripted import NOW_MS, run_plan

MINUTE = 60_000


def test_jobs_are_declared_in_one_call_of_flat_triples(cron: CronPlans, keys: QueueKeys) -> None:
    k = keys
    declare = Eval(
        scripts.DECLARE_CRON,
        [k.cron, k.cron_next, k.wake, k.cron_state, k.cron_last, k.cron_fired],
        ["a", b"def-a", NOW_MS + MINUTE, "b", b"def-b", NOW_MS + 2 * MINUTE],
    )
    jobs = [("a", b"def-a", NOW_MS + MINUTE), ("b", b"def-b", NOW_MS + 2 * MINUTE)]
    assert run_plan(cron.declare_cron(jobs), (declare, [1, 0])) == [1, 0]


@pytest.mark.parametrize(("next_tick", "sent"), [(None, -1), (NOW_MS + MINUTE, NOW_MS + MINUTE)])
def test_a_job_is_paused_with_minus_one_and_resumed_from_its_tick(
    cron: CronPlans, keys: QueueKeys, next_tick: int | None, sent: int
) -> None:
    k = keys
    set_next = Eval(
        scripts.SET_CRON_NEXT,
        [k.cron, k.cron_next, k.cron_held, k.wake, k.cron_state, k.cron_last, k.cron_fired],
        ["a", sent],
    )
    assert run_plan(cron.set_cron_next("a", next_tick), (set_next, 2)) == 2


def test_due_jobs_are_read_with_a_held_tick_written_by_hand_as_their_problem(
    cron: CronPlans, keys: QueueKeys
) -> None:
    due = Eval(
        scripts.DUE_CRON, [keys.cron_next, keys.cron, keys.cron_held], [NOW_MS, MOST_DUE_CRON]
    )
    found = run_plan(
        cron.due_cron(NOW_MS, MOST_DUE_CRON + 1),  # no more than one call may read
        (due, [[b"a", b"1800000000000", b"b", b"1799999940000", b"c", b"1799999880000"],
               [b"def-a", None, b"def-c"], [None, b"1799999940000", b"soon"]]),
    )  # fmt: skip
    assert found == [
        DueCron("a", NOW_MS, b"def-a", None),
        DueCron("b", NOW_MS - MINUTE, None, NOW_MS - MINUTE),
        DueCron("c", NOW_MS - 2 * MINUTE, b"def-c", None,
                "its held tick is not a number: 'soon'"),
    ]  # fmt: skip


# --- the table -------------------------------------------------------------------------


def table_reads(keys: QueueKeys) -> Batch:
    k = keys
    return Batch(
        (Command(("HGETALL", k.cron)), Command(("ZRANGE", k.cron_next, 0, -1, "WITHSCORES")),
         Command(("HGETALL", k.cron_last)), Command(("HGETALL", k.cron_held)),
         Command(("HGETALL", k.cron_state)), Command(("HGETALL", k.cron_backfill)),
         Command(("HGETALL", k.cron_fired)))
    )  # fmt: skip


def test_the_table_reads_each_record_leaving_out_what_duetime_did_not_write(
    cron: CronPlans, keys: QueueKeys
) -> None:
    backfill = f"{NOW_MS - 10 * MINUTE}|{NOW_MS}|{MINUTE}|-1|11|11".encode()  # six fields
    table = run_plan(
        cron.cron_table(),
        (table_reads(keys), [
            {b"a": b"def-a", b"b": b"def-b"},
            [b"a", b"1800000060000"],  # b is paused
            {b"a": b"cron:a:1800000000000"},
            [b"a", b"1800000000000", b"b", b"never"],
            {b"a": b"3|1|0|", b"b": b"x|0|0|"},
            {b"a": backfill, b"b": b"1|2|3"},
            # a's schedule enqueued from 1799999880000 up to its last task's tick.
            {b"a": b"1799999880000|1000:2000", b"b": b"oops|"},
        ]),
    )  # fmt: skip
    assert table == CronTable(
        definitions={"a": b"def-a", "b": b"def-b"},
        next_ticks={"a": NOW_MS + MINUTE},
        last_task={"a": "cron:a:1800000000000"},
        held={"a": NOW_MS},
        states={"a": CronState(runs=3, failures=1, ended=False)},
        backfills={"a": CronBackfill(NOW_MS - 10 * MINUTE, NOW_MS, MINUTE, None, 11, 11)},
        fired={"a": ((1000, 2000), (NOW_MS - 2 * MINUTE, NOW_MS)), "b": ()},
    )


def test_one_jobs_entry_is_read_without_the_table(cron: CronPlans, keys: QueueKeys) -> None:
    k = keys
    reads = Batch(
        (Command(("HGET", k.cron, "a")), Command(("ZSCORE", k.cron_next, "a")),
         Command(("HGET", k.cron_last, "a")), Command(("HGET", k.cron_held, "a")),
         Command(("HGET", k.cron_state, "a")), Command(("HGET", k.cron_backfill, "a")),
         Command(("HGET", k.cron_fired, "a")))
    )  # fmt: skip
    replies = [b"def-a", None, None, None, b"0|0|1|", None, None]  # paused, and ended
    entry = run_plan(cron.cron_entry("a"), (reads, replies))
    assert entry == CronTable({"a": b"def-a"}, {}, {}, {}, {"a": CronState(0, 0, True)})
    assert run_plan(cron.cron_entry("a"), (reads, [None] * 7)) == CronTable({}, {}, {}, {})


@pytest.mark.parametrize(
    ("raw", "last_task", "spans"),
    [
        (None, None, ()),  # none enqueued
        (b"|5:9,1:3", None, ((1, 3), (5, 9))),  # closed spans only, put in order
        (b"|1:3,4:9", None, ((1, 9),)),  # spans that touch are one
        (b"100|", b"cron:a:160", ((100, 160),)),  # the open span ends at the last task's tick
        (b"100|", b"cron:a:50", ((100, 100),)),  # never before its start
        (b"100|", b"by hand", ((100, 100),)),
        (b"100|1:150", b"cron:a:200", ((1, 200),)),
        (b"x|1:2", None, ()),  # not one duetime wrote
        (b"|1:two", None, ()),
        ("\u00b2|1:2".encode(), None, ()),  # digits int() refuses, written by hand
        ("|1:\u00b2".encode(), None, ()),
        (b"100|", "cron:a:\u00b2".encode(), ((100, 100),)),
    ],
)
def test_a_schedules_spans_are_read_with_the_open_one_ending_at_its_last_task(
    raw: bytes | None, last_task: bytes | None, spans: tuple[tuple[int, int], ...]
) -> None:
    assert parsed_fired(raw, last_task) == spans


def test_spans_that_overlap_or_touch_are_merged_and_a_tick_finds_its_span() -> None:
    spans = merged_spans([(10, 20), (1, 5), (6, 8), (15, 30), (40, 40)])
    assert spans == ((1, 8), (10, 30), (40, 40))
    ends = [covering(spans, tick) for tick in (0, 1, 9, 30, 40, 41)]
    assert ends == [None, 8, None, 30, 40, None]


# --- backfills -------------------------------------------------------------------------


def test_a_backfills_record_reads_back_as_written() -> None:
    backfill = CronBackfill(1000, 9000, 1000, 5000, 3, 9, skipped=1, already_ran=2,
                            covered=((1000, 1999), (7000, 8000)))  # fmt: skip
    assert backfill.encoded() == "1000|9000|1000|5000|3|9|1|2|1000:1999,7000:8000"
    assert parsed_backfill(backfill.encoded().encode()) == backfill
    # Its own progress covers the ticks up to the one before its next, with those before.
    assert backfill.handled() == ((1000, 4999), (7000, 8000))
    done = CronBackfill(1000, 9000, 1000, None, 9, 9)
    assert parsed_backfill(done.encoded().encode()) == done
    assert done.handled() == ((1000, 9000),)
    not_started = CronBackfill(1000, 9000, 1000, 1000, 0, 9, covered=((5000, 6000),))
    assert not_started.handled() == ((5000, 6000),)


@pytest.mark.parametrize(
    "raw",
    [b"", b"1|2|3|4|5", b"1|2|3|4|5|6|7|8", b"1|2|3|x|5|6", b"1|2|3|4|5|6|7|8|1:x",
     b"1|2|3|4|5|6|7|8|9|", b"1|2|3|--4|5|6", "1|2|3|\u00b2|5|6".encode(),
     "1|2|3|4|5|6|7|8|1:\u0663".encode()],
)  # fmt: skip
def test_a_backfill_record_duetime_did_not_write_reads_as_none(raw: bytes) -> None:
    assert parsed_backfill(raw) is None


def test_a_backfill_is_started_if_its_record_is_still_the_one_read(
    cron: CronPlans, keys: QueueKeys
) -> None:
    k = keys
    backfill = CronBackfill(1000, 9000, 1000, 1000, 0, 9)
    start_keys = [k.cron, k.cron_backfill, k.cron_backfill_due, k.wake]
    fresh = Eval(scripts.START_BACKFILL, start_keys, ["a", b"", backfill.encoded(), NOW_MS, 1])
    assert run_plan(cron.start_backfill("a", None, backfill, NOW_MS), (fresh, 1)) == 1
    # One with nothing to do is recorded done: no next tick is due.
    nothing = CronBackfill(1000, 900, 1000, None, 0, 0)
    replacing = Eval(
        scripts.START_BACKFILL, start_keys, ["a", b"old", nothing.encoded(), NOW_MS, 0]
    )
    assert run_plan(cron.start_backfill("a", b"old", nothing, NOW_MS), (replacing, 2)) == 2


def test_due_backfills_are_read_with_their_definitions_and_records(
    cron: CronPlans, keys: QueueKeys
) -> None:
    k = keys
    due = Command(("ZRANGE", k.cron_backfill_due, "-inf", NOW_MS, "BYSCORE", "WITHSCORES",
                   "LIMIT", 0, 10))  # fmt: skip
    record = CronBackfill(1000, 9000, 1000, 2000, 1, 9).encoded().encode()
    found = run_plan(
        cron.due_backfills(NOW_MS, 10),
        (due, [b"a", b"1800000000000", b"b", b"1799999999999.5"]),
        (Batch((Command(("HMGET", k.cron, "a", "b")),
                Command(("HMGET", k.cron_backfill, "a", "b")))),
         [[b"def-a", None], [record, b"garbage"]]),
    )  # fmt: skip
    assert found == [
        DueBackfill("a", NOW_MS, b"def-a", parsed_backfill(record), record),
        DueBackfill("b", NOW_MS - 1, None, None, b"garbage"),  # compared as read
    ]
    assert run_plan(cron.due_backfills(NOW_MS, 10), (due, [])) == []


@pytest.mark.parametrize("fire", ["fire_cron", "fire_backfill"])
def test_firings_are_packed_in_one_argument_and_read_as_counts_or_outcomes(
    cron: CronPlans, fire: str
) -> None:
    rows: list[list[Any]] = [["a", NOW_MS, b"def"], ["b", NOW_MS - MINUTE, b"def"]]

    def call(request: Request) -> None:
        assert isinstance(request, Eval)
        assert request.script == {"fire_cron": scripts.FIRE_CRON,
                                  "fire_backfill": scripts.FIRE_BACKFILL}[fire]  # fmt: skip
        [packed] = request.args
        assert msgpack.unpackb(packed, raw=False) == [["a", NOW_MS, "def"],
                                                      ["b", NOW_MS - MINUTE, "def"]]  # fmt: skip

    outcomes = run_plan(getattr(cron, fire)(rows), (call, [3, b"stale", b"delayed"]))
    assert outcomes == [3, CronFireOutcome.STALE, CronFireOutcome.DELAYED]
