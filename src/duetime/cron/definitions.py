"""Cron job definitions as stored: encoding, decoding and checking them, and the
template that jobs declared alike share.

A definition holds a job's name and data and what it shares with jobs declared alike
(its schedule, handler, policies, limits). Decoding checks the shared part once per
distinct one (cached): a queue of a million jobs, one per user, checks one schedule,
and its dispatcher fires each tick from the shared template (``CronTemplate``), with
only the name and data being the job's own.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from duetime import codec, flow
from duetime.cron import MISSED_POLICIES, OVERLAP_POLICIES, RESULT_TTL_MS, CronJob, tick_id
from duetime.cron import options as cron_options
from duetime.errors import DecodeError, InvalidInputError

#: The newest definition format this version writes and reads (2: with flow control;
#: 3: with schedule options).
DEFINITION_VERSION = 3
#: Fields of each definition format.
_DEFINITION_FIELDS = {1: 10, 2: 13, 3: 20}
#: Distinct shared parts kept decoded (a queue usually has a few).
_TEMPLATES_KEPT = 1024


@dataclass(frozen=True, slots=True, eq=False)
class CronTemplate:
    """A cron job less its name and data, checked: what jobs declared alike share. Equal
    only to itself (decoding returns one per distinct shared part), so that it is a cheap
    key for work shared by its jobs."""

    job: CronJob  # the shared part, named "" with no data
    head: bytes  # a tick task's envelope before its data (codec.envelope_parts)
    limits: bytes  # and after its run-at
    flow_record: str

    def named(self, name: str, data: Any) -> CronJob:
        return replace(self.job, name=name, data=data)

    def tick_task(
        self, name: str, packed_data: bytes, tick_ms: int, run_at_ms: int
    ) -> tuple[str, int, bytes, str]:
        """The task of one tick of the job ``name`` whose data is ``packed_data``, as
        ``fire_cron`` takes it: its deterministic id, its run-at (the tick, plus its
        jitter, or when a backfill runs it), its envelope (``cron.task_of``'s) and its
        flow record ("" for none)."""
        envelope = self.head + packed_data + codec.packed_run_at(run_at_ms) + self.limits
        return tick_id(name, tick_ms), run_at_ms, envelope, self.flow_record


def encode_job(job: CronJob) -> bytes:
    """A definition as stored: format 1; 2 when its ticks have flow control; 3 when it
    has schedule options (so that a job without them stays readable by older hosts)."""
    fields = [1, job.name, job.expression, job.data, job.timezone, job.task, job.missed,
              job.overlap, job.max_attempts, job.timeout_ms]  # fmt: skip
    if job.flow_record or job.has_schedule_options:
        fields[0] = 2
        fields += [job.priority, job.limit_key, job.cost]
    if job.has_schedule_options:
        fields[0] = 3
        fields += [job.every_ms, job.catch_up_ms, job.jitter_ms, job.start_ms, job.end_ms,
                   job.max_runs, job.pause_after_failures]  # fmt: skip
    return codec.pack(fields)


def decode_job(blob: bytes) -> CronJob:
    """Read a stored definition and check that this host can fire it: a definition that
    is corrupt, written by a newer duetime, or whose cron expression is read in a time
    zone missing from this host's tz database raises DecodeError saying which (a poison
    record: the dispatcher pauses that job, and the checker and ``cron list`` report it).
    An interval job (``every``) does not depend on its zone."""
    name, data, template = decode_parts(blob)
    return template.named(name, data)


def decode_parts(blob: bytes) -> tuple[str, Any, CronTemplate]:
    """A stored definition as its name, its data and its template, checked as
    ``decode_job`` checks it."""
    fields = codec.unpack(blob)
    if not isinstance(fields, list) or not fields or not isinstance(fields[0], int):
        raise DecodeError("not a duetime cron job definition")
    if fields[0] > DEFINITION_VERSION:
        raise DecodeError(
            f"written by a newer duetime (definition format {fields[0]}, this one reads "
            f"{DEFINITION_VERSION}); upgrade duetime on this host"
        )
    if len(fields) != _DEFINITION_FIELDS.get(fields[0]):
        raise DecodeError(f"not a version-{fields[0]} cron job definition")
    shared = (fields[2], *fields[4:])
    if not isinstance(fields[1], str) or not _hashable(shared):
        raise DecodeError("cron job definition fields have the wrong types")
    return fields[1], fields[3], _template(*shared)


def _hashable(values: tuple[Any, ...]) -> bool:
    # Every field of a sound definition is text, a number or None: one that is not
    # hashable (a list or a map where text belongs) is garbage.
    try:
        hash(values)
    except TypeError:
        return False
    return True


@lru_cache(maxsize=_TEMPLATES_KEPT, typed=True)
def _template(*shared: Any) -> CronTemplate:
    """The template of a definition's shared part (its fields but the name and data), or
    DecodeError. Cached by value and type (True is not 1 here), checks included; a
    refusal is not cached, so a poison record is refused whenever it is read."""
    expression, timezone, task, missed, overlap, *counts = shared[:7]
    if len(shared) > 7:
        try:
            flow.checked_record(*shared[7:10])
        except InvalidInputError as error:
            raise DecodeError(f"cron job definition's flow control: {error}") from None
    every = _stored_options(list(shared[10:]))
    texts = (expression, timezone, task, missed, overlap)
    if not all(isinstance(text, str) for text in texts) or not all(
        isinstance(number, int) and not isinstance(number, bool) and number > 0 for number in counts
    ):
        raise DecodeError("cron job definition fields have the wrong types")
    if missed not in MISSED_POLICIES or overlap not in OVERLAP_POLICIES:
        raise DecodeError(f"unknown policy missed={missed!r} overlap={overlap!r}")
    if not every:
        if not cron_options.valid_expression(expression):
            raise DecodeError(f"invalid cron expression {expression!r}")
        if not cron_options.known_zone(timezone):
            raise DecodeError(
                f"time zone {timezone!r} is not in this host's tz database "
                "(install or update the tzdata package)"
            )
    job = CronJob("", expression, None, *shared[1:])
    head, limits = codec.envelope_parts(job.task, job.max_attempts, job.timeout_ms, RESULT_TTL_MS)
    return CronTemplate(job, head, limits, job.flow_record)


def _stored_options(options: list[Any]) -> int:
    """Check a format-3 definition's schedule options; returns its interval (0: none)."""
    if not options:
        return 0
    every, catch_up, jitter, start, end, max_runs, pause_after = options
    whole = (every, jitter)
    optional = (catch_up, start, end, max_runs, pause_after)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in whole) or not all(
        n is None or (isinstance(n, int) and not isinstance(n, bool) and n >= 0) for n in optional
    ):
        raise DecodeError("cron job definition's schedule options have the wrong types")
    if every and every < cron_options.SHORTEST_INTERVAL_MS:
        raise DecodeError(f"cron job definition's interval is too short ({every} ms)")
    return int(every)
