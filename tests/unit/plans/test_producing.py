"""The producer's plans (store/plans/producing.py), without a server: the generation of
delayed buckets as learned and as replies name it, schedule calls cut into calls of
SCHEDULE_BATCH tasks with each task pointed at its bucket, the positions refused across
calls and groups, the lookup of one task retried on a newer generation, a status reply
read, and a reschedule's compare-and-set loop."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from duetime.errors import CorruptStateError, NotDurableError
from duetime.states import RescheduleOutcome, TaskState
from duetime.store.plans import scripts
from duetime.store.plans.keys import MAX_GENERATION, QueueKeys, bucket_name, id_hash
from duetime.store.plans.producing import (
    GENERATION_ROUNDS,
    SCHEDULE_BATCH,
    NewTask,
    ProducerPlans,
    StatusReply,
    status_reply,
    store_tasks,
)
from duetime.store.plans.requests import Command, Durability, Durably, Eval, EvalMany, Request
from duetime.validation import milliseconds_not_below
from tests.unit.plans.scripted import NOW_MS, run_plan

NOW_US = NOW_MS * 1000


def learn(producer: ProducerPlans, keys: QueueKeys, stored: bytes | None) -> None:
    run_plan(
        producer.learn_generation(),
        (Command(("HGET", keys.delayed_layout, "generation")), stored),
    )


def generation_of_one(producer: ProducerPlans, keys: QueueKeys) -> int:
    """The generation a schedule call of one task goes to: its argument, and the bucket
    of that generation it names."""
    call = producer.schedule_call(NOW_MS, "t", NOW_MS + 5, b"envelope", NOW_US + 5000)
    generation = call.args[5]
    assert isinstance(generation, int)
    assert call.keys[-1] == keys.delayed_bucket(bucket_name("t", generation))
    return generation


# --- the generation of delayed buckets -------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "generation"),
    [
        (None, 0),  # never written: the first generation
        (b"3", 3),
        (str(MAX_GENERATION).encode(), MAX_GENERATION),
        # Garbage written by hand reads as the last generation, as in the scripts.
        (str(MAX_GENERATION + 1).encode(), MAX_GENERATION),
        (b"-1", MAX_GENERATION),
        (b"three", MAX_GENERATION),
        (b"", MAX_GENERATION),
    ],
)
def test_learn_generation_reads_the_layout(
    producer: ProducerPlans, keys: QueueKeys, stored: bytes | None, generation: int
) -> None:
    learn(producer, keys, stored)
    assert generation_of_one(producer, keys) == generation


def test_learn_generation_asks_once(producer: ProducerPlans, keys: QueueKeys) -> None:
    learn(producer, keys, b"2")
    run_plan(producer.learn_generation())  # no request: it is known
    assert generation_of_one(producer, keys) == 2


def test_a_schedule_reply_names_the_refused_positions_and_the_generation(
    producer: ProducerPlans, keys: QueueKeys
) -> None:
    learn(producer, keys, None)
    # (generation, tasks written, positions from 1 of those whose id was live)
    assert producer.refused([b"5", 4, [2, 4]]) == [1, 3]
    assert generation_of_one(producer, keys) == 5


# --- schedule calls --------------------------------------------------------------------


def envelope(source: Any, run_at_ms: float) -> bytes:
    return f"{source}@{run_at_ms}".encode()


def record(source: Any) -> str:
    return f"record-{source}"


def delayed_items(count: int, prefix: str = "t") -> list[NewTask]:
    return [(f"{prefix}{n}", NOW_US + 1000 + n, n) for n in range(count)]


def unpacked(arguments: Any) -> list[list[Any]]:
    """A schedule_tasks call's packed argument: (id, run-at ms, envelope, bucket's index
    in KEYS, run-at µs as text, flow record) per task."""
    flat = msgpack.unpackb(arguments, raw=False)
    assert len(flat) % 6 == 0
    return [flat[i : i + 6] for i in range(0, len(flat), 6)]


def test_a_large_schedule_is_cut_into_calls_of_a_batch_each(
    producer: ProducerPlans, keys: QueueKeys
) -> None:
    learn(producer, keys, None)
    items = delayed_items(2 * SCHEDULE_BATCH + 500)
    calls, order = producer.schedule_calls(NOW_MS, items, envelope, record)
    assert len(calls) == 3
    written = [unpacked(args[1]) for _, args in calls]
    assert [len(tasks) for tasks in written] == [SCHEDULE_BATCH, SCHEDULE_BATCH, 500]
    # Every task once, in the order the positions say.
    ids = [task[0] for tasks in written for task in tasks]
    assert ids == [items[position][0] for position in order]
    assert sorted(order) == list(range(len(items)))


def test_a_large_schedule_opens_a_generation_with_room_and_writes_bucket_by_bucket(
    producer: ProducerPlans, keys: QueueKeys
) -> None:
    """2,500 delayed tasks, 16 a bucket: 2^8 buckets (the next power of two above 156)."""
    learn(producer, keys, b"1")
    items = delayed_items(2500)
    calls, order = producer.schedule_calls(NOW_MS, items, envelope, record)
    generation = 8
    buckets = [id_hash(items[position][0]) & 255 for position in order]
    assert buckets == sorted(buckets)  # bucket by bucket: a call names a few buckets
    for call_keys, args in calls:
        assert args[0] == NOW_MS and args[2] == generation
        assert len(call_keys) == len(set(call_keys)), "a bucket named twice in one call"
        for task_id, run_at_ms, blob, index, run_at_us, flow in unpacked(args[1]):
            # Each task points (from 1) at its own bucket among the call's keys.
            assert call_keys[index - 1] == keys.delayed_bucket(bucket_name(task_id, generation))
            assert run_at_us == str(NOW_US + 1000 + int(task_id[1:]))
            assert run_at_ms == milliseconds_not_below(int(run_at_us))
            assert blob == envelope(int(task_id[1:]), run_at_ms).decode()
            assert flow == record(int(task_id[1:]))


def test_a_small_schedule_keeps_its_order_and_its_generation(
    producer: ProducerPlans, keys: QueueKeys
) -> None:
    learn(producer, keys, b"2")
    items = delayed_items(40)
    calls, order = producer.schedule_calls(NOW_MS, items, envelope, record)
    assert order == list(range(40))
    # 40 delayed tasks want 2 generations' room at 16 a bucket: the known 2 is kept.
    [(_, args)] = calls
    assert args[2] == 2


@pytest.mark.parametrize(
    ("known", "delayed", "generation"),
    [
        (2, 100, 3),  # 100 delayed tasks at 16 a bucket want 2^3 buckets
        (10, 100, 10),  # never lowered
        (0, 16, 0),  # a bucket's worth fits the first generation
    ],
)
def test_a_schedule_raises_the_generation_for_its_delayed_tasks_only(
    producer: ProducerPlans, keys: QueueKeys, known: int, delayed: int, generation: int
) -> None:
    learn(producer, keys, str(known).encode())
    due_now = [(f"n{n}", NOW_US - n, n) for n in range(2 * SCHEDULE_BATCH)]  # not counted
    calls, _ = producer.schedule_calls(NOW_MS, due_now + delayed_items(delayed), envelope, record)
    assert {args[2] for _, args in calls} == {generation}


def test_a_repeated_id_keeps_its_first_place_when_sorted_by_bucket(
    producer: ProducerPlans, keys: QueueKeys
) -> None:
    """schedule_tasks creates an id once: the first of two copies must be written first,
    so the refused position is the copy's."""
    learn(producer, keys, None)
    items = delayed_items(SCHEDULE_BATCH + 1)
    items.append(("t7", NOW_US + 99_000, "copy"))
    _, order = producer.schedule_calls(NOW_MS, items, envelope, record)
    copies = [position for position in order if items[position][0] == "t7"]
    assert copies == [7, len(items) - 1]


# --- store_tasks -----------------------------------------------------------------------


def call(name: str) -> tuple[list[str], list[Any]]:
    return [f"k-{name}"], [name]


def test_store_tasks_runs_every_call_in_one_round_trip_and_numbers_the_refused(
    producer: ProducerPlans, keys: QueueKeys
) -> None:
    """Positions count across a group's calls (each reply says how many it wrote)."""
    learn(producer, keys, None)
    groups = [(producer, [call("a1"), call("a2")]), (producer, [call("b1")])]
    refused = run_plan(
        store_tasks(groups),
        (EvalMany(scripts.SCHEDULE_TASKS, [call("a1"), call("a2"), call("b1")]),
         [[b"0", SCHEDULE_BATCH, [5]], [b"0", 500, [1, 3]], [b"3", 10, [10]]]),
    )  # fmt: skip
    assert refused == [[4, SCHEDULE_BATCH, SCHEDULE_BATCH + 2], [9]]
    assert generation_of_one(producer, keys) == 3  # the last reply's


def test_store_tasks_sends_a_lone_call_as_a_plain_script_call(
    producer: ProducerPlans, keys: QueueKeys
) -> None:
    learn(producer, keys, None)
    refused = run_plan(
        store_tasks([(producer, [call("a")])]),
        (Eval(scripts.SCHEDULE_TASKS, ["k-a"], ["a"]), [b"1", 3, []]),
    )
    assert refused == [[]]
    assert generation_of_one(producer, keys) == 1


def test_store_tasks_short_of_replicas_raises_and_still_notes_the_generations(
    producer: ProducerPlans, keys: QueueKeys
) -> None:
    learn(producer, keys, None)
    durability = Durability(replicas=1, timeout_ms=1000)
    replies = [[b"4", 2, []]]

    def durable_call(request: Request) -> None:
        assert isinstance(request, Durably) and request.durability == durability
        assert request.calls.script == scripts.SCHEDULE_TASKS
        assert list(request.calls.calls) == [call("a")]

    with pytest.raises(NotDurableError) as raised:
        run_plan(store_tasks([(producer, [call("a")])], durability), (durable_call, (replies, [0])))
    assert raised.value.reply == replies and raised.value.confirmed == 0
    assert generation_of_one(producer, keys) == 4


# --- one task's lookup, status and reschedule ------------------------------------------


def status_lookup(producer: ProducerPlans, keys: QueueKeys, generation: int) -> Eval:
    buckets = [keys.delayed_bucket(bucket_name("t", g)) for g in range(generation + 1)]
    return producer.status_call("t", generation, buckets if generation >= 0 else [])


STATUS = [b"scheduled", b"1800000000500.5", b"2", None, b"env", None, b"", 0, b"-1"]


def test_a_lookup_with_no_generation_known_names_no_bucket_and_retries_on_the_one_named(
    producer: ProducerPlans, keys: QueueKeys
) -> None:
    unknown = status_lookup(producer, keys, -1)
    assert list(unknown.args) == ["t", -1] and not any(":delayed:" in k for k in unknown.keys)
    status = run_plan(
        producer.status("t"),
        (unknown, 2),  # the script answers with the generation before touching a bucket
        (status_lookup(producer, keys, 2), STATUS),
    )
    assert status.state == TaskState.SCHEDULED
    assert generation_of_one(producer, keys) == 2


def test_a_lookup_told_of_another_generation_every_time_gives_up(
    producer: ProducerPlans, keys: QueueKeys
) -> None:
    steps = [(status_lookup(producer, keys, -1), 1)]
    steps += [(status_lookup(producer, keys, g), g + 1) for g in range(1, GENERATION_ROUNDS)]
    with pytest.raises(CorruptStateError, match="keeps changing"):
        run_plan(producer.status("t"), *steps)


def test_a_status_reply_is_read_with_garbage_as_none() -> None:
    assert status_reply(STATUS) == StatusReply(
        state=TaskState.SCHEDULED,
        score_ms=1800000000500.5,
        attempts=2,
        error=None,
        envelope=b"env",
        result=None,
        flow_record=None,  # "" is no record
        waiting=False,
        cancel_asked_ms=None,  # -1 is none
    )
    running = [b"running", b"-1", b"x7", b"boom", b"env", None, b"rec", 1, b"1800000000000"]
    read = status_reply(running)
    assert read.score_ms is None and read.attempts is None  # a counter written by hand
    assert (read.flow_record, read.waiting, read.cancel_asked_ms) == (b"rec", True, NOW_MS)
    never_claimed = [b"ready", b"5", None, None, b"env", None, None, 0, None]
    assert status_reply(never_claimed).attempts == 0


def test_reschedule_of_a_task_that_is_gone_asks_nothing_more(
    producer: ProducerPlans, keys: QueueKeys
) -> None:
    moved = run_plan(
        producer.reschedule("t", NOW_MS + 60_000, lambda blob, at: blob),
        (Command(("HGET", keys.tasks, "t")), None),
    )
    assert moved is None


def test_reschedule_reads_again_while_the_envelope_changes_and_never_moves_into_the_past(
    producer: ProducerPlans, keys: QueueKeys
) -> None:
    learn(producer, keys, b"0")
    rewrites: list[tuple[bytes, float]] = []

    def rewrite(blob: bytes, at: float) -> bytes:
        rewrites.append((blob, at))
        return blob + b"+"

    def move(current: bytes) -> Any:
        def check(request: Request) -> None:
            assert isinstance(request, Eval) and request.script == scripts.RESCHEDULE_TASK
            # now, id, due (now: the asked time is past), the envelope read, the new one,
            # the generation, the due µs; the task's bucket last among the keys.
            assert list(request.args) == [NOW_MS, "t", NOW_MS, current, current + b"+", 0,
                                          str(NOW_US)]  # fmt: skip
            assert request.keys[-1] == keys.delayed_bucket(bucket_name("t", 0))

        return check

    outcome = run_plan(
        producer.reschedule("t", NOW_MS - 5000, rewrite),
        (Command(("HGET", keys.tasks, "t")), b"v1"),
        (move(b"v1"), b"changed"),
        (Command(("HGET", keys.tasks, "t")), b"v2"),
        (move(b"v2"), b"running"),
    )
    assert outcome == RescheduleOutcome.RUNNING
    assert rewrites == [(b"v1", NOW_MS), (b"v2", NOW_MS)]
