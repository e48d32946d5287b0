"""Every step duetime takes on Redis, written once.

Each operation is a *plan*: a generator that yields requests (a command, a script
call or a batch) and receives their replies. ``runner.SyncRunner`` and
``runner.AsyncRunner`` execute the same plans, so the asyncio client and the
synchronous one share all logic. Plans never sleep and never touch a socket.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from duetime import codec
from duetime.clock import Clock, ServerClock
from duetime.errors import (
    ConfigurationError,
    CorruptStateError,
    DuetimeError,
    NotDurableError,
    RedisCommandError,
)
from duetime.settings import Settings
from duetime.states import CronFireOutcome, RescheduleOutcome, TaskState
from duetime.store import scripts
from duetime.store.keys import (
    MAX_GENERATION,
    QUEUE_REGISTRY,
    QueueKeys,
    QueueLayout,
    bucket_name,
    id_hash,
    split_lease_member,
)
from duetime.store.scripts import Script
from duetime.validation import milliseconds_not_below, whole_microseconds

T = TypeVar("T")

#: Tasks per schedule_tasks script call: bounds how long one call holds the server.
SCHEDULE_BATCH = 1000
#: A large schedule call opens a generation of delayed buckets with at least one bucket
#: per this many of its delayed tasks (schedule_tasks.lua opens the next one as the
#: buckets fill), so each stays in the server's compact encoding (128 entries).
BUCKET_FILL = 16
#: Lookups told of a newer generation of delayed buckets more often than this in a row
#: give up (someone keeps rewriting the layout by hand).
GENERATION_ROUNDS = 5
#: The per-minute figures: a minute in ms, and how many minutes dispatchers keep.
MINUTE_MS = 60_000
MINUTES_KEPT = 61


@dataclass(frozen=True, slots=True)
class Command:
    """One Redis command. ``block`` is set for blocking commands: the seconds the
    server may hold it, so the runner sends it on a connection whose socket timeout
    is longer than that. ``route`` is a key of the queue for a command that names none
    (TIME, SCAN, CONFIG GET): on a cluster it goes to the node holding that key.
    ``refusal_as_reply``: the server's refusal comes back to the plan as a
    RedisCommandError reply, for a plan that can say what it means."""

    args: tuple[Any, ...]
    block: float | None = None
    route: str | None = None
    refusal_as_reply: bool = False


@dataclass(frozen=True, slots=True)
class Eval:
    script: Script
    keys: Sequence[str]
    args: Sequence[Any]


#: One script call's keys and arguments.
ScriptCall = tuple[Sequence[str], Sequence[Any]]


class MadeOnDemand(Sequence[T]):
    """Items made when first asked for, then kept: the script calls of a large schedule,
    which a runner sends each as it is made, so the server runs one while the next is
    made."""

    def __init__(self, count: int, make: Callable[[int], T]) -> None:
        self._made: list[T] = []
        self._count, self._make = count, make

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[T]: ...
    def __getitem__(self, index: int | slice) -> T | Sequence[T]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if not -self._count <= index < self._count:
            raise IndexError(index)
        index %= self._count
        while len(self._made) <= index:  # in order: each may depend on the one before
            self._made.append(self._make(len(self._made)))
        return self._made[index]


#: A task to store: its id, run-at in whole µs, and what its envelope is made from (see
#: ``schedule_calls``).
NewTask = tuple[str, int, Any]


@dataclass(frozen=True, slots=True)
class EvalMany:
    """One script called several times in one round trip (a pipeline, not a transaction)."""

    script: Script
    calls: Sequence[ScriptCall]


#: Seconds a durable wait must end before socket_timeout: its reply is read within
#: socket_timeout, from about when the wait starts on the server.
DURABLE_READ_MARGIN = 0.5


@dataclass(frozen=True, slots=True)
class Durability:
    """Wait for this many replicas to confirm a write, up to ``timeout_ms`` (WAIT); with
    ``fsync``, for the write to be in the append-only file on the master and on that
    many replicas (WAITAOF)."""

    replicas: int
    timeout_ms: int
    fsync: bool = False

    @classmethod
    def wanted(cls, settings: Settings, durable: bool | None) -> Durability | None:
        """What to wait for: ``durable`` True asks for at least one replica where the
        settings ask for nothing, False for nothing, None follows the settings."""
        if durable is False:
            return None
        replicas, fsync = settings.durable_replicas, settings.durable_fsync
        if durable and not (replicas or fsync):
            replicas = 1
        if not (replicas or fsync):
            return None
        if settings.durable_timeout + DURABLE_READ_MARGIN > settings.socket_timeout:
            raise ConfigurationError(
                f"durable_timeout ({settings.durable_timeout:g}s) must be at least "
                f"{DURABLE_READ_MARGIN:g}s below socket_timeout ({settings.socket_timeout:g}s): "
                "the replicas' confirmation is read within socket_timeout, and a read that "
                "times out after the write went through would report Redis unavailable for "
                "a task that was stored (a retry would store it twice). Lower "
                "durable_timeout or raise socket_timeout"
            )
        return cls(replicas, round(settings.durable_timeout * 1000), fsync)

    @property
    def commands(self) -> list[tuple[str | int, ...]]:
        """The waits sent after the writes, on their connection; the last one's reply
        is the confirmation. WAIT comes before WAITAOF when replicas must fsync: a
        replica reports its fsync only in answer to a request that reaches it after the
        write (or once a second), and WAITAOF's request would otherwise travel with the
        write: each call would take a second. So a call may wait twice the timeout."""
        waitaof = ("WAITAOF", 1, self.replicas, self.timeout_ms)
        wait = ("WAIT", self.replicas, self.timeout_ms)
        if not self.fsync:
            return [wait]
        return [wait, waitaof] if self.replicas else [waitaof]

    def shortfall(self, confirmations: Sequence[Any] | None) -> tuple[int, str | None]:
        """The fewest replicas any reply confirmed, and what fell short (None: nothing).
        ``confirmations`` are WAIT or WAITAOF replies, one per master written (an
        exception where the server refused); None when a write went elsewhere."""
        seconds = f"{self.timeout_ms / 1000:g}s"
        if confirmations is None:
            return 0, "the slot map changed during the call, so no wait covered every write"
        fsynced_locally = True
        replicas = self.replicas
        for reply in confirmations:
            if isinstance(reply, Exception):
                return 0, f"the server refused to confirm ({reply})"
            if self.fsync:
                fsynced_locally = fsynced_locally and bool(int(reply[0]))
                replicas = min(replicas, int(reply[1]))
            else:
                replicas = min(replicas, int(reply))
        if not fsynced_locally:
            return replicas, f"the master did not write it to its append-only file within {seconds}"
        if replicas < self.replicas:
            done = "wrote it to their append-only file" if self.fsync else "confirmed it"
            return replicas, f"only {replicas} of {self.replicas} replica(s) {done} in {seconds}"
        return replicas, None


@dataclass(frozen=True, slots=True)
class Durably:
    """Script calls followed by WAIT on the same connection, in one round trip; the
    reply is (the calls' replies, how many replicas confirmed them)."""

    calls: EvalMany
    durability: Durability


@dataclass(frozen=True, slots=True)
class Batch:
    """Commands sent in one round trip; ``transaction`` wraps them in MULTI/EXEC.
    ``read_only`` (only reads in it) lets the runner send a refused transaction again
    as a plain pipeline when the server is over maxmemory, which refuses MULTI."""

    commands: Sequence[Command]
    transaction: bool = False
    read_only: bool = False


Request = Command | Eval | EvalMany | Durably | Batch
Plan = Generator[Request, Any, T]


# --- results -------------------------------------------------------------------------


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


@dataclass(frozen=True, slots=True)
class Listed:
    """A task as a listing finds it: ``score`` is its run-at (scheduled), lease deadline
    (running) or time of death (dead), in ms; records as stored (None if absent)."""

    task_id: str
    state: TaskState
    score: float | None
    worker: str | None
    envelope: bytes | None
    attempts: int | None
    error: bytes | None


@dataclass(slots=True)  # not frozen: made per task, and a frozen __init__ costs ~1 µs
class Claimed:
    task_id: str
    attempt: int
    envelope: bytes | None  # None: the id had no envelope and was dropped
    early_run_at_ms: float | None = None  # due from (QueueKeys.early): wait for it
    problem: str | None = None  # garbage found in the task's records: it goes to dead


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    was_registered: bool
    lost: list[tuple[str, int]]  # (task id, attempt) of attempts whose lease is gone (fenced)
    held: list[str]  # every id in the worker's processing list


@dataclass(slots=True)  # not frozen: made per task, and a frozen __init__ costs ~1 µs
class Outcome:
    """A successful attempt to acknowledge."""

    task_id: str
    attempt: int
    result_ttl_ms: int = 0
    result: bytes = b""
    lateness_us: int = 0  # how long after its run-at the attempt started


@dataclass(frozen=True, slots=True)
class StatusReply:
    state: TaskState
    score_ms: float | None
    attempts: int | None  # None: the stored counter is not a number (garbage)
    error: bytes | None
    envelope: bytes | None
    result: bytes | None


@dataclass(frozen=True, slots=True)
class DeadEntry:
    task_id: str
    died_at_ms: int
    envelope: bytes | None
    error: bytes | None


@dataclass(frozen=True, slots=True)
class CronTable:
    definitions: dict[str, bytes]
    next_ticks: dict[str, int]  # paused jobs are absent
    last_task: dict[str, str]
    held: dict[str, int]


@dataclass(frozen=True, slots=True)
class DueCron:
    name: str
    next_tick_ms: int  # the score read, compared and set by fire_cron
    definition: bytes | None
    held_tick_ms: int | None
    problem: str | None = None  # its held tick is garbage: the job is a poison record


@dataclass(slots=True)
class Snapshot:
    """One consistent (MULTI/EXEC) read of every structure of a queue."""

    now_ms: int
    tasks: set[str] = field(default_factory=set)
    scheduled: list[str] = field(default_factory=list)
    #: delayed bucket name -> its (task id, run-at in µs) entries
    delayed: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    delayed_index: dict[str, float] = field(default_factory=dict)  # bucket -> earliest µs
    delayed_layout: dict[str, bytes] = field(default_factory=dict)  # as stored
    ready: list[str] = field(default_factory=list)
    active: dict[str, list[str]] = field(default_factory=dict)  # worker -> ids
    dead: list[str] = field(default_factory=list)
    leases: dict[str, int] = field(default_factory=dict)  # member -> deadline
    workers: dict[str, int] = field(default_factory=dict)  # worker -> heartbeat
    attempts: dict[str, bytes] = field(default_factory=dict)  # id -> attempts started
    errors: set[str] = field(default_factory=set)
    early: dict[str, bytes] = field(default_factory=dict)  # id -> due from (keys.early)
    counters: dict[str, bytes] = field(default_factory=dict)  # the stats hash as stored
    reaped: set[str] = field(default_factory=set)  # reaped workers to look at once more
    wake_length: int = 0
    cron: dict[str, bytes] = field(default_factory=dict)  # job name -> definition
    cron_entries: dict[str, set[str]] = field(default_factory=dict)  # key part -> names
    cron_held: dict[str, bytes] = field(default_factory=dict)  # job name -> held tick
    results_without_ttl: list[str] = field(default_factory=list)
    stray_keys: list[str] = field(default_factory=list)


def _text(value: bytes | str) -> str:
    # surrogateescape: an id that is not UTF-8 (written by hand) still round-trips to
    # the same bytes (the runner encodes with the same error handler).
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def _pairs(reply: Any) -> list[tuple[Any, Any]]:
    """Name/value pairs from a flat list or a dict reply."""
    if isinstance(reply, dict):
        return list(reply.items())
    return list(zip(reply[::2], reply[1::2], strict=True))


def _score(value: bytes | str | None) -> float | None:
    if value is None:
        return None
    number = float(value)
    return None if number < 0 else number


def _whole_score(value: bytes | str | None) -> int | None:
    """A score written in whole milliseconds (deadlines, heartbeats, cron ticks)."""
    number = _score(value)
    return None if number is None else int(number)


def _ms_or_none(value: bytes | str | None) -> float | None:
    """A time (ms) duetime wrote; None for none or garbage (the checker reports it)."""
    try:
        number = float(_text(value)) if value is not None else math.nan
    except ValueError:
        return None
    return number if math.isfinite(number) else None


_COUNT = re.compile(r"-?[0-9]{1,18}")


def count_or_none(value: bytes | str | None) -> int | None:
    """A counter duetime wrote as a decimal integer; None for anything else (garbage
    written by hand), so one bad value is reported rather than failing the whole read."""
    if value is None:
        return None
    text = _text(value)
    return int(text) if _COUNT.fullmatch(text) else None


def _durably(calls: EvalMany, durability: Durability) -> Plan[list[Any]]:
    """Run ``calls`` and wait for the confirmation; NotDurableError (carrying the calls'
    replies) when it falls short in time: the write is on the master, but a failover
    (or, with fsync, a crash) may or may not keep it."""
    replies, confirmations = yield Durably(calls, durability)
    confirmed, shortfall = durability.shortfall(confirmations)
    if shortfall is not None:
        raise NotDurableError(confirmed, durability.replicas, shortfall, replies)
    return list(replies)


def sample_clock(clock: Clock, route: str) -> Plan[None]:
    """Take one TIME sample for the clock, from the server that holds ``route``."""
    sent = time.monotonic()
    seconds, micros = yield Command(("TIME",), route=route)
    # Microseconds kept: flooring here and again in now_ms() made the estimate trail by ~1 ms.
    clock.observe(int(seconds) * 1000 + int(micros) / 1000, time.monotonic() - sent)


def current_time(clock: Clock, route: str) -> Plan[int]:
    """The server time in ms, sampling TIME only when the clock asks for it."""
    now = clock.now_ms()
    while now is None:
        yield from sample_clock(clock, route)
        now = clock.now_ms()
    return now


@dataclass(frozen=True, slots=True)
class RegisteredQueue:
    name: str
    shards: int
    seen_ms: int  # when a dispatcher last started for it (server clock)


def register_queues(layouts: Sequence[QueueLayout]) -> Plan[None]:
    """Note the queues a dispatcher serves, so that they can be listed."""
    seconds, micros = yield Command(("TIME",), route=QUEUE_REGISTRY)
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    fields = [part for layout in layouts for part in (layout.queue, f"{layout.count} {now_ms}")]
    yield Command(("HSET", QUEUE_REGISTRY, *fields))


def registered_queues() -> Plan[list[RegisteredQueue]]:
    """The queues dispatchers noted, by name; an entry written by hand that does not
    parse is left out."""
    reply = yield Command(("HGETALL", QUEUE_REGISTRY))
    if isinstance(reply, list):  # some clients leave HGETALL as a flat list
        reply = dict(zip(reply[::2], reply[1::2], strict=True))
    found = []
    for name, value in reply.items():
        shards, _, seen = _text(value).partition(" ")
        if shards.isdigit() and seen.isdigit():
            found.append(RegisteredQueue(_text(name), int(shards), int(seen)))
    return sorted(found, key=lambda queue: queue.name)


def shard_operations(
    layout: QueueLayout, clock: Clock | None, resync_interval: float
) -> list[QueueOperations]:
    """The operations of each shard of a queue. With a clock given they all follow it;
    otherwise each follows a clock of its own: on a cluster, shards live on different
    masters, and a shard's "now" is the TIME of the server that holds it."""
    return [QueueOperations(keys, clock or ServerClock(resync_interval)) for keys in layout.shards]


def _wire_id(task_id: str) -> str | bytes:
    """An id as it goes inside a packed argument: one that is not ASCII as its bytes
    (surrogateescape, as the runner sends text), so an id read back from Redis is
    written as it came."""
    return task_id if task_id.isascii() else task_id.encode("utf-8", "surrogateescape")


def _packed(flat: list[Any]) -> bytes:
    """Many script arguments as one msgpack array, which Lua reads with cmsgpack.unpack.
    Without bin types: the cmsgpack of Redis's Lua predates them (it refuses bin 8), and
    text and bytes alike arrive in Lua as strings."""
    return codec.packed(flat, use_bin_type=False)


def _microseconds(run_at_ms: float) -> str:
    """A run-at as the text of whole µs, as the delayed buckets keep it (scripts hand it
    to the server as it is: a number given to a command from Lua is formatted slowly)."""
    return str(whole_microseconds(run_at_ms))


def store_tasks(
    groups: Sequence[tuple[QueueOperations, Sequence[ScriptCall]]],
    durability: Durability | None = None,
) -> Plan[list[list[int]]]:
    """Run schedule_tasks calls (of one queue or of several shards, each group with the
    operations that made it) in one round trip (with ``durability``, the replicas'
    confirmation is waited for in the same round trip). For each group, the positions
    (from 0, in the order its calls write them) of the tasks not created: their id was
    live. Calls made on demand are made as they are sent."""
    calls = [(group, index) for group, (_, made) in enumerate(groups) for index in range(len(made))]
    script_calls = MadeOnDemand(len(calls), lambda n: groups[calls[n][0]][1][calls[n][1]])
    if durability is not None:
        try:
            replies = yield from _durably(
                EvalMany(scripts.SCHEDULE_TASKS, script_calls), durability
            )
        except NotDurableError as error:
            if isinstance(error.reply, list):  # written: note the generations all the same
                for (group, _), reply in zip(calls, error.reply, strict=True):
                    groups[group][0].refused(reply)
            raise
    elif len(calls) == 1:  # a plain call costs less than a pipeline of one
        replies = [(yield Eval(scripts.SCHEDULE_TASKS, *script_calls[0]))]
    else:
        replies = yield EvalMany(scripts.SCHEDULE_TASKS, script_calls)
    refused: list[list[int]] = [[] for _ in groups]
    written = [0] * len(groups)  # tasks of each group in its calls so far
    for (group, _), reply in zip(calls, replies, strict=True):
        refused[group] += [written[group] + p for p in groups[group][0].refused(reply)]
        written[group] += int(reply[1])
    return refused


class QueueOperations:
    """The plans of one queue (or of one shard of a sharded queue)."""

    def __init__(self, keys: QueueKeys, clock: Clock) -> None:
        self.keys = keys
        self.clock = clock
        #: The generation of delayed buckets new tasks go to, as last heard from the
        #: server (None: not yet asked). See schedule_tasks.lua.
        self.generation: int | None = None
        #: The earliest delayed buckets, with their earliest run-at, as the last promotion
        #: saw them: the next one passes the keys of those due.
        self._earliest_buckets: list[tuple[str, float]] = []
        self._schedule_keys = (
            keys.tasks, keys.scheduled, keys.ready, keys.wake, keys.stats, keys.delayed,
            keys.delayed_layout,
        )  # fmt: skip

    def now(self) -> Plan[int]:
        return (yield from current_time(self.clock, self.keys.tasks))

    def refresh_clock(self) -> Plan[None]:
        """Resample the server clock if it is due, so hot paths need not."""
        if self.clock.wants_sample():
            yield from sample_clock(self.clock, self.keys.tasks)

    # --- producing -------------------------------------------------------------------

    def learn_generation(self) -> Plan[None]:
        """Ask for the generation of delayed buckets, if it is not known yet."""
        if self.generation is None:
            stored = yield Command(("HGET", self.keys.delayed_layout, "generation"))
            number = count_or_none(stored)
            # Garbage (written by hand) reads as the last generation, as in the scripts.
            in_range = number is not None and 0 <= number <= MAX_GENERATION
            self.generation = 0 if stored is None else number if in_range else MAX_GENERATION

    def schedule_calls(
        self, now: int, items: Sequence[NewTask], envelope: Callable[[Any, float], bytes]
    ) -> tuple[Sequence[ScriptCall], list[int]]:
        """The schedule_tasks calls storing tasks, one per SCHEDULE_BATCH items, and the
        positions of the items in the order they are written. The calls are made on
        demand, each task's envelope with them: ``envelope(source, run_at_ms)``, from
        the last element of its item. ``now`` must come from this queue's own server
        clock, and the generation must be known (``learn_generation``). A large call
        opens a generation with room for all its tasks (BUCKET_FILL a bucket), and writes
        them bucket by bucket: each script call then writes a few buckets, not one per
        task."""
        assert self.generation is not None
        now_us = now * 1000
        delayed = sum(1 for _, run_at_us, _ in items if run_at_us > now_us)
        wanted = math.ceil(math.log2(delayed / BUCKET_FILL)) if delayed > BUCKET_FILL else 0
        generation = min(MAX_GENERATION, max(self.generation, wanted))
        mask = (1 << generation) - 1
        buckets = [id_hash(task_id) & mask for task_id, _, _ in items]
        order = list(range(len(items)))
        if len(items) > SCHEDULE_BATCH:  # stable: a repeated id keeps its first place
            order.sort(key=buckets.__getitem__)

        def call(number: int) -> ScriptCall:
            keys = list(self._schedule_keys)
            where: dict[int, int] = {}  # bucket -> its index in KEYS (from 1)
            flat: list[Any] = []
            start = number * SCHEDULE_BATCH
            for position in order[start : start + SCHEDULE_BATCH]:
                task_id, run_at_us, source = items[position]
                run_at_ms = milliseconds_not_below(run_at_us)  # the envelope's, to the µs
                if (index := where.get(bucket := buckets[position])) is None:
                    keys.append(self.keys.delayed_bucket(f"{generation}:{bucket}"))
                    index = where[bucket] = len(keys)
                flat += (_wire_id(task_id), run_at_ms, envelope(source, run_at_ms), index,
                         str(run_at_us))  # fmt: skip
            return keys, [now, _packed(flat), generation]

        return MadeOnDemand(-(-len(order) // SCHEDULE_BATCH), call), order

    def schedule_call(
        self, now: int, task_id: str, run_at_ms: float, envelope: bytes, run_at_us: int
    ) -> Eval:
        """The schedule_task call storing one task, in the generation known (see
        ``refused`` for its reply, ``store_tasks`` for many, durable or in several
        shards)."""
        assert self.generation is not None
        name = bucket_name(task_id, self.generation)
        keys = (*self._schedule_keys, self.keys.delayed_bucket(name))
        arguments = (now, task_id, run_at_ms, envelope, str(run_at_us), self.generation)
        return Eval(scripts.SCHEDULE_TASK, keys, arguments)

    def refused(self, reply: list[Any]) -> list[int]:
        """A schedule_tasks (or schedule_task) reply: the positions (from 0) of the tasks
        not created, their id already live; notes the generation of delayed buckets it
        names."""
        generation, _, refused = reply
        self.generation = int(generation)
        return [int(position) - 1 for position in refused]

    def _bucket_keys(self, task_id: str, generation: int) -> list[str]:
        """A task's delayed bucket in every generation up to ``generation``."""
        return [self.keys.delayed_bucket(bucket_name(task_id, g)) for g in range(generation + 1)]

    def _looked_up(self, task_id: str, lookup: Callable[[int, list[str]], Eval]) -> Plan[Any]:
        """Run a lookup script of one task given the generation of delayed buckets and
        the task's bucket in each one up to it; again when the script answers that the
        generation is another (with an integer, before it touches any bucket). An
        unknown generation is sent as -1, with no buckets."""
        for _ in range(GENERATION_ROUNDS):
            generation = -1 if self.generation is None else self.generation
            buckets = self._bucket_keys(task_id, generation) if generation >= 0 else []
            reply = yield lookup(generation, buckets)
            if not isinstance(reply, int):
                return reply
            self.generation = reply
        raise CorruptStateError(
            f"the generation of delayed buckets of {self.keys.queue!r} keeps changing "
            f"(now {self.generation}); is something rewriting {self.keys.delayed_layout}?"
        )

    def occupied(self) -> Plan[bool]:
        """Whether the queue holds any task or cron job (one command)."""
        k = self.keys
        found = yield Command(("EXISTS", k.tasks, k.scheduled, k.ready, k.dead, k.cron, k.delayed))
        return int(found) > 0

    def envelopes(self, task_ids: Sequence[str]) -> Plan[list[bytes | None]]:
        """The stored envelope of each id (None where there is none), in one command."""
        stored: list[bytes | None] = yield Command(("HMGET", self.keys.tasks, *task_ids))
        return stored

    def cancel(self, task_id: str) -> Plan[TaskState | None]:
        k = self.keys
        fixed = (k.tasks, k.scheduled, k.ready, k.dead, k.attempts, k.errors, k.stats, k.early,
                 k.delayed, k.delayed_layout)  # fmt: skip
        place = yield from self._looked_up(
            task_id,
            lambda generation, buckets: Eval(
                scripts.CANCEL_TASK, (*fixed, *buckets), (task_id, generation)
            ),
        )
        return TaskState(_text(place)) if place else None

    def reschedule(
        self, task_id: str, run_at_ms: float, rewrite: Callable[[bytes, float], bytes]
    ) -> Plan[RescheduleOutcome | None]:
        """Move a waiting task to ``run_at_ms``, or to now if that is earlier (as when
        scheduling: its lateness counts from the move); ``rewrite(envelope, run_at_ms)``
        makes the new envelope from the current one. Compare-and-set: retried if the
        envelope changes meanwhile."""
        k = self.keys
        fixed = (k.tasks, k.scheduled, k.ready, k.dead, k.wake, k.early, k.delayed,
                 k.delayed_layout)  # fmt: skip
        while True:
            current = yield Command(("HGET", k.tasks, task_id))
            if current is None:
                return None
            now = yield from self.now()
            due_ms = max(run_at_ms, now)
            arguments = (now, task_id, due_ms, current, rewrite(current, due_ms))
            due_us = _microseconds(due_ms)
            outcome = yield from self._looked_up(
                task_id,
                lambda generation, buckets, head=arguments, us=due_us: Eval(  # type: ignore[misc]
                    scripts.RESCHEDULE_TASK, (*fixed, *buckets), (*head, generation, us)
                ),
            )
            if not outcome:
                return None
            if (result := RescheduleOutcome(_text(outcome))) != RescheduleOutcome.CHANGED:
                return result

    def status(self, task_id: str) -> Plan[StatusReply]:
        k = self.keys
        fixed = (k.tasks, k.scheduled, k.ready, k.dead, k.attempts, k.errors, k.result(task_id),
                 k.delayed_layout)  # fmt: skip
        state, score, attempts, error, envelope, result = yield from self._looked_up(
            task_id,
            lambda generation, buckets: Eval(
                scripts.TASK_STATUS, (*fixed, *buckets), (task_id, generation)
            ),
        )
        return StatusReply(
            TaskState(_text(state)), _score(score), count_or_none(attempts or b"0"),
            error, envelope, result,
        )  # fmt: skip

    def wait_result(self, task_id: str, timeout: float) -> Plan[bytes | None]:
        """Block until the task's result exists (without consuming it), up to ``timeout``."""
        key = self.keys.result(task_id)
        # BLMOVE from a list to itself rotates its single element: a non-destructive wait.
        blob: bytes | None = yield Command(
            ("BLMOVE", key, key, "LEFT", "LEFT", timeout), block=timeout
        )
        return blob

    # --- dispatching -----------------------------------------------------------------

    def promote_due(self, limit: int, ahead_ms: int = 0, stage_ms: int = 0) -> Plan[Promotion]:
        """Move tasks due by now + ``ahead_ms`` to ready (those not yet due are waited
        for by the worker that claims them), and stage delayed tasks due by now +
        ``stage_ms`` from their buckets into scheduled; ``limit`` bounds both together."""
        now = yield from self.now()
        k = self.keys
        upto = now + ahead_ms
        stage_upto = max(upto, now + stage_ms)
        fixed = (k.scheduled, k.ready, k.leases, k.stats, k.workers, k.cron_next, k.early,
                 k.reaped, k.delayed, k.delayed_layout)  # fmt: skip
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
                (_text(earliest[i]), float(earliest[i + 1]) / 1000)
                for i in range(0, len(earliest), 2)
            ]
        return Promotion(
            moved, now, _score(next_due), _whole_score(next_lease), _whole_score(oldest_beat),
            _whole_score(next_tick), _whole_score(next_look), staged,
            min((earliest for _, earliest in self._earliest_buckets), default=None),
        )  # fmt: skip

    def check_fsync(self) -> Plan[None]:
        """ConfigurationError unless this queue's server can confirm fsyncs (WAITAOF,
        with appendonly on), as durable_fsync needs. Waits a millisecond at most."""
        reply = yield Command(("WAITAOF", 1, 0, 1), route=self.keys.tasks, refusal_as_reply=True)
        if isinstance(reply, RedisCommandError):
            raise ConfigurationError(
                f"durable_fsync cannot be used: {reply}. It needs WAITAOF (Redis or Valkey "
                "7.2 and later) and appendonly yes on the master; change the server, or turn "
                "durable_fsync off"
            )

    def eviction_policy(self) -> Plan[str]:
        reply = yield Command(("CONFIG", "GET", "maxmemory-policy"), route=self.keys.tasks)
        values = list(reply.values()) if isinstance(reply, dict) else reply[1::2]
        return _text(values[0]) if values else "unknown"

    def minute_figures(self) -> Plan[dict[str, int]]:
        """The per-minute figures ("<minute>:<figure>" -> count); garbage is left out."""
        reply = yield Command(("HGETALL", self.keys.minutes))
        if isinstance(reply, list):  # some clients leave HGETALL as a flat list
            reply = dict(zip(reply[::2], reply[1::2], strict=True))
        figures = {}
        for name, value in reply.items():
            if (count := count_or_none(value)) is not None:
                figures[_text(name)] = count
        return figures

    def trim_minutes(self, oldest_kept: int) -> Plan[int]:
        """Drop the per-minute figures of minutes before ``oldest_kept`` (and garbage)."""
        fields = yield Command(("HKEYS", self.keys.minutes))
        old = []
        for raw in fields:
            minute, _, _ = _text(raw).partition(":")
            if not minute.isdigit() or int(minute) < oldest_kept:
                old.append(raw)
        if old:
            yield Command(("HDEL", self.keys.minutes, *old))
        return len(old)

    def set_paused(self, paused: bool) -> Plan[bool]:
        """Pause the queue (workers claim nothing; scheduling and promotion go on) or
        resume it, waking the paused workers. True when this changed the state."""
        k = self.keys
        if paused:
            created, _ = yield Batch(
                (Command(("SET", k.paused, "1", "NX")), Command(("DEL", k.resumed))),
                transaction=True,
            )
            return bool(created)
        removed, _, _ = yield Batch(
            (
                Command(("DEL", k.paused)),
                Command(("DEL", k.resumed)),
                Command(("RPUSH", k.resumed, "1")),
            ),
            transaction=True,
        )
        return bool(removed)

    def is_paused(self) -> Plan[bool]:
        return bool((yield Command(("EXISTS", self.keys.paused))))

    def wait_resumed(self, timeout: float) -> Plan[bool]:
        """Block until the queue is resumed, up to ``timeout`` seconds; every paused
        worker wakes (the element stays: BLMOVE from the list to itself)."""
        key = self.keys.resumed
        reply = yield Command(("BLMOVE", key, key, "LEFT", "LEFT", timeout), block=timeout)
        return reply is not None

    def wait_wake(self, timeout: float) -> Plan[bool]:
        """Block until someone signals an earlier due time, up to ``timeout`` seconds."""
        reply = yield Command(("BLPOP", self.keys.wake, timeout), block=timeout)
        return reply is not None

    def reap_expired_leases(self, limit: int) -> Plan[int]:
        """Re-enter tasks whose lease ran out. Reads the expired leases, then moves them
        in one script that checks each deadline again."""
        now = yield from self.now()
        k = self.keys
        members = yield Command(("ZRANGE", k.leases, "-inf", now, "BYSCORE", "LIMIT", 0, limit))
        if not members:
            return 0
        active_keys: dict[str, int] = {}
        args: list[Any] = [now]
        for raw in members:
            member = _text(raw)
            worker_id, _ = split_lease_member(member)
            index = active_keys.setdefault(k.active(worker_id), 7 + len(active_keys))
            args += (member, index)
        return int(
            (
                yield Eval(
                    scripts.REAP_EXPIRED_LEASES,
                    (k.leases, k.scheduled, k.wake, k.stats, k.tasks, k.early, *active_keys),
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
        now = yield from self.now()
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
        now = yield from self.now()
        stale_before = now - worker_ttl_ms
        stale = yield Command(("ZRANGE", self.keys.workers, "-inf", stale_before, "BYSCORE"))
        total = 0
        for raw in stale:
            reaped = yield from self.reap_worker(_text(raw), stale_before, look_again_in_ms)
            total += max(0, reaped)
        return total

    def look_at_reaped(self, worker_ttl_ms: int) -> Plan[int]:
        """Look once more at the lists of workers reaped a block's length ago: an id that
        a pending BLMOVE moved there after the reap is re-entered now. A worker that came
        back meanwhile (heartbeated within ``worker_ttl_ms``) keeps its list."""
        now = yield from self.now()
        due = yield Command(("ZRANGE", self.keys.reaped, "-inf", now, "BYSCORE", "LIMIT", 0, 100))
        total = 0
        for raw in due:
            total += max(0, (yield from self.reap_worker(_text(raw), now - worker_ttl_ms)))
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
                worker_id = k.worker_of_active(_text(raw))
                orphans.append(worker_id)
            if int(cursor) == 0:
                break
        total = 0
        for worker_id in orphans:
            registered = yield Command(("ZSCORE", k.workers, worker_id))
            if registered is None:
                total += max(0, (yield from self.reap_worker(worker_id, 0)))
        return total

    # --- working ---------------------------------------------------------------------

    def take_ready(self, worker_id: str, timeout: float) -> Plan[str | None]:
        """Block until a task id is ready and move it into the worker's processing list."""
        k = self.keys
        reply = yield Command(
            ("BLMOVE", k.ready, k.active(worker_id), "LEFT", "RIGHT", timeout), block=timeout
        )
        return None if reply is None else _text(reply)

    def give_back(self, worker_id: str, task_id: str) -> Plan[bool]:
        """Put an id taken by BLMOVE, not yet leased, back at the head of ready."""
        k = self.keys
        keys = (k.active(worker_id), k.ready, k.tasks, k.stats)
        return bool((yield Eval(scripts.GIVE_BACK_TASK, keys, (task_id,))))

    def claim(
        self, worker_id: str, lease_ms: int, most: int, taken: Sequence[str] = ()
    ) -> Plan[list[Claimed] | None]:
        """Lease the ids already ``taken`` by BLMOVE plus up to ``most`` more from ready.
        None while the queue is paused: nothing is leased, the taken ids are back at
        the head of ready."""
        now = yield from self.now()
        k = self.keys
        reply = yield Eval(
            scripts.CLAIM_TASKS,
            (k.ready, k.active(worker_id), k.leases, k.attempts, k.tasks, k.workers, k.early,
             k.paused, k.stats),
            (now, now + lease_ms, worker_id, most, *taken),
        )  # fmt: skip
        if not isinstance(reply, list):
            return None
        return [
            Claimed(
                _text(reply[i]), int(reply[i + 1]), reply[i + 2], _score(reply[i + 3]),
                _text(reply[i + 4]) if reply[i + 4] else None,
            )
            for i in range(0, len(reply), 5)
        ]  # fmt: skip

    def heartbeat(
        self,
        worker_id: str,
        lease_ms: int,
        running: Sequence[tuple[str, int]],
        fenced_outcomes: int = 0,
    ) -> Plan[HeartbeatReply]:
        """Prove the worker alive and renew its running attempts' leases; also adds the
        outcomes the worker dropped itself (fenced) to the queue's counter."""
        now = yield from self.now()
        k = self.keys
        args: list[Any] = [now, now + lease_ms, worker_id, fenced_outcomes]
        for task_id, attempt in running:
            args += (task_id, attempt)
        known, lost, held = yield Eval(
            scripts.HEARTBEAT, (k.workers, k.leases, k.attempts, k.active(worker_id), k.stats), args
        )
        return HeartbeatReply(
            bool(known),
            [(_text(lost[i]), int(lost[i + 1])) for i in range(0, len(lost), 2)],
            [_text(i) for i in held],
        )

    def ack(
        self, worker_id: str, outcomes: Sequence[Outcome], durability: Durability | None = None
    ) -> Plan[list[bool]]:
        now = yield from self.now()
        k = self.keys
        keys = [k.active(worker_id), k.leases, k.attempts, k.tasks, k.errors, k.stats, k.minutes]
        flat: list[Any] = []
        for outcome in outcomes:
            flat += (_wire_id(outcome.task_id), outcome.attempt, outcome.result_ttl_ms,
                     outcome.result, outcome.lateness_us)  # fmt: skip
            if outcome.result_ttl_ms > 0:
                keys.append(k.result(outcome.task_id))
        # One msgpack argument, not five per outcome: redis-py packs arguments one by one,
        # which cost the worker more per task than the rest of its ack.
        args: list[Any] = [now, worker_id, _packed(flat)]
        if durability is not None:
            [flags] = yield from _durably(EvalMany(scripts.ACK_TASKS, [(keys, args)]), durability)
        else:
            flags = yield Eval(scripts.ACK_TASKS, keys, args)
        return [bool(flag) for flag in flags]

    def fail(
        self,
        worker_id: str,
        task_id: str,
        attempt: int,
        error: bytes,
        retry_delay_ms: int | None,
        result_ttl_ms: int = 0,
        result: bytes = b"",
    ) -> Plan[bool]:
        """Record a failed attempt: retry ``retry_delay_ms`` from now (server clock), or
        move the task to dead when it is None."""
        now = yield from self.now()
        k = self.keys
        applied = yield Eval(
            scripts.FAIL_TASK,
            (
                k.active(worker_id), k.leases, k.attempts, k.errors, k.scheduled,
                k.dead, k.wake, k.stats, k.result(task_id), k.minutes, k.early,
            ),
            (now, worker_id, task_id, attempt, error,
             -1 if retry_delay_ms is None else now + retry_delay_ms, result_ttl_ms, result),
        )  # fmt: skip
        return bool(applied)

    def release_worker(
        self, worker_id: str, look_again_in_ms: int, fenced_outcomes: int = 0
    ) -> Plan[int]:
        """Hand the worker's tasks back and deregister it; its list is looked at once
        more ``look_again_in_ms`` later (a BLMOVE cut off by the stop may land there).
        ``fenced_outcomes``: outcomes it dropped itself, not yet counted."""
        now = yield from self.now()
        k = self.keys
        return int(
            (
                yield Eval(
                    scripts.RELEASE_WORKER,
                    (
                        k.workers,
                        k.active(worker_id),
                        k.leases,
                        k.attempts,
                        k.ready,
                        k.stats,
                        k.reaped,
                        k.tasks,
                        k.early,
                    ),
                    (worker_id, now + look_again_in_ms, fenced_outcomes, now),
                )
            )
        )

    # --- cron ------------------------------------------------------------------------

    def declare_cron(self, name: str, definition: bytes, first_tick_ms: int) -> Plan[int]:
        """0 unchanged, 1 created, 2 updated."""
        k = self.keys
        keys = (k.cron, k.cron_next, k.wake)
        return int((yield Eval(scripts.DECLARE_CRON, keys, (name, definition, first_tick_ms))))

    def set_cron_next(self, name: str, next_tick_ms: int | None) -> Plan[bool]:
        """Resume a cron job from ``next_tick_ms``, or pause it with None."""
        k = self.keys
        tick = -1 if next_tick_ms is None else next_tick_ms
        keys = (k.cron, k.cron_next, k.cron_held, k.wake)
        return bool((yield Eval(scripts.SET_CRON_NEXT, keys, (name, tick))))

    def remove_cron(self, name: str) -> Plan[bool]:
        k = self.keys
        keys = (k.cron, k.cron_next, k.cron_last, k.cron_held)
        return bool((yield Eval(scripts.REMOVE_CRON, keys, (name,))))

    def cron_table(self) -> Plan[CronTable]:
        """Every cron job's definition, next tick, last tick task id and held tick."""
        k = self.keys
        definitions, next_ticks, last, held = yield Batch(
            (
                Command(("HGETALL", k.cron)),
                Command(("ZRANGE", k.cron_next, 0, -1, "WITHSCORES")),
                Command(("HGETALL", k.cron_last)),
                Command(("HGETALL", k.cron_held)),
            )
        )
        return CronTable(
            {_text(n): blob for n, blob in _pairs(definitions)},
            {_text(n): int(float(s)) for n, s in _pairs(next_ticks)},
            {_text(n): _text(i) for n, i in _pairs(last)},
            # A held tick that is not a number is garbage; the job shows as not held.
            {_text(n): t for n, raw in _pairs(held) if (t := count_or_none(raw)) is not None},
        )

    def due_cron(self, now_ms: int, limit: int) -> Plan[list[DueCron]]:
        """Cron jobs whose next tick has come: name, the score read, definition, held tick."""
        k = self.keys
        flat = yield Command(
            ("ZRANGE", k.cron_next, "-inf", now_ms, "BYSCORE", "WITHSCORES", "LIMIT", 0, limit)
        )
        if not flat:
            return []
        names = [_text(flat[i]) for i in range(0, len(flat), 2)]
        definitions, held = yield Batch(
            (Command(("HMGET", k.cron, *names)), Command(("HMGET", k.cron_held, *names)))
        )
        due = []
        for i, name in enumerate(names):
            held_tick = count_or_none(held[i])
            problem = None
            if held[i] is not None and held_tick is None:
                problem = f"its held tick is not a number: {_text(held[i])[:40]!r}"
            due.append(
                DueCron(name, int(float(flat[2 * i + 1])), definitions[i], held_tick, problem)
            )
        return due

    def fire_cron(
        self,
        name: str,
        expected_next_ms: int,
        following_ms: int | None,
        overlap: str,
        retry_at_ms: int,
        held_tick_ms: int,
        ticks: Sequence[tuple[str, int, bytes]],
    ) -> Plan[CronFireOutcome | int]:
        """Enqueue due ticks and advance the job (compare-and-set on its next tick):
        the number of ticks enqueued, or why none was."""
        k = self.keys
        args: list[Any] = [name, expected_next_ms, -1 if following_ms is None else following_ms,
                           overlap, retry_at_ms, held_tick_ms]  # fmt: skip
        for task_id, run_at_ms, envelope in ticks:
            args += (task_id, run_at_ms, envelope)
        keys = (k.cron_next, k.cron_last, k.cron_held, k.tasks, k.ready, k.stats)
        reply = yield Eval(scripts.FIRE_CRON, keys, args)
        return reply if isinstance(reply, int) else CronFireOutcome(_text(reply))

    # --- dead letters ----------------------------------------------------------------

    def listed(self, state: TaskState, count: int) -> Plan[list[Listed]]:
        """The first ``count`` task ids in one state, in the order they will be served:
        scheduled by run-at, ready from the head, running by lease deadline, dead most
        recent first; with what the queue keeps about each."""
        k = self.keys
        entries: list[tuple[str, float | None, str | None]] = []  # id, score, worker
        if state == TaskState.READY:
            ids = yield Command(("LRANGE", k.ready, 0, count - 1))
            entries = [(_text(task_id), None, None) for task_id in ids]
        elif state == TaskState.SCHEDULED:
            entries = [(i, score, None) for i, score in (yield from self._earliest(count))]
        else:
            key, order = {
                TaskState.RUNNING: (k.leases, ()),
                TaskState.DEAD: (k.dead, ("REV",)),
            }[state]
            flat = yield Command(("ZRANGE", key, 0, count - 1, *order, "WITHSCORES"))
            for i in range(0, len(flat), 2):
                member, score = _text(flat[i]), float(flat[i + 1])
                if state == TaskState.RUNNING:
                    worker, task_id = split_lease_member(member)
                    entries.append((task_id, score, worker))
                else:
                    entries.append((member, score, None))
        if not entries:
            return []
        ids = [task_id for task_id, _, _ in entries]
        envelopes, attempts, errors = yield Batch(
            (
                Command(("HMGET", k.tasks, *ids)),
                Command(("HMGET", k.attempts, *ids)),
                Command(("HMGET", k.errors, *ids)),
            )
        )
        return [
            Listed(task_id, state, score, worker, envelopes[i], count_or_none(attempts[i]),
                   errors[i])
            for i, (task_id, score, worker) in enumerate(entries)
        ]  # fmt: skip

    def _earliest(self, count: int) -> Plan[list[tuple[str, float]]]:
        """The ``count`` scheduled tasks due first (id, due time), from the retries and
        re-entered tasks and the delayed buckets merged: the index is read in order, and
        only buckets whose earliest task may still be among the first ``count`` are read."""
        k = self.keys
        flat = yield Command(("ZRANGE", k.scheduled, 0, count - 1, "WITHSCORES"))
        found = [(_text(flat[i]), float(flat[i + 1])) for i in range(0, len(flat), 2)]
        start = 0
        while True:  # the buckets and their index keep µs
            page = yield Command(("ZRANGE", k.delayed, start, start + 63, "WITHSCORES"))
            bar = found[count - 1][1] if len(found) >= count else math.inf
            wanted = [
                _text(page[i]) for i in range(0, len(page), 2) if float(page[i + 1]) / 1000 <= bar
            ]
            if wanted:
                buckets = yield Batch(
                    tuple(
                        Command(("ZRANGE", k.delayed_bucket(name), 0, count - 1, "WITHSCORES"))
                        for name in wanted
                    )
                )
                for flat in buckets:
                    found += [
                        (_text(flat[i]), float(flat[i + 1]) / 1000) for i in range(0, len(flat), 2)
                    ]
                found.sort(key=lambda entry: (entry[1], entry[0]))
                del found[count:]
            if len(wanted) < len(page) // 2 or len(page) < 128:
                return found  # the index is in order: the buckets after start later still
            start += 64

    def dead_entries(self, offset: int, count: int) -> Plan[list[DeadEntry]]:
        """Dead tasks, most recent death first."""
        k = self.keys
        flat = yield Command(("ZRANGE", k.dead, offset, offset + count - 1, "REV", "WITHSCORES"))
        ids = [_text(flat[i]) for i in range(0, len(flat), 2)]
        if not ids:
            return []
        envelopes, errors = yield Batch(
            (Command(("HMGET", k.tasks, *ids)), Command(("HMGET", k.errors, *ids)))
        )
        return [
            DeadEntry(task_id, int(float(flat[2 * i + 1])), envelopes[i], errors[i])
            for i, task_id in enumerate(ids)
        ]

    def requeue_dead(self, task_ids: Sequence[str]) -> Plan[int]:
        now = yield from self.now()
        k = self.keys
        keys = (k.dead, k.attempts, k.errors, k.ready, k.stats, k.early)
        return int((yield Eval(scripts.REQUEUE_DEAD, keys, (now, *task_ids))))

    def purge_dead(
        self,
        task_ids: Sequence[str] = (),
        died_before_ms: int = -1,
        keep_at_most: int = -1,
        limit: int = 1000,
    ) -> Plan[int]:
        k = self.keys
        return int(
            (
                yield Eval(
                    scripts.PURGE_DEAD,
                    (k.dead, k.tasks, k.attempts, k.errors),
                    (died_before_ms, keep_at_most, limit, *task_ids),
                )
            )
        )

    def dead_ids(self, count: int) -> Plan[list[str]]:
        return [_text(i) for i in (yield Command(("ZRANGE", self.keys.dead, 0, count - 1)))]

    # --- observing -------------------------------------------------------------------

    def counts(self) -> Plan[dict[str, Any]]:
        now = yield from self.now()
        k = self.keys
        (scheduled, ready, leases, dead, workers, head, stats, paused, ready_head, delayed,
         bucket_head) = yield Batch(
            (
                Command(("ZCARD", k.scheduled)),
                Command(("LLEN", k.ready)),
                Command(("ZCARD", k.leases)),
                Command(("ZCARD", k.dead)),
                Command(("ZRANGE", k.workers, "-inf", "+inf", "BYSCORE", "WITHSCORES")),
                Command(("ZRANGE", k.scheduled, 0, 0, "WITHSCORES")),
                Command(("HGETALL", k.stats)),
                Command(("EXISTS", k.paused)),
                Command(("LINDEX", k.ready, 0)),
                Command(("HGET", k.delayed_layout, "tasks")),
                Command(("ZRANGE", k.delayed, 0, 0, "WITHSCORES")),
            )
        )  # fmt: skip
        if bucket_head and (not head or float(bucket_head[1]) / 1000 < float(head[1])):
            head = [bucket_head[0], float(bucket_head[1]) / 1000]  # the index is in µs
        if isinstance(stats, list):  # some clients leave HGETALL as a flat list
            stats = dict(zip(stats[::2], stats[1::2], strict=True))
        # The oldest ready task (the head: workers take from the left): its run-at, and
        # the time it is due from when that is later (a retry, requeue or re-entry).
        ready_head_envelope = ready_head_due = None
        if ready_head is not None:
            ready_head_envelope, ready_head_due = yield Batch(
                (Command(("HGET", k.tasks, ready_head)), Command(("HGET", k.early, ready_head)))
            )
        return {
            "paused": bool(paused),
            "ready_head_envelope": ready_head_envelope,
            "ready_head_due_ms": _ms_or_none(ready_head_due),
            "now_ms": now,
            # A count of the buckets' tasks that is not a number (garbage) counts as 0;
            # the checker reports it.
            "scheduled": int(scheduled) + max(0, count_or_none(delayed) or 0),
            "ready": int(ready),
            "running": int(leases),
            "dead": int(dead),
            "workers": {
                _text(workers[i]): int(float(workers[i + 1])) for i in range(0, len(workers), 2)
            },
            "next_due_ms": int(float(head[1])) if head else None,
            # A counter that is not a number (garbage) shows as -1; the checker reports it.
            "counters": {
                _text(name): -1 if (number := count_or_none(value)) is None else number
                for name, value in stats.items()
            },
        }

    def snapshot(self) -> Plan[Snapshot]:
        """Read every structure of the queue in one MULTI/EXEC, for the invariant check."""
        now = yield from self.now()
        k = self.keys
        list_keys: set[str] = set()
        bucket_keys: list[str] = []
        result_keys: list[str] = []
        stray: list[str] = []
        fixed = {k.tasks, k.scheduled, k.ready, k.leases, k.workers, k.attempts, k.errors,
                 k.dead, k.wake, k.stats, k.cron, k.cron_next, k.cron_last,
                 k.cron_held, k.early, k.reaped, k.paused, k.resumed, k.minutes,
                 k.delayed, k.delayed_layout}  # fmt: skip
        cursor: Any = 0
        while True:
            cursor, found = yield Command(
                ("SCAN", cursor, "MATCH", f"duetime:{{{k.queue}}}:*", "COUNT", 1000),
                route=k.tasks,
            )
            for raw in found:
                key = _text(raw)
                if key.startswith(k.active("")):
                    list_keys.add(key)
                elif key.startswith(k.delayed_bucket("")):
                    bucket_keys.append(key)
                elif key.startswith(k.result("")):
                    result_keys.append(key)
                elif key not in fixed:
                    stray.append(key)
            if int(cursor) == 0:
                break
        for _ in range(3):
            registered = yield Command(("ZRANGE", k.workers, 0, -1))
            active_keys = sorted(list_keys | {k.active(_text(w)) for w in registered})
            replies = yield Batch(
                (
                    Command(("HKEYS", k.tasks)),
                    Command(("ZRANGE", k.scheduled, 0, -1)),
                    Command(("LRANGE", k.ready, 0, -1)),
                    Command(("ZRANGE", k.dead, 0, -1)),
                    Command(("ZRANGE", k.leases, 0, -1, "WITHSCORES")),
                    Command(("ZRANGE", k.workers, 0, -1, "WITHSCORES")),
                    Command(("HGETALL", k.attempts)),
                    Command(("HKEYS", k.errors)),
                    Command(("LLEN", k.wake)),
                    Command(("HGETALL", k.cron)),
                    Command(("ZRANGE", k.cron_next, 0, -1)),
                    Command(("HKEYS", k.cron_last)),
                    Command(("HGETALL", k.cron_held)),
                    Command(("HGETALL", k.early)),
                    Command(("HGETALL", k.stats)),
                    Command(("ZRANGE", k.reaped, 0, -1)),
                    Command(("ZRANGE", k.delayed, 0, -1, "WITHSCORES")),
                    Command(("HGETALL", k.delayed_layout)),
                    *(Command(("LRANGE", key, 0, -1)) for key in active_keys),
                    *(Command(("PTTL", key)) for key in result_keys),
                    *(Command(("ZRANGE", key, 0, -1, "WITHSCORES")) for key in bucket_keys),
                ),
                transaction=True,
                read_only=True,
            )
            tasks, scheduled, ready, dead, leases, workers, attempts, errors, wake = replies[:9]
            cron, cron_next, cron_last, cron_held, early, stats, reaped = replies[9:16]
            delayed_index, delayed_layout = replies[16:18]
            rest = replies[18:]
            lists = rest[: len(active_keys)]
            ttls = rest[len(active_keys) : len(active_keys) + len(result_keys)]
            buckets = rest[len(active_keys) + len(result_keys) :]
            snap = Snapshot(now_ms=now)
            snap.workers = {
                _text(workers[i]): int(float(workers[i + 1])) for i in range(0, len(workers), 2)
            }
            if any(k.active(worker) not in active_keys for worker in snap.workers):
                continue  # a worker registered between the scan and the snapshot
            snap.tasks = {_text(i) for i in tasks}
            snap.scheduled = [_text(i) for i in scheduled]
            prefix = len(k.delayed_bucket(""))
            snap.delayed = {
                key[prefix:]: [(_text(name), float(score)) for name, score in _pairs(flat)]
                for key, flat in zip(bucket_keys, buckets, strict=True)
                if flat
            }
            snap.delayed_index = {
                _text(name): float(score) for name, score in _pairs(delayed_index)
            }
            snap.delayed_layout = {_text(name): value for name, value in _pairs(delayed_layout)}
            snap.ready = [_text(i) for i in ready]
            snap.dead = [_text(i) for i in dead]
            snap.leases = {
                _text(leases[i]): int(float(leases[i + 1])) for i in range(0, len(leases), 2)
            }
            snap.attempts = {_text(i): value for i, value in _pairs(attempts)}
            snap.errors = {_text(i) for i in errors}
            snap.early = {_text(i): value for i, value in _pairs(early)}
            snap.counters = {_text(name): value for name, value in _pairs(stats)}
            snap.reaped = {_text(i) for i in reaped}
            snap.wake_length = int(wake)
            snap.cron = {_text(name): blob for name, blob in _pairs(cron)}
            snap.cron_entries = {
                "cron_next": {_text(i) for i in cron_next},
                "cron_last": {_text(i) for i in cron_last},
                "cron_held": {_text(i) for i, _ in _pairs(cron_held)},
            }
            snap.cron_held = {_text(i): value for i, value in _pairs(cron_held)}
            snap.active = {
                k.worker_of_active(key): [_text(i) for i in ids]
                for key, ids in zip(active_keys, lists, strict=True)
                if ids
            }
            snap.results_without_ttl = [
                key for key, ttl in zip(result_keys, ttls, strict=True) if int(ttl) == -1
            ]
            snap.stray_keys = stray
            return snap
        raise DuetimeError("workers kept registering during the snapshot; run the check again")
