"""A single schedule call runs schedule_task.lua, a batch runs schedule_tasks.lua: for
one task, on the same state, both leave the server exactly the same (the task's place,
the bucket index, the layout's count and generation, the stats, the wake signal) and
answer the same. Checked over every combination of run-at, what the queue already
holds, the generation the client asks for, and a layout edited by hand."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import redis

from duetime.clock import ManualClock
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operations import QueueOperations
from duetime.store.plans.scripts import SCHEDULE_TASK, SCHEDULE_TASKS
from duetime.validation import milliseconds_not_below
from tests.helpers import as_bytes

NOW_MS = 1_800_000_000_000
TASK_ID = "the-task-id"
RUN_AT_US = {
    "past": (NOW_MS - 5) * 1000,
    "now": NOW_MS * 1000,
    "in a second": (NOW_MS + 1000) * 1000 + 7,
    "in a day": (NOW_MS + 86_400_000) * 1000,
    "past 2255": 2**53 + 4096,
}
HOLDING = ("nothing", "an earlier bucket", "an earlier retry", "a later bucket", "the id",
           "a wake signal")  # fmt: skip
LAYOUT = ("as written", "garbage", "client ahead")


def prepare(raw: redis.Redis, keys: QueueKeys, holding: str, layout: str) -> int:
    """Put the queue in a state; the generation the client asks for."""
    if holding in ("an earlier bucket", "a later bucket"):
        offset = -500 if holding == "an earlier bucket" else 10_000_000
        us = (NOW_MS + 1000) * 1000 + offset * 1000
        raw.hset(keys.tasks, "other", b"envelope")
        raw.zadd(keys.delayed_bucket("0:0"), {"other": us})
        raw.zadd(keys.delayed, {"0:0": us})
        raw.hset(keys.delayed_layout, mapping={"generation": 0, "tasks": 1})
    elif holding == "an earlier retry":
        raw.hset(keys.tasks, "retry", b"envelope")
        raw.zadd(keys.scheduled, {"retry": NOW_MS + 10})
    elif holding == "the id":
        raw.hset(keys.tasks, TASK_ID, b"what was there")
        raw.rpush(keys.ready, TASK_ID)
    elif holding == "a wake signal":
        raw.rpush(keys.wake, 1)
    if layout == "garbage":
        raw.hset(keys.delayed_layout, mapping={"generation": "x", "tasks": "y"})
    return 3 if layout == "client ahead" else 0


def state(raw: redis.Redis, keys: QueueKeys) -> dict[str, Any]:
    """Every key of the queue, by its name without the queue's, with its content."""
    found: dict[str, Any] = {}
    prefix = keys.tasks.removesuffix("tasks")
    for key in raw.scan_iter(match=f"{prefix}*"):
        name = as_bytes(key).decode().removeprefix(prefix)
        kind = as_bytes(raw.type(key)).decode()
        if kind == "hash":
            found[name] = raw.hgetall(key)
        elif kind == "zset":
            found[name] = raw.zrange(key, 0, -1, withscores=True)
        else:
            found[name] = raw.lrange(key, 0, -1)
    return found


def schedule(raw: redis.Redis, keys: QueueKeys, asked: int, run_at_us: int, single: bool) -> Any:
    operations = QueueOperations(keys, ManualClock(NOW_MS))
    operations.state.generation = asked
    run_at_ms = milliseconds_not_below(run_at_us)
    if single:
        call = operations.producer.schedule_call(NOW_MS, TASK_ID, run_at_ms, b"envelope", run_at_us)
        script, keys_and_args = SCHEDULE_TASK, (call.keys, call.args)
    else:
        calls, _ = operations.producer.schedule_calls(
            NOW_MS, [(TASK_ID, run_at_us, None)], lambda _, __: b"envelope", lambda _: ""
        )
        script, keys_and_args = SCHEDULE_TASKS, calls[0]
    script_keys, script_args = keys_and_args
    raw.script_load(script.source)
    return raw.evalsha(script.sha, len(script_keys), *script_keys, *script_args)


@pytest.mark.parametrize(
    ("run_at", "holding", "layout"), list(itertools.product(RUN_AT_US, HOLDING, LAYOUT))
)
def test_one_task_leaves_the_same_state_through_either_script(
    redis_url: str, raw: redis.Redis, run_at: str, holding: str, layout: str
) -> None:
    outcomes = []
    for single in (True, False):
        keys = QueueKeys(f"single-{single}")
        asked = prepare(raw, keys, holding, layout)
        reply = schedule(raw, keys, asked, RUN_AT_US[run_at], single)
        outcomes.append((reply, state(raw, keys)))
    assert outcomes[0] == outcomes[1]
