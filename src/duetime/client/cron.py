"""A queue's cron jobs from the client's side: define, declare, converge on a set
(``sync_cron``), pause and resume, trigger once, remove, and list them with their next
ticks and their last run. The cron plans of ``QueueCore``; the schedule arithmetic and the
stored definitions are ``duetime.cron``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from duetime import codec, cron, validation
from duetime.client.backfill import backfill_info
from duetime.client.ids import new_task_id
from duetime.client.models import CronInfo, CronRun, TaskRef
from duetime.client.preparing import PreparedTask, task_name_of
from duetime.client.producing import Producing
from duetime.client.reports import result_record
from duetime.client.shards import QueueShards
from duetime.cron import definitions as cron_definitions
from duetime.errors import DecodeError, InvalidInputError, TaskNotFoundError
from duetime.store.plans.cron_jobs import CronTable, covering
from duetime.store.plans.requests import Plan

#: Cron jobs declared per script call (``add_crons`` of many jobs).
DECLARE_BATCH = 1000


class CronControl:
    """A queue's cron jobs from the client's side: the plans that define, declare, list,
    pause, trigger and remove them, over each shard's ``CronPlans`` (triggering one
    schedules a task: ``producing``)."""

    def __init__(self, queue: QueueShards, producing: Producing) -> None:
        self.queue = queue
        self.producing = producing

    def cron_job(
        self,
        name: str,
        expression: str | None,
        data: Any,
        *,
        tz: str = "UTC",
        task: TaskRef | None = None,
        missed: str = "skip",
        overlap: str = "allow",
        max_attempts: int | None = None,
        timeout: float | None = None,
        priority: int = 0,
        limit_key: str | None = None,
        cost: int = 1,
        **schedule: Any,
    ) -> cron.CronJob:
        """A validated cron definition; raises InvalidInputError, nothing stored.
        ``schedule`` holds the schedule's options (``cron.define``)."""
        return cron.define(
            name,
            expression,
            data,
            timezone=tz,
            task=task_name_of(task),
            missed=missed,
            overlap=overlap,
            max_attempts=self.queue.settings.max_attempts if max_attempts is None else max_attempts,
            timeout=self.queue.settings.task_timeout if timeout is None else timeout,
            max_payload_bytes=self.queue.settings.max_payload_bytes,
            priority=priority,
            limit_key=limit_key,
            cost=cost,
            **schedule,
        )

    def declare_cron_plan(self, jobs: Sequence[cron.CronJob]) -> Plan[dict[str, str]]:
        """Create or update each job (in its shard), in batches of ``DECLARE_BATCH`` per
        script call; returns name -> created | updated | unchanged. Every job's first
        tick is worked out before anything is written."""
        jobs = validation.items(jobs, "jobs")
        for position, job in enumerate(jobs):
            if not isinstance(job, cron.CronJob):
                raise InvalidInputError(
                    f"jobs item {position}: expected a cron job (made by Queue.cron_job), "
                    f"got {validation.shown(job)}"
                )
        names = [job.name for job in jobs]
        if len(set(names)) != len(names):
            raise InvalidInputError("the same cron job name was given twice")
        homes = [self.queue.layout.of_cron(job.name) for job in jobs]
        nows = {}
        for home in sorted(set(homes)):
            nows[home] = yield from self.queue.shards[home].state.now()
        firsts = []
        for job, home in zip(jobs, homes, strict=True):
            first = job.first_run_after(nows[home])
            if first is None:
                raise InvalidInputError(f"cron job {job.name!r} never fires again (its end passed)")
            firsts.append(first)
        outcomes = {}
        for home in sorted(set(homes)):
            mine = [i for i, h in enumerate(homes) if h == home]
            for start in range(0, len(mine), DECLARE_BATCH):
                batch = [
                    (jobs[i].name, cron_definitions.encode_job(jobs[i]), firsts[i])
                    for i in mine[start : start + DECLARE_BATCH]
                ]
                codes = yield from self.queue.shards[home].cron.declare_cron(batch)
                for (name, _, _), code in zip(batch, codes, strict=True):
                    outcomes[name] = ("unchanged", "created", "updated")[code]
            # A copy declared under another shard count would fire each tick a second
            # time (its ticks are other tasks in another shard): one job, one place.
            for other in self.queue.search_order(home)[1:]:
                for i in mine:
                    yield from other.cron.remove_cron(jobs[i].name)
        if jobs and not self.queue.listed:
            yield from self.queue.list_queue()
        return outcomes

    def add_crons_plan(self, jobs: Sequence[cron.CronJob]) -> Plan[dict[str, int]]:
        """Declare many jobs; returns how many were created, updated and unchanged."""
        outcomes = yield from self.declare_cron_plan(jobs)
        counts = dict.fromkeys(("created", "updated", "unchanged"), 0)
        for outcome in outcomes.values():
            counts[outcome] += 1
        return counts

    def sync_cron_plan(self, jobs: Sequence[cron.CronJob], prune: bool) -> Plan[dict[str, str]]:
        """Converge on exactly these jobs: declare them, and with ``prune`` remove the rest
        (and any copy of a declared job outside its shard, left by another shard count)."""
        validation.flag(prune, "prune")
        outcomes = yield from self.declare_cron_plan(jobs)
        if prune:
            for index, shard in enumerate(self.queue.shards):
                table = yield from shard.cron.cron_table()
                for name in sorted(table.definitions):
                    if name in outcomes and self.queue.layout.of_cron(name) == index:
                        continue
                    yield from shard.cron.remove_cron(name)
                    outcomes.setdefault(name, "removed")
        return outcomes

    def pause_cron_plan(self, name: str, paused: bool) -> Plan[bool]:
        """Pause or resume a job; False when it was paused (or live) already. Resuming
        a job that ended (its end passed, or it ran max_runs times) raises
        InvalidInputError: declare it again with a later end or more runs."""
        validation.cron_name(name)
        for shard in self.queue.search_order(self.queue.layout.of_cron(name)):
            next_tick = None
            if not paused:
                table = yield from shard.cron.cron_entry(name)
                blob = table.definitions.get(name)
                if blob is None:
                    continue
                now = yield from shard.state.now()
                next_tick = cron_definitions.decode_job(blob).first_run_after(now)
                state = table.states.get(name)
                if next_tick is None or (state is not None and state.ended):
                    raise InvalidInputError(
                        f"cron job {name!r} has ended (its end passed, its runs are done, or "
                        "its expression fires no more): declare it again with a later end "
                        "or more max_runs"
                    )
            if done := (yield from shard.cron.set_cron_next(name, next_tick)):
                return done == 1
        raise TaskNotFoundError(f"no cron job {name!r} in queue {self.queue.name!r}")

    def trigger_cron_plan(self, name: str) -> Plan[str]:
        """Run a cron job once now, outside its schedule: a task with the job's handler,
        data, attempts and timeout, under a fresh id (it is not a tick: the schedule,
        its overlap policy and its last run are untouched). Returns the task id."""
        _, job = yield from self.queue.cron_home(name)
        task = cron.task_of(job, 0)  # runs now: its run-at is moot
        packed_data = codec.pack(task.data)
        limit = self.queue.settings.max_payload_bytes
        validation.payload(task.data, len(packed_data), limit, packed_data)
        item: PreparedTask = (
            new_task_id(),
            None,
            0,
            task.task,
            packed_data,
            task.max_attempts,
            task.timeout_ms,
            task.result_ttl_ms,
            True,  # generated
            job.flow_record,
            None,  # no keyed mode
            0,  # no expiry
        )
        return (yield from self.producing.schedule_one_plan(item))

    def remove_cron_plan(self, name: str) -> Plan[bool]:
        validation.cron_name(name)
        removed = False
        for shard in self.queue.shards:
            removed = (yield from shard.cron.remove_cron(name)) or removed
        return removed

    def list_cron_plan(self, upcoming: int) -> Plan[list[CronInfo]]:
        _upcoming(upcoming)
        jobs = []
        for shard in self.queue.shards:
            table = yield from shard.cron.cron_table()
            now = yield from shard.state.now()
            for name in table.definitions:
                jobs.append((yield from self._cron_info(name, table, now, upcoming)))
        return sorted(jobs, key=lambda job: job.name)

    def cron_info_plan(self, name: str, upcoming: int) -> Plan[CronInfo | None]:
        """One job as ``list_cron`` shows it, read alone; None when there is no such job."""
        validation.cron_name(name)
        _upcoming(upcoming)
        for shard in self.queue.search_order(self.queue.layout.of_cron(name)):
            table = yield from shard.cron.cron_entry(name)
            if name in table.definitions:
                now = yield from shard.state.now()
                return (yield from self._cron_info(name, table, now, upcoming))
        return None

    def _cron_info(self, name: str, table: CronTable, now: int, upcoming: int) -> Plan[CronInfo]:
        state = table.states.get(name)
        ended = state is not None and state.ended and name not in table.next_ticks
        paused = name not in table.next_ticks and not ended
        try:
            job = cron_definitions.decode_job(table.definitions[name])
        except DecodeError as problem:
            # A poison record (a dispatcher pauses it): shown, not a failed listing.
            return CronInfo(name, "", "", "", None, "", "", paused, [], None, str(problem))
        next_runs: list[int] = []
        if name in table.next_ticks:
            next_runs = _next_runs(job, table, now, upcoming)
        last: CronRun | None = None
        if name in table.last_task:
            backfill = table.backfills.get(name)
            handled = backfill.handled() if backfill is not None else ()
            last = yield from self._cron_run(
                job, table.last_task[name], handled, table.fired.get(name, ())
            )
        keeps = job.keeps_state
        return CronInfo(
            name=job.name,
            expression=job.expression,
            timezone=job.timezone,
            task=job.task,
            data=job.data,
            missed=job.missed,
            overlap=job.overlap,
            paused=paused,
            next_runs=[run / 1000 for run in next_runs[:upcoming]],
            last_run=last,
            priority=job.priority,
            limit_key=job.limit_key,
            cost=job.cost,
            every=_seconds(job.every_ms or None),
            catch_up=_seconds(job.catch_up_ms),
            jitter=_seconds(job.jitter_ms or None),
            start=_seconds(job.start_ms),
            end=_seconds(job.end_ms),
            max_runs=job.max_runs,
            pause_after_failures=job.pause_after_failures,
            runs=(state.runs if state else 0) if keeps else None,
            failures=(state.failures if state else 0) if job.pause_after_failures else None,
            ended=ended,
            backfill=backfill_info(table.backfills.get(name)),
        )

    def _cron_run(
        self,
        job: cron.CronJob,
        task_id: str,
        backfilled: tuple[tuple[int, int], ...],
        fired: tuple[tuple[int, int], ...],
    ) -> Plan[CronRun | None]:
        """The run of ``task_id``; ``backfilled`` holds the spans of ticks the job's
        backfills handled (a run of theirs is due when it fires, so it is not late), and
        ``fired`` those of ticks its schedule enqueued (a backfill's range may hold them:
        it does not run them, so they are the schedule's runs)."""
        tick = cron.tick_of_task(task_id)
        if tick is None:
            return None  # not an id duetime wrote; the checker does not own cron_last values
        from_backfill = covering(backfilled, tick) is not None and covering(fired, tick) is None
        _, reply = yield from self.queue.locate(task_id)
        result, _ = result_record(reply.result)
        error = codec.decode_error(reply.error).error if reply.error else None
        started = result.started_ms / 1000 if result and result.started_ms else None
        return CronRun(
            tick=tick / 1000,
            task_id=task_id,
            state=reply.state,
            started=started,
            # From when it was due: the tick, plus its jitter.
            lateness_ms=None
            if started is None or from_backfill
            else started * 1000 - _due(job, tick),
            succeeded=result.ok if result else None,
            error=error if error else (None if not result or result.ok else str(result.value)),
            backfilled=from_backfill,
        )


def _next_runs(job: cron.CronJob, table: CronTable, now: int, upcoming: int) -> list[int]:
    """When a live job's next runs are due (ms): its held tick or its score first, even
    if past (a dispatcher fires it at once), then those after now."""
    score = table.next_ticks[job.name]
    first = table.held.get(job.name, score)
    if first >= now and job.name not in table.held:
        return job.upcoming(first, upcoming)
    after = job.first_run_after(max(first, now))
    return [first] + ([] if after is None else job.upcoming(after, upcoming - 1))


def _due(job: cron.CronJob, tick: int) -> int:
    """When the run of ``tick`` was due: the tick plus its jitter."""
    return job.run_at(tick, job.next_tick(tick)) if job.jitter_ms else tick


def _seconds(milliseconds: int | None) -> float | None:
    return None if milliseconds is None else milliseconds / 1000


#: The most upcoming fire times ``list_cron`` and ``cron_info`` compute per job.
MOST_UPCOMING = 1000


def _upcoming(value: object) -> int:
    return validation.whole_number(value, "upcoming", 0, MOST_UPCOMING)
