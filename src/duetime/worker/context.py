"""What a handler can learn of the attempt it runs (``current_task()``), and what it
can ask of the worker beyond succeeding or failing (``Snooze``)."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import TYPE_CHECKING

from duetime import validation

if TYPE_CHECKING:
    from duetime.worker.state import Attempt


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What a handler may want to know about the attempt it runs (``current_task()``)."""

    id: str
    queue: str
    task: str
    attempt: int
    max_attempts: int
    run_at: float  # epoch seconds
    worker_id: str


#: The longest a handler may snooze its task: past that, schedule a new one.
LONGEST_SNOOZE_SECONDS = 30 * 24 * 3600


class Snooze(Exception):
    """Raise it from a handler to run the task again ``seconds`` from now without
    spending an attempt or recording an error: the remote side said "slow down" or
    "try again in N s". ``whole_key=True`` makes every task of the task's limit key
    wait as long (a Retry-After that applies to the whole API, say)."""

    def __init__(self, seconds: float, *, whole_key: bool = False) -> None:
        self.seconds = validation.positive_seconds(seconds, "a snooze") if seconds else 0.0
        if self.seconds > LONGEST_SNOOZE_SECONDS:
            raise ValueError(f"a snooze is at most 30 days, got {seconds}s; schedule a new task")
        self.whole_key = bool(whole_key)
        super().__init__(f"snoozed for {self.seconds:g}s" + (" (whole key)" if whole_key else ""))


#: The attempt a handler runs, in the attempt's own context. Its TaskContext is made
#: only when asked for: most handlers never ask, and an attempt must cost little.
current_attempt: contextvars.ContextVar[Attempt] = contextvars.ContextVar("duetime_task")


def current_task() -> TaskContext:
    """The attempt the calling handler runs; LookupError outside a handler."""
    return current_attempt.get().task_context()
