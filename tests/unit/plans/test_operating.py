"""The operator's plans (store/plans/operating.py), without a server: listings of each
state (ready then the due waiting under flow control, leases split into worker and id,
dead most recent first, scheduled merged from the retries and only the delayed buckets
that may hold one of the first), dead letters paged, requeued and purged, a queue's counts
read with garbage counted as the checker expects, per-minute figures, pause and resume,
and the record of reaped workers read with entries written by hand left out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from duetime import codec
from duetime.errors import DecodeError
from duetime.states import TaskState
from duetime.store.plans import scripts
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operating import (
    GONE_KEPT,
    DeadEntry,
    GoneEntry,
    Listed,
    OperatorPlans,
    gone_entry,
)
from duetime.store.plans.requests import Batch, Command, Eval, Request
from tests.unit.plans.scripted import NOW_MS, Answer, run_plan

RANK = f"{NOW_MS:015d}"


def records(keys: QueueKeys, *ids: str) -> Batch:
    """What a listing reads of each task it found."""
    return Batch(
        (Command(("HMGET", keys.tasks, *ids)), Command(("HMGET", keys.attempts, *ids)),
         Command(("HMGET", keys.errors, *ids)))
    )  # fmt: skip


# --- listings --------------------------------------------------------------------------


def test_ready_lists_the_head_then_the_due_waiting_under_flow_control(
    operator: OperatorPlans, keys: QueueKeys
) -> None:
    due = [f"k\0{RANK}\0b".encode(), f"\0{RANK}\0c".encode()]  # "": tasks without a key
    listed = run_plan(
        operator.listed(TaskState.READY, 3),
        (Command(("LRANGE", keys.ready, 0, 2)), [b"a"]),
        (Command(("ZRANGE", keys.due, 0, 1)), due),  # the 2 still wanted
        (records(keys, "a", "b", "c"), [[b"ea", None, b"ec"], [b"2", None, b"x"],
                                                 [None, None, b"err"]]),
    )  # fmt: skip
    assert listed == [
        Listed("a", TaskState.READY, None, None, b"ea", 2, None),
        Listed("b", TaskState.READY, None, None, None, None, None),
        Listed("c", TaskState.READY, None, None, b"ec", None, b"err"),  # a count by hand
    ]


def test_ready_with_a_full_head_reads_no_due_task(operator: OperatorPlans, keys: QueueKeys) -> None:
    listed = run_plan(
        operator.listed(TaskState.READY, 2),
        (Command(("LRANGE", keys.ready, 0, 1)), [b"a", b"b"]),
        (records(keys, "a", "b"), [[None, None], [None, None], [None, None]]),
    )
    assert [entry.task_id for entry in listed] == ["a", "b"]


def test_running_tasks_are_listed_with_their_worker_and_lease_deadline(
    operator: OperatorPlans, keys: QueueKeys
) -> None:
    listed = run_plan(
        operator.listed(TaskState.RUNNING, 10),
        (Command(("ZRANGE", keys.leases, 0, 9, "WITHSCORES")),
         [b"w1|t1", b"1800000030000", b"w2|t|2", b"1800000040000"]),
        (records(keys, "t1", "t|2"), [[b"e1", b"e2"], [b"1", b"3"], [None, None]]),
    )  # fmt: skip
    assert [(e.task_id, e.worker, e.score, e.attempts) for e in listed] == [
        ("t1", "w1", 1800000030000.0, 1),
        ("t|2", "w2", 1800000040000.0, 3),  # the worker is what comes before the first |
    ]


def test_dead_tasks_are_listed_most_recent_first(operator: OperatorPlans, keys: QueueKeys) -> None:
    listed = run_plan(
        operator.listed(TaskState.DEAD, 5),
        (Command(("ZRANGE", keys.dead, 0, 4, "REV", "WITHSCORES")), [b"d1", b"1800000000000"]),
        (records(keys, "d1"), [[b"e"], [b"5"], [b"boom"]]),
    )
    assert listed == [Listed("d1", TaskState.DEAD, float(NOW_MS), None, b"e", 5, b"boom")]


def test_an_empty_listing_reads_no_records(operator: OperatorPlans, keys: QueueKeys) -> None:
    listed = run_plan(
        operator.listed(TaskState.RUNNING, 5),
        (Command(("ZRANGE", keys.leases, 0, 4, "WITHSCORES")), []),
    )
    assert listed == []


def us(ms: int) -> bytes:
    """A score of the delayed buckets and their index: µs."""
    return str(ms * 1000).encode()


def test_scheduled_merges_the_retries_with_only_the_buckets_that_may_come_first(
    operator: OperatorPlans, keys: QueueKeys
) -> None:
    k = keys
    listed = run_plan(
        operator.listed(TaskState.SCHEDULED, 2),
        (Command(("ZRANGE", k.scheduled, 0, 1, "WITHSCORES")),
         [b"a", str(NOW_MS + 100).encode(), b"b", str(NOW_MS + 300).encode()]),
        # Bucket 0:2's earliest task is after the second of those: it is not read.
        (Command(("ZRANGE", k.delayed, 0, 63, "WITHSCORES")),
         [b"0:1", us(NOW_MS + 50), b"0:2", us(NOW_MS + 500)]),
        (Batch((Command(("ZRANGE", k.delayed_bucket("0:1"), 0, 1, "WITHSCORES")),)),
         [[b"c", us(NOW_MS + 50), b"d", us(NOW_MS + 200)]]),
        (records(k, "c", "a"), [[None, None], [None, None], [None, None]]),
    )  # fmt: skip
    assert [(e.task_id, e.score) for e in listed] == [("c", NOW_MS + 50.0), ("a", NOW_MS + 100.0)]


def test_scheduled_reads_the_next_page_of_buckets_while_each_may_come_first(
    operator: OperatorPlans, keys: QueueKeys
) -> None:
    k = keys
    page = [part for n in range(64) for part in (f"0:{n}".encode(), us(NOW_MS + n))]

    def buckets(request: Request) -> list[Any]:
        assert isinstance(request, Batch)
        return [[] for _ in request.commands]  # emptied since the index was read

    def all_read(count: int) -> Any:
        def check(request: Request) -> None:
            assert isinstance(request, Batch) and len(request.commands) == count

        return check

    listed = run_plan(
        operator.listed(TaskState.SCHEDULED, 1000),
        (Command(("ZRANGE", k.scheduled, 0, 999, "WITHSCORES")), []),
        (Command(("ZRANGE", k.delayed, 0, 63, "WITHSCORES")), page),
        (all_read(64), Answer(buckets)),
        (Command(("ZRANGE", k.delayed, 64, 127, "WITHSCORES")), page[:10]),  # the last page
        (all_read(5), Answer(buckets)),
    )
    assert listed == []


# --- dead letters ----------------------------------------------------------------------


def test_dead_letters_are_paged_most_recent_first(operator: OperatorPlans, keys: QueueKeys) -> None:
    k = keys
    entries = run_plan(
        operator.dead_entries(20, 10),
        (Command(("ZRANGE", k.dead, 20, 29, "REV", "WITHSCORES")),
         [b"d2", b"1800000000200.7", b"d1", b"1800000000100"]),
        (Batch((Command(("HMGET", k.tasks, "d2", "d1")), Command(("HMGET", k.errors, "d2", "d1")))),
         [[b"e2", None], [b"x2", b"x1"]]),
    )  # fmt: skip
    assert entries == [
        DeadEntry("d2", NOW_MS + 200, b"e2", b"x2"),
        DeadEntry("d1", NOW_MS + 100, None, b"x1"),
    ]
    past_the_end = Command(("ZRANGE", k.dead, 0, 9, "REV", "WITHSCORES"))
    assert run_plan(operator.dead_entries(0, 10), (past_the_end, [])) == []


def test_requeue_and_purge_name_the_ids_and_read_those_done(
    operator: OperatorPlans, keys: QueueKeys
) -> None:
    k = keys
    requeue = Eval(
        scripts.REQUEUE_DEAD,
        [k.dead, k.attempts, k.errors, k.ready, k.stats, k.early, k.tasks],
        [NOW_MS, "d1", "d2"],
    )
    assert run_plan(operator.requeue_dead(["d1", "d2"]), (requeue, [b"d2"])) == ["d2"]
    purge = Eval(
        scripts.PURGE_DEAD,
        [k.dead, k.tasks, k.attempts, k.errors, k.flow_records],
        [NOW_MS - 1000, 100, 500, "d1"],
    )
    plan = operator.purge_dead(["d1"], died_before_ms=NOW_MS - 1000, keep_at_most=100, limit=500)
    assert run_plan(plan, (purge, [b"d1", b"old"])) == ["d1", "old"]
    everything = Eval(scripts.PURGE_DEAD, purge.keys, [-1, -1, 1000])  # no retention: -1
    assert run_plan(operator.purge_dead(), (everything, [])) == []


# --- counts, figures, pausing ----------------------------------------------------------


def gone_blob(*fields: Any) -> bytes:
    """An entry of the record of reaped workers, as gone_workers.lua packs it."""
    return codec.packed(list(fields), use_bin_type=False)


def holding(state: Mapping[tuple[Any, ...], Any]) -> Answer:
    """A server answering a batch from ``state``: each command's reply by its arguments."""

    def answer(request: Request) -> list[Any]:
        assert isinstance(request, Batch)
        return [state[c.args] for c in request.commands]

    return Answer(answer)


def queue_holding(keys: QueueKeys) -> dict[tuple[Any, ...], Any]:
    k = keys
    state: dict[tuple[Any, ...], Any] = {
        ("ZCARD", k.scheduled): 2,
        ("LLEN", k.ready): 4,
        ("ZCARD", k.leases): 1,
        ("ZCARD", k.dead): 3,
        ("ZRANGE", k.workers, "-inf", "+inf", "BYSCORE", "WITHSCORES"):
            [b"w1", b"1800000000000", b"w2", b"1799999999000.5"],
        ("ZRANGE", k.scheduled, 0, 0, "WITHSCORES"): [b"r1", b"1800000009000"],
        ("HGETALL", k.stats): [b"completed", b"12", b"failed", b"oops"],  # a flat list
        ("EXISTS", k.paused): 0,
        ("LINDEX", k.ready, 0): None,
        ("HGET", k.delayed_layout, "tasks"): b"10",
        ("ZRANGE", k.delayed, 0, 0, "WITHSCORES"): [],
        ("ZCARD", k.due): 5,
        ("ZCARD", k.throttled): 1,
        ("EXISTS", k.limits): 1,
        ("LRANGE", k.gone_workers, 0, GONE_KEPT - 1): [
            gone_blob("w9", NOW_MS - 9000, NOW_MS - 100, 2, ["t1", "t2"]),
            b"written by hand",
            gone_blob("w8", False, NOW_MS - 200, 0, {}),  # never registered, took nothing
        ],
    }  # fmt: skip
    return state


def test_counts_add_the_buckets_and_the_due_waiting_and_show_garbage(
    operator: OperatorPlans, keys: QueueKeys
) -> None:
    found = run_plan(operator.counts(), (lambda request: None, holding(queue_holding(keys))))
    assert found == {
        "paused": False,
        "ready_head_envelope": None,
        "ready_head_due_ms": None,
        "now_ms": NOW_MS,
        "scheduled": 2 + 10,  # the retries, and the delayed buckets' count
        "ready": 4 + 5,  # ready, and the due waiting for a turn or a limit
        "waiting": 5,
        "throttled": 1,
        "flow_control": True,
        "running": 1,
        "dead": 3,
        "workers": {"w1": NOW_MS, "w2": NOW_MS - 1000},
        "next_due_ms": NOW_MS + 9000,
        "gone_workers": [
            GoneEntry("w9", NOW_MS - 9000, NOW_MS - 100, 2, ("t1", "t2")),
            GoneEntry("w8", None, NOW_MS - 200, 0, ()),
        ],
        "counters": {"completed": 12, "failed": -1},  # not a number: -1
    }


def test_counts_take_the_earlier_head_and_read_the_oldest_ready_task(
    operator: OperatorPlans, keys: QueueKeys
) -> None:
    k = keys
    state = queue_holding(keys)
    state[("ZRANGE", k.delayed, 0, 0, "WITHSCORES")] = [b"0:3", us(NOW_MS + 4000)]
    state[("HGET", k.delayed_layout, "tasks")] = b"ten"  # garbage counts as none
    state[("LINDEX", k.ready, 0)] = b"r7"
    state[("HGETALL", k.stats)] = {}
    state[("LRANGE", k.gone_workers, 0, GONE_KEPT - 1)] = b"a string, not a list"
    head = Batch((Command(("HGET", k.tasks, b"r7")), Command(("HGET", k.early, b"r7"))))
    found = run_plan(
        operator.counts(),
        (lambda request: None, holding(state)),
        (head, [b"env7", b"1800000001000.5"]),
    )
    assert found["next_due_ms"] == NOW_MS + 4000  # the bucket's, in µs there
    assert found["scheduled"] == 2
    assert (found["ready_head_envelope"], found["ready_head_due_ms"]) == (b"env7", NOW_MS + 1000.5)
    assert found["counters"] == {} and found["gone_workers"] == []


def test_minute_figures_leave_out_garbage(operator: OperatorPlans, keys: QueueKeys) -> None:
    reply = [b"100:completed", b"7", b"100:failed", b"x", b"101:completed", b"-2"]
    figures = run_plan(operator.minute_figures(), (Command(("HGETALL", keys.minutes)), reply))
    assert figures == {"100:completed": 7, "101:completed": -2}


def test_pause_and_resume_are_transactions_that_say_whether_they_changed_it(
    operator: OperatorPlans, keys: QueueKeys
) -> None:
    k = keys
    pause = Batch(
        (Command(("SET", k.paused, "1", "NX")), Command(("DEL", k.resumed))), transaction=True
    )
    assert run_plan(operator.set_paused(True), (pause, [True, 0])) is True
    assert run_plan(operator.set_paused(True), (pause, [None, 0])) is False  # paused already
    resume = Batch(
        (Command(("DEL", k.paused)), Command(("DEL", k.resumed)),
         Command(("RPUSH", k.resumed, "1"))),  # wakes every paused worker
        transaction=True,
    )  # fmt: skip
    assert run_plan(operator.set_paused(False), (resume, [1, 1, 1])) is True
    assert run_plan(operator.set_paused(False), (resume, [0, 0, 1])) is False
    assert run_plan(operator.is_paused(), (Command(("EXISTS", k.paused)), 1)) is True


@pytest.mark.parametrize(
    "fields",
    [
        ("w", NOW_MS, NOW_MS, 1),  # four fields
        (7, NOW_MS, NOW_MS, 1, []),  # a worker that is not text
        ("w", True, NOW_MS, 1, []),  # a beat that is neither false nor whole
        ("w", NOW_MS, 1.5, 1, []),
        ("w", NOW_MS, NOW_MS, 1, [3]),  # an id that is not text
        ("w", NOW_MS, NOW_MS, 1, "t"),
    ],
)
def test_a_gone_entry_duetime_did_not_write_is_refused(fields: tuple[Any, ...]) -> None:
    with pytest.raises(DecodeError):
        gone_entry(gone_blob(*fields))
