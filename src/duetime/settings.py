"""Every tunable of duetime, with its default and why, in one place."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from duetime.errors import ConfigurationError
from duetime.validation import as_float, shown

MOST_PROMOTE_AHEAD = 1.0
MOST_STAGE_AHEAD = 3600.0
#: The most tasks one promote script call moves: the batch goes through Lua's unpack(),
#: whose stack is bounded.
MOST_PROMOTE_BATCH = 5000
_DAY = 86_400.0
#: The most snoozes a task may be allowed (Settings.max_snoozes, @app.task(max_snoozes=)).
MOST_SNOOZES = 1_000_000
#: Longest duration a setting takes (100 years), as for per-task durations.
_LONGEST = 100 * 365.25 * _DAY


@dataclass(frozen=True, slots=True)
class _Range:
    """What one setting accepts: a whole number or any finite number, within bounds
    (``least`` itself is allowed only when ``least_allowed``)."""

    whole: bool
    least: float
    most: float
    least_allowed: bool = False
    why: str = ""  # said when the value is out of range

    def problem(self, value: object) -> str | None:
        kind = "an integer" if self.whole else "a number"
        number = as_float(value)
        if number is None or (self.whole and not isinstance(value, int)):
            return f"must be {kind}, got {shown(value)}"
        low_ok = number >= self.least if self.least_allowed else number > self.least
        if not (math.isfinite(number) and low_ok and number <= self.most):
            if self.whole:
                low = f"from {self.least + (0 if self.least_allowed else 1):g} to"
            else:
                low = f"{'from' if self.least_allowed else 'above'} {self.least:g} up to"
            because = f" ({self.why})" if self.why else ""
            return f"must be {kind} {low} {self.most:g}{because}, got {shown(value)}"
        return None


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True, slots=True)
class _Switch:
    """A setting that is on or off. From the environment: 1/0, true/false, yes/no, on/off."""

    def problem(self, value: object) -> str | None:
        return None if isinstance(value, bool) else f"must be true or false, got {shown(value)}"

    @staticmethod
    def parse(raw: str) -> bool | str:
        word = raw.strip().lower()
        return True if word in _TRUE else False if word in _FALSE else raw


#: The range of every setting; the reasons for the bounds are in the field comments.
_RANGES: dict[str, _Range | _Switch] = {
    "lease_duration": _Range(False, 0, _DAY),
    "heartbeat_interval": _Range(False, 0, 3600),
    "worker_ttl": _Range(False, 0, _DAY),
    "block_timeout": _Range(False, 0, 3600),
    "socket_timeout": _Range(False, 0, 3600),
    "promote_batch": _Range(True, 0, MOST_PROMOTE_BATCH, why="Lua's unpack() stack is bounded"),
    "promote_ahead": _Range(
        False, 0, MOST_PROMOTE_AHEAD, True, "a task promoted ahead holds a worker slot meanwhile"
    ),
    "stage_ahead": _Range(False, 0, MOST_STAGE_AHEAD, True),
    "claim_batch": _Range(True, 0, 10_000),
    "max_payload_bytes": _Range(True, 0, 512 * 1024 * 1024),
    "max_attempts": _Range(True, 0, 1000),
    "max_snoozes": _Range(True, 0, MOST_SNOOZES, least_allowed=True),
    "task_timeout": _Range(False, 0, _LONGEST),
    "retry_base": _Range(False, 0, _LONGEST),
    "retry_max": _Range(False, 0, _LONGEST),
    "dead_ttl": _Range(False, 0, _LONGEST),
    "dead_max": _Range(True, 0, 1_000_000_000),
    "shutdown_grace": _Range(False, 0, _DAY),
    "cancel_grace": _Range(False, 0, _DAY),
    "listen_for_cancels": _Switch(),
    "clock_resync_interval": _Range(False, 0, 3600),
    "maintenance_interval": _Range(False, 0, _DAY),
    "durable_replicas": _Range(True, 0, 100, least_allowed=True),
    "durable_timeout": _Range(False, 0, 3600),
    "durable_fsync": _Switch(),
    "metrics_port": _Range(True, 0, 65535, least_allowed=True),
    "coalesce_schedules": _Switch(),
    "freeze_startup_objects": _Switch(),
}


@dataclass(frozen=True, slots=True)
class Settings:
    """Knobs shared by the client, the dispatcher and the worker.

    Durations are in seconds. The defaults favour fast recovery on one host;
    raise ``lease_duration`` and ``worker_ttl`` where pauses (GC, swapping,
    slow networks) are longer than a few seconds.
    """

    #: How long a claimed task stays leased without renewal. A worker renews the
    #: leases of its running tasks every ``heartbeat_interval``.
    lease_duration: float = 10.0
    #: How often a worker proves it is alive and renews its leases.
    heartbeat_interval: float = 1.0
    #: A worker silent for this long is dead: its processing list is re-entered.
    worker_ttl: float = 5.0
    #: Longest a blocking call (BLMOVE, BLPOP) waits on the server before it
    #: returns, so a daemon notices shutdown and a silent connection in bounded time.
    block_timeout: float = 2.0
    #: Socket timeout for ordinary commands; a hung socket fails after this.
    socket_timeout: float = 5.0
    #: Most due tasks moved to ``ready`` (and delayed tasks staged) by one promote script
    #: call.
    promote_batch: int = 1000
    #: How long before its run-at a task may be moved to ``ready``. The worker that
    #: claims it waits on a precise local timer until the run-at, so the round trips
    #: of promoting and claiming are done before the task is due rather than after.
    #: 0 promotes at the run-at.
    promote_ahead: float = 0.005
    #: How long before its run-at a delayed task moves from its bucket into the one
    #: ``scheduled`` sorted set (staging). Buckets are picked by id, so the tasks of a
    #: burst due at one instant sit in as many buckets, and promoting them from there at
    #: the run-at costs a bucket each; staged ahead, they are promoted in one range. The
    #: dispatcher stages when the earliest bucket comes within half of this. Costs about
    #: 100 bytes more per task while staged. 0 promotes from the buckets directly.
    stage_ahead: float = 2.0
    #: Most tasks a worker claims in one script call when there is a backlog.
    claim_batch: int = 100
    #: Largest encoded task data accepted by ``schedule_task``.
    max_payload_bytes: int = 512 * 1024
    #: Attempts (first run included) before a task goes to the dead-letter set.
    max_attempts: int = 5
    #: Times a task may snooze (``Snooze``) in all; the snooze past that sends it to the
    #: dead-letter set with ``SnoozeLimitError`` (a handler that snoozes on every run
    #: would loop for ever). A handler's own ``@app.task(max_snoozes=...)`` comes first.
    max_snoozes: int = 100
    #: Seconds a single attempt may run before it is timed out and retried.
    task_timeout: float = 300.0
    #: Exponential back-off between attempts: base * 2**(attempt-1), capped, jittered.
    retry_base: float = 1.0
    retry_max: float = 600.0
    #: Dead tasks are dropped after this long, and beyond this many (oldest first).
    dead_ttl: float = 7 * 24 * 3600.0
    dead_max: int = 10_000
    #: On SIGTERM, how long running tasks may finish before they are handed back.
    shutdown_grace: float = 30.0
    #: After a running task's cancel reaches its worker, how long a plain function has to
    #: see ``current_task().cancelled`` and return (an async handler is cancelled at once,
    #: and again then) before the worker stops waiting for it and ends the task as
    #: cancelled; its lease is not renewed past that.
    cancel_grace: float = 10.0
    #: A worker listens on its queues' cancel channels (pub/sub), so that a cancel of a
    #: running task reaches it at once rather than at its next heartbeat (which stays the
    #: reliable path). False: heartbeats only (a proxy without pub/sub, an ACL without
    #: channels); one connection less per worker.
    listen_for_cancels: bool = True
    #: How often the server clock offset is re-sampled with TIME.
    clock_resync_interval: float = 5.0
    #: How often a dispatcher sweeps for orphan processing lists, trims dead tasks and
    #: drops spent records of debounce, throttle and unique keys.
    maintenance_interval: float = 30.0
    #: Durable mode: when above 0, a schedule call (and a worker's ack) returns only once
    #: this many replicas confirmed the write (WAIT), else it raises NotDurableError.
    #: Costs a replication round trip per call. 0: off (replication is asynchronous).
    durable_replicas: int = 0
    #: How long durable mode waits for the replicas' confirmation.
    durable_timeout: float = 1.0
    #: Durable mode also waits until the write is fsynced to the append-only file: on
    #: the master, and on durable_replicas replicas (WAITAOF; Redis or Valkey 7.2 and
    #: later, with appendonly yes). Off: WAIT confirms receipt by replicas, not disk.
    durable_fsync: bool = False
    #: Port of the Prometheus endpoint a dispatcher or worker process serves (one per
    #: process, shared by its daemons; on 127.0.0.1 unless $DUETIME_METRICS_ADDRESS
    #: names another address). 0: no endpoint. See docs/metrics.md.
    metrics_port: int = 0
    #: Single schedule calls to one Queue (from many threads) or AsyncQueue (from many
    #: coroutines) that arrive while one is on its way to Redis go together in the next
    #: round trip, each still getting its own id or error. False: one round trip per call.
    #: Durable calls never are (each waits for its own confirmation: ``client.queue``).
    coalesce_schedules: bool = True
    #: Once a dispatcher or worker has started, the garbage collector stops walking the
    #: objects its process holds then (one collection, then ``gc.freeze()``; once per
    #: process): modules, clients and scripts, tens of thousands of objects whose full
    #: collections otherwise stop the event loop for 10 to 20 ms, and tasks due meanwhile
    #: run that late. False: leave the collector as it is (an application that embeds a
    #: daemon and later drops cycles of objects it made before, which would then stay).
    freeze_startup_objects: bool = True

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            problem = _RANGES[field.name].problem(getattr(self, field.name))
            if problem is not None:
                raise ConfigurationError(f"setting {field.name} {problem}")
        if self.heartbeat_interval * 2 > self.lease_duration:
            raise ConfigurationError(
                "lease_duration must be at least twice heartbeat_interval, "
                "or leases expire between two renewals"
            )
        if self.heartbeat_interval * 2 > self.worker_ttl:
            raise ConfigurationError("worker_ttl must be at least twice heartbeat_interval")

    @property
    def look_again_after_reap(self) -> float:
        """Seconds after a worker is reaped or stops at which a dispatcher looks at its
        processing list once more: a BLMOVE it left pending on the server (a paused or
        cut-off worker) ends within block_timeout, plus the server's timeout tick
        (100 ms at the default hz), and may land an id there meanwhile."""
        return self.block_timeout + 1.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Defaults overridden by $DUETIME_<FIELD> variables (e.g. DUETIME_LEASE_DURATION=30).
        A value that is not a number, or out of range, raises ConfigurationError naming
        the variable."""
        environ = os.environ if environ is None else environ
        changes: dict[str, float | int | bool] = {}
        for field in dataclasses.fields(cls):
            variable = f"DUETIME_{field.name.upper()}"
            raw = environ.get(variable)
            if raw is None:
                continue
            allowed = _RANGES[field.name]
            value: float | int | bool | str = raw
            if isinstance(allowed, _Switch):
                value = allowed.parse(raw)
            else:
                with contextlib.suppress(ValueError):
                    value = int(raw) if allowed.whole else float(raw)
            problem = allowed.problem(value)
            if problem is not None:
                raise ConfigurationError(f"{variable} {problem}")
            changes[field.name] = value  # type: ignore[assignment]
        try:
            return cls(**changes)  # type: ignore[arg-type]
        except ConfigurationError as error:
            raise ConfigurationError(f"{error} (from DUETIME_* variables)") from None

    def replace(self, **changes: float | int | bool) -> Settings:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


DEFAULT_SETTINGS = Settings()
