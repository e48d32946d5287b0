"""The queue's history of finished attempts from the client's side: listing them
(newest first, filtered by handler, outcome or task, a sharded queue's shards merged),
and reading or changing how many each shard keeps."""

from __future__ import annotations

from collections.abc import Callable

from duetime import validation
from duetime.client.models import FinishedAttempt, TaskRef
from duetime.client.preparing import task_name_of
from duetime.client.shards import QueueShards
from duetime.errors import InvalidInputError
from duetime.states import HistoryOutcome
from duetime.store.plans.history import MOST_HISTORY_SIZE, HistoryEntry
from duetime.store.plans.operations import QueueOperations
from duetime.store.plans.requests import Plan

#: Entries read per round trip while a listing looks for the ones it wants.
HISTORY_CHUNK = 500
#: The most entries a listing returns (a task's own included).
MOST_LISTED = 10_000


def finished_attempt(entry: HistoryEntry) -> FinishedAttempt:
    return FinishedAttempt(
        task_id=entry.task_id,
        task=entry.task,
        outcome=entry.outcome,
        attempt=entry.attempt,
        finished_at=entry.finished_ms / 1000,
        worker=entry.worker,
        duration=None if entry.duration_us is None else entry.duration_us / 1e6,
        lateness=None if entry.lateness_us is None else entry.lateness_us / 1e6,
        error=entry.error,
        count=entry.count,
        last_at=None if entry.last_ms is None else entry.last_ms / 1000,
    )


def history_outcome(value: object) -> HistoryOutcome:
    """An outcome as the history names it, checked."""
    if isinstance(value, str) and value in HistoryOutcome.__members__.values():
        return HistoryOutcome(value)
    named = ", ".join(HistoryOutcome)
    raise InvalidInputError(f"outcome must be one of {named}, got {value!r}")


class HistoryPlans:
    """The plans that read a queue's history and change its size."""

    def __init__(self, queue: QueueShards) -> None:
        self.queue = queue

    def history_plan(
        self,
        limit: int,
        offset: int,
        task: TaskRef | None,
        outcome: HistoryOutcome | str | None,
        task_id: str | None,
    ) -> Plan[list[FinishedAttempt]]:
        """Finished attempts, newest first: all of them, or one handler's (``task``; ""
        is the default handler), with one outcome, or one task's (``task_id``), from
        ``offset`` on."""
        validation.whole_number(limit, "limit", 1, MOST_LISTED)
        validation.whole_number(offset, "offset", 0, MOST_HISTORY_SIZE)
        name = None if task is None else "" if task == "" else task_name_of(task)
        wanted = None if outcome is None else history_outcome(outcome)

        def keep(entry: HistoryEntry) -> bool:
            return (name is None or entry.task == name) and (
                wanted is None or entry.outcome == wanted
            )

        if task_id is not None:
            validation.task_id(task_id)
            found = yield from self._of_task(task_id, offset + limit)
            entries = [entry for entry in found if keep(entry)]
        else:
            entries = []
            for shard in self.queue.shards:
                entries += yield from _matching(shard, keep, offset + limit)
            if len(self.queue.shards) > 1:
                entries.sort(key=lambda entry: (entry.finished_ms, entry.number), reverse=True)
        return [finished_attempt(entry) for entry in entries[offset : offset + limit]]

    def _of_task(self, task_id: str, most: int) -> Plan[list[HistoryEntry]]:
        """A task's entries, from the first of its shards (in search order) that has any."""
        for shard in self.queue.search_order(self.queue.layout.of_task(task_id)):
            found = yield from shard.history.task_history(task_id, most)
            if found:
                return found
        return []

    def history_size_plan(self) -> Plan[int]:
        """How many entries each shard's history keeps (0: off); as shard 0 says."""
        size, _ = yield from self.queue.operations.history.history_size()
        return size

    def set_history_plan(self, size: int | None) -> Plan[None]:
        if size is not None:
            validation.whole_number(size, "history size", 0, MOST_HISTORY_SIZE)
        for shard in self.queue.shards:
            yield from shard.history.set_history_size(size)
        if not self.queue.listed:  # a write that makes the queue known, as a first task does
            yield from self.queue.list_queue()


def _matching(
    shard: QueueOperations, keep: Callable[[HistoryEntry], bool], count: int
) -> Plan[list[HistoryEntry]]:
    """The newest ``count`` entries of one shard that ``keep`` keeps, read in chunks."""
    found: list[HistoryEntry] = []
    below = 0
    while len(found) < count:
        entries, below = yield from shard.history.history_run(below, HISTORY_CHUNK)
        found += [entry for entry in entries if keep(entry)]
        if below == 0:
            break
    return found[:count]
