"""The dispatcher's plans: promote due tasks (and stage delayed ones from their
buckets), wait to be woken, take back the work of expired leases and silent or vanished
workers, and trim the per-minute figures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from duetime import validation
from duetime.store.plans import scripts
from duetime.store.plans.base import QueuePlans, QueueState
from duetime.store.plans.keys import split_lease_member
from duetime.store.plans.replies import as_text, score_or_none, whole_score
from duetime.store.plans.requests import Command, Eval, Plan

#: The per-minute figures: a minute in ms, and how many minutes dispatchers keep.
MINUTE_MS = 60_000
MINUTES_KEPT = 61


@dataclass(frozen=True, slots=True)
class Promotion:
    moved: int
    now_ms: int
    next_due_ms: float | None
    next_lease_deadline_ms: int | None
    oldest_heartbeat_ms: int | None
    next_cron_tick_ms: int | None
    next_reaped_look_ms: int | None = None  # when a reaped worker's list is looked at again
    staged: int = 0  # delayed tasks moved from their buckets into scheduled
    next_bucket_ms: float | None = None  # the earliest run-at left in a delayed bucket


class DispatcherPlans(QueuePlans):
    """The plans a dispatcher runs on its queue."""

    def __init__(self, state: QueueState) -> None:
        super().__init__(state)
        #: The earliest delayed buckets, with their earliest run-at, as the last promotion
        #: saw them: the next one passes the keys of those due.
        self._earliest_buckets: list[tuple[str, float]] = []

    def promote_due(self, limit: int, ahead_ms: int = 0, stage_ms: int = 0) -> Plan[Promotion]:
        """Move tasks due by now + ``ahead_ms`` to ready (those not yet due are waited
        for by the worker that claims them), and stage delayed tasks due by now +
        ``stage_ms`` from their buckets into scheduled; ``limit`` bounds both together."""
        now = yield from self.state.now()
        k = self.keys
        upto = now + ahead_ms
        stage_upto = max(upto, now + stage_ms)
        fixed = (
            k.scheduled,
            k.ready,
            k.leases,
            k.stats,
            k.workers,
            k.cron_next,
            k.early,
            k.reaped,
            k.delayed,
            k.delayed_layout,
            *k.flow_keys,
            k.wake,
            k.cron_backfill_due,
            k.flow_holds,
        )
        moved, staged, passed = 0, 0, set[str]()
        # A script touches only the keys it is given: the buckets passed are those the
        # last promotion named due by now. One that became due since (a task scheduled
        # earlier than any, or a dispatcher just started) is named in the reply, and
        # promoted by a second call at once.
        for call in range(2):
            due = [name for name, earliest in self._earliest_buckets if earliest <= stage_upto]
            if call and (moved + staged >= limit or set(due) <= passed):
                break
            passed.update(due)
            reply = yield Eval(
                scripts.PROMOTE_DUE,
                (*fixed, *(k.delayed_bucket(name) for name in due)),
                (now, upto, limit - moved - staged, stage_upto),
            )
            count, next_due, next_lease, oldest_beat, next_tick, next_look, earliest = reply[:7]
            moved += int(count)
            staged += int(reply[7])
            self._earliest_buckets = [
                (as_text(earliest[i]), float(earliest[i + 1]) / 1000)
                for i in range(0, len(earliest), 2)
            ]
        # Positional: keywords would cost a hot path a third of a microsecond.
        return Promotion(
            moved,
            now,
            score_or_none(next_due),
            whole_score(next_lease),
            whole_score(oldest_beat),
            whole_score(next_tick),
            whole_score(next_look),
            staged,
            min((earliest for _, earliest in self._earliest_buckets), default=None),
        )

    def wait_wake(self, timeout: float) -> Plan[bool]:
        """Block until someone signals an earlier due time, up to ``timeout`` seconds."""
        reply = yield Command(("BLPOP", self.keys.wake, timeout), block=timeout)
        return reply is not None

    def trim_minutes(self, oldest_kept: int) -> Plan[int]:
        """Drop the per-minute figures of minutes before ``oldest_kept`` (and garbage)."""
        fields = yield Command(("HKEYS", self.keys.minutes))
        old = []
        for raw in fields:
            minute, _, _ = as_text(raw).partition(":")
            if not validation.is_whole(minute) or int(minute) < oldest_kept:
                old.append(raw)
        if old:
            yield Command(("HDEL", self.keys.minutes, *old))
        return len(old)

    def reap_expired_leases(self, limit: int) -> Plan[int]:
        """Re-enter tasks whose lease ran out. Reads the expired leases, then moves them
        in one script that checks each deadline again."""
        now = yield from self.state.now()
        k = self.keys
        members = yield Command(("ZRANGE", k.leases, "-inf", now, "BYSCORE", "LIMIT", 0, limit))
        if not members:
            return 0
        active_keys: dict[str, int] = {}
        args: list[Any] = [now]
        for raw in members:
            member = as_text(raw)
            worker_id, _ = split_lease_member(member)
            index = active_keys.setdefault(k.active(worker_id), 21 + len(active_keys))
            args += (member, index)
        return int(
            (
                yield Eval(
                    scripts.REAP_EXPIRED_LEASES,
                    (
                        k.leases,
                        k.scheduled,
                        k.wake,
                        k.stats,
                        k.tasks,
                        k.early,
                        *k.flow_keys,
                        k.ready,
                        k.attempts,
                        *k.history_keys,
                        k.cancelling,
                        k.errors,
                        *active_keys,
                    ),
                    args,
                )
            )
        )

    def reap_worker(
        self, worker_id: str, stale_before_ms: int, look_again_in_ms: int | None = None
    ) -> Plan[int]:
        """Re-enter a silent (or unregistered) worker's tasks and forget it; -1 if it
        heartbeated after ``stale_before_ms``. With ``look_again_in_ms``, its list is
        looked at once more that much later (see ``look_at_reaped``)."""
        now = yield from self.state.now()
        k = self.keys
        look_at = -1 if look_again_in_ms is None else now + look_again_in_ms
        return int(
            (
                yield Eval(
                    scripts.REAP_WORKER,
                    (
                        k.workers,
                        k.active(worker_id),
                        k.leases,
                        k.scheduled,
                        k.wake,
                        k.stats,
                        k.reaped,
                        k.tasks,
                        k.early,
                        *k.flow_keys,
                        k.ready,
                        k.attempts,
                        *k.history_keys,
                        k.cancelling,
                        k.errors,
                        k.gone_workers,
                    ),
                    (now, worker_id, stale_before_ms, look_at),
                )
            )
        )

    def reap_dead_workers(self, worker_ttl_ms: int, look_again_in_ms: int) -> Plan[int]:
        """Re-enter the tasks of every worker silent for longer than ``worker_ttl_ms``.
        A reaped worker may have left a BLMOVE pending on the server (it was paused, not
        dead); its list is looked at again ``look_again_in_ms`` later, once that block
        has surely ended."""
        now = yield from self.state.now()
        stale_before = now - worker_ttl_ms
        stale = yield Command(("ZRANGE", self.keys.workers, "-inf", stale_before, "BYSCORE"))
        total = 0
        for raw in stale:
            reaped = yield from self.reap_worker(as_text(raw), stale_before, look_again_in_ms)
            total += max(0, reaped)
        return total

    def look_at_reaped(self, worker_ttl_ms: int) -> Plan[int]:
        """Look once more at the lists of workers reaped a block's length ago: an id that
        a pending BLMOVE moved there after the reap is re-entered now. A worker that came
        back meanwhile (heartbeated within ``worker_ttl_ms``) keeps its list."""
        now = yield from self.state.now()
        due = yield Command(("ZRANGE", self.keys.reaped, "-inf", now, "BYSCORE", "LIMIT", 0, 100))
        total = 0
        for raw in due:
            total += max(0, (yield from self.reap_worker(as_text(raw), now - worker_ttl_ms)))
        return total

    def sweep_orphan_lists(self) -> Plan[int]:
        """Reap processing lists whose worker is not registered (a worker that was
        reaped, came back for a moment and died again)."""
        k = self.keys
        orphans: list[str] = []
        cursor: Any = 0
        while True:
            cursor, found = yield Command(
                ("SCAN", cursor, "MATCH", k.active_pattern, "COUNT", 1000), route=k.tasks
            )
            for raw in found:
                worker_id = k.worker_of_active(as_text(raw))
                orphans.append(worker_id)
            if int(cursor) == 0:
                break
        total = 0
        for worker_id in orphans:
            registered = yield Command(("ZSCORE", k.workers, worker_id))
            if registered is None:
                total += max(0, (yield from self.reap_worker(worker_id, 0)))
        return total
