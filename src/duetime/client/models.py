"""The public records of the client API: what a caller hands in (``Job``, the per-task
options) and what it gets back (a task's status, a queue's figures, listings, dead tasks,
cron jobs and their runs). Plain frozen data; nothing here talks to Redis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypedDict

from duetime.keyed import Debounce, KeyedState, Throttle, Unique
from duetime.states import HistoryOutcome, TaskState

Timestamp = int | float | datetime
#: A duration: seconds, or a ``timedelta``.
Duration = int | float | timedelta
TaskRef = str | Any  # a task name, or a handler registered with duetime.App
TaskIds = str | Sequence[str] | None  # one id, several, or None for every one


class TaskOptions(TypedDict, total=False):
    """Per-task options of the schedule_* calls (all optional)."""

    task: TaskRef | None  # a registered handler or its name; default: the default handler
    id: str | None  # your own id: scheduling the same live id again changes nothing
    max_attempts: int | None  # default: Settings.max_attempts
    timeout: Duration | None  # how long one attempt may run; default: Settings.task_timeout
    result_ttl: Duration | None  # keep the outcome this long for result(); default: none
    expires: Duration | None  # not started this long after its run-at: dropped, not run
    priority: int  # among due tasks, ranks as if due this many seconds earlier; default 0
    limit_key: str | None  # the tasks of one key share its limits and take turns with others
    cost: int  # what one start spends of the rate limits; default 1
    debounce: Debounce | None  # calls with its key collapse into one task (one mode at most)
    throttle: Throttle | None  # the first call with its key runs, later ones in its window not
    unique: Unique | None  # at most one live task per key


class KeyedCallOptions(TaskOptions, total=False):
    """The options of ``Queue.schedule_keyed``: those of a schedule call, and when (at most
    one of them; neither is now)."""

    at: Timestamp | None  # epoch seconds or an aware datetime
    delay: Duration | None  # seconds (or a timedelta) from now, by the server's clock


#: The option names TaskOptions allows.
TASK_OPTIONS = frozenset(TaskOptions.__annotations__)


class HandleOptions(TypedDict, total=False):
    """The per-task options of a handle's schedule calls (``Queue.task``): those of
    ``TaskOptions`` but ``task``, which the handle gives."""

    id: str | None
    max_attempts: int | None
    timeout: Duration | None
    result_ttl: Duration | None
    expires: Duration | None
    priority: int
    limit_key: str | None
    cost: int
    debounce: Debounce | None
    throttle: Throttle | None
    unique: Unique | None


@dataclass(frozen=True, slots=True)
class Job:
    """One task for ``schedule_many``: give ``at`` (epoch seconds or aware datetime)
    or ``delay`` (seconds from now), not both."""

    data: Any
    at: Timestamp | None = None
    delay: Duration | None = None
    task: TaskRef | None = None
    id: str | None = None
    max_attempts: int | None = None
    timeout: Duration | None = None
    result_ttl: Duration | None = None
    expires: Duration | None = None
    priority: int = 0
    limit_key: str | None = None
    cost: int = 1
    debounce: Debounce | None = None
    throttle: Throttle | None = None
    unique: Unique | None = None


@dataclass(frozen=True, slots=True)
class TaskStatus:
    """What is known of one task. A finished task is known only while its result is
    kept (``result_ttl``); then ``attempts`` is the attempt that finished."""

    id: str
    state: TaskState  # scheduled | ready | running | dead | finished
    #: Epoch seconds: when it is next due while scheduled (a retry: after its back-off),
    #: else when it was due (a run-at already past when scheduled: that moment); None once
    #: finished.
    run_at: float | None
    died_at: float | None
    #: Attempts started (finished: the attempt that finished, an expired task's that
    #: started before it expired; 0 if unknown).
    attempts: int
    task: str | None
    data: Any
    last_error: str | None
    last_traceback: str | None
    result: Any
    succeeded: bool | None  # for a finished task (or a dead one that kept its outcome)
    finished_at: float | None = None  # epoch seconds, when the result was stored
    problem: str | None = None  # a record of this task in Redis that duetime cannot read
    priority: int = 0
    limit_key: str | None = None
    cost: int = 1
    #: Why a due task under flow control has not started (its key's or the queue's
    #: limit, with until when), or None.
    waiting_for: str | None = None
    #: The debounce, throttle or unique key whose current task this is, and what it
    #: holds (calls collapsed, deadline), or None.
    keyed: KeyedState | None = None
    #: For a running task whose cancel was asked: when (epoch seconds). Its worker stops
    #: it, and the end of its attempt ends it as cancelled.
    cancel_asked_at: float | None = None
    #: How many times a handler snoozed the task (``Snooze``); its limit is
    #: ``Settings.max_snoozes`` or its handler's ``max_snoozes``.
    snoozes: int = 0


@dataclass(frozen=True, slots=True)
class GoneWorker:
    """A worker a dispatcher took for dead (silent past ``worker_ttl``) and reaped, as the
    queue's record of its last 50 reaped workers keeps it. Times are epoch seconds by the
    server clock: ``last_heartbeat`` (None: it was not registered, only its list was
    left), ``reaped_at``; ``taken_back`` tasks were re-entered, ``task_ids`` the first 20
    of them (per shard)."""

    id: str
    last_heartbeat: float | None
    reaped_at: float
    taken_back: int
    task_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class QueueStats:
    queue: str
    scheduled: int
    ready: int
    running: int
    dead: int
    workers: dict[str, float]  # worker id -> seconds since its last heartbeat
    next_due: float | None  # epoch seconds of the earliest scheduled task
    counters: dict[str, int] = field(default_factory=dict)
    shards: list[QueueStats] = field(default_factory=list)  # each shard's, when sharded
    paused: bool = False  # workers claim nothing (see Queue.pause)
    #: Seconds the oldest due task has waited to be promoted (0: none is due), and the
    #: oldest ready task to be claimed since its run-at (0: none is ready): the lag a
    #: delayed-task system adds, before a handler starts.
    oldest_due_age: float = 0.0
    oldest_ready_age: float = 0.0
    #: Under flow control (see Queue.set_limits): whether the queue is, how many of its
    #: ready tasks wait for their turn or a limit, and how many limit keys (or the queue
    #: itself) wait for a rate limit.
    flow_control: bool = False
    waiting: int = 0
    throttled: int = 0
    #: The workers reaped last (at most 50 a shard), newest first: what their absence
    #: from ``workers`` means (see ``GoneWorker``).
    gone_workers: list[GoneWorker] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TaskSummary:
    """A task as ``Queue.tasks`` lists it. Times are epoch seconds by the server clock:
    ``run_at`` from its envelope (the first attempt's), ``due_at`` while scheduled (when
    it is next due: a retry's is after its back-off), ``lease_deadline`` while running,
    ``died_at`` when dead; ``error`` is the last failure (of a task being retried, or
    dead)."""

    id: str
    state: TaskState
    task: str | None
    data: Any
    run_at: float | None
    attempts: int
    worker: str | None = None
    lease_deadline: float | None = None
    died_at: float | None = None
    error: str | None = None
    problem: str | None = None  # a record of this task that duetime cannot read
    due_at: float | None = None


@dataclass(frozen=True, slots=True)
class MinuteFigures:
    """What a queue did in one minute (server clock): attempts completed, retried and
    gone dead, how late the completed ones started (seconds; None if none did), and how
    long flow control's limits held them before (seconds; 0 when none was held; see
    metrics.md, what lateness measures)."""

    start: float  # epoch seconds
    completed: int
    retried: int
    dead: int
    lateness_mean: float | None
    lateness_max: float | None
    held_mean: float | None = None
    held_max: float | None = None


#: The states Queue.tasks lists.
LISTED_STATES = (TaskState.SCHEDULED, TaskState.READY, TaskState.RUNNING, TaskState.DEAD)


@dataclass(frozen=True, slots=True)
class DeadTask:
    id: str
    died_at: float
    task: str | None
    data: Any
    error: str
    traceback: str
    attempts: int


@dataclass(frozen=True, slots=True)
class FinishedAttempt:
    """An attempt that ended (or a cancel), as the queue's history keeps it. Times are
    epoch seconds by the server clock; ``duration`` and ``lateness`` (seconds the
    handler ran, and how long after the task was due it started) are None where the
    handler did not run or the ending was not the worker's (lost, cancelled)."""

    task_id: str
    task: str | None  # the handler's name ("" the default one); None: not readable
    outcome: HistoryOutcome
    attempt: int  # the attempt that ended (cancelled: the attempts started, maybe 0)
    finished_at: float
    worker: str | None = None
    duration: float | None = None
    lateness: float | None = None
    error: str | None = None  # the first line of the error (retried, dead)
    #: How many endings the entry stands for: a task that snoozes again, with nothing
    #: else of it ending between, takes one entry, and ``count`` says how many snoozes;
    #: ``last_at`` is when the latest was (None when ``count`` is 1). The entry keeps
    #: the first snooze's place, time, attempt, worker and duration.
    count: int = 1
    last_at: float | None = None


@dataclass(frozen=True, slots=True)
class CronRun:
    """The latest fired tick of a cron job."""

    tick: float  # epoch seconds the tick was due
    task_id: str
    state: TaskState  # unknown: finished without a result kept, or its result expired
    started: float | None  # when its last attempt started, if known
    lateness_ms: float | None  # started - when it was due (None for a backfill's run)
    succeeded: bool | None
    error: str | None
    #: A backfill fired it: its run was due when it fired, so it is not late.
    backfilled: bool = False


@dataclass(frozen=True, slots=True)
class CronBackfillInfo:
    """A cron job's backfill: the past range whose ticks it runs, its pace, its progress."""

    start: float  # epoch seconds of the range's first tick and last tick
    end: float
    rate: float  # ticks started per second, at most
    ticks: int  # ticks in the range
    fired: int  # ticks it enqueued so far
    done: bool
    #: Ticks of the range it does not run again: an earlier backfill of the job handled
    #: them, or their task was live (queued, running, retried or dead) when it came by.
    already_ran: int = 0
    skipped: int = 0  # ticks skipped under overlap="skip" (their previous run was live)
    #: From ``backfill_cron``: the unfinished backfill of another range this one replaced,
    #: as it stood (its ticks not reached are not run, unless this range holds them).
    replaced: CronBackfillInfo | None = None

    @property
    def to_run(self) -> int:
        """Ticks of the range it has still to reach (0 once done)."""
        return 0 if self.done else self.ticks - self.fired - self.already_ran - self.skipped


@dataclass(frozen=True, slots=True)
class CronInfo:
    name: str
    expression: str
    timezone: str
    task: str
    data: Any
    missed: str
    overlap: str
    paused: bool
    next_runs: list[float]  # epoch seconds of the next few ticks (none while paused)
    last_run: CronRun | None
    problem: str | None = None  # the stored definition cannot be used here (poison)
    priority: int = 0  # its ticks' flow control (docs/flow.md)
    limit_key: str | None = None
    cost: int = 1
    #: The schedule's options (docs/cron.md), in seconds (epoch seconds for start and
    #: end); None where not set. ``expression`` is "" for an interval schedule.
    every: float | None = None
    catch_up: float | None = None
    jitter: float | None = None
    start: float | None = None
    end: float | None = None
    max_runs: int | None = None
    pause_after_failures: int | None = None
    runs: int | None = None  # ticks fired so far (kept with max_runs or pause_after_failures)
    failures: int | None = None  # runs that failed in a row (with pause_after_failures)
    ended: bool = False  # its end passed, its runs are done, or it fires no more
    backfill: CronBackfillInfo | None = None  # its latest backfill, running or done
