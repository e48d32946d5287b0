"""Scheduling with a debounce, throttle or unique key: the plans of ``QueueCore`` that
write such a task (one script call, in the shard its key hashes to, so that every call
of a key meets the others there); a schedule_many writes those it holds here, one by
one (``producing``). ``preparing`` checks such a call.
"""

from __future__ import annotations

import math
from typing import Any

from duetime.client.ids import MAX_ID_ROUNDS, new_task_id
from duetime.client.preparing import (
    FLOW,
    KEYED,
    PACKED_DATA,
    TASK_NAME,
    PreparedTask,
    envelope_parts_of,
    run_at_us_of,
)
from duetime.client.shards import QueueShards
from duetime.errors import DuetimeError, InvalidOptionError, NotDurableError
from duetime.hooks import ScheduledTask
from duetime.keyed import Debounce, KeyedMode, Scheduled, Throttle, field_of
from duetime.states import KeyedOutcome, TaskState
from duetime.store.plans import scripts
from duetime.store.plans.keyed import KeyedReply, keyed_reply
from duetime.store.plans.requests import Eval, EvalMany, Plan, ScriptCall, written_durably
from duetime.store.plans.scripts import Script


class KeyedScheduling:
    """The plans that write tasks with a debounce, throttle or unique key."""

    def __init__(self, queue: QueueShards) -> None:
        self.queue = queue

    def keyed_id_plan(self, item: PreparedTask) -> Plan[str]:
        """The id of the task that carries a keyed call (as schedule_task returns it)."""
        return (yield from self.schedule_keyed_plan(item)).id

    def schedule_keyed_plan(self, item: PreparedTask) -> Plan[Scheduled]:
        """Write one keyed call: one script call in its key's shard (again with another
        id in the rare case the generated one is live)."""
        mode = item[KEYED]
        assert mode is not None
        index = self.queue.layout.of_keyed(mode.key)
        shard = self.queue.shards[index]
        now = yield from shard.state.now()
        run_at_ms = math.ceil(run_at_us_of(item, now) / 1000)  # whole ms, never earlier
        head, limits = envelope_parts_of(item)
        parts = (head, item[PACKED_DATA], limits, item[FLOW])
        script, extra = self._mode_arguments(mode)
        for _ in range(MAX_ID_ROUNDS):
            task_id = self._id_in_shard(index)
            call = shard.keyed.keyed_call(now, field_of(mode), task_id, run_at_ms, parts, extra)
            reply = keyed_reply(script, (yield from self._keyed_write(index, script, call)))
            if reply.outcome != "collided":
                return self._scheduled(mode, reply, run_at_ms, item)
        raise DuetimeError(
            f"generated task ids collided with live ids {MAX_ID_ROUNDS} times in a row; "
            "the random source looks broken"
        )

    def _mode_arguments(self, mode: KeyedMode) -> tuple[Script, tuple[Any, ...]]:
        """The script of a mode, and its own arguments (see each script's header)."""
        if isinstance(mode, Debounce):
            limit = self.queue.settings.max_payload_bytes
            extra = (mode.window_ms, mode.max_wait_ms, mode.collect, mode.most, limit)
            return scripts.DEBOUNCE_TASK, extra
        if isinstance(mode, Throttle):
            return scripts.THROTTLE_TASK, (mode.window_ms, "1" if mode.trailing else "0")
        return scripts.SCHEDULE_UNIQUE, (mode.until,)

    def _id_in_shard(self, index: int) -> str:
        """A fresh id that a sharded queue routes to shard ``index``, so that status and
        cancel look there first (one try per shard count, on average)."""
        task_id = new_task_id()
        while self.queue.layout.of_task(task_id) != index:
            task_id = new_task_id()
        return task_id

    def _keyed_write(self, index: int, script: Script, call: ScriptCall) -> Plan[Any]:
        """Run a keyed script call in shard ``index``; durable (waiting for replicas) as
        the queue asks."""
        durability = self.queue.durability
        if durability is None:
            return (yield Eval(script, *call))
        yield from self.queue.check_fsync(index)
        try:
            return (yield from written_durably(EvalMany(script, [call]), durability))[0]
        except NotDurableError as error:
            carried: tuple[str, ...] = ()
            if isinstance(error.reply, list) and len(error.reply[0]) > 1:
                carried = (str(keyed_reply(script, error.reply[0]).task_id),)
            raise NotDurableError(
                error.confirmed, error.wanted, error.shortfall, error.reply, task_ids=carried
            ) from None

    def _scheduled(
        self, mode: KeyedMode, reply: KeyedReply, run_at_ms: int, item: PreparedTask
    ) -> Scheduled:
        """What a keyed script's reply says happened to the call."""
        if reply.outcome == "collect":
            raise InvalidOptionError(
                f"the waiting task of debounce key {mode.key!r} collects {reply.detail!r}; "
                f"this call asks for {getattr(mode, 'collect', '')!r}: give every call of a "
                "key the same collect"
            )
        assert reply.task_id is not None
        outcome = KeyedOutcome(reply.outcome)
        run_at = reply.run_at_ms
        if reply.state is not None and outcome == KeyedOutcome.CREATED:
            run_at = run_at_ms  # a unique key's new task runs at the call's run-at
        if outcome == KeyedOutcome.CREATED and self.queue.hooks:
            assert run_at is not None
            task = ScheduledTask(reply.task_id, item[TASK_NAME], run_at / 1000)
            self.queue.hooks.on_schedule(self.queue.name, [task])
        return Scheduled(
            id=reply.task_id,
            outcome=outcome,
            run_at=None if run_at is None else run_at / 1000,
            calls=reply.calls,
            until=None if reply.until_ms is None else reply.until_ms / 1000,
            state=None if reply.state is None else TaskState(reply.state),
        )
