"""The invariant checker: reads one consistent snapshot of a queue and reports every
place where the data model is broken.

Checked: a live task id is in exactly one place (scheduled: a staged, retried or
re-entered task, or a delayed bucket; ready, due under flow control, one processing
list, dead) and every id in
a place has its envelope (invariant 1); each delayed bucket is where lookups and
dispatchers find it (its tasks' ids hash to it, the index holds its earliest run-at, the
layout counts its tasks and covers its generation); nothing is left behind that would
grow without bound: per-task hashes of tasks that are gone, leases without their task,
processing lists of unregistered workers, results without a TTL, unknown keys, records
of debounce, throttle and unique keys that no sweep would drop, a history longer than
its size or an index of entries it no longer keeps (invariant 7; the history's
entries are of tasks that are gone, by design). Also reported: garbage where duetime
keeps numbers (attempt counters, early run-at notes, counters, held cron ticks, the
history's size and number), cancels asked of tasks that are not running, keyed records
that do not read, and cron definitions this host cannot use (poison records the
dispatcher pauses).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from duetime import keyed, validation
from duetime.cron import definitions as cron_definitions
from duetime.errors import DuetimeError
from duetime.store.plans.history import DEFAULT_HISTORY_SIZE, HISTORY_TRIM_STEP, read_entry
from duetime.store.plans.keys import MAX_GENERATION, bucket_name, lease_member, split_lease_member
from duetime.store.plans.replies import count_or_none
from duetime.store.plans.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.subject}: {self.detail}"


def check_invariants(snapshot: Snapshot) -> list[Violation]:
    problems = _placement(snapshot)
    problems += _leaks(snapshot)
    problems += _processing_lists(snapshot)
    problems += _delayed(snapshot)
    problems += _garbage(snapshot)
    problems += _left_over(snapshot)
    problems += _keyed(snapshot)
    problems += _history(snapshot)
    return problems


def _placement(snapshot: Snapshot) -> list[Violation]:
    """Invariant 1: a live id is in exactly one place, and every id in a place has its
    envelope."""
    found: list[Violation] = []
    places: dict[str, list[str]] = {}
    for place, ids in (
        ("scheduled", snapshot.scheduled),
        *(
            (f"delayed:{name}", [i for i, _ in entries])
            for name, entries in snapshot.delayed.items()
        ),
        ("ready", snapshot.ready),
        ("due", snapshot.due),
        ("dead", snapshot.dead),
        *((f"active:{worker}", ids) for worker, ids in snapshot.active.items()),
    ):
        for task_id in ids:
            places.setdefault(task_id, []).append(place)

    for task_id in sorted(snapshot.tasks):
        in_places = places.get(task_id, [])
        if not in_places:
            found.append(Violation("lost", task_id, "envelope stored but the id is in no place"))
        elif len(in_places) > 1:
            where = ", ".join(sorted(in_places))
            found.append(Violation("duplicated", task_id, f"in {len(in_places)} places: {where}"))
    for task_id, in_places in sorted(places.items()):
        if task_id not in snapshot.tasks:
            where = ", ".join(in_places)
            found.append(Violation("orphan id", task_id, f"in {where} without an envelope"))
    return found


def _leaks(snapshot: Snapshot) -> list[Violation]:
    """Per-task entries of tasks that are gone, and leases without their task."""
    found: list[Violation] = []
    per_task = (
        ("attempts", set(snapshot.attempts)),
        ("errors", snapshot.errors),
        ("flow record", snapshot.flow_records),
        ("cancel", set(snapshot.cancelling)),
    )
    for name, entries in per_task:
        for task_id in sorted(entries - snapshot.tasks):
            found.append(Violation("leak", task_id, f"{name} entry of a task that is gone"))

    # Retried and re-entered tasks wait in scheduled with the time they are due from.
    waiting = set(snapshot.ready).union(snapshot.scheduled, snapshot.due, *snapshot.active.values())
    for task_id in sorted(set(snapshot.early) - waiting):
        detail = "early run-at of a task not in ready, due, scheduled or a worker's list"
        found.append(Violation("leak", task_id, detail))

    # A cancel is asked of a running task only; the end of its attempt takes it.
    running_ids = set().union(*snapshot.active.values())
    for task_id in sorted((set(snapshot.cancelling) & snapshot.tasks) - running_ids):
        detail = "cancel asked of a task that is not in a worker's list"
        found.append(Violation("leak", task_id, detail))

    for member in sorted(set(snapshot.running) - set(snapshot.leases)):
        detail = "flow control slot held by a task without its lease"
        found.append(Violation("leak", member, detail))
    for member in sorted(snapshot.leases):
        worker, task_id = split_lease_member(member)
        if task_id not in snapshot.active.get(worker, []):
            detail = "lease whose task is not in that worker's list"
            found.append(Violation("leak", member, detail))
    return found


def _processing_lists(snapshot: Snapshot) -> list[Violation]:
    """Each worker's processing list: registered, no id twice, every task leased."""
    found: list[Violation] = []
    for worker, ids in sorted(snapshot.active.items()):
        if worker not in snapshot.workers:
            detail = f"processing list of an unregistered worker ({len(ids)} ids)"
            found.append(Violation("orphan list", worker, detail))
        for task_id, count in Counter(ids).items():
            if count > 1:
                found.append(Violation("duplicated", task_id, f"{count} times in {worker}'s list"))
        for task_id in ids:
            if task_id in snapshot.tasks and lease_member(worker, task_id) not in snapshot.leases:
                # Normal for an instant between BLMOVE and the claim; a quiet queue has none.
                detail = f"in {worker}'s list without a lease"
                found.append(Violation("unleased", task_id, detail))
    return found


def _left_over(snapshot: Snapshot) -> list[Violation]:
    """What would grow without bound: entries of cron jobs that are gone, results
    without a TTL, keys duetime does not write, a wake list that is not drained."""
    found: list[Violation] = []
    for part, names in sorted(snapshot.cron_entries.items()):
        for name in sorted(names - set(snapshot.cron)):
            found.append(Violation("leak", name, f"{part} entry of a cron job that is gone"))
    for key in snapshot.results_without_ttl:
        found.append(Violation("leak", key, "result without a TTL"))
    for key in snapshot.stray_keys:
        found.append(Violation("stray key", key, "not a key duetime writes"))
    if snapshot.wake_length > 1:
        detail = f"wake list holds {snapshot.wake_length} elements"
        found.append(Violation("leak", "wake", detail))
    return found


def _delayed(snapshot: Snapshot) -> list[Violation]:
    """The delayed buckets: each found by lookups and by dispatchers."""
    found, generation = _delayed_layout(snapshot)
    for name, entries in sorted(snapshot.delayed.items()):
        found += _bucket(snapshot, name, entries, generation)
    for name in sorted(set(snapshot.delayed_index) - set(snapshot.delayed)):
        found.append(Violation("leak", name, "index entry of an empty delayed bucket"))
    return found


def _delayed_layout(snapshot: Snapshot) -> tuple[list[Violation], int]:
    """The layout's generation and count of delayed tasks; the generation lookups use."""
    found: list[Violation] = []
    generation = count_or_none(snapshot.delayed_layout.get("generation", b"0"))
    if generation is None or not 0 <= generation <= MAX_GENERATION:
        stored = _shown(snapshot.delayed_layout["generation"])
        detail = f"generation {stored} (read as {MAX_GENERATION}: lookups try every generation)"
        found.append(Violation("garbage", "delayed_layout.generation", detail))
        generation = MAX_GENERATION
    counted = count_or_none(snapshot.delayed_layout.get("tasks", b"0"))
    held = sum(len(entries) for entries in snapshot.delayed.values())
    if counted != held:
        stored = _shown(snapshot.delayed_layout.get("tasks", b"0"))
        detail = f"counts {stored} delayed tasks; the buckets hold {held}"
        found.append(Violation("miscount", "delayed_layout.tasks", detail))
    return found, generation


def _bucket(
    snapshot: Snapshot, name: str, entries: list[tuple[str, float]], generation: int
) -> list[Violation]:
    """One delayed bucket: in a generation lookups try, its ids hashing to it, indexed
    at its earliest run-at."""
    found: list[Violation] = []
    first, _, _ = name.partition(":")
    bucket_generation = int(first) if validation.is_whole(first) else None
    if bucket_generation is None or bucket_generation > generation:
        detail = (
            f"delayed bucket outside generations 0 to {generation}: lookups "
            f"(cancel, status, reschedule) of its {len(entries)} task(s) miss it"
        )
        return [Violation("misplaced", name, detail)]
    for task_id, _ in entries:
        if (home := bucket_name(task_id, bucket_generation)) != name:
            detail = (
                f"in delayed bucket {name}, but its id belongs in {home}: lookups "
                "(cancel, status, reschedule) miss it"
            )
            found.append(Violation("misplaced", task_id, detail))
    earliest = min(score for _, score in entries)
    indexed = snapshot.delayed_index.get(name)
    if indexed is None:
        detail = (
            f"delayed bucket missing from the index: its {len(entries)} task(s) are never promoted"
        )
        found.append(Violation("lost", name, detail))
    elif indexed != earliest:
        detail = f"indexed at {indexed:.0f} µs, but its earliest task is due at {earliest:.0f} µs"
        found.append(Violation("stale index", name, detail))
    return found


def _garbage(snapshot: Snapshot) -> list[Violation]:
    """Values that are not what duetime writes there, and unusable cron definitions."""
    found: list[Violation] = []
    for task_id, value in sorted(snapshot.attempts.items()):
        count = count_or_none(value)
        if count is None or count < 0:
            found.append(Violation("garbage", task_id, f"attempt counter {_shown(value)}"))
    for task_id, value in sorted(snapshot.early.items()):
        if not _is_number(value):
            found.append(Violation("garbage", task_id, f"early run-at note {_shown(value)}"))
    for name, value in sorted(snapshot.counters.items()):
        if count_or_none(value) is None:
            found.append(Violation("garbage", f"stats.{name}", f"counter {_shown(value)}"))
    for name, value in sorted(snapshot.cron_held.items()):
        if count_or_none(value) is None:
            found.append(Violation("garbage", name, f"held cron tick {_shown(value)}"))
    for name, blob in sorted(snapshot.cron.items()):
        try:
            cron_definitions.decode_job(blob)
        except DuetimeError as problem:
            found.append(Violation("poison cron", name, f"definition unusable here: {problem}"))
    return found


def _history(snapshot: Snapshot) -> list[Violation]:
    """The history: within its size, each entry readable, its index pointing only at
    entries it keeps, each of them its task's."""
    found: list[Violation] = []
    state = snapshot.history_state
    size = count_or_none(state.get("size", str(DEFAULT_HISTORY_SIZE).encode()))
    newest = count_or_none(state.get("seq", b"0"))
    for name, value in (("size", size), ("seq", newest)):
        if value is None or value < 0:
            found.append(Violation("garbage", f"history_state.{name}", _shown(state[name])))
    held = len(snapshot.history)
    if size is not None and held >= size + HISTORY_TRIM_STEP:
        detail = f"holds {held} entries; it keeps {size}, and is trimmed {HISTORY_TRIM_STEP} later"
        found.append(Violation("leak", "history", detail))
    owners: dict[int, str] = {}
    for index, blob in enumerate(snapshot.history):
        try:
            owners[index] = read_entry(0, blob).task_id
        except DuetimeError as problem:
            found.append(Violation("garbage", f"history entry {index}", str(problem)))
    if newest is None:
        return found
    for task_id, number in sorted(snapshot.history_tasks.items()):
        index = newest - int(number)
        if not 0 <= index < held:
            detail = f"history index entry of entry {number:.0f}, which is not kept"
            found.append(Violation("leak", task_id, detail))
        elif owners.get(index, task_id) != task_id:
            detail = f"history index points at entry {number:.0f}, of task {owners[index]}"
            found.append(Violation("stale index", task_id, detail))
    return found


def _is_number(value: bytes) -> bool:
    try:
        return math.isfinite(float(value))
    except ValueError:
        return False


def _shown(value: bytes) -> str:
    return repr(value[:40]) + ("..." if len(value) > 40 else "")


def _keyed(snapshot: Snapshot) -> list[Violation]:
    """The records of debounce, throttle and unique keys: each readable and looked at by
    a dispatcher's sweep (or it would stay for ever), and each note of a task's key
    naming a record that names the task."""
    found: list[Violation] = []
    for name, record in sorted(snapshot.keyed.items()):
        if keyed.keyed_state(name, record) is None:
            found.append(Violation("garbage", name, f"keyed record {_shown(record.encode())}"))
        if name not in snapshot.keyed_expiry:
            found.append(Violation("leak", name, "keyed record that no sweep will look at"))
    for name in sorted(snapshot.keyed_expiry - set(snapshot.keyed)):
        found.append(Violation("leak", name, "keyed sweep entry of a record that is gone"))
    for task_id, name in sorted(snapshot.keyed_tasks.items()):
        held = snapshot.keyed.get(name)
        if held is None or task_id not in keyed.record_task_ids(name, held):
            detail = f"note of the key {name!r} of a task its record does not name"
            found.append(Violation("leak", task_id, detail))
    return found
