"""What the Finished page and a task's page show of the queue's history of finished
attempts, read through the public ``AsyncQueue`` API: a page of attempts, newest first,
filtered by handler and outcome, and one task's attempts."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from duetime import AsyncQueue, FinishedAttempt, HistoryOutcome
from duetime.client.history import history_outcome
from duetime.errors import InvalidInputError

#: Attempts shown per page of the Finished list.
FINISHED_PAGE = 50
#: Most attempts of one task its page shows.
TASK_ATTEMPTS = 100
#: How the default handler (task name "") is shown, and may be typed in the filter.
DEFAULT_HANDLER_SHOWN = "(default)"
OUTCOMES: tuple[str, ...] = tuple(HistoryOutcome)


@dataclass(frozen=True, slots=True)
class FinishedQuery:
    """The Finished page's filters as typed ("" for none) and its page number."""

    task: str = ""
    outcome: str = ""
    page: int = 0

    @property
    def filtered(self) -> bool:
        return bool(self.task or self.outcome)


@dataclass(frozen=True, slots=True)
class FinishedPage:
    attempts: list[FinishedAttempt]
    has_next: bool
    size: int  # how many attempts the history keeps (per shard; 0: it is off)
    error: str | None = None  # a filter that cannot be used, said to the person


async def finished_page(queue: AsyncQueue, query: FinishedQuery) -> FinishedPage:
    """One page of finished attempts, newest first, matching the query's filters."""
    size = await queue.history_size()
    try:
        outcome = history_outcome(query.outcome) if query.outcome else None
        task = None
        if query.task:
            task = "" if query.task == DEFAULT_HANDLER_SHOWN else query.task
        found = await queue.history(
            FINISHED_PAGE + 1, query.page * FINISHED_PAGE, task=task, outcome=outcome
        )
    except InvalidInputError as error:
        return FinishedPage([], False, size, str(error))
    return FinishedPage(found[:FINISHED_PAGE], len(found) > FINISHED_PAGE, size)


async def task_attempts(queue: AsyncQueue, task_id: str) -> tuple[list[FinishedAttempt], int]:
    """A task's finished attempts still kept, newest first; and the history's size."""
    found, size = await asyncio.gather(
        queue.history(TASK_ATTEMPTS, task_id=task_id), queue.history_size()
    )
    return found, size
