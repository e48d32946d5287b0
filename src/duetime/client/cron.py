"""A queue's cron jobs from the client's side: define, declare, converge on a set
(``sync_cron``), pause and resume, trigger once, remove, and list them with their next
ticks and their last run. The cron plans of ``QueueCore``; the schedule arithmetic and the
stored definitions are ``duetime.cron``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from duetime import codec, cron, validation
from duetime.client.ids import new_task_id
from duetime.client.models import CronInfo, CronRun, TaskRef
from duetime.client.prepared import prepared_task
from duetime.client.preparing import task_name_of
from duetime.client.producing import Producing
from duetime.client.reports import result_record
from duetime.errors import DecodeError, InvalidInputError, TaskNotFoundError
from duetime.store.cron_jobs import CronTable
from duetime.store.requests import Plan


class CronPlans(Producing):
    """The plans of a queue's cron jobs (triggering one schedules a task: ``Producing``)."""

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
        priority: int = 0,
        limit_key: str | None = None,
        cost: int = 1,
    ) -> cron.CronJob:
        """A validated cron definition; raises InvalidInputError, nothing stored."""
        return cron.define(
            name,
            expression,
            data,
            timezone=tz,
            task=task_name_of(task),
            missed=missed,
            overlap=overlap,
            max_attempts=self.settings.max_attempts if max_attempts is None else max_attempts,
            timeout=self.settings.task_timeout if timeout is None else timeout,
            max_payload_bytes=self.settings.max_payload_bytes,
            priority=priority,
            limit_key=limit_key,
            cost=cost,
        )

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
        if jobs and not self.listed:
            yield from self._list()
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

    def pause_cron_plan(self, name: str, paused: bool) -> Plan[bool]:
        """Pause or resume a job; False when it was paused (or live) already."""
        for shard in self._search_order(self.layout.of_cron(name)):
            next_tick = None
            if not paused:
                table = yield from shard.cron_table()
                blob = table.definitions.get(name)
                if blob is None:
                    continue
                now = yield from shard.now()
                next_tick = cron.decode_job(blob).next_tick(now)
            if done := (yield from shard.set_cron_next(name, next_tick)):
                return done == 1
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
            task = cron.task_of(job, 0)  # runs now: its run-at is moot
            packed_data = codec.pack(task.data)
            limit = self.settings.max_payload_bytes
            validation.payload(task.data, len(packed_data), limit, packed_data)
            item = prepared_task(
                new_task_id(),
                None,
                0,
                task.task,
                packed_data,
                task.max_attempts,
                task.timeout_ms,
                task.result_ttl_ms,
                generated=True,
                flow=job.flow_record,
            )
            return (yield from self.schedule_one_plan(item))
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
            name=job.name,
            expression=job.expression,
            timezone=job.timezone,
            task=job.task,
            data=job.data,
            missed=job.missed,
            overlap=job.overlap,
            paused=paused,
            next_runs=next_runs[:upcoming],
            last_run=last,
            priority=job.priority,
            limit_key=job.limit_key,
            cost=job.cost,
        )

    def _cron_run(self, task_id: str) -> Plan[CronRun | None]:
        tick_text = task_id.rsplit(":", 1)[-1]
        if not tick_text.isdigit():
            return None  # not an id duetime wrote; the checker does not own cron_last values
        tick = int(tick_text)
        _, reply = yield from self._locate(task_id)
        result, _ = result_record(reply.result)
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
