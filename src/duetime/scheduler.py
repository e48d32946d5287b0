"""The client API: schedule, cancel, reschedule, inspect and wait for tasks.

``QueueCore`` validates input and builds plans; ``Queue`` runs them on a
synchronous Redis client and ``AsyncQueue`` on an asyncio one, so both behave the
same by construction. Every input is checked before anything is written.
"""

from __future__ import annotations

import base64
import contextlib
import os
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Self, TypedDict, TypeVar, Unpack

from duetime import codec, cron, validation
from duetime.checker import Violation, check_invariants
from duetime.clock import Clock
from duetime.coalescing import TaskCoalescer, ThreadCoalescer
from duetime.codec import Envelope, ResultRecord
from duetime.errors import (
    CorruptStateError,
    DecodeError,
    DuetimeError,
    InvalidInputError,
    NotDurableError,
    ResultTimeoutError,
    TaskFailedError,
    TaskNotFoundError,
    TaskStateError,
)
from duetime.hooks import HookChain, Hooks, ScheduledTask
from duetime.settings import DEFAULT_SETTINGS, Settings
from duetime.states import RescheduleOutcome, TaskState
from duetime.store import AsyncRunner, SyncRunner
from duetime.store.cron_jobs import CronTable
from duetime.store.dispatching import MINUTE_MS, MINUTES_KEPT
from duetime.store.keys import QueueLayout
from duetime.store.operating import Listed
from duetime.store.operations import (
    QueueOperations,
    RegisteredQueue,
    registered_queues,
    shard_operations,
)
from duetime.store.producing import NewTask, StatusReply, store_tasks
from duetime.store.requests import Durability, Plan
from duetime.store.runner import RedisSpec

T = TypeVar("T")
Timestamp = int | float | datetime
TaskRef = str | Any  # a task name, or a handler registered with duetime.App
TaskIds = str | Sequence[str] | None  # one id, several, or None for every one


class TaskOptions(TypedDict, total=False):
    """Per-task options of the schedule_* calls (all optional)."""

    task: TaskRef | None  # a registered handler or its name; default: the default handler
    id: str | None  # your own id: scheduling the same live id again changes nothing
    max_attempts: int | None  # default: Settings.max_attempts
    timeout: float | None  # seconds one attempt may run; default: Settings.task_timeout
    result_ttl: float | None  # keep the outcome this long for result(); default: none


_TASK_OPTIONS = frozenset(TaskOptions.__annotations__)


@dataclass(frozen=True, slots=True)
class Job:
    """One task for ``schedule_many``: give ``at`` (epoch seconds or aware datetime)
    or ``delay`` (seconds from now), not both."""

    data: Any
    at: Timestamp | None = None
    delay: float | None = None
    task: TaskRef | None = None
    id: str | None = None
    max_attempts: int | None = None
    timeout: float | None = None
    result_ttl: float | None = None


@dataclass(frozen=True, slots=True)
class TaskStatus:
    """What is known of one task. A finished task is known only while its result is
    kept (``result_ttl``); then ``attempts`` is the attempt that finished."""

    id: str
    state: TaskState  # scheduled | ready | running | dead | finished
    run_at: float | None  # epoch seconds, while scheduled
    died_at: float | None
    attempts: int  # attempts started (finished: the attempt that finished; 0 if unknown)
    task: str | None
    data: Any
    last_error: str | None
    last_traceback: str | None
    result: Any
    succeeded: bool | None  # for a finished task (or a dead one that kept its outcome)
    finished_at: float | None = None  # epoch seconds, when the result was stored
    problem: str | None = None  # a record of this task in Redis that duetime cannot read


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
    gone dead, and how late the completed ones started (seconds; None if none did)."""

    start: float  # epoch seconds
    completed: int
    retried: int
    dead: int
    lateness_mean: float | None
    lateness_max: float | None


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
class CronRun:
    """The latest fired tick of a cron job."""

    tick: float  # epoch seconds the tick was due
    task_id: str
    state: TaskState  # unknown: finished without a result kept, or its result expired
    started: float | None  # when its last attempt started, if known
    lateness_ms: float | None  # started - tick
    succeeded: bool | None
    error: str | None


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


#: One task checked and ready to write: (id, run-at in whole µs or None, delay in ms,
#: task name, packed data, max_attempts, timeout_ms, result_ttl_ms, whether duetime made
#: the id, so it may be replaced if it collides). A plain tuple, not an object: the
#: garbage collector stops tracking a tuple of plain values, where the 200,000 objects
#: of a large schedule_many made its full collections walk them again and again (0.6 µs
#: a task, a tenth of the call).
_Prepared = tuple[str, int | None, int, str, bytes, int, int, int, bool]
#: Positions in a _Prepared.
_ID: Final = 0
_AT_US: Final = 1
_DELAY_MS: Final = 2
_TASK: Final = 3
_GENERATED: Final = 8


def _run_at_us(item: _Prepared, now_ms: int) -> int:
    """When a prepared task runs, in whole µs, given its server's clock. A run-at in the
    past is stored as now: the task is due from the moment it is scheduled, and its
    lateness counts from there (a task dated 2020 is not years late), for free: no note
    beside it, no other command."""
    at_us = item[_AT_US]
    now_us = now_ms * 1000
    return now_us + item[_DELAY_MS] * 1000 if at_us is None else max(at_us, now_us)


def _envelope(item: _Prepared, run_at_ms: float) -> bytes:
    _, _, _, task, packed_data, max_attempts, timeout_ms, result_ttl_ms, _ = item
    return codec.envelope_from_packed_data(
        task, packed_data, run_at_ms, max_attempts, timeout_ms, result_ttl_ms
    )


#: Random bytes per generated id; 9 bytes encode to exactly 12 base64 characters.
_ID_BYTES = 9
_ID_LENGTH = 12
#: Rounds of fresh ids for generated ids that collided with live ones. One collision of
#: 72 random bits is already rare; this many in a row means something else is wrong.
_MAX_ID_ROUNDS = 8


def new_task_ids(count: int) -> list[str]:
    """Random ids of 12 URL-safe characters (72 bits): short, since every id is stored
    twice. A collision with a live id is detected and retried by ``schedule_plan``, so
    the ids only need to make collisions rare, not impossible. Made in bulk."""
    # "." and "_" for the two symbols: an id never starts with "-", which a command line
    # would take for an option.
    text = base64.b64encode(os.urandom(_ID_BYTES * count), altchars=b"._").decode()
    return [text[i : i + _ID_LENGTH] for i in range(0, _ID_LENGTH * count, _ID_LENGTH)]


#: Ids made ahead for single schedule calls: one urandom call per 256 ids instead of
#: one per call. deque.popleft is atomic, so threads share it safely; a forked child
#: empties it, or parent and child would hand out the same ids (caught as collisions,
#: but each costs a round trip).
_ID_POOL_SIZE = 256
_id_pool: deque[str] = deque()
os.register_at_fork(after_in_child=lambda: _id_pool.clear())


def new_task_id() -> str:
    """One id, as ``new_task_ids(1)`` would make it (handed out in the order made)."""
    while True:
        try:
            return _id_pool.popleft()
        except IndexError:
            _id_pool.extend(new_task_ids(_ID_POOL_SIZE))


def _fresh_ids(count: int, taken: set[str]) -> list[str]:
    """``count`` new ids, none of them in ``taken`` or repeated."""
    fresh: list[str] = []
    while len(fresh) < count:
        for task_id in new_task_ids(count - len(fresh)):
            if task_id not in taken:
                taken.add(task_id)
                fresh.append(task_id)
    return fresh


def task_name_of(task: TaskRef | None) -> str:
    if task is None:
        return ""
    name = getattr(task, "duetime_name", task)
    return validation.task_name(name)


class QueueCore:
    """Validation and plans shared by ``Queue`` and ``AsyncQueue``."""

    def __init__(
        self,
        name: str,
        settings: Settings,
        clock: Clock | None,
        result_ttl: float | None,
        durable: bool | None = None,
        shards: int = 1,
        hooks: Iterable[Hooks] = (),
    ) -> None:
        self.name = validation.queue_name(name)
        self.hooks = HookChain(hooks)
        self.durability = Durability.wanted(settings, durable)
        self.settings = settings
        self.layout = QueueLayout(self.name, validation.shards(shards))
        self.shards = shard_operations(self.layout, clock, settings.clock_resync_interval)
        self.operations = self.shards[0]  # the queue itself, or its shard 0
        self.clock = self.operations.clock
        self.default_result_ttl_ms = (
            0 if result_ttl is None else validation.milliseconds(result_ttl, "result_ttl")
        )
        self.default_timeout_ms = round(settings.task_timeout * 1000)
        self._fsync_checked: set[int] = set()  # shards whose server can confirm fsyncs

    # --- validation ------------------------------------------------------------------

    def prepare(self, job: Job, generated_id: str | None = None) -> _Prepared:
        """Check one job completely; raises InvalidInputError before anything is written."""
        return self.prepare_fields(
            job.data, job.at, job.delay, job.task, job.id, job.max_attempts, job.timeout,
            job.result_ttl, generated_id,
        )  # fmt: skip

    def prepare_call(
        self, call: str, data: Any, at: Timestamp | None, delay: float | None,
        options: TaskOptions,
    ) -> _Prepared:  # fmt: skip
        """Check the arguments of one schedule_* call, as ``prepare`` checks a Job."""
        if options and not _TASK_OPTIONS.issuperset(options):
            unknown = sorted(options.keys() - _TASK_OPTIONS)[0]
            raise TypeError(f"{call}() got an unexpected keyword argument {unknown!r}")
        return self.prepare_fields(
            data, at, delay, options.get("task"), options.get("id"),
            options.get("max_attempts"), options.get("timeout"), options.get("result_ttl"),
        )  # fmt: skip

    def prepare_fields(
        self,
        data: Any,
        at: Timestamp | None,
        delay: float | None,
        task: TaskRef | None,
        task_id: str | None,
        max_attempts: int | None,
        timeout: float | None,
        result_ttl: float | None,
        generated_id: str | None = None,
    ) -> _Prepared:
        if (at is None) == (delay is None):
            raise InvalidInputError("give exactly one of a run-at time or a delay")
        at_us = None if at is None else validation.timestamp_us(at)
        delay_ms = 0
        if delay is not None and delay != 0:
            delay_ms = validation.milliseconds(delay, "delay")
        generated = task_id is None
        if task_id is not None:
            task_id = validation.task_id(task_id)
        else:
            task_id = generated_id or new_task_id()
        # Defaults come from validated settings; only given values need checking.
        if max_attempts is None:
            max_attempts = self.settings.max_attempts
        else:
            max_attempts = validation.attempts(max_attempts)
        timeout_ms = (
            self.default_timeout_ms
            if timeout is None
            else validation.milliseconds(timeout, "timeout")
        )
        result_ttl_ms = self.default_result_ttl_ms
        if result_ttl is not None:
            result_ttl_ms = validation.milliseconds(result_ttl, "result_ttl")
        packed_data = codec.pack(data)
        validation.payload(data, len(packed_data), self.settings.max_payload_bytes, packed_data)
        return (
            task_id, at_us, delay_ms, "" if task is None else task_name_of(task), packed_data,
            max_attempts, timeout_ms, result_ttl_ms, generated,
        )  # fmt: skip

    def prepare_all(self, jobs: Iterable[Job | tuple[Timestamp, Any]]) -> list[_Prepared]:
        """Check every job of a schedule_many before anything is written. An (at, data)
        pair, the usual bulk item, is checked here in line, with one Packer for all (a
        third of the time it takes through ``prepare_fields``, which a Job and a pair of
        any other shape go through, with the same checks)."""
        prepared: list[_Prepared] = []
        jobs = list(jobs)
        generated = new_task_ids(len(jobs))
        pack = codec.new_packer()
        limit = self.settings.max_payload_bytes
        max_attempts, timeout_ms = self.settings.max_attempts, self.default_timeout_ms
        result_ttl_ms = self.default_result_ttl_ms
        ids_given = False
        for position, job in enumerate(jobs):
            try:
                if type(job) is tuple and len(job) == 2 and job[0] is not None:
                    at, data = job
                    at_us = validation.timestamp_us(at)
                    try:
                        packed_data = pack(data)
                    except codec.PACK_ERRORS as error:
                        raise codec.unpackable(error) from error
                    validation.payload(data, len(packed_data), limit, packed_data)
                    prepared.append((
                        generated[position], at_us, 0, "", packed_data, max_attempts,
                        timeout_ms, result_ttl_ms, True,
                    ))  # fmt: skip
                elif isinstance(job, Job):
                    prepared.append(self.prepare(job, generated[position]))
                    ids_given = ids_given or job.id is not None
                elif isinstance(job, tuple) and len(job) == 2:
                    at, data = job
                    prepared.append(self.prepare_fields(
                        data, at, None, None, None, None, None, None, generated[position]
                    ))  # fmt: skip
                else:
                    raise InvalidInputError("expected a Job or an (at, data) pair")
            except InvalidInputError as error:
                raise type(error)(f"item {position}: {error}") from None
        # Generated ids alone repeat with odds of 2**-72: looked at when some are given.
        ids = [item[_ID] for item in prepared] if ids_given else []
        if len(set(ids)) != len(ids):
            raise InvalidInputError("schedule_many got the same task id twice in one call")
        return prepared

    # --- plans -----------------------------------------------------------------------

    def schedule_plan(self, prepared: Sequence[_Prepared]) -> Plan[list[str]]:
        """Write prepared tasks: one script call per 1,000 per shard, all in one round
        trip. Returns the ids stored, in order. A given id that is already live changes
        nothing (idempotent). A generated id that is already live is either this very
        write, resent by redis-py after a dropped reply (the stored envelope is ours), or
        a collision with another task: then this task is written again under a fresh id."""
        ids = [item[_ID] for item in prepared]
        nows: dict[int, int] = {}  # shard -> its server's "now" for this call
        items: list[NewTask] = []
        for item in prepared:
            shard = self.layout.of_task(item[_ID])
            if shard not in nows:
                nows[shard] = yield from self.shards[shard].now()
            items.append((item[_ID], _run_at_us(item, nows[shard]), item))
        pending = list(range(len(items)))  # positions still to write
        for _ in range(_MAX_ID_ROUNDS):
            writing = items if len(pending) == len(items) else [items[i] for i in pending]
            try:
                refused = yield from self._store(writing, nows)
            except NotDurableError as error:  # say which tasks: they are on the master
                raise NotDurableError(
                    error.confirmed, error.wanted, error.shortfall, error.reply,
                    tuple(ids[i] for i in pending),
                ) from None  # fmt: skip
            generated = [pending[i] for i in refused if prepared[pending[i]][_GENERATED]]
            pending = yield from self._collided(generated, items)
            if not pending:
                if self.hooks:
                    self.hooks.on_schedule(self.name, [
                        ScheduledTask(task_id, item[_TASK], stored[1] / 1_000_000)
                        for task_id, item, stored in zip(ids, prepared, items, strict=True)
                    ])  # fmt: skip
                return ids
            # A fresh id must not repeat one of this call, or it could take a given id's place.
            fresh = _fresh_ids(len(pending), set(ids))
            for position, task_id in zip(pending, fresh, strict=True):
                ids[position] = task_id
                items[position] = (task_id, *items[position][1:])
        raise DuetimeError(
            f"{len(pending)} generated task id(s) collided with live ids "
            f"{_MAX_ID_ROUNDS} times in a row; the random source looks broken"
        )

    def _store(self, items: Sequence[NewTask], nows: dict[int, int]) -> Plan[list[int]]:
        """Store items, each in its shard, in one round trip; the positions of those not
        created (their id was live), in order."""
        by_shard = self.layout.by_shard([task_id for task_id, _, _ in items])
        calls = []
        placed: list[tuple[list[int], list[int]]] = []  # per shard: positions, order written
        for shard, positions in by_shard.items():
            if shard not in nows:  # a fresh id may land in a shard not yet asked
                nows[shard] = yield from self.shards[shard].now()
            operations = self.shards[shard]
            if self.durability and self.durability.fsync and shard not in self._fsync_checked:
                yield from operations.check_fsync()  # before writing, not after
                self._fsync_checked.add(shard)
            yield from operations.learn_generation()
            shard_calls, written = operations.schedule_calls(
                nows[shard],
                items if len(positions) == len(items) else [items[p] for p in positions],
                _envelope,
            )
            calls.append((operations, shard_calls))
            placed.append((positions, written))
        refused_by_shard = yield from store_tasks(calls, self.durability)
        refused = [
            positions[written[i]]
            for (positions, written), shard_refused in zip(placed, refused_by_shard, strict=True)
            for i in shard_refused
        ]
        return sorted(refused)

    def _collided(self, positions: list[int], items: Sequence[NewTask]) -> Plan[list[int]]:
        """The positions whose id is live with an envelope other than the one written.
        An envelope gone meanwhile counts as a collision: writing the task again can at
        worst run it twice (at-least-once allows that), never lose it. One read per shard."""
        by_shard = self.layout.by_shard([items[p][0] for p in positions])
        collided = []
        for shard, indexes in by_shard.items():
            group = [positions[i] for i in indexes]
            stored = yield from self.shards[shard].envelopes([items[p][0] for p in group])
            collided += [
                p
                for p, blob in zip(group, stored, strict=True)
                if blob != _envelope(items[p][2], validation.milliseconds_not_below(items[p][1]))
            ]
        return sorted(collided)

    def _home(self, task_id: str) -> QueueOperations:
        """The shard a task id is written to."""
        return self.shards[self.layout.of_task(task_id)]

    def _search_order(self, home: int) -> list[QueueOperations]:
        """Shards to look in for a task or cron job: its own first, then the others (it
        may have been written while the queue had another shard count)."""
        return [self.shards[home], *(s for i, s in enumerate(self.shards) if i != home)]

    def _first_found(
        self, task_id: str, step: Callable[[QueueOperations], Plan[T | None]]
    ) -> Plan[T | None]:
        """The first answer other than None of ``step`` in the task's shards, in search
        order; None when no shard has one."""
        for shard in self._search_order(self.layout.of_task(task_id)):
            if (answer := (yield from step(shard))) is not None:
                return answer
        return None

    def _locate(self, task_id: str) -> Plan[tuple[QueueOperations, StatusReply]]:
        """The shard that knows the task and what it says (its home shard if none does)."""
        home = self.layout.of_task(task_id)
        found: tuple[QueueOperations, StatusReply] | None = None
        for shard in self._search_order(home):
            reply = yield from shard.status(task_id)
            if reply.state != TaskState.UNKNOWN:
                return shard, reply
            found = found or (shard, reply)
        assert found is not None
        return found

    def schedule_one_plan(self, item: _Prepared) -> Plan[str]:
        """One task: the plan of ``schedule_plan``, cut to its usual course (one script
        call, no lists of positions) because single calls are the hot path of most
        producers. Durable writes and a refused generated id take the general plan."""
        if self.durability is not None:
            return (yield from self.schedule_plan([item]))[0]
        task_id = item[_ID]
        shard = self._home(task_id)
        now = shard.clock.now_ms()
        if now is None:
            now = yield from shard.now()
        run_at_us = _run_at_us(item, now)
        run_at = validation.milliseconds_not_below(run_at_us)
        envelope = _envelope(item, run_at)
        if shard.generation is None:
            yield from shard.learn_generation()
        refused = shard.refused(
            (yield shard.schedule_call(now, task_id, run_at, envelope, run_at_us))
        )
        if refused and item[_GENERATED]:
            # Our own write resent after a dropped reply, or a collision: sorted out there.
            return (yield from self.schedule_plan([item]))[0]
        if self.hooks:
            self.hooks.on_schedule(
                self.name, [ScheduledTask(task_id, item[_TASK], run_at_us / 1_000_000)]
            )
        return task_id

    def schedule_together_plan(self, items: list[_Prepared]) -> Plan[list[str | DuetimeError]]:
        """Single calls coalesced into one round trip: one id per call, or, when the
        replicas fell short, one NotDurableError per call naming that call's task."""
        try:
            return list((yield from self.schedule_plan(items)))
        except NotDurableError as error:
            mine = [
                (item[_ID],) if item[_ID] in error.task_ids else error.task_ids for item in items
            ]
            return [
                NotDurableError(error.confirmed, error.wanted, error.shortfall, error.reply, ids)
                for ids in mine
            ]

    def cancel_plan(self, task_id: str) -> Plan[bool]:
        validation.task_id(task_id)
        place = yield from self._first_found(task_id, lambda shard: shard.cancel(task_id))
        if place == TaskState.RUNNING:
            raise TaskStateError(
                f"task {task_id} is running and cannot be cancelled; "
                "it will finish or fail on its own"
            )
        return place is not None

    def reschedule_plan(self, task_id: str, at: Timestamp) -> Plan[None]:
        validation.task_id(task_id)
        run_at_ms = validation.timestamp_ms(at)

        def rewrite(blob: bytes, run_at_ms: float) -> bytes:
            old = codec.decode_envelope(blob)
            return codec.encode_envelope(
                Envelope(
                    old.task,
                    old.data,
                    run_at_ms,
                    old.max_attempts,
                    old.timeout_ms,
                    old.result_ttl_ms,
                )
            )

        outcome = yield from self._first_found(
            task_id, lambda shard: shard.reschedule(task_id, run_at_ms, rewrite)
        )
        if outcome is None:
            raise TaskNotFoundError(f"no live task {task_id!r} in queue {self.name!r}")
        if outcome != RescheduleOutcome.OK:
            raise TaskStateError(f"task {task_id} is {outcome} and cannot be rescheduled")

    def not_found(self, task_id: str) -> TaskNotFoundError:
        """What to say when nothing is kept under an id: a typo and a finished task that
        kept no result look the same in Redis, so say both."""
        return TaskNotFoundError(
            f"nothing is known of task {task_id!r} in queue {self.name!r}: it never existed, "
            "or it finished or was cancelled and kept nothing (schedule with result_ttl to "
            "keep its outcome for a while)"
        )

    def status_plan(self, task_id: str) -> Plan[TaskStatus | None]:
        _, reply = yield from self._locate(validation.task_id(task_id))
        return _status(task_id, reply)

    def result_plan(self, task_id: str, timeout: float | None) -> Plan[Any]:
        """Wait for the outcome of a task: its result if it succeeded; TaskFailedError
        (with the reason) if it died, for any reason, before or during a run;
        ResultTimeoutError when ``timeout`` seconds pass first (None waits for ever)."""
        validation.task_id(task_id)
        limit = validation.wait_seconds(timeout, "timeout")
        waited = 0.0
        while True:
            shard, reply = yield from self._locate(task_id)
            if reply.result is not None:
                return self._outcome(task_id, reply.result)
            if reply.state == TaskState.DEAD:
                error = codec.decode_error(reply.error).error if reply.error else ""
                raise TaskFailedError(task_id, error or "it is in the dead-letter set")
            if reply.state == TaskState.UNKNOWN:
                raise self.not_found(task_id)
            if _keeps_no_result(reply):
                raise TaskStateError(
                    f"task {task_id} was scheduled without result_ttl; it keeps no result"
                )
            # Wait for the result in chunks, looking at the task again in between: a
            # task that dies without storing a result still ends the wait.
            chunk = self.settings.block_timeout
            if limit is not None:
                chunk = min(chunk, limit - waited)
                if chunk <= 0:
                    raise ResultTimeoutError(f"task {task_id} has no result after {limit:g}s")
            blob = yield from shard.wait_result(task_id, chunk)
            if blob is not None:
                return self._outcome(task_id, blob)
            waited += chunk

    @staticmethod
    def _outcome(task_id: str, blob: bytes) -> Any:
        try:
            result = codec.decode_result(blob)
        except DecodeError as problem:
            raise CorruptStateError(f"the stored result of task {task_id}: {problem}") from None
        if not result.ok:
            raise TaskFailedError(task_id, str(result.value))
        return result.value

    def stats_plan(self) -> Plan[QueueStats]:
        each = []
        for shard in self.shards:
            counts = yield from shard.counts()
            each.append(_queue_stats(shard.keys.queue, counts))
        if len(each) == 1:
            return each[0]
        return _combined_stats(self.name, each)

    def dead_plan(self, limit: int, offset: int) -> Plan[list[DeadTask]]:
        validation.whole_number(limit, "limit", 1, 10_000)
        validation.whole_number(offset, "offset", 0, 10**12)
        if len(self.shards) == 1:
            entries = yield from self.operations.dead_entries(offset, limit)
        else:  # the latest deaths of every shard, merged
            entries = []
            for shard in self.shards:
                entries += yield from shard.dead_entries(0, offset + limit)
            entries.sort(key=lambda entry: entry.died_at_ms, reverse=True)
            entries = entries[offset : offset + limit]
        attempts_seen: list[DeadTask] = []
        for entry in entries:
            error = codec.decode_error(entry.error) if entry.error else None
            task, data = None, None
            if entry.envelope is not None:
                try:
                    envelope = codec.decode_envelope(entry.envelope)
                    task, data = envelope.task, envelope.data
                except DecodeError as problem:
                    data = f"<undecodable envelope: {problem}>"
            attempts_seen.append(
                DeadTask(
                    entry.task_id, entry.died_at_ms / 1000, task, data,
                    error.error if error else "", error.traceback if error else "",
                    error.attempt if error else 0,
                )
            )  # fmt: skip
        return attempts_seen

    def tasks_plan(self, state: str, limit: int, offset: int) -> Plan[list[TaskSummary]]:
        """Tasks in one state, in the order they will be served (dead: latest first);
        a sharded queue's shards merged by that order (ready: by run-at)."""
        if state not in LISTED_STATES:
            listed = ", ".join(LISTED_STATES)
            raise InvalidInputError(f"state must be one of {listed}, got {state!r}")
        validation.whole_number(limit, "limit", 1, 10_000)
        validation.whole_number(offset, "offset", 0, 1_000_000)
        found = []
        for shard in self.shards:
            entries = yield from shard.listed(TaskState(state), offset + limit)
            found += [_summary(entry) for entry in entries]
        if len(self.shards) > 1:
            found.sort(key=_LISTING_ORDER[TaskState(state)])
        return found[offset : offset + limit]

    def throughput_plan(self, minutes: int) -> Plan[list[MinuteFigures]]:
        """The last ``minutes`` minutes, oldest first, the current one last (partial)."""
        validation.whole_number(minutes, "minutes", 1, MINUTES_KEPT - 1)
        now_minute = (yield from self.operations.now()) // MINUTE_MS
        totals: dict[str, int] = {}
        late_max: dict[int, int] = {}
        for shard in self.shards:
            for name, count in (yield from shard.minute_figures()).items():
                number, _, figure = name.partition(":")
                if figure == "late_max_us" and number.isdigit():
                    late_max[int(number)] = max(count, late_max.get(int(number), 0))
                else:
                    totals[name] = totals.get(name, 0) + count
        figures = []
        for minute in range(now_minute - minutes + 1, now_minute + 1):
            completed = totals.get(f"{minute}:completed", 0)
            late_sum = totals.get(f"{minute}:late_sum_us", 0)
            figures.append(
                MinuteFigures(
                    minute * MINUTE_MS / 1000, completed,
                    totals.get(f"{minute}:retried", 0), totals.get(f"{minute}:dead", 0),
                    late_sum / completed / 1e6 if completed else None,
                    late_max[minute] / 1e6 if completed and minute in late_max else None,
                )
            )  # fmt: skip
        return figures

    def pause_plan(self, paused: bool) -> Plan[bool]:
        """Pause or resume every shard; True when any changed."""
        changed = False
        for shard in self.shards:
            changed = (yield from shard.set_paused(paused)) or changed
        return changed

    def paused_plan(self) -> Plan[bool]:
        for shard in self.shards:
            if (yield from shard.is_paused()):
                return True
        return False

    def run_now_plan(self, task_id: str) -> Plan[None]:
        """Make a waiting (scheduled) task due now: a delayed task, or a retry waiting
        out its back-off. Its run-at becomes the server's now."""
        status = yield from self.status_plan(task_id)
        if status is None:
            raise self.not_found(task_id)
        if status.state != TaskState.SCHEDULED:
            raise TaskStateError(
                f"task {task_id} is {status.state}, not scheduled: only a waiting task can "
                "be run now"
            )
        now_ms = yield from self._home(task_id).now()
        yield from self.reschedule_plan(task_id, now_ms / 1000)

    def requeue_plan(self, task_ids: TaskIds) -> Plan[int]:
        """Requeue the given dead tasks (one id, or a sequence), or all when None."""
        return (yield from self._each_dead(task_ids, QueueOperations.requeue_dead))

    def purge_plan(self, task_ids: TaskIds) -> Plan[int]:
        """Delete the given dead tasks (one id, or a sequence), or all when None."""
        return (yield from self._each_dead(task_ids, QueueOperations.purge_dead))

    def _each_dead(
        self, task_ids: TaskIds, step: Callable[[QueueOperations, Sequence[str]], Plan[int]]
    ) -> Plan[int]:
        """Apply a dead-letter step to the given ids, or to every dead task, in every
        shard (a step leaves ids it does not find alone); returns how many it applied to."""
        ids = None if task_ids is None else validation.task_ids(task_ids)
        total = 0
        for shard in self.shards:
            if ids is not None:
                total += yield from step(shard, ids)
                continue
            while batch := (yield from shard.dead_ids(1000)):
                total += yield from step(shard, batch)
        return total

    # --- cron ------------------------------------------------------------------------

    def cron_job(
        self,
        name: str,
        expression: str,
        data: Any,
        *,
        tz: str = "UTC",
        task: TaskRef | None = None,
        missed: str = "skip",
        overlap: str = "allow",
        max_attempts: int | None = None,
        timeout: float | None = None,
    ) -> cron.CronJob:
        """A validated cron definition; raises InvalidInputError, nothing stored."""
        return cron.define(
            name, expression, data, timezone=tz, task=task_name_of(task), missed=missed,
            overlap=overlap,
            max_attempts=self.settings.max_attempts if max_attempts is None else max_attempts,
            timeout=self.settings.task_timeout if timeout is None else timeout,
            max_payload_bytes=self.settings.max_payload_bytes,
        )  # fmt: skip

    def declare_cron_plan(self, jobs: Sequence[cron.CronJob]) -> Plan[dict[str, str]]:
        """Create or update each job (in its shard); returns name -> created | updated |
        unchanged."""
        outcomes = {}
        for job in jobs:
            home = self.layout.of_cron(job.name)
            shard = self.shards[home]
            now = yield from shard.now()
            first = job.next_tick(now)
            assert first is not None  # cron.define refuses expressions that never fire
            code = yield from shard.declare_cron(job.name, cron.encode_job(job), first)
            outcomes[job.name] = ("unchanged", "created", "updated")[code]
            # A copy declared under another shard count would fire each tick a second
            # time (its ticks are other tasks in another shard): one job, one place.
            for other in self._search_order(home)[1:]:
                yield from other.remove_cron(job.name)
        return outcomes

    def sync_cron_plan(self, jobs: Sequence[cron.CronJob], prune: bool) -> Plan[dict[str, str]]:
        """Converge on exactly these jobs: declare them, and with ``prune`` remove the rest
        (and any copy of a declared job outside its shard, left by another shard count)."""
        names = [job.name for job in jobs]
        if len(set(names)) != len(names):
            raise InvalidInputError("sync_cron got the same cron job name twice")
        outcomes = yield from self.declare_cron_plan(jobs)
        if prune:
            for index, shard in enumerate(self.shards):
                table = yield from shard.cron_table()
                for name in sorted(table.definitions):
                    if name in outcomes and self.layout.of_cron(name) == index:
                        continue
                    yield from shard.remove_cron(name)
                    outcomes.setdefault(name, "removed")
        return outcomes

    def pause_cron_plan(self, name: str, paused: bool) -> Plan[None]:
        for shard in self._search_order(self.layout.of_cron(name)):
            next_tick = None
            if not paused:
                table = yield from shard.cron_table()
                blob = table.definitions.get(name)
                if blob is None:
                    continue
                now = yield from shard.now()
                next_tick = cron.decode_job(blob).next_tick(now)
            if (yield from shard.set_cron_next(name, next_tick)):
                return
        raise TaskNotFoundError(f"no cron job {name!r} in queue {self.name!r}")

    def trigger_cron_plan(self, name: str) -> Plan[str]:
        """Run a cron job once now, outside its schedule: a task with the job's handler,
        data, attempts and timeout, under a fresh id (it is not a tick: the schedule,
        its overlap policy and its last run are untouched). Returns the task id."""
        for shard in self._search_order(self.layout.of_cron(name)):
            table = yield from shard.cron_table()
            blob = table.definitions.get(name)
            if blob is None:
                continue
            job = cron.decode_job(blob)
            options = Job(
                job.data, delay=0, task=job.task, max_attempts=job.max_attempts,
                timeout=job.timeout_ms / 1000, result_ttl=cron.RESULT_TTL_MS / 1000,
            )  # fmt: skip
            return (yield from self.schedule_one_plan(self.prepare(options)))
        raise TaskNotFoundError(f"no cron job {name!r} in queue {self.name!r}")

    def remove_cron_plan(self, name: str) -> Plan[bool]:
        removed = False
        for shard in self.shards:
            removed = (yield from shard.remove_cron(name)) or removed
        return removed

    def list_cron_plan(self, upcoming: int) -> Plan[list[CronInfo]]:
        jobs = []
        for shard in self.shards:
            table = yield from shard.cron_table()
            now = yield from shard.now()
            for name in table.definitions:
                jobs.append((yield from self._cron_info(name, table, now, upcoming)))
        return sorted(jobs, key=lambda job: job.name)

    def _cron_info(self, name: str, table: CronTable, now: int, upcoming: int) -> Plan[CronInfo]:
        paused = name not in table.next_ticks
        try:
            job = cron.decode_job(table.definitions[name])
        except DecodeError as problem:
            # A poison record (a dispatcher pauses it): shown, not a failed listing.
            return CronInfo(name, "", "", "", None, "", "", paused, [], None, str(problem))
        next_runs: list[float] = []
        if not paused:
            first = table.held.get(name, table.next_ticks[name])
            next_runs = [first / 1000]
            for tick in job.ticks_after(max(first, now)):
                if len(next_runs) >= upcoming:
                    break
                next_runs.append(tick / 1000)
        last: CronRun | None = None
        if name in table.last_task:
            last = yield from self._cron_run(table.last_task[name])
        return CronInfo(
            job.name, job.expression, job.timezone, job.task, job.data, job.missed,
            job.overlap, paused, next_runs[:upcoming], last,
        )  # fmt: skip

    def _cron_run(self, task_id: str) -> Plan[CronRun | None]:
        tick_text = task_id.rsplit(":", 1)[-1]
        if not tick_text.isdigit():
            return None  # not an id duetime wrote; the checker does not own cron_last values
        tick = int(tick_text)
        _, reply = yield from self._locate(task_id)
        result, _ = _result_record(reply.result)
        error = codec.decode_error(reply.error).error if reply.error else None
        started = result.started_ms / 1000 if result and result.started_ms else None
        return CronRun(
            tick=tick / 1000,
            task_id=task_id,
            state=reply.state,
            started=started,
            lateness_ms=None if started is None else started * 1000 - tick,
            succeeded=result.ok if result else None,
            error=error if error else (None if not result or result.ok else str(result.value)),
        )

    def check_plan(self) -> Plan[list[Violation]]:
        """Every shard's invariants (a subject is prefixed with its shard when sharded),
        and whether a shard past this queue's shard count holds anything."""
        violations = []
        for index, shard in enumerate(self.shards):
            found = check_invariants((yield from shard.snapshot()))
            if len(self.shards) > 1:
                found = [Violation(v.kind, f"shard {index}: {v.subject}", v.detail) for v in found]
            violations += found
        beyond = QueueOperations(self.layout.beyond, self.clock)
        if (yield from beyond.occupied()):
            violations.append(
                Violation(
                    "tasks beyond the shards", f"shard {self.layout.count}",
                    f"it holds tasks or cron jobs, but queue {self.name!r} is used here with "
                    f"{self.layout.count} shard(s): no dispatcher or worker given that count "
                    "serves them; run them with the shard count the queue was written with",
                )
            )  # fmt: skip
        return violations


def _queue_stats(name: str, counts: dict[str, Any]) -> QueueStats:
    now = counts["now_ms"]
    next_due_ms = counts["next_due_ms"]
    ready_since_ms = None
    if counts["ready_head_envelope"] is not None:
        with contextlib.suppress(DecodeError):  # garbage: the checker reports it
            ready_since_ms = codec.decode_envelope(counts["ready_head_envelope"]).run_at_ms
        # Due from later than its run-at (retried, requeued, re-entered): the same
        # definition as an attempt's lateness.
        if ready_since_ms is not None and counts["ready_head_due_ms"] is not None:
            ready_since_ms = max(ready_since_ms, counts["ready_head_due_ms"])
    return QueueStats(
        paused=counts["paused"],
        oldest_due_age=max(0.0, (now - next_due_ms) / 1000) if next_due_ms is not None else 0.0,
        oldest_ready_age=max(0.0, (now - ready_since_ms) / 1000) if ready_since_ms else 0.0,
        queue=name,
        scheduled=counts["scheduled"],
        ready=counts["ready"],
        running=counts["running"],
        dead=counts["dead"],
        workers={worker: (now - beat) / 1000 for worker, beat in counts["workers"].items()},
        next_due=None if counts["next_due_ms"] is None else counts["next_due_ms"] / 1000,
        counters=counts["counters"],
    )


def _combined_stats(name: str, shards: list[QueueStats]) -> QueueStats:
    """A sharded queue's figures: sums, the earliest due time, each worker's most recent
    heartbeat (a worker serves every shard), counters summed (-1 where any is garbage)."""
    workers: dict[str, float] = {}
    counters: dict[str, int] = {}
    for shard in shards:
        for worker, age in shard.workers.items():
            workers[worker] = min(age, workers.get(worker, age))
        for counter, value in shard.counters.items():
            known = counters.get(counter, 0)
            counters[counter] = -1 if -1 in (value, known) else known + value
    due = [shard.next_due for shard in shards if shard.next_due is not None]
    return QueueStats(
        paused=any(shard.paused for shard in shards),
        oldest_due_age=max(shard.oldest_due_age for shard in shards),
        oldest_ready_age=max(shard.oldest_ready_age for shard in shards),
        queue=name,
        scheduled=sum(shard.scheduled for shard in shards),
        ready=sum(shard.ready for shard in shards),
        running=sum(shard.running for shard in shards),
        dead=sum(shard.dead for shard in shards),
        workers=workers,
        next_due=min(due, default=None),
        counters=counters,
        shards=shards,
    )


def _summary(entry: Listed) -> TaskSummary:
    """What a listing shows of one task; a record that does not decode is named, not
    raised, so one bad task does not hide the page."""
    problems = []
    task, data, run_at = None, None, None
    if entry.envelope is None:
        problems.append("it has no envelope")
    else:
        try:
            envelope = codec.decode_envelope(entry.envelope)
            run_at = validation.seconds_of_ms(envelope.run_at_ms)
            task, data = envelope.task, envelope.data
        except DecodeError as problem:
            problems.append(f"its envelope is unreadable ({problem})")
    error = None
    if entry.error is not None:
        try:
            error = codec.decode_error_checked(entry.error).error
        except DecodeError as problem:
            problems.append(f"error record unreadable: {problem}")
    score = None if entry.score is None else entry.score / 1000
    return TaskSummary(
        entry.task_id, entry.state, task, data, run_at, entry.attempts or 0,
        worker=entry.worker,
        lease_deadline=score if entry.state == TaskState.RUNNING else None,
        died_at=score if entry.state == TaskState.DEAD else None,
        error=error, problem="; ".join(problems) or None,
        due_at=score if entry.state == TaskState.SCHEDULED else None,
    )  # fmt: skip


#: How merged listings of a sharded queue are ordered.
_LISTING_ORDER: dict[TaskState, Callable[[TaskSummary], float]] = {
    TaskState.SCHEDULED: lambda task: task.due_at or 0.0,
    TaskState.READY: lambda task: task.run_at or 0.0,
    TaskState.RUNNING: lambda task: task.lease_deadline or 0.0,
    TaskState.DEAD: lambda task: -(task.died_at or 0.0),
}


def _result_record(blob: bytes | None) -> tuple[ResultRecord | None, str | None]:
    """A stored result record, or the problem with it (garbage written by hand)."""
    if blob is None:
        return None, None
    try:
        return codec.decode_result(blob), None
    except DecodeError as problem:
        return None, f"its result record is unreadable ({problem})"


def _keeps_no_result(reply: StatusReply) -> bool:
    """The task is live and was scheduled without result_ttl (so none will come)."""
    if reply.envelope is None:
        return False
    try:
        return codec.decode_envelope(reply.envelope).result_ttl_ms == 0
    except DecodeError:
        return False  # a worker will dead-letter it; the wait then ends


def _status(task_id: str, reply: StatusReply) -> TaskStatus | None:
    if reply.state == TaskState.UNKNOWN:
        return None
    problems = []
    envelope = None
    if reply.envelope is not None:
        try:
            envelope = codec.decode_envelope(reply.envelope)
        except DecodeError as unreadable:
            problems.append(f"its envelope is unreadable ({unreadable})")
    if reply.attempts is None:
        problems.append("its attempt counter is not a number")
    error = None
    if reply.error:
        try:
            error = codec.decode_error_checked(reply.error)
        except DecodeError as unreadable:
            problems.append(f"error record unreadable: {unreadable}")
    result, problem = _result_record(reply.result)
    if problem is not None:
        problems.append(problem)
    attempts = reply.attempts or 0
    if reply.state == TaskState.FINISHED and result is not None:
        attempts = result.attempt
    score = reply.score_ms
    return TaskStatus(
        id=task_id,
        state=reply.state,
        run_at=(
            validation.seconds_of_ms(score)
            if reply.state == TaskState.SCHEDULED and score is not None
            else None
        ),
        died_at=score / 1000 if reply.state == TaskState.DEAD and score else None,
        attempts=attempts,
        task=envelope.task if envelope else None,
        data=envelope.data if envelope else None,
        last_error=error.error if error else None,
        last_traceback=error.traceback if error else None,
        result=result.value if result else None,
        succeeded=result.ok if result else None,
        finished_at=result.finished_ms / 1000 if result and result.finished_ms else None,
        problem="; ".join(problems) or None,
    )


def known_queues(
    redis: RedisSpec = None, settings: Settings = DEFAULT_SETTINGS
) -> list[RegisteredQueue]:
    """The queues dispatchers have served on this server (each noted when a dispatcher
    starts), by name, with their shard count: what ``duetime queues`` lists."""
    runner = SyncRunner(redis, settings)
    try:
        return runner.run(registered_queues())
    finally:
        runner.close()


class Queue:
    """A queue on a synchronous connection.

    ``redis`` is a URL, a ``redis.Redis`` client (its address is reused), or None for
    $DUETIME_REDIS_URL or else the embedded server. ``durable=True`` makes schedule calls
    wait for replicas to confirm them (see ``Settings.durable_replicas``). ``shards``
    spreads the queue over that many hash tags, which Redis Cluster places on different
    masters; give workers and dispatchers the same count (docs/deployment.md).
    ``hooks`` (duetime.Hooks) hear about every task this object schedules.
    """

    def __init__(
        self,
        name: str,
        redis: RedisSpec = None,
        *,
        settings: Settings = DEFAULT_SETTINGS,
        clock: Clock | None = None,
        result_ttl: float | None = None,
        durable: bool | None = None,
        shards: int = 1,
        hooks: Iterable[Hooks] = (),
    ) -> None:
        self.core = QueueCore(name, settings, clock, result_ttl, durable, shards, hooks)
        self.runner = SyncRunner(redis, settings)
        self.name = self.core.name
        self._coalescer: ThreadCoalescer[_Prepared, str] | None = None
        if settings.coalesce_schedules:
            core, runner = self.core, self.runner  # not self: a cycle would outlive a drop
            self._coalescer = ThreadCoalescer(
                lambda item: runner.run(core.schedule_one_plan(item)),
                lambda items: runner.run(core.schedule_together_plan(items)),
            )

    def schedule_task(self, at: Timestamp, data: Any, **options: Unpack[TaskOptions]) -> str:
        """Run ``data`` at ``at`` (epoch seconds or aware datetime); returns the task id.
        With an ``id`` that is already live, nothing changes and that id is returned."""
        if at is None:
            validation.timestamp_ms(at)  # the error speaks of the run-at, not of a delay
        return self._schedule(self.core.prepare_call("schedule_task", data, at, None, options))

    def schedule_in(self, delay: float, data: Any, **options: Unpack[TaskOptions]) -> str:
        """Run ``data`` ``delay`` seconds from now (server clock); 0 means right now."""
        return self._schedule(self.core.prepare_call("schedule_in", data, None, delay, options))

    def _schedule(self, item: _Prepared) -> str:
        if self._coalescer is None:
            return self.runner.run(self.core.schedule_one_plan(item))
        return self._coalescer.submit(item)

    def schedule_now(self, data: Any, **options: Unpack[TaskOptions]) -> str:
        return self.schedule_in(0, data, **options)

    def schedule_many(self, jobs: Iterable[Job | tuple[Timestamp, Any]]) -> list[str]:
        """Schedule many tasks, one round trip per 1,000. All are validated first."""
        return self.runner.run(self.core.schedule_plan(self.core.prepare_all(jobs)))

    def cancel(self, task_id: str) -> bool:
        """Remove a waiting or dead task; False if no live task has this id."""
        return self.runner.run(self.core.cancel_plan(task_id))

    def reschedule(self, task_id: str, at: Timestamp) -> None:
        self.runner.run(self.core.reschedule_plan(task_id, at))

    def status(self, task_id: str) -> TaskStatus | None:
        return self.runner.run(self.core.status_plan(task_id))

    def result(self, task_id: str, timeout: float | None = None) -> Any:
        """Wait for the stored result of a task scheduled with ``result_ttl``."""
        return self.runner.run(self.core.result_plan(task_id, timeout))

    def stats(self) -> QueueStats:
        return self.runner.run(self.core.stats_plan())

    def tasks(self, state: str, limit: int = 50, offset: int = 0) -> list[TaskSummary]:
        """Tasks in one state (scheduled, ready, running or dead), in serving order."""
        return self.runner.run(self.core.tasks_plan(state, limit, offset))

    def throughput(self, minutes: int = 60) -> list[MinuteFigures]:
        """Per-minute figures of the last ``minutes`` (at most 60), oldest first."""
        return self.runner.run(self.core.throughput_plan(minutes))

    def pause(self) -> bool:
        """Workers stop claiming from this queue (running tasks finish); scheduling and
        promotion go on. True when it was not paused already."""
        return self.runner.run(self.core.pause_plan(True))

    def resume(self) -> bool:
        """Workers claim again, at once. True when it was paused."""
        return self.runner.run(self.core.pause_plan(False))

    def is_paused(self) -> bool:
        return self.runner.run(self.core.paused_plan())

    def run_now(self, task_id: str) -> None:
        """Make a scheduled task due now (TaskStateError if it is not waiting)."""
        self.runner.run(self.core.run_now_plan(task_id))

    def dead_tasks(self, limit: int = 100, offset: int = 0) -> list[DeadTask]:
        return self.runner.run(self.core.dead_plan(limit, offset))

    def requeue_dead(self, task_ids: TaskIds = None) -> int:
        return self.runner.run(self.core.requeue_plan(task_ids))

    def purge_dead(self, task_ids: TaskIds = None) -> int:
        return self.runner.run(self.core.purge_plan(task_ids))

    def check(self) -> list[Violation]:
        """Verify the invariants on the live server; an empty list means all hold."""
        return self.runner.run(self.core.check_plan())

    def cron_job(self, name: str, expression: str, data: Any, **options: Any) -> cron.CronJob:
        """A validated cron definition for ``sync_cron`` (options as for ``add_cron``)."""
        return self.core.cron_job(name, expression, data, **options)

    def add_cron(self, name: str, expression: str, data: Any, **options: Any) -> str:
        """Create or update a recurring job; returns created, updated or unchanged.
        Options: tz, task, missed (skip|once|all), overlap (allow|skip|delay),
        max_attempts, timeout."""
        job = self.core.cron_job(name, expression, data, **options)
        return self.runner.run(self.core.declare_cron_plan([job]))[name]

    def sync_cron(self, jobs: Sequence[cron.CronJob], prune: bool = True) -> dict[str, str]:
        """Make the queue's cron jobs exactly ``jobs`` (declared in code); with ``prune``,
        jobs no longer declared are removed. Returns name -> what happened."""
        return self.runner.run(self.core.sync_cron_plan(jobs, prune))

    def list_cron(self, upcoming: int = 3) -> list[CronInfo]:
        return self.runner.run(self.core.list_cron_plan(upcoming))

    def pause_cron(self, name: str) -> None:
        self.runner.run(self.core.pause_cron_plan(name, paused=True))

    def resume_cron(self, name: str) -> None:
        """Resume from the next tick after now (ticks while paused are not run)."""
        self.runner.run(self.core.pause_cron_plan(name, paused=False))

    def remove_cron(self, name: str) -> bool:
        return self.runner.run(self.core.remove_cron_plan(name))

    def trigger_cron(self, name: str) -> str:
        """Run a cron job once now, outside its schedule; returns the task id."""
        return self.runner.run(self.core.trigger_cron_plan(name))

    def close(self) -> None:
        self.runner.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncQueue:
    """The asyncio twin of ``Queue``: same arguments, same plans, awaited."""

    def __init__(
        self,
        name: str,
        redis: RedisSpec = None,
        *,
        settings: Settings = DEFAULT_SETTINGS,
        clock: Clock | None = None,
        result_ttl: float | None = None,
        durable: bool | None = None,
        shards: int = 1,
        hooks: Iterable[Hooks] = (),
    ) -> None:
        self.core = QueueCore(name, settings, clock, result_ttl, durable, shards, hooks)
        self.runner = AsyncRunner(redis, settings)
        self.name = self.core.name
        self._coalescer: TaskCoalescer[_Prepared, str] | None = None
        if settings.coalesce_schedules:
            core, runner = self.core, self.runner  # not self: a cycle would outlive a drop

            async def one(item: _Prepared) -> str:
                return await runner.run(core.schedule_one_plan(item))

            async def together(items: list[_Prepared]) -> list[str | DuetimeError]:
                return await runner.run(core.schedule_together_plan(items))

            self._coalescer = TaskCoalescer(one, together)

    async def schedule_task(self, at: Timestamp, data: Any, **options: Unpack[TaskOptions]) -> str:
        if at is None:
            validation.timestamp_ms(at)  # the error speaks of the run-at, not of a delay
        prepared = self.core.prepare_call("schedule_task", data, at, None, options)
        return await self._schedule(prepared)

    async def schedule_in(self, delay: float, data: Any, **options: Unpack[TaskOptions]) -> str:
        prepared = self.core.prepare_call("schedule_in", data, None, delay, options)
        return await self._schedule(prepared)

    def _schedule(self, item: _Prepared) -> Awaitable[str]:
        # Not a coroutine itself: it hands over the one to await (a layer less per call).
        if self._coalescer is None:
            return self.runner.run(self.core.schedule_one_plan(item))
        return self._coalescer.submit(item)

    async def schedule_now(self, data: Any, **options: Unpack[TaskOptions]) -> str:
        return await self.schedule_in(0, data, **options)

    async def schedule_many(self, jobs: Iterable[Job | tuple[Timestamp, Any]]) -> list[str]:
        return await self.runner.run(self.core.schedule_plan(self.core.prepare_all(jobs)))

    async def cancel(self, task_id: str) -> bool:
        return await self.runner.run(self.core.cancel_plan(task_id))

    async def reschedule(self, task_id: str, at: Timestamp) -> None:
        await self.runner.run(self.core.reschedule_plan(task_id, at))

    async def status(self, task_id: str) -> TaskStatus | None:
        return await self.runner.run(self.core.status_plan(task_id))

    async def result(self, task_id: str, timeout: float | None = None) -> Any:
        return await self.runner.run(self.core.result_plan(task_id, timeout))

    async def stats(self) -> QueueStats:
        return await self.runner.run(self.core.stats_plan())

    async def tasks(self, state: str, limit: int = 50, offset: int = 0) -> list[TaskSummary]:
        return await self.runner.run(self.core.tasks_plan(state, limit, offset))

    async def throughput(self, minutes: int = 60) -> list[MinuteFigures]:
        return await self.runner.run(self.core.throughput_plan(minutes))

    async def pause(self) -> bool:
        return await self.runner.run(self.core.pause_plan(True))

    async def resume(self) -> bool:
        return await self.runner.run(self.core.pause_plan(False))

    async def is_paused(self) -> bool:
        return await self.runner.run(self.core.paused_plan())

    async def run_now(self, task_id: str) -> None:
        await self.runner.run(self.core.run_now_plan(task_id))

    async def dead_tasks(self, limit: int = 100, offset: int = 0) -> list[DeadTask]:
        return await self.runner.run(self.core.dead_plan(limit, offset))

    async def requeue_dead(self, task_ids: TaskIds = None) -> int:
        return await self.runner.run(self.core.requeue_plan(task_ids))

    async def purge_dead(self, task_ids: TaskIds = None) -> int:
        return await self.runner.run(self.core.purge_plan(task_ids))

    async def check(self) -> list[Violation]:
        return await self.runner.run(self.core.check_plan())

    def cron_job(self, name: str, expression: str, data: Any, **options: Any) -> cron.CronJob:
        return self.core.cron_job(name, expression, data, **options)

    async def add_cron(self, name: str, expression: str, data: Any, **options: Any) -> str:
        job = self.core.cron_job(name, expression, data, **options)
        return (await self.runner.run(self.core.declare_cron_plan([job])))[name]

    async def sync_cron(self, jobs: Sequence[cron.CronJob], prune: bool = True) -> dict[str, str]:
        return await self.runner.run(self.core.sync_cron_plan(jobs, prune))

    async def list_cron(self, upcoming: int = 3) -> list[CronInfo]:
        return await self.runner.run(self.core.list_cron_plan(upcoming))

    async def pause_cron(self, name: str) -> None:
        await self.runner.run(self.core.pause_cron_plan(name, paused=True))

    async def resume_cron(self, name: str) -> None:
        await self.runner.run(self.core.pause_cron_plan(name, paused=False))

    async def remove_cron(self, name: str) -> bool:
        return await self.runner.run(self.core.remove_cron_plan(name))

    async def trigger_cron(self, name: str) -> str:
        return await self.runner.run(self.core.trigger_cron_plan(name))

    async def close(self) -> None:
        await self.runner.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
