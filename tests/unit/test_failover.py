"""The Sentinel failover watcher's rules, fed answers and events by hand (the real
failover is in tests/integration/test_sentinel.py)."""

from __future__ import annotations

from typing import Any

import pytest

from duetime.store.redis.failover import FailoverWatcher, event_service

OLD, NEW = ("10.0.0.1", 6379), ("10.0.0.2", 6379)
LEADER, OTHER = ("127.0.0.1", 26379), ("127.0.0.1", 26380)


@pytest.fixture
def watcher() -> FailoverWatcher:
    watcher = FailoverWatcher([LEADER, OTHER], "svc", {}, hold=0.05)
    watcher._running = True  # no threads: the test plays the sentinels
    watcher._learn(OLD, 1, False, OTHER)
    return watcher


class Answers:
    """A stand-in for a sentinel connection that answers SENTINEL MASTER."""

    def __init__(self, address: tuple[str, int], epoch: int, flags: str = "master") -> None:
        self.state = {"ip": address[0], "port": address[1], "config-epoch": epoch, "flags": flags}

    def sentinel_master(self, service: str) -> dict[str, Any]:
        return self.state


def test_event_service_reads_each_event_shape() -> None:
    assert event_service("+switch-master", "svc 10.0.0.1 6379 10.0.0.2 6379") == "svc"
    slave = "slave 10.0.0.2:6379 10.0.0.2 6379 @ svc 10.0.0.1 6379"
    assert event_service("+failover-state-send-slaveof-noone", slave) == "svc"
    assert event_service("-failover-abort-slave-timeout", "master svc 10.0.0.1 6379") == "svc"
    assert event_service("+switch-master", "") == ""


def test_a_promotion_holds_sends_until_the_new_master_is_named(watcher: FailoverWatcher) -> None:
    slave = "slave 10.0.0.2:6379 10.0.0.2 6379 @ svc 10.0.0.1 6379"
    watcher._on_event("+failover-state-send-slaveof-noone", slave, LEADER, Answers(OLD, 1))
    assert watcher.holding
    with pytest.raises(Exception, match="has not named the new one"):
        watcher.before_send()
    # The leader, mid-failover, has raised the epoch but not yet the address: not learned.
    watcher._learn(OLD, 2, True, LEADER)
    assert watcher.holding and watcher.epoch == 0
    watcher._on_event("+switch-master", "svc 10.0.0.1 6379 10.0.0.2 6379", LEADER, Answers(NEW, 2))
    assert not watcher.holding
    assert watcher.epoch == 1 and watcher.master() == NEW
    watcher.before_send()  # no longer held


def test_a_lagging_sentinel_does_not_name_the_old_master_again(watcher: FailoverWatcher) -> None:
    watcher._learn(NEW, 2, False, LEADER)
    watcher._learn(OLD, 1, False, OTHER)  # has not heard of the failover yet
    assert watcher.master() == NEW and watcher.epoch == 1


def test_only_the_leader_ends_a_hold_it_started(watcher: FailoverWatcher) -> None:
    watcher._hold(LEADER)
    watcher._on_event(
        "-failover-abort-not-elected", "master svc 10.0.0.1 6379", OTHER, Answers(OLD, 1)
    )
    assert watcher.holding
    watcher._learn(OLD, 1, False, OTHER)  # another sentinel sees no failover: it never would
    assert watcher.holding
    watcher._on_event(
        "-failover-abort-slave-timeout", "master svc 10.0.0.1 6379", LEADER, Answers(OLD, 1)
    )
    assert not watcher.holding and watcher.master() == OLD and watcher.epoch == 0


def test_events_of_other_services_are_ignored(watcher: FailoverWatcher) -> None:
    slave = "slave 10.0.0.9:6379 10.0.0.9 6379 @ another 10.0.0.8 6379"
    watcher._on_event("+failover-state-send-slaveof-noone", slave, LEADER, Answers(OLD, 1))
    assert not watcher.holding
