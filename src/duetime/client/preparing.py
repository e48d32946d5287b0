"""Checking what a schedule call was given, completely, before anything is written, and
turning it into prepared tasks: ``PreparedTask``, one task checked and ready to write,
what it is made of, when it runs and the envelope it is written in.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, cast

from duetime import codec, flow, keyed, validation
from duetime.client import ids
from duetime.client.ids import new_task_id
from duetime.client.models import (
    TASK_OPTIONS,
    Duration,
    Job,
    KeyedCallOptions,
    TaskOptions,
    TaskRef,
    Timestamp,
)
from duetime.errors import InvalidInputError, InvalidNameError, InvalidOptionError
from duetime.keyed import KeyedMode
from duetime.settings import Settings

#: The options of a keyed call: looked for only when a call has options.
_KEYED_OPTIONS = frozenset({"debounce", "throttle", "unique"})
#: The options schedule_keyed takes besides a schedule call's.
_WHEN: Final = ("at", "delay")


#: One task checked and ready to write: what it is made of and when it runs, at ``AT_US``
#: (whole µs) or, when that is None, ``DELAY_MS`` from now by its shard's clock. A plain
#: tuple whose fields are named by position here and read by these names only (never by
#: a number). Not a NamedTuple: the garbage collector stops tracking a tuple of plain
#: values, not a tuple subclass, and 50,000 tracked records (a large schedule_many) made
#: it walk the heap again: bench/bench_core.py's schedule_many ran at 0.86-0.88 of this.
PreparedTask = tuple[
    str, int | None, int, str, bytes, int, int, int, bool, str, KeyedMode | None, int
]
TASK_ID: Final = 0
AT_US: Final = 1
DELAY_MS: Final = 2
TASK_NAME: Final = 3
PACKED_DATA: Final = 4
MAX_ATTEMPTS: Final = 5
TIMEOUT_MS: Final = 6
RESULT_TTL_MS: Final = 7
#: Whether duetime made the id, so that it may be replaced if it collides.
GENERATED: Final = 8
#: Its flow record: "" for none, see ``duetime.flow.flow_record``.
FLOW: Final = 9
#: Its debounce, throttle or unique mode, or None: see ``duetime.keyed``.
KEYED: Final = 10
#: How late after its run-at it may still start, ms; 0: no limit (``expires``).
EXPIRES_MS: Final = 11


def run_at_us_of(item: PreparedTask, now_ms: int) -> int:
    """When it runs, in whole µs, given its server's clock. A run-at in the past is
    stored as now: the task is due from the moment it is scheduled, and its lateness
    counts from there (a task dated 2020 is not years late), for free: no note beside
    it, no other command."""
    at_us = item[AT_US]
    now_us = now_ms * 1000
    return now_us + item[DELAY_MS] * 1000 if at_us is None else max(at_us, now_us)


def envelope_of(item: PreparedTask, run_at_ms: float) -> bytes:
    """The envelope it is written in, to run at ``run_at_ms``."""
    return codec.envelope_from_packed_data(
        item[TASK_NAME],
        item[PACKED_DATA],
        run_at_ms,
        item[MAX_ATTEMPTS],
        item[TIMEOUT_MS],
        item[RESULT_TTL_MS],
        item[EXPIRES_MS],
    )


def envelope_parts_of(item: PreparedTask) -> tuple[bytes, bytes]:
    """Its envelope cut around the run-at and the data, for a keyed script to put
    together (``codec.envelope_parts``): the head and the limits."""
    return codec.envelope_parts(
        item[TASK_NAME], item[MAX_ATTEMPTS], item[TIMEOUT_MS], item[RESULT_TTL_MS],
        item[EXPIRES_MS],
    )  # fmt: skip


def task_name_of(task: TaskRef | None) -> str:
    """The handler name a task is scheduled under, checked: a handler's registered name,
    or the name given; "" (the default handler) for None."""
    if task is None:
        return ""
    name = getattr(task, "duetime_name", task)
    if callable(name):
        shown = getattr(name, "__qualname__", None) or type(name).__name__
        raise InvalidNameError(
            f"{shown} is not registered with an App: decorate it with @app.task (the "
            "workers' App), or give the task's name"
        )
    return validation.task_name(name)


def handler_name(handler: object) -> str:
    """The registered name of the ``handler`` that ``Queue.task`` makes a handle of: a
    function registered with ``@app.task`` (a name or None carries no type to check)."""
    if not callable(handler):
        raise InvalidNameError(
            "task() takes a handler registered with @app.task (to schedule by name, pass "
            f"task= to a schedule call), got {validation.shown(handler)}"
        )
    return task_name_of(handler)


class Preparing:
    """The checks of ``QueueCore``: a call, a keyed call, a Job or a whole
    schedule_many, against the queue's settings and its defaults (``result_ttl``: the
    queue's own, None for none)."""

    def __init__(self, settings: Settings, result_ttl: float | None) -> None:
        self.settings = settings
        self.default_result_ttl_ms = (
            0 if result_ttl is None else validation.milliseconds(result_ttl, "result_ttl")
        )
        self.default_timeout_ms = round(settings.task_timeout * 1000)

    def prepare(self, job: Job, generated_id: str | None = None) -> PreparedTask:
        """Check one job completely; raises InvalidInputError before anything is written."""
        return self.prepare_fields(
            job.data,
            job.at,
            job.delay,
            job.task,
            job.id,
            job.max_attempts,
            job.timeout,
            job.result_ttl,
            generated_id,
            job.priority,
            job.limit_key,
            job.cost,
            keyed.checked_mode(job.debounce, job.throttle, job.unique, job.id),
            job.expires,
        )

    def prepare_call(
        self,
        call: str,
        data: Any,
        at: Timestamp | None,
        delay: Duration | None,
        options: TaskOptions,
    ) -> PreparedTask:
        """Check the arguments of one schedule_* call, as ``prepare`` checks a Job."""
        if options and not TASK_OPTIONS.issuperset(options):
            unknown = sorted(options.keys() - TASK_OPTIONS)[0]
            raise TypeError(f"{call}() got an unexpected keyword argument {unknown!r}")
        keyed_mode = None
        if options and not _KEYED_OPTIONS.isdisjoint(options):
            keyed_mode = keyed.checked_mode(
                options.get("debounce"),
                options.get("throttle"),
                options.get("unique"),
                options.get("id"),
            )
        return self.prepare_fields(
            data,
            at,
            delay,
            options.get("task"),
            options.get("id"),
            options.get("max_attempts"),
            options.get("timeout"),
            options.get("result_ttl"),
            None,
            options.get("priority", 0),
            options.get("limit_key"),
            options.get("cost", 1),
            keyed_mode,
            options.get("expires"),
        )

    def prepare_keyed(self, data: Any, options: KeyedCallOptions) -> PreparedTask:
        """Check a ``schedule_keyed`` call: its options, when (now unless ``at`` or
        ``delay`` is given) and exactly one of debounce, throttle and unique."""
        rest = {name: value for name, value in options.items() if name not in _WHEN}
        at, delay = options.get("at"), options.get("delay")
        when = 0 if at is None and delay is None else delay
        item = self.prepare_call("schedule_keyed", data, at, when, cast(TaskOptions, rest))
        if item[KEYED] is None:
            raise InvalidOptionError("schedule_keyed needs one of debounce=, throttle= or unique=")
        return item

    def prepare_fields(
        self,
        data: Any,
        at: Timestamp | None,
        delay: Duration | None,
        task: TaskRef | None,
        task_id: str | None,
        max_attempts: int | None,
        timeout: Duration | None,
        result_ttl: Duration | None,
        generated_id: str | None = None,
        priority: int = 0,
        limit_key: str | None = None,
        cost: int = 1,
        keyed_mode: keyed.KeyedMode | None = None,
        expires: Duration | None = None,
    ) -> PreparedTask:
        if (at is None) == (delay is None):
            raise InvalidInputError("give exactly one of a run-at time or a delay")
        at_us = None if at is None else validation.timestamp_us(at)
        delay_ms = 0 if delay is None else validation.delay_ms(delay)
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
        task_name = "" if task is None else task_name_of(task)
        record = flow.checked_record(priority, limit_key, cost)
        expires_ms = 0 if expires is None else validation.milliseconds(expires, "expires")
        return (
            task_id,
            at_us,
            delay_ms,
            task_name,
            packed_data,
            max_attempts,
            timeout_ms,
            result_ttl_ms,
            generated,
            record,
            keyed_mode,
            expires_ms,
        )

    def prepare_all(self, jobs: Iterable[Job | tuple[Timestamp, Any]]) -> list[PreparedTask]:
        """Check every job of a schedule_many before anything is written. An (at, data)
        pair, the usual bulk item, is checked here in line, with one Packer for all (a
        third of the time it takes through ``prepare_fields``, which a Job and a pair of
        any other shape go through, with the same checks)."""
        prepared: list[PreparedTask] = []
        jobs = validation.items(jobs, "jobs")
        generated = ids.new_task_ids(len(jobs))
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
                    # No delay, the default handler, an id duetime made.
                    prepared.append(
                        (
                            generated[position],
                            at_us,
                            0,
                            "",
                            packed_data,
                            max_attempts,
                            timeout_ms,
                            result_ttl_ms,
                            True,
                            "",
                            None,
                            0,
                        )
                    )
                elif isinstance(job, Job):
                    prepared.append(self.prepare(job, generated[position]))
                    ids_given = ids_given or job.id is not None
                elif isinstance(job, tuple) and len(job) == 2:
                    at, data = job
                    prepared.append(self.prepare(Job(data, at=at), generated[position]))
                else:
                    raise InvalidInputError("expected a Job or an (at, data) pair")
            except InvalidInputError as error:
                raise type(error)(f"item {position}: {error}") from None
        # Generated ids alone repeat with odds of 2**-72: looked at when some are given.
        all_ids = [item[TASK_ID] for item in prepared] if ids_given else []
        if len(set(all_ids)) != len(all_ids):
            raise InvalidInputError("schedule_many got the same task id twice in one call")
        return prepared
