"""The invariant checker, fed hand-made snapshots (state before -> violations after)."""

from __future__ import annotations

from duetime.checker import check_invariants
from duetime.store.operations import Snapshot


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
        attempts={"c", "d"},
        errors={"d"},
        dead=["d"],
        early={"b", "c"},  # promoted ahead: in ready, or taken by BLMOVE before the claim
    )
    assert kinds(snap) == []


def test_early_run_at_of_a_task_no_longer_waiting_is_a_leak() -> None:
    snap = snapshot(tasks={"a"}, scheduled=["a"], early={"a", "gone"})
    assert kinds(snap) == [("leak", "a"), ("leak", "gone")]


def test_task_in_two_places_is_duplicated() -> None:
    assert kinds(snapshot(tasks={"a"}, scheduled=["a"], ready=["a"])) == [("duplicated", "a")]


def test_envelope_in_no_place_is_lost() -> None:
    assert kinds(snapshot(tasks={"a"})) == [("lost", "a")]


def test_id_without_envelope_is_an_orphan() -> None:
    assert kinds(snapshot(ready=["x"])) == [("orphan id", "x")]


def test_leftover_per_task_entries_are_leaks() -> None:
    found = kinds(snapshot(attempts={"gone"}, errors={"gone"}))
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
    snap = snapshot(cron={"kept"}, cron_entries={"cron_next": {"kept", "gone"}, "cron_held": set()})
    assert kinds(snap) == [("leak", "gone")]
