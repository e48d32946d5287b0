"""Acting on many waiting tasks at once: cancel, reschedule or run now each task of a
list of ids, chosen by hand or by a search (``matching.select_matching``), and say what
was done and what was skipped, and why (requeue or purge named dead tasks too). A task
that has not started is scheduled, ready, or due and waiting under flow control (for
its turn or a limit): a bulk action reaches each.

Each task is its own atomic step (the same script as for one task), so a task that
started, died or finished meanwhile is skipped, never half-changed; nothing is held
across tasks, and a step that fails part-way leaves the tasks before it done. Every id
is checked before the first step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, tzinfo

from duetime import codec, times, validation
from duetime.client.control import Control, DeadStep
from duetime.client.matching import MatchSelection, counted
from duetime.client.models import Duration, TaskIds, Timestamp
from duetime.client.searching import WAITING
from duetime.client.shards import QueueShards
from duetime.errors import InvalidInputError
from duetime.states import RescheduleOutcome, TaskState
from duetime.store.plans.operating import OperatorPlans
from duetime.store.plans.requests import Plan

#: Why a task was skipped: it was running, dead, already due (run now: ``ready``, or
#: ``waiting`` under flow control for its turn or a limit, which a run now does not
#: pass), or not live.
GONE = "gone"
#: What each action did, as an outcome says it.
DONE = {
    "cancel": "cancelled",
    "reschedule": "rescheduled",
    "run_now": "made due now",
    "requeue": "requeued",
    "purge": "purged",
}
#: Why a dead-letter action skipped an id: no dead task has it (unknown, or not dead).
NOT_DEAD = "not dead"


@dataclass(frozen=True, slots=True)
class BulkOutcome:
    """What a bulk action did: ``done``, the ids it acted on, in the order given;
    ``skipped``, each other id with why (``running``, ``dead``, ``ready`` for a task
    already due that was to run now, or ``gone``: finished, cancelled, never there)."""

    action: str  # cancel | reschedule | run_now | requeue | purge (dead tasks)
    done: list[str]
    skipped: dict[str, str]
    #: A reschedule's new run-at (epoch seconds; one not in the future made them due now).
    run_at: float | None = None

    @property
    def summary(self) -> str:
        """One line for people: ``cancelled 12; skipped 3 (2 running, 1 gone)``; a
        reschedule says to when (in UTC)."""
        return self.described(UTC)

    def described(self, zone: tzinfo | None) -> str:
        """``summary`` with a reschedule's time in ``zone`` (None: this host's)."""
        said = f"{DONE[self.action]} {len(self.done):,}"
        if self.run_at is not None:
            said += f" to {times.format_time(self.run_at, zone)}"
        if not self.skipped:
            return said
        reasons: dict[str, int] = {}
        for reason in self.skipped.values():
            reasons[reason] = reasons.get(reason, 0) + 1
        return f"{said}; skipped {len(self.skipped):,} ({counted(reasons)})"

    def of_matches(self, picked: MatchSelection, zone: tzinfo | None) -> str:
        """What an action on a search's matches did, every match accounted for: ``21
        matched: 18 cancelled, 3 running (not touched)`` (and ``2 skipped (2 running)``
        for chosen tasks that changed before their step)."""
        said = f"{len(self.done):,} {DONE[self.action]}"
        if self.run_at is not None:
            said += f" to {times.format_time(self.run_at, zone)}"
        parts = [said]
        if self.skipped:
            reasons: dict[str, int] = {}
            for reason in self.skipped.values():
                reasons[reason] = reasons.get(reason, 0) + 1
            parts.append(f"{len(self.skipped):,} skipped ({counted(reasons)})")
        if picked.left_alone:
            parts.append(f"{counted(picked.left_alone)} (not touched)")
        if picked.unnameable:
            parts.append(f"{picked.unnameable:,} with an id duetime does not accept (not touched)")
        return f"{picked.matched:,} matched: {', '.join(parts)}"


@dataclass
class _Tally:
    action: str
    done: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    run_at: float | None = None

    def outcome(self) -> BulkOutcome:
        return BulkOutcome(self.action, self.done, self.skipped, self.run_at)


def _checked_ids(task_ids: TaskIds) -> list[str]:
    """The ids, each checked, once each in the order given (None is refused here: a bulk
    action never means every task)."""
    if task_ids is None:
        raise InvalidInputError("give the task ids to act on (a list, or one id)")
    return list(dict.fromkeys(validation.task_ids(task_ids)))


class BulkControl:
    """The plans of ``QueueCore`` that act on many waiting tasks, one atomic step each
    (on dead ones, the steps of ``control``)."""

    def __init__(self, queue: QueueShards, control: Control) -> None:
        self.queue = queue
        self.control = control

    def cancel_many_plan(self, task_ids: TaskIds, stop_running: bool = True) -> Plan[BulkOutcome]:
        """Cancel each task that has not started (scheduled, ready, or waiting under flow
        control), and ask each running one's worker to stop it (it ends as cancelled);
        without ``stop_running`` a running one is skipped and runs (a task claimed while
        the action goes is then cancelled or runs, never both). A dead one is left alone
        (a dead task is purged with ``purge_dead``)."""
        validation.flag(stop_running, "stop_running")
        tally = _Tally("cancel")
        for task_id in _checked_ids(task_ids):
            place = yield from self._cancel_live(task_id, stop_running)
            if place == TaskState.RUNNING and not stop_running:
                tally.skipped[task_id] = str(place)
                continue
            if place in (TaskState.SCHEDULED, TaskState.READY, TaskState.RUNNING):
                tally.done.append(task_id)
            else:
                tally.skipped[task_id] = GONE if place is None else str(place)
        return tally.outcome()

    def reschedule_many_plan(self, task_ids: TaskIds, at: Timestamp) -> Plan[BulkOutcome]:
        """Give each task that has not started (scheduled, ready, or waiting under flow
        control) the run-at ``at``; a time not in the future makes it due now (under
        flow control: due in its key's turn, as a promoted task)."""
        ids = _checked_ids(task_ids)
        run_at_ms = validation.timestamp_ms(at)
        tally = _Tally("reschedule", run_at=run_at_ms / 1000)
        for task_id in ids:
            outcome = yield from self._reschedule_one(task_id, run_at_ms)
            if outcome == RescheduleOutcome.OK:
                tally.done.append(task_id)
            else:
                tally.skipped[task_id] = GONE if outcome is None else str(outcome)
        return tally.outcome()

    def reschedule_many_in_plan(self, task_ids: TaskIds, delay: Duration) -> Plan[BulkOutcome]:
        """``reschedule_many_plan`` to ``delay`` from now, by the server's clock."""
        ids = _checked_ids(task_ids)
        delay_ms = validation.delay_ms(delay)
        now_ms = yield from self.queue.operations.state.now()
        return (yield from self.reschedule_many_plan(ids, (now_ms + delay_ms) / 1000))

    def requeue_many_plan(self, task_ids: TaskIds) -> Plan[BulkOutcome]:
        """``requeue_dead`` of the ids named, saying which were not dead (``NOT_DEAD``)."""
        return (yield from self._dead_many("requeue", task_ids, OperatorPlans.requeue_dead))

    def purge_many_plan(self, task_ids: TaskIds) -> Plan[BulkOutcome]:
        """``purge_dead`` of the ids named, saying which were not dead (``NOT_DEAD``)."""
        return (yield from self._dead_many("purge", task_ids, OperatorPlans.purge_dead))

    def _dead_many(self, action: str, task_ids: TaskIds, step: DeadStep) -> Plan[BulkOutcome]:
        ids = _checked_ids(task_ids)
        done = yield from self.control.named_dead(ids, step)
        taken = set(done)
        return BulkOutcome(action, done, {i: NOT_DEAD for i in ids if i not in taken})

    def _cancel_live(self, task_id: str, stop_running: bool) -> Plan[TaskState | None]:
        return (
            yield from self.queue.first_found(
                task_id, lambda shard: shard.producer.cancel(task_id, True, stop_running)
            )
        )

    def _reschedule_one(self, task_id: str, run_at_ms: float) -> Plan[RescheduleOutcome | None]:
        return (
            yield from self.queue.first_found(
                task_id,
                lambda shard: shard.producer.reschedule(
                    task_id, run_at_ms, codec.rescheduled_envelope
                ),
            )
        )

    def run_now_many_plan(self, task_ids: TaskIds) -> Plan[BulkOutcome]:
        """Make each scheduled task due now (its run-at becomes the server's now; under
        flow control it is then due in its key's turn); a task already due is skipped:
        ``ready``, or ``waiting`` under flow control (a run now passes no limit), as are
        running, dead and gone ones."""
        tally = _Tally("run_now")
        for task_id in _checked_ids(task_ids):
            shard, reply = yield from self.queue.locate(task_id)
            if reply.state != TaskState.SCHEDULED:
                live = reply.state in (TaskState.READY, TaskState.RUNNING, TaskState.DEAD)
                reason = str(reply.state) if live else GONE
                tally.skipped[task_id] = WAITING if reply.waiting else reason
                continue
            now_ms = yield from shard.state.now()
            # The step is atomic: a task claimed since the look above is refused by it.
            outcome = yield from shard.producer.reschedule(
                task_id, now_ms, codec.rescheduled_envelope
            )
            if outcome == RescheduleOutcome.OK:
                tally.done.append(task_id)
            else:
                tally.skipped[task_id] = GONE if outcome is None else str(outcome)
        return tally.outcome()
