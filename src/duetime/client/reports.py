"""Reading what the store replied into the client's records: a queue's figures (one
shard's, and a sharded queue's combined), a task's status, a listed task, a dead task, the
per-minute figures. A record duetime cannot read is named in the record, not raised, so
that one bad task does not hide the others.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from duetime import codec, flow, validation
from duetime.client.models import (
    DeadTask,
    GoneWorker,
    MinuteFigures,
    QueueStats,
    TaskStatus,
    TaskSummary,
)
from duetime.codec import ResultRecord
from duetime.errors import DecodeError
from duetime.states import TaskState
from duetime.store.plans.dispatching import MINUTE_MS
from duetime.store.plans.operating import DeadEntry, GoneEntry, Listed
from duetime.store.plans.producing import StatusReply
from duetime.store.plans.replies import as_text


def queue_stats(name: str, counts: dict[str, Any]) -> QueueStats:
    """One shard's figures from its counts; ages and heartbeats by its server's clock."""
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
        flow_control=counts["flow_control"],
        waiting=counts["waiting"],
        throttled=counts["throttled"],
        gone_workers=merged_gone(gone_worker(entry) for entry in counts["gone_workers"]),
    )


def gone_worker(entry: GoneEntry) -> GoneWorker:
    beat = entry.last_beat_ms
    return GoneWorker(
        id=entry.worker,
        last_heartbeat=None if beat is None else beat / 1000,
        reaped_at=entry.reaped_ms / 1000,
        taken_back=entry.taken_back,
        task_ids=entry.task_ids,
    )


#: How long a reaped worker counts as gone (the dashboard shows it, the metrics count it).
GONE_SHOWN = 3600.0


def recently_gone(stats: QueueStats, now: float) -> list[GoneWorker]:
    """The queue's workers reaped in the last ``GONE_SHOWN`` seconds (epoch ``now``) that
    have not registered again since (a frozen worker that was resumed shows as itself)."""
    return [
        gone
        for gone in stats.gone_workers
        if gone.reaped_at >= now - GONE_SHOWN and gone.id not in stats.workers
    ]


def merged_gone(entries: Iterable[GoneWorker]) -> list[GoneWorker]:
    """Reaped workers, one each, newest first. A worker serves every shard of a sharded
    queue, so its reaps on several shards are one worker, with the tasks taken back from
    all of them; so are a reap and the second look at its list (a task that a BLMOVE it
    left pending moved there)."""
    merged: dict[str, GoneWorker] = {}
    for gone in entries:
        known = merged.get(gone.id)
        if known is not None:
            beats = [b for b in (known.last_heartbeat, gone.last_heartbeat) if b is not None]
            gone = GoneWorker(
                gone.id,
                max(beats, default=None),
                max(known.reaped_at, gone.reaped_at),
                known.taken_back + gone.taken_back,
                known.task_ids + gone.task_ids,
            )
        merged[gone.id] = gone
    return sorted(merged.values(), key=lambda gone: -gone.reaped_at)


def combined_stats(name: str, shards: list[QueueStats]) -> QueueStats:
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
        flow_control=any(shard.flow_control for shard in shards),
        waiting=sum(shard.waiting for shard in shards),
        throttled=sum(shard.throttled for shard in shards),
        gone_workers=merged_gone(g for shard in shards for g in shard.gone_workers),
    )


def task_summary(entry: Listed) -> TaskSummary:
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
        id=entry.task_id,
        state=entry.state,
        task=task,
        data=data,
        run_at=run_at,
        attempts=entry.attempts or 0,
        worker=entry.worker,
        lease_deadline=score if entry.state == TaskState.RUNNING else None,
        died_at=score if entry.state == TaskState.DEAD else None,
        error=error,
        problem="; ".join(problems) or None,
        due_at=score if entry.state == TaskState.SCHEDULED else None,
    )


#: How merged listings of a sharded queue are ordered.
LISTING_ORDER: dict[TaskState, Callable[[TaskSummary], float]] = {
    TaskState.SCHEDULED: lambda task: task.due_at or 0.0,
    TaskState.READY: lambda task: task.run_at or 0.0,
    TaskState.RUNNING: lambda task: task.lease_deadline or 0.0,
    TaskState.DEAD: lambda task: -(task.died_at or 0.0),
}


def result_record(blob: bytes | None) -> tuple[ResultRecord | None, str | None]:
    """A stored result record, or the problem with it (garbage written by hand)."""
    if blob is None:
        return None, None
    try:
        return codec.decode_result(blob), None
    except DecodeError as problem:
        return None, f"its result record is unreadable ({problem})"


def keeps_no_result(reply: StatusReply) -> bool:
    """The task is live and was scheduled without result_ttl (so none will come)."""
    if reply.envelope is None:
        return False
    try:
        return codec.decode_envelope(reply.envelope).result_ttl_ms == 0
    except DecodeError:
        return False  # a worker will dead-letter it; the wait then ends


def task_status(task_id: str, reply: StatusReply) -> TaskStatus | None:
    """What a status reply says of a task; None when nothing is known of it."""
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
    result, problem = result_record(reply.result)
    if problem is not None:
        problems.append(problem)
    attempts = reply.attempts or 0
    if reply.state == TaskState.FINISHED and result is not None:
        attempts = result.attempt
    score = reply.score_ms
    priority, cost, limit_key = flow.record_parts(as_text(reply.flow_record or b""))
    # Scheduled: when it is next due (a retry's, after its back-off); otherwise the run-at
    # it was given (a ready task has been due since then).
    if reply.state == TaskState.SCHEDULED and score is not None:
        run_at: float | None = validation.seconds_of_ms(score)
    else:
        run_at = None if envelope is None else validation.seconds_of_ms(envelope.run_at_ms)
    return TaskStatus(
        id=task_id,
        state=reply.state,
        run_at=run_at,
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
        priority=priority,
        limit_key=limit_key,
        cost=cost,
        cancel_asked_at=None if reply.cancel_asked_ms is None else reply.cancel_asked_ms / 1000,
        snoozes=envelope.snoozes if envelope else 0,
    )


def dead_task(entry: DeadEntry) -> DeadTask:
    """A dead task as ``Queue.dead_tasks`` lists it; an envelope that does not decode is
    shown as its data."""
    error = codec.decode_error(entry.error) if entry.error else None
    task, data = None, None
    if entry.envelope is not None:
        try:
            envelope = codec.decode_envelope(entry.envelope)
            task, data = envelope.task, envelope.data
        except DecodeError as problem:
            data = f"<undecodable envelope: {problem}>"
    return DeadTask(
        id=entry.task_id,
        died_at=entry.died_at_ms / 1000,
        task=task,
        data=data,
        error=error.error if error else "",
        traceback=error.traceback if error else "",
        attempts=error.attempt if error else 0,
    )


def minute_figures(minute: int, totals: dict[str, int], maxima: dict[str, int]) -> MinuteFigures:
    """One minute's figures, from every shard's counts summed (``totals``, by
    "<minute>:<figure>") and the largest of each minute (``maxima``, µs, by
    "<minute>:late_max_us" and "<minute>:held_max_us")."""
    completed = totals.get(f"{minute}:completed", 0)
    late_sum = totals.get(f"{minute}:late_sum_us", 0)
    late_max = maxima.get(f"{minute}:late_max_us")
    held_sum = totals.get(f"{minute}:held_sum_us", 0)
    held_max = maxima.get(f"{minute}:held_max_us", 0)
    return MinuteFigures(
        start=minute * MINUTE_MS / 1000,
        completed=completed,
        retried=totals.get(f"{minute}:retried", 0),
        dead=totals.get(f"{minute}:dead", 0),
        lateness_mean=late_sum / completed / 1e6 if completed else None,
        lateness_max=late_max / 1e6 if completed and late_max is not None else None,
        held_mean=held_sum / completed / 1e6 if completed else None,
        held_max=held_max / 1e6 if completed else None,
    )
