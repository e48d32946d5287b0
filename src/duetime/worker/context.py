"""What a handler can learn of the attempt it runs: ``current_task()``."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import TYPE_CHECKING

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


#: The attempt a handler runs, in the attempt's own context. Its TaskContext is made
#: only when asked for: most handlers never ask, and an attempt must cost little.
current_attempt: contextvars.ContextVar[Attempt] = contextvars.ContextVar("duetime_task")


def current_task() -> TaskContext:
    """The attempt the calling handler runs; LookupError outside a handler."""
    return current_attempt.get().task_context()
