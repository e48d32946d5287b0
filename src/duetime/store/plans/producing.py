"""The producer's plans: store tasks (one or many, in the generation of delayed buckets
the server names), cancel, reschedule, read a task's state and wait for its result."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from duetime.errors import CorruptStateError, NotDurableError
from duetime.states import RescheduleOutcome, TaskState
from duetime.store.plans import scripts
from duetime.store.plans.base import QueuePlans, QueueState
from duetime.store.plans.keys import MAX_GENERATION, bucket_name, id_hash
from duetime.store.plans.replies import as_text, count_or_none, score_or_none
from duetime.store.plans.requests import (
    Command,
    Durability,
    Eval,
    EvalMany,
    MadeOnDemand,
    Plan,
    ScriptCall,
    packed_arguments,
    wire_id,
    written_durably,
)
from duetime.validation import milliseconds_not_below, whole_microseconds

#: Tasks per schedule_tasks script call: bounds how long one call holds the server.
SCHEDULE_BATCH = 1000
#: A large schedule call opens a generation of delayed buckets with at least one bucket
#: per this many of its delayed tasks (schedule_tasks.lua opens the next one as the
#: buckets fill), so each stays in the server's compact encoding (128 entries).
BUCKET_FILL = 16
#: Lookups told of a newer generation of delayed buckets more often than this in a row
#: give up (someone keeps rewriting the layout by hand).
GENERATION_ROUNDS = 5

#: A task to store: its id, run-at in whole µs, and what its envelope is made from (see
#: ``schedule_calls``).
NewTask = tuple[str, int, Any]


@dataclass(frozen=True, slots=True)
class StatusReply:
    state: TaskState
    score_ms: float | None
    attempts: int | None  # None: the stored counter is not a number (garbage)
    error: bytes | None
    envelope: bytes | None
    result: bytes | None
    flow_record: bytes | None = None  # priority, cost and limit key, under flow control
    waiting: bool = False  # due, waiting in the due set for its turn or a limit
    cancel_asked_ms: float | None = None  # running, and its cancel was asked then


def status_reply(reply: list[Any]) -> StatusReply:
    """A task_status reply (not the generation: see ``_looked_up``), read."""
    state, score, attempts, error, envelope, result, record, waiting, cancel_asked = reply
    return StatusReply(
        state=TaskState(as_text(state)),
        score_ms=score_or_none(score),
        attempts=count_or_none(attempts or b"0"),
        error=error,
        envelope=envelope,
        result=result,
        flow_record=record or None,
        waiting=bool(waiting),
        cancel_asked_ms=score_or_none(cancel_asked),
    )


def _microseconds(run_at_ms: float) -> str:
    """A run-at as the text of whole µs, as the delayed buckets keep it (scripts hand it
    to the server as it is: a number given to a command from Lua is formatted slowly)."""
    return str(whole_microseconds(run_at_ms))


class ProducerPlans(QueuePlans):
    """The plans that write and read single tasks, as clients call them."""

    def __init__(self, state: QueueState) -> None:
        super().__init__(state)
        keys = state.keys
        #: The keys every schedule call names first (its delayed buckets follow).
        self._schedule_keys = (
            keys.tasks,
            keys.scheduled,
            keys.ready,
            keys.wake,
            keys.stats,
            keys.delayed,
            keys.delayed_layout,
            keys.limits,
            keys.flow_records,
            keys.due,
            keys.turns,
            keys.throttled,
            keys.rate_state,
            keys.running,
            keys.leases,
            keys.flow_holds,
        )

    def learn_generation(self) -> Plan[None]:
        """Ask for the generation of delayed buckets, if it is not known yet."""
        if self.state.generation is None:
            stored = yield Command(("HGET", self.keys.delayed_layout, "generation"))
            number = count_or_none(stored)
            # Garbage (written by hand) reads as the last generation, as in the scripts.
            in_range = number is not None and 0 <= number <= MAX_GENERATION
            self.state.generation = 0 if stored is None else number if in_range else MAX_GENERATION

    def schedule_calls(
        self,
        now: int,
        items: Sequence[NewTask],
        envelope: Callable[[Any, float], bytes],
        record: Callable[[Any], str],
    ) -> tuple[Sequence[ScriptCall], list[int]]:
        """The schedule_tasks calls storing tasks, one per SCHEDULE_BATCH items, and the
        positions of the items in the order they are written. The calls are made on
        demand, each task's envelope with them: ``envelope(source, run_at_ms)``, from
        the last element of its item, and its flow record, ``record(source)``. ``now``
        must come from this queue's own server clock, and the generation must be known
        (``learn_generation``). A large call
        opens a generation with room for all its tasks (BUCKET_FILL a bucket), and writes
        them bucket by bucket: each script call then writes a few buckets, not one per
        task."""
        assert self.state.generation is not None
        now_us = now * 1000
        delayed = sum(1 for _, run_at_us, _ in items if run_at_us > now_us)
        wanted = math.ceil(math.log2(delayed / BUCKET_FILL)) if delayed > BUCKET_FILL else 0
        generation = min(MAX_GENERATION, max(self.state.generation, wanted))
        mask = (1 << generation) - 1
        buckets = [id_hash(task_id) & mask for task_id, _, _ in items]
        order = list(range(len(items)))
        if len(items) > SCHEDULE_BATCH:  # stable: a repeated id keeps its first place
            order.sort(key=buckets.__getitem__)

        def call(number: int) -> ScriptCall:
            keys = list(self._schedule_keys)
            where: dict[int, int] = {}  # bucket -> its index in KEYS (from 1)
            flat: list[Any] = []
            start = number * SCHEDULE_BATCH
            for position in order[start : start + SCHEDULE_BATCH]:
                task_id, run_at_us, source = items[position]
                run_at_ms = milliseconds_not_below(run_at_us)  # the envelope's, to the µs
                if (index := where.get(bucket := buckets[position])) is None:
                    keys.append(self.keys.delayed_bucket(f"{generation}:{bucket}"))
                    index = where[bucket] = len(keys)
                flat += (
                    wire_id(task_id),
                    run_at_ms,
                    envelope(source, run_at_ms),
                    index,
                    str(run_at_us),
                    record(source),
                )
            return keys, [now, packed_arguments(flat), generation]

        return MadeOnDemand(-(-len(order) // SCHEDULE_BATCH), call), order

    def schedule_call(
        self,
        now: int,
        task_id: str,
        run_at_ms: float,
        envelope: bytes,
        run_at_us: int,
        record: str = "",
    ) -> Eval:
        """The schedule_task call storing one task, in the generation known (see
        ``refused`` for its reply, ``store_tasks`` for many, durable or in several
        shards)."""
        assert self.state.generation is not None
        name = bucket_name(task_id, self.state.generation)
        keys = (*self._schedule_keys, self.keys.delayed_bucket(name))
        arguments = (
            now,
            task_id,
            run_at_ms,
            envelope,
            str(run_at_us),
            self.state.generation,
            record,
        )
        return Eval(scripts.SCHEDULE_TASK, keys, arguments)

    def refused(self, reply: list[Any]) -> list[int]:
        """A schedule_tasks (or schedule_task) reply: the positions (from 0) of the tasks
        not created, their id already live; notes the generation of delayed buckets it
        names."""
        generation, _, refused = reply
        self.state.generation = int(generation)
        return [int(position) - 1 for position in refused]

    def bucket_keys(self, task_id: str, generation: int) -> list[str]:
        """A task's delayed bucket in every generation up to ``generation``."""
        return [self.keys.delayed_bucket(bucket_name(task_id, g)) for g in range(generation + 1)]

    def _looked_up(self, task_id: str, lookup: Callable[[int, list[str]], Eval]) -> Plan[Any]:
        """Run a lookup script of one task given the generation of delayed buckets and
        the task's bucket in each one up to it; again when the script answers that the
        generation is another (with an integer, before it touches any bucket). An
        unknown generation is sent as -1, with no buckets."""
        for _ in range(GENERATION_ROUNDS):
            generation = -1 if self.state.generation is None else self.state.generation
            buckets = self.bucket_keys(task_id, generation) if generation >= 0 else []
            reply = yield lookup(generation, buckets)
            if not isinstance(reply, int):
                return reply
            self.state.generation = reply
        raise CorruptStateError(
            f"the generation of delayed buckets of {self.keys.queue!r} keeps changing "
            f"(now {self.state.generation}); is something rewriting {self.keys.delayed_layout}?"
        )

    def occupied(self) -> Plan[bool]:
        """Whether the queue holds any task or cron job (one command)."""
        k = self.keys
        found = yield Command(("EXISTS", k.tasks, k.scheduled, k.ready, k.dead, k.cron, k.delayed))
        return int(found) > 0

    def envelopes(self, task_ids: Sequence[str]) -> Plan[list[bytes | None]]:
        """The stored envelope of each id (None where there is none), in one command."""
        stored: list[bytes | None] = yield Command(("HMGET", self.keys.tasks, *task_ids))
        return stored

    def cancel(
        self, task_id: str, waiting_only: bool = False, running: bool = True
    ) -> Plan[TaskState | None]:
        """Remove a task that has not started, or a dead one unless ``waiting_only``
        (recorded in the history): the place it was taken from; RUNNING when it runs
        (with ``running``, its cancel is asked: the end of its attempt ends it as
        cancelled; else it is left alone); DEAD with ``waiting_only`` when it is dead
        (left alone); None when it is not live."""
        now = yield from self.state.now()
        k = self.keys
        fixed = (
            k.tasks,
            k.scheduled,
            k.ready,
            k.dead,
            k.attempts,
            k.errors,
            k.stats,
            k.early,
            k.delayed,
            k.delayed_layout,
            k.flow_records,
            k.due,
            *k.history_keys,
            k.cancelling,
            k.wake,
        )
        place = yield from self._looked_up(
            task_id,
            lambda generation, buckets: Eval(
                scripts.CANCEL_TASK,
                (*fixed, *buckets),
                (task_id, generation, now, _flag(waiting_only), _flag(running), k.cancel_channel),
            ),
        )
        return TaskState(as_text(place)) if place else None

    def reschedule(
        self, task_id: str, run_at_ms: float, rewrite: Callable[[bytes, float], bytes]
    ) -> Plan[RescheduleOutcome | None]:
        """Move a waiting task to ``run_at_ms``, or to now if that is earlier (as when
        scheduling: its lateness counts from the move); ``rewrite(envelope, run_at_ms)``
        makes the new envelope from the current one. Compare-and-set: retried if the
        envelope changes meanwhile."""
        k = self.keys
        fixed = (
            k.tasks,
            k.scheduled,
            k.ready,
            k.dead,
            k.wake,
            k.early,
            k.delayed,
            k.delayed_layout,
            k.flow_records,
            k.due,
            k.limits,
        )
        while True:
            current = yield Command(("HGET", k.tasks, task_id))
            if current is None:
                return None
            now = yield from self.state.now()
            due_ms = max(run_at_ms, now)
            arguments = (now, task_id, due_ms, current, rewrite(current, due_ms))
            due_us = _microseconds(due_ms)
            outcome = yield from self._looked_up(
                task_id,
                lambda generation, buckets, head=arguments, us=due_us: Eval(  # type: ignore[misc]
                    scripts.RESCHEDULE_TASK, (*fixed, *buckets), (*head, generation, us)
                ),
            )
            if not outcome:
                return None
            if (result := RescheduleOutcome(as_text(outcome))) != RescheduleOutcome.CHANGED:
                return result

    def status(self, task_id: str) -> Plan[StatusReply]:
        reply = yield from self._looked_up(
            task_id, lambda generation, buckets: self.status_call(task_id, generation, buckets)
        )
        return status_reply(reply)

    def status_call(self, task_id: str, generation: int, buckets: Sequence[str]) -> Eval:
        """The task_status call of one task, given the generation of delayed buckets and
        the task's bucket in each one up to it (its reply: ``status_reply``)."""
        k = self.keys
        fixed = (
            k.tasks,
            k.scheduled,
            k.ready,
            k.dead,
            k.attempts,
            k.errors,
            k.result(task_id),
            k.delayed_layout,
            k.flow_records,
            k.due,
            k.cancelling,
        )
        return Eval(scripts.TASK_STATUS, (*fixed, *buckets), (task_id, generation))

    def wait_result(self, task_id: str, timeout: float) -> Plan[bytes | None]:
        """Block until the task's result exists (without consuming it), up to ``timeout``."""
        key = self.keys.result(task_id)
        # BLMOVE from a list to itself rotates its single element: a non-destructive wait.
        blob: bytes | None = yield Command(
            ("BLMOVE", key, key, "LEFT", "LEFT", timeout), block=timeout
        )
        return blob


def store_tasks(
    groups: Sequence[tuple[ProducerPlans, Sequence[ScriptCall]]],
    durability: Durability | None = None,
) -> Plan[list[list[int]]]:
    """Run schedule_tasks calls (of one queue or of several shards, each group with the
    operations that made it) in one round trip (with ``durability``, the replicas'
    confirmation is waited for in the same round trip). For each group, the positions
    (from 0, in the order its calls write them) of the tasks not created: their id was
    live. Calls made on demand are made as they are sent."""
    calls = [(group, index) for group, (_, made) in enumerate(groups) for index in range(len(made))]
    script_calls = MadeOnDemand(len(calls), lambda n: groups[calls[n][0]][1][calls[n][1]])
    if durability is not None:
        try:
            replies = yield from written_durably(
                EvalMany(scripts.SCHEDULE_TASKS, script_calls), durability
            )
        except NotDurableError as error:
            if isinstance(error.reply, list):  # written: note the generations all the same
                for (group, _), reply in zip(calls, error.reply, strict=True):
                    groups[group][0].refused(reply)
            raise
    elif len(calls) == 1:  # a plain call costs less than a pipeline of one
        replies = [(yield Eval(scripts.SCHEDULE_TASKS, *script_calls[0]))]
    else:
        replies = yield EvalMany(scripts.SCHEDULE_TASKS, script_calls)
    refused: list[list[int]] = [[] for _ in groups]
    written = [0] * len(groups)  # tasks of each group in its calls so far
    for (group, _), reply in zip(calls, replies, strict=True):
        refused[group] += [written[group] + p for p in groups[group][0].refused(reply)]
        written[group] += int(reply[1])
    return refused


def _flag(on: bool) -> str:
    return "1" if on else "0"
