"""The search's plans (store/plans/searching.py): one bounded page of a walk with HSCAN
and its cursor, the size of what a walk covers, and the status of many tasks in one
round trip, one told of a newer generation asked again alone."""

from __future__ import annotations

import pytest

from duetime.states import TaskState
from duetime.store.plans import scripts
from duetime.store.plans.keys import QueueKeys, bucket_name
from duetime.store.plans.producing import ProducerPlans
from duetime.store.plans.requests import Command, EvalMany
from duetime.store.plans.searching import SearchPlans, Walked
from tests.unit.plans.scripted import run_plan

STATUS = [b"ready", b"5", b"1", None, b"env", None, b"", 0, b"-1"]


@pytest.mark.parametrize(
    ("walked", "key"), [("tasks", "tasks"), ("errors", "errors"), ("keys", "flow")]
)
def test_a_page_asks_for_about_count_entries_from_the_cursor(
    search: SearchPlans, walked: Walked, key: str
) -> None:
    hashed = f"duetime:{{q}}:{key}"
    reply = [b"17", [b"a", b"x", b"\xff-raw", b"y"]]
    cursor, entries = run_plan(
        search.scan_page(walked, 42, 250), (Command(("HSCAN", hashed, 42, "COUNT", 250)), reply)
    )
    # The next cursor, and each id as text (one that is not UTF-8 kept as its bytes).
    assert cursor == 17
    assert entries == [("a", b"x"), ("\udcff-raw", b"y")]


def test_a_page_reads_a_dict_reply_and_the_last_cursor(search: SearchPlans) -> None:
    reply = [b"0", {b"a": b"x"}]
    request = Command(("HSCAN", "duetime:{q}:tasks", 0, "COUNT", 10))
    assert run_plan(search.scan_page("tasks", 0, 10), (request, reply)) == (0, [("a", b"x")])


def test_the_walk_size_is_the_hash_length(search: SearchPlans) -> None:
    request = Command(("HLEN", "duetime:{q}:errors"))
    assert run_plan(search.walk_size("errors"), (request, 12)) == 12


def test_no_status_asked_asks_nothing(search: SearchPlans) -> None:
    assert run_plan(search.statuses([])) == []


def test_statuses_go_in_one_round_trip_and_one_told_of_a_newer_generation_alone(
    search: SearchPlans, producer: ProducerPlans, keys: QueueKeys
) -> None:
    def buckets(task_id: str, generation: int) -> list[str]:
        return [keys.delayed_bucket(bucket_name(task_id, g)) for g in range(generation + 1)]

    def lookup(task_id: str, generation: int) -> tuple[list[str], list[object]]:
        call = producer.status_call(task_id, generation, buckets(task_id, generation))
        return list(call.keys), [task_id, generation]

    found = run_plan(
        search.statuses(["a", "b"]),
        (Command(("HGET", keys.delayed_layout, "generation")), b"1"),
        (EvalMany(scripts.TASK_STATUS, [lookup("a", 1), lookup("b", 1)]), [STATUS, 3]),
        # b's call was told the generation is 3: it is made again alone, in generation 3.
        (producer.status_call("b", 3, buckets("b", 3)), [b"dead", b"9", b"5", b"boom", b"env",
                                                        None, b"", 0, b"-1"]),
    )  # fmt: skip
    assert [status.state for status in found] == [TaskState.READY, TaskState.DEAD]
    assert found[1].attempts == 5 and found[1].error == b"boom"
