"""The invariant checker, fed hand-made snapshots (state before -> violations after)."""

from __future__ import annotations

from duetime import codec, cron
from duetime.checker import check_invariants
from duetime.cron import definitions as cron_definitions
from duetime.store.plans.snapshot import Snapshot


def job_blob(name: str, timezone: str = "UTC") -> bytes:
    job = cron.define(name, "* * * * *", {"n": 1}, timezone=timezone)
    return cron_definitions.encode_job(job)


def snapshot(**fields: object) -> Snapshot:
    snap = Snapshot(now_ms=1000)
    for name, value in fields.items():
        setattr(snap, name, value)
    return snap


def kinds(snap: Snapshot) -> list[tuple[str, str]]:
    return [(v.kind, v.subject) for v in check_invariants(snap)]


def test_consistent_queue_has_no_violations() -> None:
    snap = snapshot(
        tasks={"a", "b", "c", "d"},
        scheduled=["a"],
        ready=["b"],
        active={"w1": ["c"]},
        leases={"w1|c": 5000},
        workers={"w1": 900},
        attempts={"c": b"1", "d": b"3"},
        errors={"d"},
        dead=["d"],
        early={
            "b": b"1000.5",
            "c": b"1001",
        },  # promoted ahead: in ready, or taken by BLMOVE before the claim
    )
    assert kinds(snap) == []


def test_early_run_at_of_a_task_no_longer_waiting_is_a_leak() -> None:
    # A retried or re-entered task waits in scheduled with the time it is due from.
    notes = {"a": b"1", "d": b"2", "gone": b"3"}
    snap = snapshot(tasks={"a", "d"}, scheduled=["a"], dead=["d"], early=notes)
    assert kinds(snap) == [("leak", "d"), ("leak", "gone")]


def test_task_in_two_places_is_duplicated() -> None:
    assert kinds(snapshot(tasks={"a"}, scheduled=["a"], ready=["a"])) == [("duplicated", "a")]


def test_envelope_in_no_place_is_lost() -> None:
    assert kinds(snapshot(tasks={"a"})) == [("lost", "a")]


def test_id_without_envelope_is_an_orphan() -> None:
    assert kinds(snapshot(ready=["x"])) == [("orphan id", "x")]


def test_leftover_per_task_entries_are_leaks() -> None:
    found = kinds(snapshot(attempts={"gone": b"1"}, errors={"gone"}))
    assert found == [("leak", "gone"), ("leak", "gone")]


def test_processing_list_of_unregistered_worker_is_reported() -> None:
    snap = snapshot(tasks={"a"}, active={"ghost": ["a"]}, leases={"ghost|a": 5000})
    assert ("orphan list", "ghost") in kinds(snap)


def test_lease_without_its_task_is_a_leak_and_unleased_task_is_reported() -> None:
    snap = snapshot(tasks={"a"}, active={"w1": ["a"]}, workers={"w1": 1}, leases={"w1|zzz": 1})
    assert kinds(snap) == [("leak", "w1|zzz"), ("unleased", "a")]


def test_results_without_ttl_stray_keys_and_wake_overflow() -> None:
    snap = snapshot(results_without_ttl=["k1"], stray_keys=["k2"], wake_length=2)
    assert kinds(snap) == [("leak", "k1"), ("stray key", "k2"), ("leak", "wake")]


def test_cron_entries_without_a_definition_are_leaks() -> None:
    snap = snapshot(
        cron={"kept": job_blob("kept")},
        cron_entries={"cron_next": {"kept", "gone"}, "cron_held": set()},
    )
    assert kinds(snap) == [("leak", "gone")]


def test_garbage_where_duetime_keeps_numbers_is_reported() -> None:
    snap = snapshot(
        tasks={"a", "b"},
        ready=["a", "b"],
        attempts={"a": b"x1", "b": b"2"},
        early={"a": b"soon", "b": b"1000.25"},
        counters={"scheduled": b"12", "completed": b"lots"},
        cron_held={"job": b"later"},
        cron={"job": job_blob("job")},
    )
    assert kinds(snap) == [
        ("garbage", "a"),
        ("garbage", "a"),
        ("garbage", "stats.completed"),
        ("garbage", "job"),
    ]


def test_cron_definitions_this_host_cannot_use_are_poison() -> None:
    # A definition naming a zone missing here, one from a newer version, and garbage.
    missing_zone = codec.pack(
        [1, "far", "* * * * *", {}, "Mars/Olympus_Mons", "", "skip", "allow", 5, 300_000]
    )
    newer = codec.pack([4, "new", "* * * * *", {}, "UTC", "", "skip", "allow", 5, 300_000, "x"])
    snap = snapshot(
        cron={"far": missing_zone, "new": newer, "junk": b"\xc1", "fine": job_blob("fine")},
    )
    assert kinds(snap) == [("poison cron", "far"), ("poison cron", "junk"), ("poison cron", "new")]
    reasons = {v.subject: v.detail for v in check_invariants(snap)}
    assert "tz database" in reasons["far"]
    assert "newer duetime" in reasons["new"]
