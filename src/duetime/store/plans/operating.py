"""The operator's plans: list the tasks in one state, page through dead letters and
requeue or purge them, read a queue's counts and per-minute figures, pause and resume
it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from duetime import codec
from duetime.errors import DecodeError
from duetime.states import TaskState
from duetime.store.plans import scripts
from duetime.store.plans.base import QueuePlans
from duetime.store.plans.keys import split_lease_member
from duetime.store.plans.replies import as_text, count_or_none, ms_or_none
from duetime.store.plans.requests import Batch, Command, Eval, Plan


@dataclass(frozen=True, slots=True)
class Listed:
    """A task as a listing finds it: ``score`` is its run-at (scheduled), lease deadline
    (running) or time of death (dead), in ms; records as stored (None if absent)."""

    task_id: str
    state: TaskState
    score: float | None
    worker: str | None
    envelope: bytes | None
    attempts: int | None
    error: bytes | None


#: How many reaped workers a queue's record keeps (gone_workers.lua: GONE_KEPT).
GONE_KEPT = 50


@dataclass(frozen=True, slots=True)
class GoneEntry:
    """A worker a reap took for dead (gone_workers.lua): its last heartbeat (ms; None:
    it was not registered), when it was reaped (ms), how many tasks were re-entered, and
    the first ids of those."""

    worker: str
    last_beat_ms: int | None
    reaped_ms: int
    taken_back: int
    task_ids: tuple[str, ...]


def gone_entry(blob: bytes) -> GoneEntry:
    """One entry of the record of reaped workers; DecodeError if duetime did not write it."""
    fields = codec.unpack_written_by_lua(blob)
    if not isinstance(fields, list) or len(fields) != 5:
        raise DecodeError("not an entry of the record of reaped workers")
    worker, beat, reaped, count, ids = fields
    if ids == {}:  # Lua packs an empty table as a map
        ids = []
    if (
        not isinstance(worker, str)
        or not (beat is False or _whole(beat))
        or not _whole(reaped)
        or not _whole(count)
        or not isinstance(ids, list)
        or not all(isinstance(i, str) for i in ids)
    ):
        raise DecodeError("an entry of the record of reaped workers has the wrong types")
    return GoneEntry(worker, None if beat is False else beat, reaped, count, tuple(ids))


def _worker_beats(reply: list[Any]) -> dict[str, int]:
    """The registry of workers (ZRANGE WITHSCORES, flat): each id and its last beat (ms)."""
    return {as_text(reply[i]): int(float(reply[i + 1])) for i in range(0, len(reply), 2)}


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class DeadEntry:
    task_id: str
    died_at_ms: int
    envelope: bytes | None
    error: bytes | None


class OperatorPlans(QueuePlans):
    """The plans of the people who look after a queue (CLI, dashboard, metrics)."""

    def listed(self, state: TaskState, count: int) -> Plan[list[Listed]]:
        """The first ``count`` task ids in one state: scheduled by run-at, ready from the
        head (then those waiting under flow control, by rank), running by lease deadline,
        dead most recent first; with what the queue keeps about each."""
        k = self.keys
        entries: list[tuple[str, float | None, str | None]] = []  # id, score, worker
        if state == TaskState.READY:
            ids = yield Command(("LRANGE", k.ready, 0, count - 1))
            if len(ids) < count:  # then those waiting under flow control, key by key
                waiting = yield Command(("ZRANGE", k.due, 0, count - len(ids) - 1))
                ids += [as_text(member).split("\0", 2)[-1] for member in waiting]
            entries = [(as_text(task_id), None, None) for task_id in ids]
        elif state == TaskState.SCHEDULED:
            entries = [(i, score, None) for i, score in (yield from self._earliest(count))]
        else:
            key, order = {
                TaskState.RUNNING: (k.leases, ()),
                TaskState.DEAD: (k.dead, ("REV",)),
            }[state]
            flat = yield Command(("ZRANGE", key, 0, count - 1, *order, "WITHSCORES"))
            for i in range(0, len(flat), 2):
                member, score = as_text(flat[i]), float(flat[i + 1])
                if state == TaskState.RUNNING:
                    worker, task_id = split_lease_member(member)
                    entries.append((task_id, score, worker))
                else:
                    entries.append((member, score, None))
        if not entries:
            return []
        ids = [task_id for task_id, _, _ in entries]
        envelopes, attempts, errors = yield Batch(
            (
                Command(("HMGET", k.tasks, *ids)),
                Command(("HMGET", k.attempts, *ids)),
                Command(("HMGET", k.errors, *ids)),
            )
        )
        return [
            Listed(
                task_id=task_id,
                state=state,
                score=score,
                worker=worker,
                envelope=envelopes[i],
                attempts=count_or_none(attempts[i]),
                error=errors[i],
            )
            for i, (task_id, score, worker) in enumerate(entries)
        ]

    def _earliest(self, count: int) -> Plan[list[tuple[str, float]]]:
        """The ``count`` scheduled tasks due first (id, due time), from the retries and
        re-entered tasks and the delayed buckets merged: the index is read in order, and
        only buckets whose earliest task may still be among the first ``count`` are read."""
        k = self.keys
        flat = yield Command(("ZRANGE", k.scheduled, 0, count - 1, "WITHSCORES"))
        found = [(as_text(flat[i]), float(flat[i + 1])) for i in range(0, len(flat), 2)]
        start = 0
        while True:  # the buckets and their index keep µs
            page = yield Command(("ZRANGE", k.delayed, start, start + 63, "WITHSCORES"))
            bar = found[count - 1][1] if len(found) >= count else math.inf
            wanted = [
                as_text(page[i]) for i in range(0, len(page), 2) if float(page[i + 1]) / 1000 <= bar
            ]
            if wanted:
                buckets = yield Batch(
                    tuple(
                        Command(("ZRANGE", k.delayed_bucket(name), 0, count - 1, "WITHSCORES"))
                        for name in wanted
                    )
                )
                for flat in buckets:
                    found += [
                        (as_text(flat[i]), float(flat[i + 1]) / 1000)
                        for i in range(0, len(flat), 2)
                    ]
                found.sort(key=lambda entry: (entry[1], entry[0]))
                del found[count:]
            if len(wanted) < len(page) // 2 or len(page) < 128:
                return found  # the index is in order: the buckets after start later still
            start += 64

    def dead_entries(self, offset: int, count: int) -> Plan[list[DeadEntry]]:
        """Dead tasks, most recent death first."""
        k = self.keys
        flat = yield Command(("ZRANGE", k.dead, offset, offset + count - 1, "REV", "WITHSCORES"))
        ids = [as_text(flat[i]) for i in range(0, len(flat), 2)]
        if not ids:
            return []
        envelopes, errors = yield Batch(
            (Command(("HMGET", k.tasks, *ids)), Command(("HMGET", k.errors, *ids)))
        )
        return [
            DeadEntry(task_id, int(float(flat[2 * i + 1])), envelopes[i], errors[i])
            for i, task_id in enumerate(ids)
        ]

    def requeue_dead(self, task_ids: Sequence[str]) -> Plan[list[str]]:
        """Requeue those of ``task_ids`` that are dead: the ids requeued."""
        now = yield from self.state.now()
        k = self.keys
        keys = (k.dead, k.attempts, k.errors, k.ready, k.stats, k.early, k.tasks)
        return [as_text(i) for i in (yield Eval(scripts.REQUEUE_DEAD, keys, (now, *task_ids)))]

    def purge_dead(
        self,
        task_ids: Sequence[str] = (),
        died_before_ms: int = -1,
        keep_at_most: int = -1,
        limit: int = 1000,
    ) -> Plan[list[str]]:
        """Purge those of ``task_ids`` that are dead, and those past retention: the ids
        purged."""
        k = self.keys
        purged = yield Eval(
            scripts.PURGE_DEAD,
            (k.dead, k.tasks, k.attempts, k.errors, k.flow_records),
            (died_before_ms, keep_at_most, limit, *task_ids),
        )
        return [as_text(i) for i in purged]

    def dead_ids(self, count: int) -> Plan[list[str]]:
        return [as_text(i) for i in (yield Command(("ZRANGE", self.keys.dead, 0, count - 1)))]

    def counts(self) -> Plan[dict[str, Any]]:
        now = yield from self.state.now()
        k = self.keys
        replies = yield Batch(
            (
                Command(("ZCARD", k.scheduled)),
                Command(("LLEN", k.ready)),
                Command(("ZCARD", k.leases)),
                Command(("ZCARD", k.dead)),
                Command(("ZRANGE", k.workers, "-inf", "+inf", "BYSCORE", "WITHSCORES")),
                Command(("ZRANGE", k.scheduled, 0, 0, "WITHSCORES")),
                Command(("HGETALL", k.stats)),
                Command(("EXISTS", k.paused)),
                Command(("LINDEX", k.ready, 0)),
                Command(("HGET", k.delayed_layout, "tasks")),
                Command(("ZRANGE", k.delayed, 0, 0, "WITHSCORES")),
                Command(("ZCARD", k.due)),
                Command(("ZCARD", k.throttled)),
                Command(("EXISTS", k.limits)),
                Command(("LRANGE", k.gone_workers, 0, GONE_KEPT - 1)),
            )
        )
        scheduled, ready, leases, dead, workers, head, stats, paused = replies[:8]
        ready_head, delayed, bucket_head, waiting, throttled, flowing, gone = replies[8:]
        if bucket_head and (not head or float(bucket_head[1]) / 1000 < float(head[1])):
            head = [bucket_head[0], float(bucket_head[1]) / 1000]  # the index is in µs
        if isinstance(stats, list):  # some clients leave HGETALL as a flat list
            stats = dict(zip(stats[::2], stats[1::2], strict=True))
        # The oldest ready task (the head: workers take from the left): its run-at, and
        # the time it is due from when that is later (a retry, requeue or re-entry).
        ready_head_envelope = ready_head_due = None
        if ready_head is not None:
            ready_head_envelope, ready_head_due = yield Batch(
                (Command(("HGET", k.tasks, ready_head)), Command(("HGET", k.early, ready_head)))
            )
        return {
            "paused": bool(paused),
            "ready_head_envelope": ready_head_envelope,
            "ready_head_due_ms": ms_or_none(ready_head_due),
            "now_ms": now,
            # A count of the buckets' tasks that is not a number (garbage) counts as 0;
            # the checker reports it.
            "scheduled": int(scheduled) + max(0, count_or_none(delayed) or 0),
            # Due tasks waiting under flow control for their turn or a limit are ready.
            "ready": int(ready) + int(waiting),
            "waiting": int(waiting),
            "throttled": int(throttled),
            "flow_control": bool(flowing),
            "running": int(leases),
            "dead": int(dead),
            "workers": _worker_beats(workers),
            "next_due_ms": int(float(head[1])) if head else None,
            "gone_workers": _gone_entries(gone),
            # A counter that is not a number (garbage) shows as -1; the checker reports it.
            "counters": {
                as_text(name): -1 if (number := count_or_none(value)) is None else number
                for name, value in stats.items()
            },
        }

    def minute_figures(self) -> Plan[dict[str, int]]:
        """The per-minute figures ("<minute>:<figure>" -> count); garbage is left out."""
        reply = yield Command(("HGETALL", self.keys.minutes))
        if isinstance(reply, list):  # some clients leave HGETALL as a flat list
            reply = dict(zip(reply[::2], reply[1::2], strict=True))
        figures = {}
        for name, value in reply.items():
            if (count := count_or_none(value)) is not None:
                figures[as_text(name)] = count
        return figures

    def set_paused(self, paused: bool) -> Plan[bool]:
        """Pause the queue (workers claim nothing; scheduling and promotion go on) or
        resume it, waking the paused workers. True when this changed the state."""
        k = self.keys
        if paused:
            created, _ = yield Batch(
                (Command(("SET", k.paused, "1", "NX")), Command(("DEL", k.resumed))),
                transaction=True,
            )
            return bool(created)
        removed, _, _ = yield Batch(
            (
                Command(("DEL", k.paused)),
                Command(("DEL", k.resumed)),
                Command(("RPUSH", k.resumed, "1")),
            ),
            transaction=True,
        )
        return bool(removed)

    def is_paused(self) -> Plan[bool]:
        return bool((yield Command(("EXISTS", self.keys.paused))))


def _gone_entries(reply: Any) -> list[GoneEntry]:
    """The record of reaped workers, newest first; an entry duetime cannot read (written
    by hand) is left out, as a key of another type is (the checker reports it)."""
    entries = []
    for blob in reply if isinstance(reply, list) else ():
        try:
            entries.append(gone_entry(blob))
        except DecodeError:
            continue
    return entries
