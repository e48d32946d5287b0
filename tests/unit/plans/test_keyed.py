"""The plans of keyed calls (store/plans/keyed.py), without a server: each keyed script's
reply read as its header says (a unique key's state where the others have run-at and
window), a call's keys and arguments, the status of a key's task, and the sweep of spent
records looped until a call looks at fewer than it may, each call at the server's now."""

from __future__ import annotations

from typing import Any

import pytest

from duetime.clock import ManualClock
from duetime.store.plans import scripts
from duetime.store.plans.keyed import (
    SWEEP_GRACE_MS,
    KeyedPlans,
    KeyedReply,
    keyed_reply,
    recheck_ms,
)
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.requests import Eval, Request
from duetime.store.plans.scripts import Script
from tests.unit.plans.scripted import NOW_MS, Answer, run_plan


@pytest.mark.parametrize(
    ("script", "reply", "read"),
    [
        (scripts.DEBOUNCE_TASK, [b"created", b"t1", 1800000005000, 1, 1800000060000],
         KeyedReply("created", "t1", 1800000005000, 1, 1800000060000)),
        (scripts.DEBOUNCE_TASK, [b"collapsed", b"t1", 1800000006000, 4, None],  # no deadline
         KeyedReply("collapsed", "t1", 1800000006000, 4, None)),
        # Dropped by a throttle: the window's leading run, which has no run-at of its own.
        (scripts.THROTTLE_TASK, [b"dropped", b"t0", None, 7, 1800000010000],
         KeyedReply("dropped", "t0", None, 7, 1800000010000)),
        (scripts.SCHEDULE_UNIQUE, [b"existing", b"t9", b"running", 3],
         KeyedReply("existing", "t9", calls=3, state="running")),
        (scripts.SCHEDULE_UNIQUE, [b"collided"], KeyedReply("collided")),
        (scripts.DEBOUNCE_TASK, [b"collided"], KeyedReply("collided")),
        (scripts.DEBOUNCE_TASK, [b"collect", b"last"], KeyedReply("collect", detail="last")),
    ],
)  # fmt: skip
def test_a_keyed_reply_is_read_as_its_scripts_header_says(
    script: Script, reply: list[Any], read: KeyedReply
) -> None:
    assert keyed_reply(script, reply) == read


def test_a_keyed_call_names_the_keyed_keys_and_its_arguments_in_order(
    keyed: KeyedPlans, keys: QueueKeys
) -> None:
    parts = (b"head", b"data", b"limits", "0|1||k")
    call_keys, args = keyed.keyed_call(NOW_MS, "debounce:k", "t1", NOW_MS + 500, parts, [9, "x"])
    assert call_keys == keys.keyed_keys
    assert list(args) == [NOW_MS, "debounce:k", "t1", NOW_MS + 500, b"head", b"data",
                          b"limits", "0|1||k", 9, "x"]  # fmt: skip


@pytest.mark.parametrize(
    ("reply", "found"),
    [
        (None, None),  # no key names the task
        ([b"unique:k", None], ("unique:k", None)),  # the record is gone
        ([b"unique:k", b"rec"], ("unique:k", "rec")),
    ],
)
def test_a_tasks_key_and_record_are_read_or_none(
    keyed: KeyedPlans,
    keys: QueueKeys,
    reply: Any,
    found: tuple[str, str | None] | None,
) -> None:
    status = Eval(scripts.KEYED_STATUS, [keys.keyed_tasks, keys.keyed], ["t1"])
    assert run_plan(keyed.keyed_status("t1"), (status, reply)) == found


def sweep(keys: QueueKeys, now: int, most: int, recheck: int) -> Eval:
    k = keys
    return Eval(
        scripts.SWEEP_KEYED,
        [k.keyed, k.keyed_expiry, k.keyed_tasks, k.tasks, k.attempts, k.dead],
        [now, most, recheck, now - SWEEP_GRACE_MS],
    )


def test_the_sweep_calls_again_while_a_call_looks_at_all_it_may(
    keyed: KeyedPlans, keys: QueueKeys, clock: ManualClock
) -> None:
    def later(reply: list[int]) -> Answer:
        """The reply, and the server's clock a second on by the next call."""

        def answer(request: Request) -> list[int]:
            clock.set(clock.now_ms() + 1000)
            return reply

        return Answer(answer)

    dropped = run_plan(
        keyed.sweep_keyed(3000, most=10),
        (sweep(keys, NOW_MS, 10, 3000), later([7, 3, 10])),  # dropped, kept, looked at
        (sweep(keys, NOW_MS + 1000, 10, 3000), later([10, 0, 10])),
        (sweep(keys, NOW_MS + 2000, 10, 3000), [2, 1, 9]),  # fewer than 10: none left
    )
    assert dropped == 19


def test_a_sweep_with_nothing_due_calls_once(keyed: KeyedPlans, keys: QueueKeys) -> None:
    assert run_plan(keyed.sweep_keyed(1000, most=5), (sweep(keys, NOW_MS, 5, 1000), [0, 0, 0])) == 0


@pytest.mark.parametrize(
    ("interval", "ms"), [(0.1, 1000), (0.5, 1000), (2.0, 4000), (1.2345, 2469)]
)
def test_a_live_unique_key_is_looked_at_again_after_two_intervals_and_a_second_at_least(
    interval: float, ms: int
) -> None:
    assert recheck_ms(interval) == ms
