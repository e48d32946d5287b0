"""Keyed calls on a flow-controlled queue (issue #41, point 8): a debounce, throttle or
unique call that makes a task due now files it among the due in the call itself, as
schedule_task does, so a worker starts it with no dispatcher pass (before, the task
stayed in scheduled until a dispatcher promoted it, and with none running it never
started)."""

from __future__ import annotations

import pytest
import redis

from duetime import Debounce, KeyLimits, Limits, Queue, Throttle, Unique
from duetime.errors import DamagedKeyError
from duetime.keyed import Scheduled
from duetime.states import KeyedOutcome, TaskState
from duetime.store.plans.keys import QueueKeys
from tests.helpers import run_with_only_a_worker

MODES = ["throttle", "unique", "debounce"]


def due_now_call(queue: Queue, mode: str) -> Scheduled:
    """A keyed call of ``mode`` whose task is due now. A debounce's own task is due a
    window later; it is due now when a call finds it full (collect 'all', ``most``)."""
    if mode == "throttle":
        return queue.schedule_keyed("t", throttle=Throttle("k", 60), limit_key="a")
    if mode == "unique":
        return queue.schedule_keyed("u", unique=Unique("k"), limit_key="a")
    debounce = Debounce("k", 60, collect="all", most=1)
    first = queue.schedule_keyed("d", debounce=debounce, limit_key="a")
    assert queue.status(first.id).state == TaskState.SCHEDULED  # type: ignore[union-attr]
    second = queue.schedule_keyed("next", debounce=debounce, limit_key="a")
    assert second.outcome == KeyedOutcome.CREATED and second.id != first.id
    return first  # full: due now with what it holds


@pytest.mark.parametrize("mode", MODES)
def test_a_due_now_keyed_task_joins_the_due_set_in_the_call(
    redis_url: str, raw: redis.Redis, queue_name: str, mode: str
) -> None:
    """The call itself files the task among the due (a blocked worker finds it in ready,
    fed from there): nothing of it is left in scheduled for a dispatcher."""
    keys = QueueKeys(queue_name)
    with Queue(queue_name, redis_url) as queue:
        queue.set_limits(Limits(each_key=KeyLimits(concurrency=1)))
        made = due_now_call(queue, mode)
        assert raw.zscore(keys.scheduled, made.id) is None
        assert queue.status(made.id).state == TaskState.READY  # type: ignore[union-attr]
        assert queue.check() == []


@pytest.mark.parametrize("mode", MODES)
def test_a_due_now_keyed_task_on_a_flow_controlled_queue_runs_with_no_dispatcher(
    redis_url: str, queue_name: str, mode: str
) -> None:
    with Queue(queue_name, redis_url) as queue:
        queue.set_limits(Limits(each_key=KeyLimits(concurrency=1)))
        ran = run_with_only_a_worker(
            queue_name, redis_url, lambda: due_now_call(queue, mode), runs=1
        )
        assert ran == [["d"] if mode == "debounce" else mode[0]]
        assert queue.check() == []


def snapshot(raw: redis.Redis, queue: str) -> dict[object, object]:
    """Every key of the queue, dumped."""
    return {key: raw.dump(key) for key in raw.scan_iter(f"duetime:{{{queue}}}:*")}


@pytest.mark.parametrize("mode", MODES)
def test_a_flow_key_of_the_wrong_type_fails_a_keyed_call_with_nothing_written(
    redis_url: str, raw: redis.Redis, queue_name: str, mode: str
) -> None:
    """The keyed scripts read every flow key they may write before their first write, as
    schedule_task does: a damaged one refuses the call and leaves the queue as it was."""
    debounce = Debounce("k", 60, collect="all", most=1)
    with Queue(queue_name, redis_url) as queue:
        queue.set_limits(Limits(each_key=KeyLimits(concurrency=1)))
        if mode == "debounce":  # a task due a window later: the next call finds it full
            queue.schedule_keyed("d", debounce=debounce, limit_key="a")
        raw.set(QueueKeys(queue_name).flow_holds, "not a hash")
        before = snapshot(raw, queue_name)
        with pytest.raises(DamagedKeyError, match="holds"):
            if mode == "debounce":
                queue.schedule_keyed("next", debounce=debounce, limit_key="a")
            else:
                due_now_call(queue, mode)
        assert snapshot(raw, queue_name) == before
