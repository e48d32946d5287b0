"""The invariant checker's read of a whole queue: every key found by SCAN, then every
structure read in one MULTI/EXEC (again if a worker registered meanwhile)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from duetime.errors import DuetimeError
from duetime.store.plans.base import QueuePlans
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.replies import as_text, pairs
from duetime.store.plans.requests import Batch, Command, Plan


@dataclass(slots=True)
class Snapshot:
    """One consistent (MULTI/EXEC) read of every structure of a queue."""

    now_ms: int
    tasks: set[str] = field(default_factory=set)
    scheduled: list[str] = field(default_factory=list)
    #: delayed bucket name -> its (task id, run-at in µs) entries
    delayed: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    delayed_index: dict[str, float] = field(default_factory=dict)  # bucket -> earliest µs
    delayed_layout: dict[str, bytes] = field(default_factory=dict)  # as stored
    ready: list[str] = field(default_factory=list)
    active: dict[str, list[str]] = field(default_factory=dict)  # worker -> ids
    dead: list[str] = field(default_factory=list)
    leases: dict[str, int] = field(default_factory=dict)  # member -> deadline
    workers: dict[str, int] = field(default_factory=dict)  # worker -> heartbeat
    attempts: dict[str, bytes] = field(default_factory=dict)  # id -> attempts started
    errors: set[str] = field(default_factory=set)
    early: dict[str, bytes] = field(default_factory=dict)  # id -> due from (keys.early)
    counters: dict[str, bytes] = field(default_factory=dict)  # the stats hash as stored
    reaped: set[str] = field(default_factory=set)  # reaped workers to look at once more
    wake_length: int = 0
    cron: dict[str, bytes] = field(default_factory=dict)  # job name -> definition
    cron_entries: dict[str, set[str]] = field(default_factory=dict)  # key part -> names
    cron_held: dict[str, bytes] = field(default_factory=dict)  # job name -> held tick
    due: list[str] = field(default_factory=list)  # ids waiting under flow control
    flow_records: set[str] = field(default_factory=set)  # ids with a flow record
    running: list[str] = field(default_factory=list)  # lease members holding a slot
    keyed: dict[str, str] = field(default_factory=dict)  # "<mode>:<key>" -> its record
    keyed_expiry: set[str] = field(default_factory=set)  # fields a sweep will look at
    keyed_tasks: dict[str, str] = field(default_factory=dict)  # task id -> its field
    history_state: dict[str, bytes] = field(default_factory=dict)  # as stored
    history: list[bytes] = field(default_factory=list)  # the entries, newest first
    history_tasks: dict[str, float] = field(default_factory=dict)  # id -> newest entry
    cancelling: dict[str, bytes] = field(default_factory=dict)  # id -> when cancel was asked
    results_without_ttl: list[str] = field(default_factory=list)
    stray_keys: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _FoundKeys:
    """The keys of a queue a SCAN found besides its fixed ones."""

    lists: set[str] = field(default_factory=set)  # workers' processing lists
    buckets: list[str] = field(default_factory=list)  # delayed buckets
    results: list[str] = field(default_factory=list)
    stray: list[str] = field(default_factory=list)  # in its tag space, but not duetime's


class SnapshotPlans(QueuePlans):
    """The invariant checker's read of a whole queue."""

    def snapshot(self) -> Plan[Snapshot]:
        """Read every structure of the queue in one MULTI/EXEC, for the invariant check."""
        now = yield from self.state.now()
        k = self.keys
        found = yield from self._found_keys()
        for _ in range(3):
            registered = yield Command(("ZRANGE", k.workers, 0, -1))
            active_keys = sorted(found.lists | {k.active(as_text(w)) for w in registered})
            replies = yield Batch(_reads(k, active_keys, found), transaction=True, read_only=True)
            snap = Snapshot(now_ms=now)
            workers = replies[5]  # the workers and their heartbeats (see _reads)
            snap.workers = {
                as_text(workers[i]): int(float(workers[i + 1])) for i in range(0, len(workers), 2)
            }
            if any(k.active(worker) not in active_keys for worker in snap.workers):
                continue  # a worker registered between the scan and the snapshot
            _fill(snap, k, replies, active_keys, found)
            return snap
        raise DuetimeError("workers kept registering during the snapshot; run the check again")

    def _found_keys(self) -> Plan[_FoundKeys]:
        """Every key of the queue, by kind: SCAN, on the queue's node."""
        k = self.keys
        found = _FoundKeys()
        fixed = {
            k.tasks,
            k.scheduled,
            k.ready,
            k.leases,
            k.workers,
            k.attempts,
            k.errors,
            k.dead,
            k.wake,
            k.stats,
            k.cron,
            k.cron_next,
            k.cron_last,
            k.cron_held,
            k.cron_state,
            k.cron_backfill,
            k.cron_backfill_due,
            k.cron_fired,
            k.early,
            k.reaped,
            k.paused,
            k.resumed,
            k.minutes,
            k.delayed,
            k.delayed_layout,
            *k.flow_keys,
            k.flow_holds,
            k.keyed,
            k.keyed_expiry,
            k.keyed_tasks,
            *k.history_keys,
            k.cancelling,
            k.gone_workers,
        }
        cursor: Any = 0
        while True:
            cursor, keys = yield Command(
                ("SCAN", cursor, "MATCH", k.all_keys_pattern, "COUNT", 1000), route=k.tasks
            )
            for raw in keys:
                key = as_text(raw)
                if key.startswith(k.active("")):
                    found.lists.add(key)
                elif key.startswith(k.delayed_bucket("")):
                    found.buckets.append(key)
                elif key.startswith(k.result("")):
                    found.results.append(key)
                elif key not in fixed:
                    found.stray.append(key)
            if int(cursor) == 0:
                return found


def _reads(k: QueueKeys, active_keys: list[str], found: _FoundKeys) -> tuple[Command, ...]:
    """The reads of the snapshot's transaction; ``_fill`` takes their replies in order."""
    return (
        Command(("HKEYS", k.tasks)),
        Command(("ZRANGE", k.scheduled, 0, -1)),
        Command(("LRANGE", k.ready, 0, -1)),
        Command(("ZRANGE", k.dead, 0, -1)),
        Command(("ZRANGE", k.leases, 0, -1, "WITHSCORES")),
        Command(("ZRANGE", k.workers, 0, -1, "WITHSCORES")),
        Command(("HGETALL", k.attempts)),
        Command(("HKEYS", k.errors)),
        Command(("LLEN", k.wake)),
        Command(("HGETALL", k.cron)),
        Command(("ZRANGE", k.cron_next, 0, -1)),
        Command(("HKEYS", k.cron_last)),
        Command(("HGETALL", k.cron_held)),
        Command(("HGETALL", k.early)),
        Command(("HGETALL", k.stats)),
        Command(("ZRANGE", k.reaped, 0, -1)),
        Command(("ZRANGE", k.delayed, 0, -1, "WITHSCORES")),
        Command(("HGETALL", k.delayed_layout)),
        Command(("ZRANGE", k.due, 0, -1)),
        Command(("HKEYS", k.flow_records)),
        Command(("ZRANGE", k.running, 0, -1)),
        Command(("HKEYS", k.cron_state)),
        Command(("HKEYS", k.cron_backfill)),
        Command(("ZRANGE", k.cron_backfill_due, 0, -1)),
        Command(("HGETALL", k.keyed)),
        Command(("ZRANGE", k.keyed_expiry, 0, -1)),
        Command(("HGETALL", k.keyed_tasks)),
        Command(("HGETALL", k.history_state)),
        Command(("LRANGE", k.history, 0, -1)),
        Command(("ZRANGE", k.history_tasks, 0, -1, "WITHSCORES")),
        Command(("HGETALL", k.cancelling)),
        Command(("HKEYS", k.cron_fired)),
        *(Command(("LRANGE", key, 0, -1)) for key in active_keys),
        *(Command(("PTTL", key)) for key in found.results),
        *(Command(("ZRANGE", key, 0, -1, "WITHSCORES")) for key in found.buckets),
    )


def _fill(
    snap: Snapshot, k: QueueKeys, replies: list[Any], active_keys: list[str], found: _FoundKeys
) -> None:
    """The snapshot's records (its workers aside) from the replies to ``_reads``."""
    tasks, scheduled, ready, dead, leases, _, attempts, errors, wake = replies[:9]
    cron, cron_next, cron_last, cron_held, early, stats, reaped = replies[9:16]
    delayed_index, delayed_layout = replies[16:18]
    cron_state, cron_backfill, cron_backfill_due = replies[21:24]
    _fill_flow_keyed_history(snap, replies)
    cron_fired = replies[31]
    rest = replies[32:]
    lists = rest[: len(active_keys)]
    ttls = rest[len(active_keys) : len(active_keys) + len(found.results)]
    buckets = rest[len(active_keys) + len(found.results) :]
    snap.tasks = {as_text(i) for i in tasks}
    snap.scheduled = [as_text(i) for i in scheduled]
    prefix = len(k.delayed_bucket(""))
    snap.delayed = {
        key[prefix:]: [(as_text(name), float(score)) for name, score in pairs(flat)]
        for key, flat in zip(found.buckets, buckets, strict=True)
        if flat
    }
    snap.delayed_index = {as_text(name): float(score) for name, score in pairs(delayed_index)}
    snap.delayed_layout = {as_text(name): value for name, value in pairs(delayed_layout)}
    snap.ready = [as_text(i) for i in ready]
    snap.dead = [as_text(i) for i in dead]
    snap.leases = {as_text(leases[i]): int(float(leases[i + 1])) for i in range(0, len(leases), 2)}
    snap.attempts = {as_text(i): value for i, value in pairs(attempts)}
    snap.errors = {as_text(i) for i in errors}
    snap.early = {as_text(i): value for i, value in pairs(early)}
    snap.counters = {as_text(name): value for name, value in pairs(stats)}
    snap.reaped = {as_text(i) for i in reaped}
    snap.wake_length = int(wake)
    snap.cron = {as_text(name): blob for name, blob in pairs(cron)}
    snap.cron_entries = {
        "cron_next": {as_text(i) for i in cron_next},
        "cron_last": {as_text(i) for i in cron_last},
        "cron_held": {as_text(i) for i, _ in pairs(cron_held)},
        "cron_state": {as_text(i) for i in cron_state},
        "cron_backfill": {as_text(i) for i in cron_backfill},
        "cron_backfill_due": {as_text(i) for i in cron_backfill_due},
        "cron_fired": {as_text(i) for i in cron_fired},
    }
    snap.cron_held = {as_text(i): value for i, value in pairs(cron_held)}
    snap.active = {
        k.worker_of_active(key): [as_text(i) for i in ids]
        for key, ids in zip(active_keys, lists, strict=True)
        if ids
    }
    snap.results_without_ttl = [
        key for key, ttl in zip(found.results, ttls, strict=True) if int(ttl) == -1
    ]
    snap.stray_keys = found.stray


def _fill_flow_keyed_history(snap: Snapshot, replies: list[Any]) -> None:
    """The flow control, keyed-call and history records from the replies to ``_reads``."""
    due, flow_records, running = replies[18:21]
    keyed, keyed_expiry, keyed_tasks = replies[24:27]
    history_state, history, history_tasks, cancelling = replies[27:31]
    # Members "<limit key>\0<rank>\0<id>" and "<limit key>\0<worker>|<id>".
    snap.due = [as_text(i).split("\0", 2)[-1] for i in due]
    snap.flow_records = {as_text(i) for i in flow_records}
    snap.running = [as_text(i).partition("\0")[2] for i in running]
    snap.keyed = {as_text(name): as_text(record) for name, record in pairs(keyed)}
    snap.keyed_expiry = {as_text(name) for name in keyed_expiry}
    snap.keyed_tasks = {as_text(i): as_text(name) for i, name in pairs(keyed_tasks)}
    snap.history_state = {as_text(name): value for name, value in pairs(history_state)}
    snap.history = list(history)
    snap.history_tasks = {as_text(i): float(number) for i, number in pairs(history_tasks)}
    snap.cancelling = {as_text(i): value for i, value in pairs(cancelling)}
