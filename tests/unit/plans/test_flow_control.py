"""Flow control's plans (store/plans/flow_control.py), without a server: the limits hash
read (empty: no flow control) and changed; the limit keys walked key by key through
both sets, up to the count asked; each key's figures and the due time of its next task
(its rank plus its priority's share) read into a FlowState; what holds a key, its own
concurrency before the one each key gets, and the reason told from it."""

from __future__ import annotations

from typing import Any

import pytest

from duetime.store.plans import scripts
from duetime.store.plans.flow_control import (
    QUEUE_GROUP,
    FlowPlans,
    FlowState,
    GroupFlow,
    Hold,
    limit_pairs,
)
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.requests import Batch, Command, Eval, Request
from tests.unit.plans.scripted import NOW_MS, Step, run_plan

RANK = b"%015d" % NOW_MS  # a rank as flow_records.lua writes it: 15 digits


def test_set_limits_sends_the_mode_and_the_fields_after_now(
    flow: FlowPlans, keys: QueueKeys
) -> None:
    fields = limit_pairs({"cap": "5", "rate": ""})  # "": drop the field
    assert fields == ["cap", "5", "rate", ""]
    change = Eval(
        scripts.SET_LIMITS,
        [*keys.flow_keys, keys.leases, keys.wake, keys.ready],
        [NOW_MS, "queue", "cap", "5", "rate", ""],
    )
    assert run_plan(flow.set_limits("queue", fields), (change, 3)) == 3


@pytest.mark.parametrize(
    ("reply", "fields"),
    [
        ({}, None),  # no limits hash: not under flow control
        ([], None),
        ({b"cap": b"5"}, {"cap": "5"}),
        ([b"cap", b"5", b"each_concurrency", b"2"], {"cap": "5", "each_concurrency": "2"}),
    ],
)
def test_the_limits_hash_reads_as_text_or_none_when_absent(
    flow: FlowPlans, keys: QueueKeys, reply: Any, fields: dict[str, str] | None
) -> None:
    assert run_plan(flow.limit_fields(), (Command(("HGETALL", keys.limits)), reply)) == fields


# --- the flow state --------------------------------------------------------------------


def first_of(key: str, low: str) -> Command:
    return Command(("ZRANGE", key, low, "+", "BYLEX", "LIMIT", 0, 1))


def after(name: str) -> str:
    """The lower bound past every member of limit key ``name``."""
    return f"({name}\1"


def walk(key: str, members: list[bytes], most: int) -> list[Step]:
    """The range reads that walk ``key``'s limit keys, one read per key: each member is
    the first of its key; a read past the last finds nothing (unless ``most`` is met)."""
    steps: list[Step] = []
    low = "-"
    for member in members:
        steps.append((first_of(key, low), [member]))
        low = after(member.decode().partition("\0")[0])
    if len(members) < most:
        steps.append((first_of(key, low), []))
    return steps


def totals(keys: QueueKeys) -> Batch:
    return Batch(
        (Command(("ZCARD", keys.due)), Command(("ZCARD", keys.running)),
         Command(("ZSCORE", keys.throttled, QUEUE_GROUP))),
        read_only=True,
    )  # fmt: skip


def test_the_flow_state_reads_each_key_and_when_its_next_task_was_due(
    flow: FlowPlans, keys: QueueKeys
) -> None:
    k = keys

    def lex(name: str) -> tuple[str, str]:
        return f"[{name}\0", f"({name}\1"

    def figures(name: str) -> tuple[Command, ...]:
        return (
            Command(("ZLEXCOUNT", k.due, *lex(name))),
            Command(("ZLEXCOUNT", k.running, *lex(name))),
            Command(("ZSCORE", k.throttled, name)),
            Command(("ZSCORE", k.turns, name)),
        )

    def head(name: str) -> Command:
        return Command(("ZRANGE", k.due, *lex(name), "BYLEX", "LIMIT", 0, 1))

    names = ["", "a", "b"]
    state = run_plan(
        flow.flow_state(),
        (Command(("HGETALL", k.limits)), {b"cap": b"4"}),
        (totals(k), [3, 2, None]),
        # Keys with due tasks ("a", "b"), then with running ones ("", "a").
        *walk(k.due, [b"a\0" + RANK + b"\0t1", b"b\0" + RANK + b"\0t2"], 50),
        *walk(k.running, [b"\0w1|t3", b"a\0w1|t4"], 50),
        (Batch(tuple(c for name in names for c in figures(name)), read_only=True),
         [0, 1, None, None,  2, 1, b"1800000009000", None,  1, 0, None, b"0"]),
        (Batch(tuple(head(name) for name in names), read_only=True),
         [[], [b"a\0" + RANK + b"\0t1"], [b"b\0" + RANK + b"\0t2"]]),
        # "a"'s next task has priority 2: its rank is its run-at less 2000 ms.
        (Command(("HMGET", k.flow_records, "t1", "t2")), [b"2|1|" + RANK + b"|a", None]),
    )  # fmt: skip
    assert state == FlowState(
        enabled=True,
        fields={"cap": "4"},
        due=3,
        running=2,
        queue_throttled_until_ms=None,
        groups=[
            GroupFlow("", 0, 1, None, False, None),
            GroupFlow("a", 2, 1, 1800000009000.0, False, NOW_MS + 2000.0),
            GroupFlow("b", 1, 0, None, True, float(NOW_MS)),
        ],
    )


def test_the_flow_state_walks_no_further_than_the_keys_asked(
    flow: FlowPlans, keys: QueueKeys
) -> None:
    """The first 2 keys of each set hold the first 2 of both; no key past them is read."""
    k = keys

    def two_keys(request: Request) -> None:
        assert isinstance(request, Batch)
        named = {c.args[2] for c in request.commands if c.args[0] == "ZSCORE"}
        assert named == {"a", "b"}

    def heads(request: Request) -> None:
        assert isinstance(request, Batch) and request.read_only
        assert [c.args[2] for c in request.commands] == ["[a\0", "[b\0"]

    state = run_plan(
        flow.flow_state(most_groups=2),
        (Command(("HGETALL", k.limits)), {}),
        (totals(k), [5, 1, b"1800000001000"]),
        *walk(k.due, [b"b\0" + RANK + b"\0t1", b"c\0" + RANK + b"\0t2"], 2),
        *walk(k.running, [b"a\0w|t3", b"d\0w|t4"], 2),
        (two_keys, [1, 1, None, None, 1, 0, None, None]),
        (heads, [[], []]),  # no task in line: no record read
    )
    assert not state.enabled and state.fields == {}
    assert state.queue_throttled_until_ms == 1800000001000.0
    assert [group.key for group in state.groups] == ["a", "b"]
    assert [group.head_due_ms for group in state.groups] == [None, None]


def test_a_queue_with_no_key_in_use_reads_no_key(flow: FlowPlans, keys: QueueKeys) -> None:
    state = run_plan(
        flow.flow_state(),
        (Command(("HGETALL", keys.limits)), {b"cap": b"1"}),
        (totals(keys), [0, 0, None]),
        (first_of(keys.due, "-"), []),
        (first_of(keys.running, "-"), []),
    )
    assert state.groups == [] and (state.due, state.running) == (0, 0)


def flow_with(
    fields: dict[str, str], running: int = 0, throttled: float | None = None
) -> FlowState:
    return FlowState(True, fields, 0, running, throttled, [])


def group(due: int = 1, has_turn: bool = True, head: float | None = NOW_MS) -> GroupFlow:
    return GroupFlow("k", due, 0, None, has_turn, head)


@pytest.mark.parametrize(
    ("state", "flow_group", "since"),
    [
        (flow_with({}), group(), None),  # in the turns, nothing at its limit: a worker's
        (flow_with({}), group(has_turn=False), NOW_MS),  # out of the turns: its limits
        (flow_with({}, throttled=NOW_MS + 5), group(), NOW_MS),  # the queue's rate
        (flow_with({"cap": "3"}, running=3), group(), NOW_MS),  # the queue's cap
        (flow_with({"cap": "3"}, running=2), group(), None),
        (flow_with({"cap": "x"}, running=9), group(), None),  # a cap written by hand
        (flow_with({}, throttled=NOW_MS + 5), group(due=0), None),  # nothing due
        (flow_with({}, throttled=NOW_MS + 5), group(head=None), None),
    ],
)
def test_a_key_is_held_since_its_next_task_was_due_only_while_a_limit_holds_it(
    state: FlowState, flow_group: GroupFlow, since: float | None
) -> None:
    assert state.held_since_ms(flow_group) == since


# --- what holds a key ------------------------------------------------------------------


def hold_reads(keys: QueueKeys, key: str) -> list[Command]:
    concurrency = [f"concurrency:{key}", "each_concurrency"] if key else []
    return [
        Command(("ZSCORE", keys.throttled, key)),
        Command(("ZSCORE", keys.throttled, QUEUE_GROUP)),
        Command(("ZLEXCOUNT", keys.running, f"[{key}\0", f"({key}\1")),
        Command(("ZCARD", keys.running)),
        Command(("HMGET", keys.limits, "cap", *concurrency)),
    ]


def test_holds_read_every_key_in_one_round_trip(flow: FlowPlans, keys: QueueKeys) -> None:
    found = run_plan(
        flow.holds(["", "a", "b"]),
        (Batch((*hold_reads(keys, ""), *hold_reads(keys, "a"), *hold_reads(keys, "b")),
               read_only=True),
         [None, None, 1, 6, [b"8"],
          # "a"'s own concurrency comes before the one every key gets.
          b"1800000002000", None, 2, 6, [None, b"2", b"5"],
          # "b"'s own is written by hand: the one every key gets holds it.
          None, b"1800000003000", 5, 6, [b"lots", b"x", b"5"]]),
    )  # fmt: skip
    assert found == [
        Hold("", None, None, 1, None, 6, 8),
        Hold("a", 1800000002000.0, None, 2, 2, 6, None),
        Hold("b", None, 1800000003000.0, 5, 5, 6, None),
    ]
    assert run_plan(flow.holds([])) == []  # no request


def test_hold_of_one_key(flow: FlowPlans, keys: QueueKeys) -> None:
    found = run_plan(
        flow.hold("a"),
        (Batch(tuple(hold_reads(keys, "a")), read_only=True), [None, None, 0, 0, [None] * 3]),
    )
    assert found == Hold("a", None, None, 0, None, 0, None)


def hold(**facts: Any) -> Hold:
    plain: dict[str, Any] = {"key": "k", "key_throttled_until_ms": None,
                             "queue_throttled_until_ms": None, "key_running": 1,
                             "key_concurrency": None, "queue_running": 1, "cap": None}  # fmt: skip
    return Hold(**(plain | facts))


@pytest.mark.parametrize(
    ("facts", "reason"),
    [
        # The queue's rate first, then the key's, then the cap, then the key's slots.
        ({"queue_throttled_until_ms": NOW_MS, "key_throttled_until_ms": NOW_MS + 1, "cap": 1},
         "the queue's rate limit, until 2027-01-15T08:00:00.000+00:00"),
        ({"key_throttled_until_ms": NOW_MS + 1, "cap": 1},
         "the rate limit of key 'k', until 2027-01-15T08:00:00.001+00:00"),
        ({"key": "", "key_throttled_until_ms": NOW_MS},
         "the rate limit of tasks without a limit key, until 2027-01-15T08:00:00.000+00:00"),
        ({"cap": 1, "key_concurrency": 1}, "the queue's cap: 1 of 1 running"),
        ({"cap": 2, "key_concurrency": 1}, "a free slot of key 'k': 1 of 1 running"),
        ({"cap": 2, "key_concurrency": 2},
         "its turn: limit keys take turns, and a worker's free slot"),
    ],
)  # fmt: skip
def test_the_reason_a_key_is_held_is_the_first_limit_it_meets(
    facts: dict[str, Any], reason: str
) -> None:
    assert hold(**facts).reason() == reason
