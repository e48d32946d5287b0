"""The invariant checker's read of a whole queue (store/plans/snapshot.py): every key
found by SCAN, sorted by kind; every structure read in one read-only MULTI/EXEC; each
reply read into its place in the snapshot; and the read made again when a worker
registered between the scan and the transaction.

The transaction is answered by a fake server that replies to each read by what it
reads (``holding``), so the test says what the queue holds, not where each reply sits
in the batch: a read added to the batch out of step with its reading shows here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from duetime.errors import DuetimeError
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.requests import Batch, Command, Request
from duetime.store.plans.snapshot import SnapshotPlans
from tests.unit.plans.scripted import NOW_MS, Answer, Step, run_plan


def scan(keys: QueueKeys, cursor: Any) -> Command:
    return Command(
        ("SCAN", cursor, "MATCH", keys.all_keys_pattern, "COUNT", 1000), route=keys.tasks
    )


def scanned(keys: QueueKeys, found: Iterable[str]) -> list[Step]:
    """SCAN over two pages (the cursor sent back as the server gave it)."""
    raw = [key.encode() for key in found]
    half = len(raw) // 2
    return [(scan(keys, 0), [b"7", raw[:half]]), (scan(keys, b"7"), [b"0", raw[half:]])]


def holding(state: Mapping[tuple[Any, ...], Any]) -> Answer:
    """A server answering a read-only transaction from ``state``: the reply of each
    command by its arguments; an empty structure for anything else."""

    def answer(request: Request) -> list[Any]:
        assert isinstance(request, Batch) and request.transaction and request.read_only
        empty = {"LLEN": 0, "PTTL": -2}
        return [state.get(c.args, empty.get(c.args[0], [])) for c in request.commands]

    return Answer(answer)


def workers_registered(keys: QueueKeys) -> Command:
    return Command(("ZRANGE", keys.workers, 0, -1))


def the_reads(request: Request) -> None:
    """The snapshot's reads: one transaction, which may be sent again as a pipeline
    when the server is over maxmemory (it refuses MULTI then)."""
    assert isinstance(request, Batch) and request.transaction and request.read_only


def test_each_structure_is_read_into_its_place(snapshots: SnapshotPlans, keys: QueueKeys) -> None:
    k = keys
    found = [k.tasks, k.ready, k.active("w-gone"), k.delayed_bucket("0:3"), k.result("t9"),
             "duetime:{q}:strange", k.history, k.delayed_bucket("0:4"), k.result("t8"),
             k.result("t10")]  # fmt: skip
    state = {
        ("HKEYS", k.tasks): [b"t1", b"t2", b"t3", b"t4"],
        ("ZRANGE", k.scheduled, 0, -1): [b"t1"],
        ("LRANGE", k.ready, 0, -1): [b"t2"],
        ("ZRANGE", k.dead, 0, -1): [b"t4"],
        ("ZRANGE", k.leases, 0, -1, "WITHSCORES"): [b"w1|t3", b"1800000005000"],
        ("ZRANGE", k.workers, 0, -1, "WITHSCORES"): [b"w1", b"1799999999000.0"],
        ("HGETALL", k.attempts): [b"t3", b"1"],
        ("HKEYS", k.errors): [b"t4"],
        ("LLEN", k.wake): 1,
        ("HGETALL", k.cron): {b"job": b"definition"},
        ("ZRANGE", k.cron_next, 0, -1): [b"job"],
        ("HGETALL", k.cron_held): [b"job", b"tick"],
        ("HGETALL", k.early): [b"t2", b"1800000000100"],
        ("HGETALL", k.stats): [b"completed", b"5"],
        ("ZRANGE", k.reaped, 0, -1): [b"w0"],
        ("ZRANGE", k.delayed, 0, -1, "WITHSCORES"): [b"0:3", b"1800000060000"],
        ("HGETALL", k.delayed_layout): [b"generation", b"0"],
        ("ZRANGE", k.due, 0, -1): [b"key\x00000005\x00t6"],
        ("HKEYS", k.flow_records): [b"t6"],
        ("ZRANGE", k.running, 0, -1): [b"key\x00w1|t3"],
        ("HGETALL", k.keyed): {b"debounce:k": b"t7 5"},
        ("ZRANGE", k.keyed_expiry, 0, -1): [b"debounce:k"],
        ("HGETALL", k.keyed_tasks): [b"t7", b"debounce:k"],
        ("HGETALL", k.history_state): [b"seq", b"3"],
        ("LRANGE", k.history, 0, -1): [b"entry"],
        ("ZRANGE", k.history_tasks, 0, -1, "WITHSCORES"): [b"t1", b"3"],
        ("HGETALL", k.cancelling): [b"t3", b"1800000000000"],
        ("HKEYS", k.cron_fired): [b"job"],
        ("LRANGE", k.active("w1"), 0, -1): [b"t3"],
        ("PTTL", k.result("t9")): -1,  # no TTL
        ("PTTL", k.result("t8")): 5000,
        ("PTTL", k.result("t10")): -2,  # gone since the scan
        ("ZRANGE", k.delayed_bucket("0:3"), 0, -1, "WITHSCORES"): [b"t5", b"1800000060000"],
    }
    snap = run_plan(
        snapshots.snapshot(),
        *scanned(keys, found),
        (workers_registered(keys), [b"w1"]),
        (the_reads, holding(state)),
    )
    assert snap.now_ms == NOW_MS
    assert snap.tasks == {"t1", "t2", "t3", "t4"}
    assert (snap.scheduled, snap.ready, snap.dead) == (["t1"], ["t2"], ["t4"])
    assert snap.leases == {"w1|t3": 1800000005000}
    assert snap.workers == {"w1": 1799999999000}
    # The registered worker's list and the one found with no worker behind it are read;
    # an empty list is left out.
    assert snap.active == {"w1": ["t3"]}
    assert snap.attempts == {"t3": b"1"} and snap.errors == {"t4"}
    assert snap.wake_length == 1 and snap.reaped == {"w0"}
    assert snap.cron == {"job": b"definition"} and snap.cron_held == {"job": b"tick"}
    assert snap.cron_entries["cron_next"] == {"job"} and snap.cron_entries["cron_fired"] == {"job"}
    assert snap.cron_entries["cron_held"] == {"job"} and snap.cron_entries["cron_last"] == set()
    assert snap.early == {"t2": b"1800000000100"} and snap.counters == {"completed": b"5"}
    assert snap.delayed == {"0:3": [("t5", 1800000060000.0)]}  # an empty bucket left out
    assert snap.delayed_index == {"0:3": 1800000060000.0}
    assert snap.delayed_layout == {"generation": b"0"}
    # Flow members "<key>\0<rank>\0<id>" and "<key>\0<worker>|<id>": the id, the lease.
    assert snap.due == ["t6"] and snap.running == ["w1|t3"] and snap.flow_records == {"t6"}
    assert snap.keyed == {"debounce:k": "t7 5"} and snap.keyed_expiry == {"debounce:k"}
    assert snap.keyed_tasks == {"t7": "debounce:k"}
    assert snap.history_state == {"seq": b"3"} and snap.history == [b"entry"]
    assert snap.history_tasks == {"t1": 3.0} and snap.cancelling == {"t3": b"1800000000000"}
    assert snap.results_without_ttl == [k.result("t9")]
    assert snap.stray_keys == ["duetime:{q}:strange"]


def test_the_reads_end_with_every_list_result_and_bucket_found(
    snapshots: SnapshotPlans, keys: QueueKeys
) -> None:
    k = keys
    found = [k.active("w-gone"), k.result("a"), k.result("b"), k.delayed_bucket("1:0")]
    tail: list[tuple[Any, ...]] = []

    def reads(request: Request) -> None:
        the_reads(request)
        assert isinstance(request, Batch)
        tail.extend(command.args for command in request.commands[-6:])

    run_plan(
        snapshots.snapshot(),
        *scanned(keys, found),
        (workers_registered(keys), [b"w1"]),
        (reads, holding({})),
    )
    assert tail == [
        ("HKEYS", k.cron_fired),  # the last of the fixed reads
        ("LRANGE", k.active("w-gone"), 0, -1),  # every list, in order of their keys
        ("LRANGE", k.active("w1"), 0, -1),
        ("PTTL", k.result("a")),
        ("PTTL", k.result("b")),
        ("ZRANGE", k.delayed_bucket("1:0"), 0, -1, "WITHSCORES"),
    ]


def test_a_worker_registered_during_the_read_makes_it_read_again(
    snapshots: SnapshotPlans, keys: QueueKeys
) -> None:
    k = keys
    newcomer = {("ZRANGE", k.workers, 0, -1, "WITHSCORES"): [b"w2", b"1800000000000"]}
    snap = run_plan(
        snapshots.snapshot(),
        *scanned(keys, []),
        (workers_registered(keys), []),
        (the_reads, holding(newcomer)),  # w2's list was not read
        (workers_registered(keys), [b"w2"]),
        (the_reads, holding({**newcomer, ("LRANGE", k.active("w2"), 0, -1): [b"x"]})),
    )
    assert snap.workers == {"w2": 1800000000000} and snap.active == {"w2": ["x"]}


def test_workers_that_keep_registering_fail_the_read(
    snapshots: SnapshotPlans, keys: QueueKeys
) -> None:
    newcomer = holding({("ZRANGE", keys.workers, 0, -1, "WITHSCORES"): [b"w2", b"1"]})
    steps: list[Step] = [(workers_registered(keys), []), (the_reads, newcomer)] * 3
    with pytest.raises(DuetimeError, match="kept registering"):
        run_plan(snapshots.snapshot(), *scanned(keys, []), *steps)
