"""Writing prepared tasks: the schedule plans of ``QueueCore``, for one task (the hot
path of most producers), many (those with a debounce, throttle or unique key among them
written by ``keyed``), and single calls coalesced into one round trip; a generated id
that collides with a live one is replaced, a given one is idempotent.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

from duetime import validation
from duetime.client.ids import MAX_ID_ROUNDS, fresh_ids
from duetime.client.keyed import KeyedScheduling
from duetime.client.preparing import (
    FLOW,
    GENERATED,
    KEYED,
    TASK_ID,
    TASK_NAME,
    PreparedTask,
    envelope_of,
    run_at_us_of,
)
from duetime.client.shards import QueueShards
from duetime.errors import DuetimeError, NotDurableError
from duetime.hooks import ScheduledTask
from duetime.store.plans.producing import NewTask, store_tasks
from duetime.store.plans.requests import Plan

_keyed_of = itemgetter(KEYED)
_record_of = itemgetter(FLOW)


class Producing:
    """The plans that schedule tasks prepared by ``Preparing``, on the queue's shards;
    ``keyed`` writes those with a debounce, throttle or unique key."""

    def __init__(self, queue: QueueShards, keyed: KeyedScheduling) -> None:
        self.queue = queue
        self.keyed = keyed

    def schedule_plan(self, prepared: Sequence[PreparedTask]) -> Plan[list[str]]:
        """Write prepared tasks (``schedule_many``); keyed tasks among them are written
        one by one, in their order, after the others (each call of a key must see the
        one before). Returns the ids, in order."""
        if not any(map(_keyed_of, prepared)):
            return (yield from self.schedule_plain_plan(prepared))
        ids = [""] * len(prepared)
        plain = [position for position, item in enumerate(prepared) if item[KEYED] is None]
        if plain:
            written = yield from self.schedule_plain_plan([prepared[p] for p in plain])
            for position, task_id in zip(plain, written, strict=True):
                ids[position] = task_id
        for position, item in enumerate(prepared):
            if item[KEYED] is not None:
                ids[position] = (yield from self.keyed.schedule_keyed_plan(item)).id
        return ids

    def schedule_plain_plan(self, prepared: Sequence[PreparedTask]) -> Plan[list[str]]:
        """Write prepared tasks without a key: one script call per 1,000 per shard, all
        in one round trip. Returns the ids stored, in order. A given id that is already
        live changes nothing (idempotent). A generated id that is already live is either
        this very write, resent by redis-py after a dropped reply (the stored envelope is
        ours), or a collision with another task: then this task is written again under a
        fresh id."""
        queue = self.queue
        ids = [item[TASK_ID] for item in prepared]
        nows: dict[int, int] = {}  # shard -> its server's "now" for this call
        items: list[NewTask] = []
        for item in prepared:
            task_id = item[TASK_ID]
            shard = queue.layout.of_task(task_id)
            if shard not in nows:
                nows[shard] = yield from queue.shards[shard].state.now()
            items.append((task_id, run_at_us_of(item, nows[shard]), item))
        pending = list(range(len(items)))  # positions still to write
        for _ in range(MAX_ID_ROUNDS):
            writing = items if len(pending) == len(items) else [items[i] for i in pending]
            try:
                refused = yield from self._store(writing, nows)
            except NotDurableError as error:  # say which tasks: they are on the master
                raise NotDurableError(
                    error.confirmed,
                    error.wanted,
                    error.shortfall,
                    error.reply,
                    task_ids=tuple(ids[i] for i in pending),
                ) from None
            generated = [pending[i] for i in refused if prepared[pending[i]][GENERATED]]
            pending = yield from self._collided(generated, items)
            if not pending:
                if not queue.listed:
                    yield from queue.list_queue()
                if queue.hooks:
                    scheduled = [
                        ScheduledTask(task_id, item[TASK_NAME], stored[1] / 1_000_000)
                        for task_id, item, stored in zip(ids, prepared, items, strict=True)
                    ]
                    queue.hooks.on_schedule(queue.name, scheduled)
                return ids
            # A fresh id must not repeat one of this call, or it could take a given id's place.
            fresh = fresh_ids(len(pending), set(ids))
            for position, task_id in zip(pending, fresh, strict=True):
                ids[position] = task_id
                items[position] = (task_id, *items[position][1:])
        raise DuetimeError(
            f"{len(pending)} generated task id(s) collided with live ids "
            f"{MAX_ID_ROUNDS} times in a row; the random source looks broken"
        )

    def _store(self, items: Sequence[NewTask], nows: dict[int, int]) -> Plan[list[int]]:
        """Store items, each in its shard, in one round trip; the positions of those not
        created (their id was live), in order."""
        queue = self.queue
        by_shard = queue.layout.by_shard([task_id for task_id, _, _ in items])
        calls = []
        placed: list[tuple[list[int], list[int]]] = []  # per shard: positions, order written
        for shard, positions in by_shard.items():
            if shard not in nows:  # a fresh id may land in a shard not yet asked
                nows[shard] = yield from queue.shards[shard].state.now()
            operations = queue.shards[shard]
            yield from queue.check_fsync(shard)
            yield from operations.producer.learn_generation()
            shard_calls, written = operations.producer.schedule_calls(
                nows[shard],
                items if len(positions) == len(items) else [items[p] for p in positions],
                envelope_of,
                _record_of,
            )
            calls.append((operations.producer, shard_calls))
            placed.append((positions, written))
        refused_by_shard = yield from store_tasks(calls, queue.durability)
        refused = [
            positions[written[i]]
            for (positions, written), shard_refused in zip(placed, refused_by_shard, strict=True)
            for i in shard_refused
        ]
        return sorted(refused)

    def _collided(self, positions: list[int], items: Sequence[NewTask]) -> Plan[list[int]]:
        """The positions whose id is live with an envelope other than the one written.
        An envelope gone meanwhile counts as a collision: writing the task again can at
        worst run it twice (at-least-once allows that), never lose it. One read per shard."""
        by_shard = self.queue.layout.by_shard([items[p][0] for p in positions])
        collided = []
        for shard, indexes in by_shard.items():
            group = [positions[i] for i in indexes]
            stored = yield from self.queue.shards[shard].producer.envelopes(
                [items[p][0] for p in group]
            )
            collided += [
                p
                for p, blob in zip(group, stored, strict=True)
                if blob != envelope_of(items[p][2], validation.milliseconds_not_below(items[p][1]))
            ]
        return sorted(collided)

    def schedule_one_plan(self, item: PreparedTask) -> Plan[str]:
        """One task without a key: the plan of ``schedule_plain_plan``, cut to its usual
        course (one script call, no lists of positions) because single calls are the hot
        path of most producers. Durable writes and a refused generated id take the
        general plan."""
        queue = self.queue
        if queue.durability is not None:
            return (yield from self.schedule_plain_plan([item]))[0]
        task_id = item[TASK_ID]
        shard = queue.home(task_id)
        now = shard.clock.now_ms()
        if now is None:
            now = yield from shard.state.now()
        run_at_us = run_at_us_of(item, now)
        run_at = validation.milliseconds_not_below(run_at_us)
        envelope = envelope_of(item, run_at)
        if shard.state.generation is None:
            yield from shard.producer.learn_generation()
        producer = shard.producer
        call = producer.schedule_call(now, task_id, run_at, envelope, run_at_us, item[FLOW])
        refused = producer.refused((yield call))
        if refused and item[GENERATED]:
            # Our own write resent after a dropped reply, or a collision: sorted out there.
            return (yield from self.schedule_plain_plan([item]))[0]
        if not queue.listed:
            yield from queue.list_queue()
        if queue.hooks:
            queue.hooks.on_schedule(
                queue.name, [ScheduledTask(task_id, item[TASK_NAME], run_at_us / 1_000_000)]
            )
        return task_id

    def schedule_together_plan(self, items: list[PreparedTask]) -> Plan[list[str | DuetimeError]]:
        """Single calls without a key coalesced into one round trip: one id per call, or,
        when the replicas fell short, one NotDurableError per call naming that call's
        task."""
        try:
            return list((yield from self.schedule_plain_plan(items)))
        except NotDurableError as error:
            mine = [
                (item[TASK_ID],) if item[TASK_ID] in error.task_ids else error.task_ids
                for item in items
            ]
            return [
                NotDurableError(error.confirmed, error.wanted, error.shortfall, error.reply, ids)
                for ids in mine
            ]
