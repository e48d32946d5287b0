"""The registry of queues (store/plans/operations.py): what a dispatcher and a client
write there, and how a listing reads it back, entries written by hand included."""

from __future__ import annotations

from duetime.errors import RedisUnavailableError
from duetime.store.plans.layout import QUEUE_REGISTRY, QueueLayout
from duetime.store.plans.operations import (
    RegisteredQueue,
    note_queue,
    register_queues,
    registered_queues,
)
from duetime.store.plans.requests import Command
from tests.unit.plans.scripted import run_plan


def test_register_queues_notes_each_layout_with_its_shards_and_the_server_time() -> None:
    run_plan(
        register_queues([QueueLayout("mail", 1), QueueLayout("work", 3)]),
        (Command(("TIME",), route=QUEUE_REGISTRY), [b"1800000000", b"123999"]),
        # Whole milliseconds of the server's clock, not the host's, in one HSET.
        (Command(("HSET", QUEUE_REGISTRY, "mail", "1 1800000000123", "work", "3 1800000000123")),
         3),
    )  # fmt: skip


def test_note_queue_writes_only_if_absent_and_takes_a_failure_as_its_reply() -> None:
    """Listing is a courtesy after a write that is done: a refusal or an unreachable
    server comes back as the reply, and the plan ends without raising it."""
    layout = QueueLayout("mail", 2)
    expected = Command(("HSETNX", QUEUE_REGISTRY, "mail", "2 0"), failure_as_reply=True)
    assert run_plan(note_queue(layout), (expected, 1)) is None
    failure = RedisUnavailableError("gone")
    assert run_plan(note_queue(layout), (expected, failure)) is None


def test_registered_queues_parse_a_dict_reply_sorted_by_name() -> None:
    reply = {b"work": b"3 1800000000123", b"mail": b"1 0"}
    found = run_plan(registered_queues(), (Command(("HGETALL", QUEUE_REGISTRY)), reply))
    assert found == [
        RegisteredQueue("mail", 1, 0),
        RegisteredQueue("work", 3, 1800000000123),
    ]


def test_registered_queues_read_a_flat_list_reply_too() -> None:
    reply = [b"b", b"2 5", b"a", b"1 7"]
    found = run_plan(registered_queues(), (Command(("HGETALL", QUEUE_REGISTRY)), reply))
    assert found == [RegisteredQueue("a", 1, 7), RegisteredQueue("b", 2, 5)]


def test_registered_queues_leave_out_entries_written_by_hand_that_do_not_parse() -> None:
    reply = {
        b"ok": b"2 10",
        b"no-space": b"2",
        b"words": b"two 10",
        b"negative": b"-1 10",
        b"three-parts": b"1 2 3",
        b"empty": b"",
        b"fraction": b"1 2.5",
        b"unseen": b"4 0",
        b"superscript": "\u00b2 10".encode(),
        b"arabic-indic": "2 \u0661\u0660".encode(),
    }
    found = run_plan(registered_queues(), (Command(("HGETALL", QUEUE_REGISTRY)), reply))
    assert found == [RegisteredQueue("ok", 2, 10), RegisteredQueue("unseen", 4, 0)]
