"""Recurring jobs: the definition, its validation, which ticks are due, and the task
each becomes.

A tick is one instant at which a cron job fires; each becomes an ordinary task with
the deterministic id ``cron:<name>:<tick ms>``, so however many dispatchers fire the
same tick, one task exists. Ticks are computed on wall-clock time in the job's zone
(zoneinfo), then mapped to instants with these rules at daylight-saving changes:

- a wall time that happens twice (clocks go back): a job whose hour field is a
  wildcard (``*``, ``*/2``) runs at both instants, as the wall clock says, so
  ``0 * * * *`` runs 25 times that day; a job at a given hour runs once, at the
  first instant, so ``30 1 * * *`` runs once;
- a wall time that does not happen (clocks go forward): a wildcard-hour job skips
  it (``0 * * * *`` runs 23 times); a job at a given hour runs once, shifted forward
  by the length of the gap (02:30 becomes 03:30).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, cast
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

from duetime import codec, flow, validation
from duetime.errors import DecodeError, InvalidInputError, InvalidNameError

MissedPolicy = Literal["skip", "once", "all"]
OverlapPolicy = Literal["allow", "skip", "delay"]
MISSED_POLICIES: tuple[str, ...] = ("skip", "once", "all")
OVERLAP_POLICIES: tuple[str, ...] = ("allow", "skip", "delay")
#: With missed="all", at most this many missed ticks (the latest) are fired on catch-up.
MAX_CATCH_UP = 100
#: The widest daylight-saving shift in the tz database is 2 hours.
_DST_WINDOW = timedelta(hours=3)

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


#: A cron task's outcome (a tick's, or a triggered run's) is kept this long, so that
#: `cron list` can show the last run.
RESULT_TTL_MS = 3600 * 1000


@dataclass(frozen=True, slots=True)
class CronJob:
    """A recurring job as declared; immutable, compared whole to detect changes."""

    name: str
    expression: str
    data: Any
    timezone: str = "UTC"
    task: str = ""
    missed: MissedPolicy = "skip"
    overlap: OverlapPolicy = "allow"
    max_attempts: int = 5
    timeout_ms: int = 300_000
    #: Flow control of its ticks (docs/flow.md); defaults: none.
    priority: int = 0
    limit_key: str | None = None
    cost: int = 1

    @property
    def flow_record(self) -> str:
        """Its ticks' flow record ("" for none: priority 0, cost 1, no limit key)."""
        return flow.flow_record(self.priority, self.cost, self.limit_key)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def wildcard_hour(self) -> bool:
        return ALIASES.get(self.expression, self.expression).split()[1].startswith("*")

    def ticks_after(self, after_ms: int) -> Iterator[int]:
        """Tick instants (ms) strictly after ``after_ms``, in order."""
        zone = self.zone
        wall = datetime.fromtimestamp(after_ms / 1000, UTC).astimezone(zone).replace(tzinfo=None)
        # Near an offset change, wall times before `after` can map to instants after it.
        start = wall - (_DST_WINDOW if _near_change(zone, wall) else timedelta(seconds=1))
        candidates = croniter(ALIASES.get(self.expression, self.expression), start)
        pending: list[int] = []
        while True:
            try:
                moment = candidates.get_next(datetime)
            except CroniterBadDateError:
                return
            pending.extend(i for i in _instants(moment, zone, self.wildcard_hour) if i > after_ms)
            pending.sort()
            # Around a repeated hour a later wall time can map to an earlier instant:
            # release only what no later wall time can still precede.
            horizon = _utc_ms(moment.replace(tzinfo=zone))
            if _near_change(zone, moment):
                horizon -= int(_DST_WINDOW.total_seconds() * 1000)
            while pending and pending[0] <= horizon:
                yield pending.pop(0)

    def next_tick(self, after_ms: int) -> int | None:
        return next(self.ticks_after(after_ms), None)

    def due_ticks(self, first_ms: int, now_ms: int) -> list[int]:
        """Every tick from ``first_ms`` (a tick) up to ``now_ms``, in order."""
        ticks = [first_ms]
        for tick in self.ticks_after(first_ms):
            if tick > now_ms:
                break
            ticks.append(tick)
            if len(ticks) > MAX_CATCH_UP + 1:
                ticks.pop(0)  # keep the latest; older ones are beyond any catch-up
        return ticks

    def ticks_to_fire(self, first_ms: int, now_ms: int) -> list[int]:
        """Apply the missed-tick policy. The latest due tick is the current one; any
        earlier due tick was missed (every dispatcher was down, or busy past it)."""
        due = self.due_ticks(first_ms, now_ms)
        current, missed = due[-1], due[:-1]
        if not missed or self.missed == "skip":
            return [current]
        if self.missed == "once":
            return [missed[-1], current]
        return [*missed[-MAX_CATCH_UP:], current]

    def tick_id(self, tick_ms: int) -> str:
        return f"cron:{self.name}:{tick_ms}"


def _near_change(zone: ZoneInfo, wall: datetime) -> bool:
    before = (wall - _DST_WINDOW).replace(tzinfo=zone).utcoffset()
    return before != (wall + _DST_WINDOW).replace(tzinfo=zone).utcoffset()


def _utc_ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def _instants(wall: datetime, zone: ZoneInfo, wildcard_hour: bool) -> list[int]:
    """The instants (ms) at which a matching wall-clock time fires, per the DST rules."""
    first = wall.replace(tzinfo=zone, fold=0)
    second = wall.replace(tzinfo=zone, fold=1)
    first_ms, second_ms = _utc_ms(first), _utc_ms(second)
    if first_ms == second_ms:
        return [first_ms]
    exists = first.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == wall
    if exists:  # repeated: fold=0 is the earlier instant
        return [first_ms, second_ms] if wildcard_hour else [first_ms]
    # Skipped: fold=0 applies the offset from before the change, i.e. shifts the wall
    # time forward by the gap.
    return [] if wildcard_hour else [first_ms]


def define(
    name: str,
    expression: str,
    data: Any,
    *,
    timezone: str = "UTC",
    task: str = "",
    missed: str = "skip",
    overlap: str = "allow",
    max_attempts: int = 5,
    timeout: float = 300.0,
    max_payload_bytes: int = 512 * 1024,
    priority: int = 0,
    limit_key: str | None = None,
    cost: int = 1,
) -> CronJob:
    """Validate a declaration completely; raises InvalidInputError before anything is stored."""
    if not isinstance(name, str) or not validation.QUEUE_NAME.fullmatch(name):
        raise InvalidNameError(
            f"invalid cron job name {validation.shown(name)}: use 1-64 of A-Z a-z 0-9 _ . -"
        )
    if not isinstance(expression, str) or not croniter.is_valid(
        ALIASES.get(expression, expression)
    ):
        raise InvalidInputError(
            f"invalid cron expression {validation.shown(expression)}: use 5 fields (minute "
            "hour day month weekday), an optional 6th for seconds, or "
            "@hourly/@daily/@weekly/@monthly/@yearly"
        )
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidInputError(
            f"unknown time zone {validation.shown(timezone)}: use an IANA name such as Europe/Paris"
        ) from None
    if missed not in MISSED_POLICIES:
        raise InvalidInputError(
            f"missed must be one of {', '.join(MISSED_POLICIES)}, got {validation.shown(missed)}"
        )
    if overlap not in OVERLAP_POLICIES:
        raise InvalidInputError(
            f"overlap must be one of {', '.join(OVERLAP_POLICIES)}, got {validation.shown(overlap)}"
        )
    packed = codec.pack(data)
    validation.payload(data, len(packed), max_payload_bytes, packed)
    flow.checked_record(priority, limit_key, cost)
    job = CronJob(
        name, expression, data, timezone, task,
        cast(MissedPolicy, missed), cast(OverlapPolicy, overlap),
        validation.attempts(max_attempts),
        validation.milliseconds(timeout, "timeout"),
        priority, limit_key, cost,
    )  # fmt: skip
    if job.next_tick(_utc_ms(datetime.now(UTC))) is None:
        raise InvalidInputError(
            f"cron expression {validation.shown(expression)} never fires (e.g. February 30)"
        )
    return job


def encode_job(job: CronJob) -> bytes:
    """A definition as stored: format 1, or 2 when its ticks have flow control (so that
    a job without it stays readable by hosts that read only format 1)."""
    fields = [1, job.name, job.expression, job.data, job.timezone, job.task, job.missed,
              job.overlap, job.max_attempts, job.timeout_ms]  # fmt: skip
    if job.flow_record:
        fields[0] = 2
        fields += [job.priority, job.limit_key, job.cost]
    return codec.pack(fields)


#: The newest definition format this version writes and reads (2: with flow control).
DEFINITION_VERSION = 2
#: Fields of each definition format.
_DEFINITION_FIELDS = {1: 10, 2: 13}


def decode_job(blob: bytes) -> CronJob:
    """Read a stored definition and check that this host can fire it: a definition that
    is corrupt, written by a newer duetime, or names a time zone missing from this host's
    tz database raises DecodeError saying which (a poison record: the dispatcher pauses
    that job, and the checker and ``cron list`` report it)."""
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
    name, expression, _, timezone, task, missed, overlap, *counts = fields[1:10]
    if len(fields) > 10:
        try:
            flow.checked_record(*fields[10:])
        except InvalidInputError as error:
            raise DecodeError(f"cron job definition's flow control: {error}") from None
    texts = (name, expression, timezone, task, missed, overlap)
    if not all(isinstance(text, str) for text in texts) or not all(
        isinstance(number, int) and not isinstance(number, bool) and number > 0 for number in counts
    ):
        raise DecodeError("cron job definition fields have the wrong types")
    if missed not in MISSED_POLICIES or overlap not in OVERLAP_POLICIES:
        raise DecodeError(f"unknown policy missed={missed!r} overlap={overlap!r}")
    if not croniter.is_valid(ALIASES.get(expression) or expression):
        raise DecodeError(f"invalid cron expression {expression!r}")
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
        raise DecodeError(
            f"time zone {timezone!r} is not in this host's tz database "
            "(install or update the tzdata package)"
        ) from None
    return CronJob(*fields[1:])


# --- a cron job's tasks --------------------------------------------------------------


def task_of(job: CronJob, run_at_ms: float) -> codec.Envelope:
    """The task a run of ``job`` at ``run_at_ms`` is: the job's handler, data, attempts and
    timeout, its outcome kept ``RESULT_TTL_MS``. The one conversion of a cron job into a
    task: a tick's task (``tick_task``) and a run triggered now (the client's
    ``trigger_cron``)."""
    return codec.Envelope(
        job.task, job.data, run_at_ms, job.max_attempts, job.timeout_ms, RESULT_TTL_MS
    )


def task_envelope(job: CronJob, run_at_ms: float) -> bytes:
    """The envelope of the task of ``job`` that runs at ``run_at_ms`` (``task_of``)."""
    return codec.encode_envelope(task_of(job, run_at_ms))


def tick_task(job: CronJob, tick_ms: int) -> tuple[str, int, bytes, str]:
    """The task of one tick, as ``fire_cron`` takes it: its deterministic id (one task
    however many dispatchers fire the tick), its run-at (the tick), its envelope and its
    flow record ("" for none)."""
    return job.tick_id(tick_ms), tick_ms, task_envelope(job, tick_ms), job.flow_record
