"""The dispatcher's plans (store/plans/dispatching.py), without a server: a promotion's
reply read (scores of none as None, delayed buckets in µs), a second call at once for a
bucket the first named due, the buckets a later promotion passes; the minutes trimmed;
expired leases and silent workers taken back, each lease pointed at its worker's list."""

from __future__ import annotations

from typing import Any

from duetime.clock import ManualClock
from duetime.store.plans import scripts
from duetime.store.plans.dispatching import DispatcherPlans, Promotion
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.requests import Command, Eval, Request
from tests.unit.plans.scripted import NOW_MS, run_plan


def promote(
    keys: QueueKeys, buckets: list[str], now: int, upto: int, limit: int, stage_upto: int
) -> Any:
    """A promote_due call naming ``buckets`` (their delayed bucket keys, last)."""

    def check(request: Request) -> None:
        assert isinstance(request, Eval) and request.script == scripts.PROMOTE_DUE
        named = [key for key in request.keys if key.startswith(keys.delayed_bucket(""))]
        assert named == [keys.delayed_bucket(name) for name in buckets]
        if buckets:  # last among the keys
            assert list(request.keys[-len(buckets) :]) == named
        assert list(request.args) == [now, upto, limit, stage_upto]

    return check


def reply(
    moved: int, staged: int = 0, earliest: tuple[bytes, ...] = (), **scores: bytes
) -> list[Any]:
    """promote_due.lua's reply: moved, the next due, lease deadline, oldest heartbeat, cron
    tick and reaped look (-1: none), the earliest buckets (name, µs), staged."""
    order = ("due", "lease", "beat", "tick", "look")
    return [moved, *(scores.get(name, b"-1") for name in order), list(earliest), staged]


def test_a_promotion_reads_each_time_and_none_as_none(
    dispatcher: DispatcherPlans, keys: QueueKeys
) -> None:
    found = run_plan(
        dispatcher.promote_due(100, ahead_ms=20, stage_ms=500),
        (promote(keys, [], NOW_MS, NOW_MS + 20, 100, NOW_MS + 500),
         reply(7, due=b"1800000000900.25", lease=b"1800000005000", tick=b"1800000060000")),
    )  # fmt: skip
    assert found == Promotion(
        moved=7,
        now_ms=NOW_MS,
        next_due_ms=1800000000900.25,
        next_lease_deadline_ms=1800000005000,
        oldest_heartbeat_ms=None,
        next_cron_tick_ms=1800000060000,
        next_reaped_look_ms=None,
        staged=0,
        next_bucket_ms=None,
    )


def test_a_bucket_named_due_is_promoted_by_a_second_call_at_once(
    dispatcher: DispatcherPlans, keys: QueueKeys
) -> None:
    due_us = str(NOW_MS * 1000 - 5).encode()
    later_us = str((NOW_MS + 60_000) * 1000).encode()
    found = run_plan(
        dispatcher.promote_due(100),
        (promote(keys, [], NOW_MS, NOW_MS, 100, NOW_MS), reply(3, 1, (b"0:1", due_us))),
        # The rest of the limit, with the bucket's key given.
        (promote(keys, ["0:1"], NOW_MS, NOW_MS, 96, NOW_MS),
         reply(2, 4, (b"0:2", later_us))),
    )  # fmt: skip
    assert (found.moved, found.staged) == (5, 5)
    assert found.next_bucket_ms == NOW_MS + 60_000  # µs in the reply, ms here


def test_no_second_call_once_the_limit_is_spent(
    dispatcher: DispatcherPlans, keys: QueueKeys
) -> None:
    due_us = str(NOW_MS * 1000).encode()
    found = run_plan(
        dispatcher.promote_due(10),
        (promote(keys, [], NOW_MS, NOW_MS, 10, NOW_MS), reply(6, 4, (b"0:1", due_us))),
    )
    assert found.moved + found.staged == 10 and found.next_bucket_ms == NOW_MS


def test_a_later_promotion_passes_the_buckets_come_due_since(
    dispatcher: DispatcherPlans, keys: QueueKeys, clock: ManualClock
) -> None:
    soon_us = str((NOW_MS + 1000) * 1000).encode()
    found = run_plan(
        dispatcher.promote_due(100),
        (promote(keys, [], NOW_MS, NOW_MS, 100, NOW_MS), reply(0, 0, (b"3:5", soon_us))),
    )
    assert found.next_bucket_ms == NOW_MS + 1000  # not due yet: no second call
    clock.set(NOW_MS + 1000)
    later = NOW_MS + 1000
    run_plan(
        dispatcher.promote_due(100),
        (promote(keys, ["3:5"], later, later, 100, later), reply(0, 1)),
    )


def test_old_minutes_and_garbage_are_trimmed(dispatcher: DispatcherPlans, keys: QueueKeys) -> None:
    fields = [b"100:completed", b"99:completed", b"junk", b"101:failed", b"-5:x"]
    trimmed = run_plan(
        dispatcher.trim_minutes(100),
        (Command(("HKEYS", keys.minutes)), fields),
        (Command(("HDEL", keys.minutes, b"99:completed", b"junk", b"-5:x")), 3),
    )
    assert trimmed == 3
    kept = run_plan(
        dispatcher.trim_minutes(100), (Command(("HKEYS", keys.minutes)), [b"100:completed"])
    )
    assert kept == 0  # and no HDEL


def test_wait_wake_blocks_with_its_timeout(dispatcher: DispatcherPlans, keys: QueueKeys) -> None:
    blpop = Command(("BLPOP", keys.wake, 2.5), block=2.5)
    assert run_plan(dispatcher.wait_wake(2.5), (blpop, None)) is False
    assert run_plan(dispatcher.wait_wake(2.5), (blpop, [keys.wake.encode(), b"1"])) is True


def test_expired_leases_are_taken_back_each_pointed_at_its_workers_list(
    dispatcher: DispatcherPlans, keys: QueueKeys
) -> None:
    expired = Command(("ZRANGE", keys.leases, "-inf", NOW_MS, "BYSCORE", "LIMIT", 0, 50))

    def reap(request: Request) -> None:
        assert isinstance(request, Eval) and request.script == scripts.REAP_EXPIRED_LEASES
        now, *pairs = request.args
        assert now == NOW_MS
        members, indexes = pairs[::2], pairs[1::2]
        assert members == ["w1|a", "w2|b", "w1|c"]
        # Each index names (from 1) its worker's processing list among the keys.
        assert [request.keys[i - 1] for i in indexes] == [
            keys.active("w1"), keys.active("w2"), keys.active("w1")
        ]  # fmt: skip
        assert len(set(request.keys)) == len(request.keys)

    taken = run_plan(
        dispatcher.reap_expired_leases(50),
        (expired, [b"w1|a", b"w2|b", b"w1|c"]),
        (reap, 3),
    )
    assert taken == 3
    assert run_plan(dispatcher.reap_expired_leases(50), (expired, [])) == 0


def reap_worker(keys: QueueKeys, worker: str, stale_before: int, look_at: int) -> Any:
    def check(request: Request) -> None:
        assert isinstance(request, Eval) and request.script == scripts.REAP_WORKER
        assert keys.active(worker) in request.keys
        assert list(request.args) == [NOW_MS, worker, stale_before, look_at]

    return check


def test_silent_workers_are_reaped_and_a_refused_reap_counts_nothing(
    dispatcher: DispatcherPlans, keys: QueueKeys
) -> None:
    stale_before = NOW_MS - 2000
    total = run_plan(
        dispatcher.reap_dead_workers(2000, look_again_in_ms=1500),
        (Command(("ZRANGE", keys.workers, "-inf", stale_before, "BYSCORE")), [b"w1", b"w2"]),
        (reap_worker(keys, "w1", stale_before, NOW_MS + 1500), 4),
        (reap_worker(keys, "w2", stale_before, NOW_MS + 1500), -1),  # it heartbeated since
    )
    assert total == 4


def test_a_reaped_workers_list_is_looked_at_again_once(
    dispatcher: DispatcherPlans, keys: QueueKeys
) -> None:
    due = Command(("ZRANGE", keys.reaped, "-inf", NOW_MS, "BYSCORE", "LIMIT", 0, 100))
    total = run_plan(
        dispatcher.look_at_reaped(2000),
        (due, [b"w1"]),
        (reap_worker(keys, "w1", NOW_MS - 2000, -1), 1),  # not to be looked at again
    )
    assert total == 1


def test_lists_of_unregistered_workers_are_reaped(
    dispatcher: DispatcherPlans, keys: QueueKeys
) -> None:
    def scan(cursor: Any) -> Command:
        return Command(
            ("SCAN", cursor, "MATCH", keys.active_pattern, "COUNT", 1000), route=keys.tasks
        )

    total = run_plan(
        dispatcher.sweep_orphan_lists(),
        (scan(0), [b"3", [keys.active("w1").encode()]]),
        (scan(b"3"), [b"0", [keys.active("w2").encode()]]),
        (Command(("ZSCORE", keys.workers, "w1")), b"1800000000000"),  # registered: kept
        (Command(("ZSCORE", keys.workers, "w2")), None),
        (reap_worker(keys, "w2", 0, -1), 2),
    )
    assert total == 2
