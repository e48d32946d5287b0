"""The error that names a damaged key: which keys are asked about, and what it says."""

from __future__ import annotations

import pytest

from duetime.store.plans.keys import QueueKeys, key_type
from duetime.store.plans.requests import Batch, Command, Eval, EvalMany
from duetime.store.plans.scripts import SCHEDULE_TASK, SCHEDULE_TASKS
from duetime.store.redis.runner import damaged_key_error, suspects

KEYS = QueueKeys("q")
WRONG = Exception("WRONGTYPE Operation against a key holding the wrong kind of value")


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        (KEYS.tasks, "hash"), (KEYS.scheduled, "zset"), (KEYS.delayed, "zset"),
        (KEYS.delayed_bucket("3:5"), "zset"), (KEYS.delayed_layout, "hash"),
        (KEYS.ready, "list"), (KEYS.active("w:1"), "list"), (KEYS.result("a:b"), "list"),
        (KEYS.paused, "string"), (QueueKeys("a:b").wake, "list"), ("other:key", None),
        ("duetime:{q}:unknown", None),
    ],
)  # fmt: skip
def test_key_type_says_what_duetime_keeps_at_each_key(key: str, kind: str | None) -> None:
    assert key_type(key) == kind


def test_only_a_wrongtype_refusal_of_a_call_that_changed_nothing_is_looked_into() -> None:
    call = Eval(SCHEDULE_TASK, (KEYS.tasks, KEYS.ready, KEYS.tasks), ())
    assert suspects(call, WRONG) == [KEYS.tasks, KEYS.ready]
    assert suspects(call, Exception("NOPERM no")) == []
    assert suspects(Command(("ZRANGE", KEYS.leases, 0, 1)), WRONG) == [KEYS.leases]
    reads = (Command(("HGET", KEYS.tasks, "x")), Command(("SCAN", 0)), Command(("TIME",)))
    assert suspects(Batch(reads), WRONG) == []  # a batch that writes: some of it applied
    refused = Exception("Command # 1 (HGET ...) of pipeline caused error: WRONGTYPE Op")
    assert suspects(Batch(reads, read_only=True), refused) == [KEYS.tasks]


def test_the_message_names_the_key_and_says_what_changed() -> None:
    keys = [KEYS.tasks, KEYS.ready, KEYS.scheduled]
    types = [b"hash", b"string", b"none"]
    alone = damaged_key_error("redis://h", Eval(SCHEDULE_TASK, keys, ()), WRONG, keys, types)
    assert alone is not None and alone.keys == {KEYS.ready: "string"}
    assert f"{KEYS.ready} holds a string where duetime keeps a list" in str(alone)
    assert "The call changed nothing" in str(alone)
    several = EvalMany(SCHEDULE_TASKS, [(keys, ()), (keys, ())])
    error = damaged_key_error("redis://h", several, WRONG, keys, types)
    assert error is not None and "other calls of the request may have been applied" in str(error)
    assert damaged_key_error("redis://h", several, WRONG, keys, [b"hash", b"list", b"zset"]) is None
