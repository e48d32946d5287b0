"""The named states and outcomes that cross the Redis layer: where a task is, and what
a script reports. They are ``StrEnum`` members, so they compare equal to the strings the
Lua scripts return and print as those strings in JSON, while a typo in Python code is
an ``AttributeError`` at once rather than a comparison that is silently never true."""

from __future__ import annotations

from enum import StrEnum


class TaskState(StrEnum):
    """Where a task is."""

    SCHEDULED = "scheduled"  # waiting for its run-at (or a retry's back-off)
    READY = "ready"  # due, waiting for a worker
    RUNNING = "running"  # in a worker's processing list
    DEAD = "dead"  # out of attempts (or poison); kept for a person to look at
    FINISHED = "finished"  # gone; only its stored outcome is left, until its TTL
    UNKNOWN = "unknown"  # nothing is kept under this id


class HistoryOutcome(StrEnum):
    """How an attempt ended, as the queue's history records it."""

    SUCCEEDED = "succeeded"
    RETRIED = "retried"  # failed (raised or timed out); another attempt follows
    DEAD = "dead"  # failed with no attempt left, or could not run at all
    SNOOZED = "snoozed"  # the handler asked to run again later; the attempt was given back
    LOST = "lost"  # its lease ran out or its worker went silent; the task runs again
    CANCELLED = "cancelled"  # the task was cancelled: while it waited, was dead, or ran
    EXPIRED = "expired"  # it had not started ``expires`` after its run-at: dropped


class RescheduleOutcome(StrEnum):
    """What ``reschedule_task.lua`` did."""

    OK = "ok"
    CHANGED = "changed"  # the envelope changed since it was read: read again and retry
    RUNNING = "running"
    DEAD = "dead"


class CronFireOutcome(StrEnum):
    """What ``fire_cron.lua`` did when it did not enqueue ticks (then it returns a count)."""

    STALE = "stale"  # another dispatcher fired this tick, or the job changed
    SKIPPED = "skipped"  # overlap=skip: the previous run is still live
    DELAYED = "delayed"  # overlap=delay: the tick is held until the previous run ends
    PAUSED = "paused"  # pause_after_failures: its last runs failed, so it was paused


class KeyedOutcome(StrEnum):
    """What a debounce, throttle or unique call did (debounce_task.lua and its kin)."""

    CREATED = "created"  # a new task carries the call
    COLLAPSED = "collapsed"  # the call joined the key's waiting task (debounce, trailing run)
    DROPPED = "dropped"  # throttled: no task carries the call
    EXISTING = "existing"  # unique: the key's task is live; nothing was written


class WorkerState(StrEnum):
    """What a worker's heartbeat says of it (``worker_state``), or that it was reaped."""

    ALIVE = "alive"  # heard from within two heartbeat intervals
    LATE = "late"  # a heartbeat is overdue (a pause, a loaded host)
    SILENT = "silent"  # three are: stopped, frozen or cut off; taken for dead at worker_ttl
    GONE = "gone"  # taken for dead: reaped, its tasks taken back (QueueStats.gone_workers)


def worker_state(heartbeat_age: float, heartbeat_interval: float, worker_ttl: float) -> WorkerState:
    """The state of a registered worker whose last heartbeat is ``heartbeat_age`` seconds
    old. A worker heartbeats every ``heartbeat_interval``, and a dispatcher reaps it once
    it is ``worker_ttl`` old; the thresholds sit before that (2 and 3 intervals: 2 s and
    3 s at the defaults, with a TTL of 5 s), so a frozen worker is seen late, then silent,
    then gone."""
    silent_after = min(3 * heartbeat_interval, worker_ttl)
    if heartbeat_age > silent_after:
        return WorkerState.SILENT
    if heartbeat_age > min(2 * heartbeat_interval, silent_after):
        return WorkerState.LATE
    return WorkerState.ALIVE
