"""Stopping an attempt whose task was cancelled while it ran. The worker hears of it
from its queues' cancel channels at once (store/cancel_signals.py), and from the
heartbeat in any case (store/lua/include/cancelling.lua marks the task on the server);
this module asks the handler to stop and bounds how long the worker waits for it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from duetime.store.redis.cancel_signals import CancelListener
from duetime.worker.state import Attempt, SharedState, WorkerSetup
from duetime.worker.timeouts import TimeoutTimer


def stop_cancelled(attempt: Attempt, timeouts: TimeoutTimer, grace: float) -> None:
    """The task of ``attempt`` was cancelled. An async handler (or an attempt whose handler
    has not started: it is waiting for its run-at) is cancelled at once; a plain function
    cannot be interrupted, so it sees ``current_task().cancelled`` and has ``grace``
    seconds to return. At the end of the grace the attempt is cancelled (again, for an
    async handler that swallowed the first): the worker stops waiting for it, and the
    step that reports it ends the task as cancelled."""
    if attempt.cancel_asked or attempt.finished or attempt.fenced:
        return
    attempt.cancel_asked = True
    attempt.cancel_heard = now = time.monotonic()
    deadline = now + grace
    if not attempt.deadline or deadline < attempt.deadline:
        attempt.deadline = deadline
        if timeouts.handle is None or deadline < timeouts.at:
            timeouts.arm(deadline)
    if attempt.thread_call is None and attempt.runner is not None:
        attempt.runner.cancel()


def past_grace(attempt: Attempt, now: float, grace: float) -> bool:
    """Whether a cancelled attempt outlived its grace (and a second past it): its lease
    is then no longer renewed, so the task ends (as cancelled) even if the handler never
    returns and the worker cannot report it."""
    return attempt.cancel_asked and now - attempt.cancel_heard > grace + 1


def cancel_listening(
    setup: WorkerSetup, state: SharedState, timeouts: TimeoutTimer
) -> Callable[[], Awaitable[None]]:
    """The worker's part that stops an attempt as soon as its task's cancel is published
    (until the worker closes), as a loop for the supervisor."""
    shards = {shard.operations.keys.cancel_channel: shard for shard in setup.shards}
    listener = CancelListener(setup.runner, list(shards), f"worker {setup.worker_id}")

    def heard(channel: str, task_id: str) -> None:
        shard = shards.get(channel)
        attempt = None if shard is None else state.held.get((shard.index, task_id))
        if attempt is not None:
            stop_cancelled(attempt, timeouts, setup.settings.cancel_grace)

    return lambda: listener.listen(heard, state.closing)
