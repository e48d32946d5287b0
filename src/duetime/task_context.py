"""``current_task()`` and ``TaskContext``: what a handler learns of the attempt it runs,
and the client of its queue it reaches from there, on the worker's own connection.

The worker lends its connection (``duetime.worker.context.LentConnection``) but knows
nothing of queue clients, and the client knows nothing of workers: this module, above
both, joins them. The clients are made once per worker, on first use, and hold no
connection of their own: a plain function's ``Queue`` hands its plans to the worker's
event loop, an async handler's ``AsyncQueue`` runs them on the worker's runner.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from duetime import validation
from duetime.client import AsyncQueue, Queue, QueueCore
from duetime.errors import QueueNotLentError, TaskCancelledError
from duetime.worker.context import LentConnection
from duetime.worker.state import Attempt, current_attempt


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What a handler may want to know about the attempt it runs (``current_task()``),
    and ``queue``, a client of the task's queue to schedule follow-up work on."""

    id: str
    queue_name: str
    task: str
    attempt: int
    max_attempts: int
    run_at: float  # epoch seconds
    worker_id: str
    timeout: float | None = None  # seconds the attempt may run (None: no timeout)
    #: How many times the task snoozed before this attempt (``Snooze`` gives the attempt
    #: back, so ``attempt`` does not count them), and how many it may in all: the snooze
    #: past ``max_snoozes`` sends the task to dead (``SnoozeLimitError``).
    snoozes: int = 0
    max_snoozes: int = 0
    _lent: LentConnection | None = field(default=None, repr=False, compare=False)
    _attempt: Attempt | None = field(default=None, repr=False, compare=False)

    @property
    def cancelled(self) -> bool:
        """Whether the task was cancelled while this attempt runs. A plain function that
        works in steps checks it between them and returns (or calls
        ``raise_if_cancelled``); the worker waits ``cancel_grace`` seconds for it. An async
        handler is cancelled (``asyncio.CancelledError``) and need not look."""
        return self._attempt is not None and self._attempt.cancel_asked

    def raise_if_cancelled(self) -> None:
        """Raise ``TaskCancelledError`` if the task was cancelled (see ``cancelled``)."""
        if self.cancelled:
            raise TaskCancelledError(self.id)

    @property
    def queue(self) -> Queue | AsyncQueue:
        """The task's queue on the worker's connection: an ``AsyncQueue`` on the worker's
        event loop (an async handler), a ``Queue`` in any other thread (a plain
        function's, or one the handler started). Do not close it: it is the worker's."""
        if self._lent is None:
            raise QueueNotLentError(
                "this TaskContext was not made by a worker, so it has no queue to lend; "
                "open a Queue of your own"
            )
        return lent_client(self._lent)


def current_task() -> TaskContext:
    """The attempt the calling handler runs; LookupError outside a handler."""
    attempt = current_attempt.get()
    if isinstance(attempt.context, TaskContext):
        return attempt.context
    envelope = attempt.envelope
    assert envelope is not None  # set before the handler runs
    shard = attempt.shard
    context = TaskContext(
        id=attempt.task_id,
        queue_name=shard.queue,
        task=envelope.task,
        attempt=attempt.attempt,
        max_attempts=envelope.max_attempts,
        run_at=validation.seconds_of_ms(envelope.run_at_ms),
        worker_id=shard.worker_id,
        timeout=envelope.timeout_ms / 1000 if envelope.timeout_ms else None,
        snoozes=envelope.snoozes,
        max_snoozes=attempt.max_snoozes,
        _lent=shard.lent,
        _attempt=attempt,
    )
    attempt.context = context
    return context


def lent_client(lent: LentConnection) -> Queue | AsyncQueue:
    """The client of ``lent``'s queue for the caller: async on the worker's loop,
    sync in a thread that runs no event loop."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is not None and running is not lent.loop:
        raise QueueNotLentError(
            "current_task().queue serves the worker's event loop and threads that run "
            "none; this code runs on an event loop of its own: open a Queue or an "
            "AsyncQueue of your own there"
        )
    clients: tuple[Queue, AsyncQueue] | None = lent.clients
    if clients is None:
        with lent.making:
            clients = lent.clients
            if clients is None:
                clients = lent.clients = _clients(lent)
    return clients[0] if running is None else clients[1]


def _clients(lent: LentConnection) -> tuple[Queue, AsyncQueue]:
    """One core for both: a sync client's plans run on the worker's loop too."""
    core = QueueCore(lent.queue, lent.settings, lent.clock, None, None, lent.shards, lent.hooks)
    return Queue.lent(core, lent.bridge), AsyncQueue.lent(core, lent.runner)
