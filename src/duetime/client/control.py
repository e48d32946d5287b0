"""Changing what a queue holds or does, task by task or as a whole: cancel, reschedule,
run now, pause and resume, requeue or purge dead tasks. The plans of ``QueueCore`` that
act on tasks already written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from duetime import codec, validation
from duetime.client.inspection import Inspection
from duetime.client.models import Duration, TaskIds, Timestamp
from duetime.client.shards import QueueShards
from duetime.errors import TaskNotFoundError, TaskStateError
from duetime.states import RescheduleOutcome, TaskState
from duetime.store.plans.operating import OperatorPlans
from duetime.store.plans.requests import Plan

#: A dead-letter step of the store (requeue or purge), on one shard: the ids it took.
DeadStep = Callable[[OperatorPlans, Sequence[str]], Plan[list[str]]]


class Control:
    """The plans that change tasks already written, or the whole queue (a task's state is
    read first by some, through ``inspection``: ``run_now`` acts on a waiting task only)."""

    def __init__(self, queue: QueueShards, inspection: Inspection) -> None:
        self.queue = queue
        self.inspection = inspection

    def cancel_plan(self, task_id: str) -> Plan[bool]:
        """Remove a waiting (or dead) task; for a running one, ask its worker to stop it:
        the end of its attempt ends it as cancelled. False when no live task has the id."""
        validation.task_id(task_id)
        place = yield from self.queue.first_found(
            task_id, lambda shard: shard.producer.cancel(task_id)
        )
        return place is not None

    def reschedule_plan(self, task_id: str, at: Timestamp) -> Plan[None]:
        validation.task_id(task_id)
        run_at_ms = validation.timestamp_ms(at)
        outcome = yield from self.queue.first_found(
            task_id,
            lambda shard: shard.producer.reschedule(task_id, run_at_ms, codec.rescheduled_envelope),
        )
        if outcome is None:
            raise TaskNotFoundError(f"no live task {task_id!r} in queue {self.queue.name!r}")
        if outcome != RescheduleOutcome.OK:
            raise TaskStateError(f"task {task_id} is {outcome} and cannot be rescheduled")

    def reschedule_in_plan(self, task_id: str, delay: Duration) -> Plan[None]:
        """Move a waiting task to ``delay`` from now, by its shard's server clock."""
        validation.task_id(task_id)
        delay_ms = validation.delay_ms(delay)
        now_ms = yield from self.queue.home(task_id).state.now()
        yield from self.reschedule_plan(task_id, (now_ms + delay_ms) / 1000)

    def pause_plan(self, paused: bool) -> Plan[bool]:
        """Pause or resume every shard; True when any changed. A pause is a write that
        makes the queue known (a queue may be paused before its first task)."""
        changed = False
        for shard in self.queue.shards:
            changed = (yield from shard.operator.set_paused(paused)) or changed
        if paused and not self.queue.listed:
            yield from self.queue.list_queue()
        return changed

    def paused_plan(self) -> Plan[bool]:
        for shard in self.queue.shards:
            if (yield from shard.operator.is_paused()):
                return True
        return False

    def run_now_plan(self, task_id: str) -> Plan[None]:
        """Make a waiting (scheduled) task due now: a delayed task, or a retry waiting
        out its back-off. Its run-at becomes the server's now."""
        status = yield from self.inspection.status_plan(task_id)
        if status is None:
            ended = yield from self.queue.home(task_id).history.task_history(task_id, 1)
            if ended:  # it ran (or was cancelled) already: say so, not "unknown"
                raise TaskStateError(
                    f"task {task_id} already ended ({ended[0].outcome}, attempt "
                    f"{ended[0].attempt}) and is no longer queued: only a waiting task can "
                    "be run now"
                )
            raise self.inspection.not_found(task_id)
        if status.state != TaskState.SCHEDULED:
            raise TaskStateError(
                f"task {task_id} is {status.state}, not scheduled: only a waiting task can "
                "be run now"
            )
        now_ms = yield from self.queue.home(task_id).state.now()
        yield from self.reschedule_plan(task_id, now_ms / 1000)

    def requeue_plan(self, task_ids: TaskIds) -> Plan[int]:
        """Requeue the given dead tasks (one id, or a sequence), or all when None."""
        return (yield from self._each_dead(task_ids, OperatorPlans.requeue_dead))

    def purge_plan(self, task_ids: TaskIds) -> Plan[int]:
        """Delete the given dead tasks (one id, or a sequence), or all when None."""
        return (yield from self._each_dead(task_ids, OperatorPlans.purge_dead))

    def _each_dead(self, task_ids: TaskIds, step: DeadStep) -> Plan[int]:
        """Apply a dead-letter step to the given ids, or to every dead task, in every
        shard (a step leaves ids it does not find alone); returns how many it applied to."""
        if task_ids is not None:
            return len((yield from self.named_dead(validation.task_ids(task_ids), step)))
        total = 0
        for shard in self.queue.shards:
            while batch := (yield from shard.operator.dead_ids(1000)):
                total += len((yield from step(shard.operator, batch)))
        return total

    def named_dead(self, ids: Sequence[str], step: DeadStep) -> Plan[list[str]]:
        """A dead-letter step on ``ids`` in every shard, each id once (a task written
        under another shard count is found where it is): the ids it applied to."""
        done: list[str] = []
        left = list(ids)
        for shard in self.queue.shards:
            if not left:
                break
            taken = set((yield from step(shard.operator, left)))
            done += [task_id for task_id in left if task_id in taken]
            left = [task_id for task_id in left if task_id not in taken]
        return done
