"""Reading a queue: a task's status and its result (waited for), the queue's figures,
its tasks by state, its dead tasks, its per-minute throughput, and the invariants
checked on the live server. The plans of ``QueueCore`` that change nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from duetime import codec, keyed, validation
from duetime.checker import Violation, check_invariants
from duetime.client.models import (
    LISTED_STATES,
    DeadTask,
    MinuteFigures,
    QueueStats,
    TaskStatus,
    TaskSummary,
)
from duetime.client.reports import (
    LISTING_ORDER,
    combined_stats,
    dead_task,
    keeps_no_result,
    minute_figures,
    queue_stats,
    task_status,
    task_summary,
)
from duetime.client.shards import QueueShards
from duetime.errors import (
    CorruptStateError,
    DecodeError,
    InvalidInputError,
    ResultTimeoutError,
    TaskCancelledError,
    TaskExpiredError,
    TaskFailedError,
    TaskNotFoundError,
    TaskStateError,
)
from duetime.states import HistoryOutcome, TaskState
from duetime.store.plans.dispatching import MINUTE_MS, MINUTES_KEPT
from duetime.store.plans.operations import QueueOperations
from duetime.store.plans.requests import Plan


class Inspection:
    """The plans that read a queue."""

    def __init__(self, queue: QueueShards) -> None:
        self.queue = queue

    def not_found(self, task_id: str) -> TaskNotFoundError:
        """What to say when nothing is kept under an id: a typo and a task finished long
        ago that kept no result look the same in Redis, so say both."""
        return TaskNotFoundError(
            f"nothing is known of task {task_id!r} in queue {self.queue.name!r}: it never existed, "
            "or it finished or was cancelled so long ago that the queue's history no longer "
            "holds it (see duetime history-size), and it kept no result (schedule with "
            "result_ttl to keep its outcome for a while)"
        )

    def status_plan(self, task_id: str) -> Plan[TaskStatus | None]:
        shard, reply = yield from self.queue.locate(validation.task_id(task_id))
        status = task_status(task_id, reply)
        if status is not None and reply.waiting:
            hold = yield from shard.flow.hold(status.limit_key or "")
            status = dataclasses.replace(status, waiting_for=hold.reason())
        if status is not None and status.state == TaskState.FINISHED:
            # Its envelope is gone with it: its handler and attempts are the history's.
            entries = yield from shard.history.task_history(task_id, 1)
            if entries:
                last = entries[0]
                started = last.attempt - 1 if last.outcome == HistoryOutcome.EXPIRED else None
                status = dataclasses.replace(
                    status,
                    task=status.task if last.task is None else last.task,
                    attempts=status.attempts if started is None else started,
                )
        elif status is not None:
            found = yield from shard.keyed.keyed_status(
                task_id
            )  # its debounce, throttle or unique key
            if found is not None and found[1] is not None:
                status = dataclasses.replace(status, keyed=keyed.keyed_state(found[0], found[1]))
        return status

    def result_plan(self, task_id: str, timeout: float | None) -> Plan[Any]:
        """Wait for the outcome of a task: its result if it succeeded; TaskFailedError
        (with the reason) if it died, for any reason, before or during a run;
        ResultTimeoutError when ``timeout`` seconds pass first (None waits for ever)."""
        validation.task_id(task_id)
        limit = validation.wait_seconds(timeout, "timeout")
        waited = 0.0
        while True:
            shard, reply = yield from self.queue.locate(task_id)
            if reply.result is not None:
                return self._outcome(task_id, reply.result)
            if reply.state == TaskState.DEAD:
                error = codec.decode_error(reply.error).error if reply.error else ""
                raise TaskFailedError(task_id, error or "it is in the dead-letter set")
            if reply.state == TaskState.UNKNOWN:
                entries = yield from shard.history.task_history(task_id, 1)
                if entries and entries[0].outcome == HistoryOutcome.CANCELLED:
                    raise TaskCancelledError(task_id)
                if entries and entries[0].outcome == HistoryOutcome.EXPIRED:
                    raise TaskExpiredError(task_id)
                raise self.not_found(task_id)
            if keeps_no_result(reply):
                raise TaskStateError(
                    f"task {task_id} was scheduled without result_ttl; it keeps no result"
                )
            # Wait for the result in chunks, looking at the task again in between: a
            # task that dies without storing a result still ends the wait.
            chunk = self.queue.settings.block_timeout
            if limit is not None:
                chunk = min(chunk, limit - waited)
                if chunk <= 0:
                    raise ResultTimeoutError(f"task {task_id} has no result after {limit:g}s")
            blob = yield from shard.producer.wait_result(task_id, chunk)
            if blob is not None:
                return self._outcome(task_id, blob)
            waited += chunk

    @staticmethod
    def _outcome(task_id: str, blob: bytes) -> Any:
        try:
            result = codec.decode_result(blob)
        except DecodeError as problem:
            raise CorruptStateError(f"the stored result of task {task_id}: {problem}") from None
        if result.ended == "cancelled":
            raise TaskCancelledError(task_id)
        if result.ended == "expired":
            raise TaskExpiredError(task_id)
        if not result.ok:
            raise TaskFailedError(task_id, str(result.value))
        return result.value

    def stats_plan(self) -> Plan[QueueStats]:
        each = []
        for shard in self.queue.shards:
            counts = yield from shard.operator.counts()
            each.append(queue_stats(shard.keys.queue, counts))
        if len(each) == 1:
            return each[0]
        return combined_stats(self.queue.name, each)

    def dead_plan(self, limit: int, offset: int) -> Plan[list[DeadTask]]:
        validation.whole_number(limit, "limit", 1, 10_000)
        validation.whole_number(offset, "offset", 0, 10**12)
        if len(self.queue.shards) == 1:
            entries = yield from self.queue.operations.operator.dead_entries(offset, limit)
        else:  # the latest deaths of every shard, merged
            entries = []
            for shard in self.queue.shards:
                entries += yield from shard.operator.dead_entries(0, offset + limit)
            entries.sort(key=lambda entry: entry.died_at_ms, reverse=True)
            entries = entries[offset : offset + limit]
        return [dead_task(entry) for entry in entries]

    def tasks_plan(self, state: str, limit: int, offset: int) -> Plan[list[TaskSummary]]:
        """Tasks in one state: scheduled by run-at, ready from the head, running by lease
        deadline, dead latest first; a sharded queue's shards merged by that order (ready:
        by run-at)."""
        if state not in LISTED_STATES:
            listed = ", ".join(LISTED_STATES)
            raise InvalidInputError(f"state must be one of {listed}, got {state!r}")
        validation.whole_number(limit, "limit", 1, 10_000)
        validation.whole_number(offset, "offset", 0, 1_000_000)
        found = []
        for shard in self.queue.shards:
            entries = yield from shard.operator.listed(TaskState(state), offset + limit)
            found += [task_summary(entry) for entry in entries]
        if len(self.queue.shards) > 1:
            found.sort(key=LISTING_ORDER[TaskState(state)])
        return found[offset : offset + limit]

    def throughput_plan(self, minutes: int) -> Plan[list[MinuteFigures]]:
        """The last ``minutes`` minutes, oldest first, the current one last (partial)."""
        validation.whole_number(minutes, "minutes", 1, MINUTES_KEPT - 1)
        now_minute = (yield from self.queue.operations.state.now()) // MINUTE_MS
        totals: dict[str, int] = {}
        maxima: dict[str, int] = {}  # "<minute>:late_max_us" or ":held_max_us" -> µs
        for shard in self.queue.shards:
            for name, count in (yield from shard.operator.minute_figures()).items():
                number, _, figure = name.partition(":")
                if figure in ("late_max_us", "held_max_us") and validation.is_whole(number):
                    maxima[name] = max(count, maxima.get(name, 0))
                else:
                    totals[name] = totals.get(name, 0) + count
        return [
            minute_figures(minute, totals, maxima)
            for minute in range(now_minute - minutes + 1, now_minute + 1)
        ]

    def check_plan(self) -> Plan[list[Violation]]:
        """Every shard's invariants (a subject is prefixed with its shard when sharded),
        and whether a shard past this queue's shard count holds anything."""
        violations = []
        for index, shard in enumerate(self.queue.shards):
            found = check_invariants((yield from shard.snapshot.snapshot()))
            if len(self.queue.shards) > 1:
                found = [Violation(v.kind, f"shard {index}: {v.subject}", v.detail) for v in found]
            violations += found
        beyond = QueueOperations(self.queue.layout.beyond, self.queue.clock)
        if (yield from beyond.producer.occupied()):
            violations.append(
                Violation(
                    kind="tasks beyond the shards",
                    subject=f"shard {self.queue.layout.count}",
                    detail=f"it holds tasks or cron jobs, but queue {self.queue.name!r} is used "
                    f"here with {self.queue.layout.count} shard(s): no dispatcher or worker given "
                    "that count serves them; run them with the shard count the queue was "
                    "written with",
                )
            )
        return violations
