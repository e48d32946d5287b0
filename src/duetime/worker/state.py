"""What the parts of a running worker share: the shards it serves, the attempts it
holds, its slots, the outcomes waiting for their ack and the stop flags, with the small
steps that change them (a slot freed, an attempt forgotten, a fenced one dropped).
Only the worker's event loop touches any of it; ``current_attempt`` names, in a handler's
own context, the attempt it runs (``duetime.task_context.current_task()`` reads it)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from duetime import validation
from duetime.hooks import AttemptInfo, HookChain
from duetime.settings import Settings
from duetime.store.plans.operations import QueueOperations
from duetime.store.plans.working import Outcome
from duetime.store.redis.runner import AsyncRunner
from duetime.worker.context import LentConnection

if TYPE_CHECKING:
    from duetime.codec import Envelope
    from duetime.metrics import AttemptTally
    from duetime.worker.threads import ThreadCall

log = logging.getLogger("duetime.worker")


@dataclass(slots=True)
class Shard:
    """The worker's part in one shard of its queue (an unsharded queue is one shard)."""

    index: int
    operations: QueueOperations
    queue: str  # the queue's name (a shard's keys carry its own label)
    worker_id: str
    untracked: list[str] = field(default_factory=list)  # ids in its list not held here
    fences_unreported: int = 0  # outcomes dropped here, not yet added to `fenced`
    paused: bool = False  # the queue was found paused (said once in the log)
    woken: bool = False  # the last wait for a resume was woken, not timed out
    lent: LentConnection | None = None  # the worker's, once it runs (current_task().queue)

    @property
    def label(self) -> str:
        return self.operations.keys.queue


class Attempt:
    """One claimed attempt, from its claim to its reported outcome. A plain class, not a
    dataclass: most fields keep their class-level default for the whole attempt, and
    only the first five are set per attempt (a worker starts tens of thousands a second)."""

    leased_at: float  # monotonic time the lease was last granted or renewed (sent)
    started: float  # monotonic; the claim, then the handler's start
    timeout = 0.0
    max_snoozes = 0  # how many times its task may snooze in all (its handler's or Settings')
    started_ms = 0
    lateness = 0.0  # seconds after it was due (AttemptInfo.due_at) that the handler started
    held = 0.0  # seconds flow control's limits held it before it was due (AttemptInfo.held)
    ran_for = 0.0  # seconds the handler ran, once it ended
    due_ms = 0.0  # when the queue owed it its start (server clock, ms)
    deadline = 0.0  # monotonic; while the handler runs under a timeout, else 0
    fenced = False
    timed_out = False  # cancelled by the timeout timer
    finished = False  # handler returned; outcome being reported
    cancel_asked = False  # the task was cancelled while this attempt ran (see cancels.py)
    cancel_heard = 0.0  # monotonic time the worker heard of that cancel
    ran = False  # the handler was started
    runner: asyncio.Task[None] | None = None
    envelope: Envelope | None = None
    thread_call: ThreadCall | None = None  # a plain handler's run on the worker's threads
    info: AttemptInfo | None = None  # what hooks are told, made when the handler starts
    # Its duetime.TaskContext, made on the first current_task() (above this layer).
    context: object = None

    def __init__(self, shard: Shard, task_id: str, attempt: int, leased_at: float) -> None:
        self.shard = shard
        self.task_id = task_id
        self.attempt = attempt
        self.leased_at = leased_at
        self.started = leased_at

    @property
    def key(self) -> tuple[int, str]:
        return self.shard.index, self.task_id

    def ran_micros(self) -> tuple[int, int] | None:
        """How long the handler ran and how late it started (µs), as the history keeps
        them; None if it never started."""
        if not self.ran:
            return None
        return round(self.ran_for * 1e6), round(max(0.0, self.lateness) * 1e6)

    def attempt_info(self) -> AttemptInfo:
        """What hooks are told of this attempt (once its handler started)."""
        if self.info is None:
            envelope = self.envelope
            assert envelope is not None
            run_at = validation.seconds_of_ms(envelope.run_at_ms)
            due_at = validation.seconds_of_ms(self.due_ms)  # due_ms is at least the run-at
            # Positional: made for each attempt while hooks want it, and keywords cost a
            # third more.
            self.info = AttemptInfo(
                self.shard.queue,
                self.task_id,
                envelope.task,
                self.attempt,
                envelope.max_attempts,
                run_at,
                due_at + self.lateness,
                self.shard.worker_id,
                due_at,
                self.held,
            )
        return self.info


#: The attempt a handler runs, in the attempt's own context. Its TaskContext is made
#: only when asked for: most handlers never ask, and an attempt must cost little.
current_attempt: contextvars.ContextVar[Attempt] = contextvars.ContextVar("duetime_task")


@dataclass(slots=True)
class WorkerCounters:
    succeeded: int = 0
    failed: int = 0
    dead: int = 0
    fenced: int = 0  # outcomes dropped because the attempt's lease was gone
    timed_out: int = 0
    dropped: int = 0  # ids found without an envelope
    snoozed: int = 0  # attempts whose handler asked to run again later (Snooze)
    cancelled: int = 0  # attempts whose task was cancelled while they ran
    expired: int = 0  # tasks dropped unstarted: they had not started by their expiry


@dataclass(frozen=True, slots=True)
class WorkerSetup:
    """What every part of a running worker is given and never changes: who it is, what
    it serves and how it reaches Redis."""

    worker_id: str
    queue: str
    settings: Settings
    runner: AsyncRunner
    shards: list[Shard]
    lease_ms: int
    hooks: HookChain
    # The built-in metrics count attempts in bulk rather than through a hook.
    tally: AttemptTally | None


class SharedState:
    """The fields the claim, run, ack and heartbeat loops share, in one object handed
    to each of them."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.counters = WorkerCounters()
        # Running, or finished with the outcome in flight; by (shard, task id).
        self.held: dict[tuple[int, str], Attempt] = {}
        self.running = 0
        self.reserved = 0  # slots a claimer is claiming for right now
        self.slot_freed = asyncio.Event()
        self.outcomes: list[tuple[Shard, Outcome]] = []
        self.outcome_ready = asyncio.Event()
        self.stop = asyncio.Event()  # stop claiming
        self.closing = asyncio.Event()  # running attempts are done or abandoned
        self.stop_now = False

    def free(self) -> int:
        return self.concurrency - self.running - self.reserved

    def release_slot(self) -> None:
        self.running -= 1
        self.slot_freed.set()

    def forget(self, shard: Shard, task_id: str, attempt: int) -> None:
        """Drop a finished attempt, unless the task was claimed again meanwhile (a
        fenced attempt finishing late must not drop its successor's entry)."""
        held = self.held.get((shard.index, task_id))
        if held is not None and held.attempt == attempt:
            del self.held[held.key]

    def drop(self, attempt: Attempt) -> None:
        """An attempt fenced before its outcome reached Redis: the outcome is dropped here,
        so it is counted here, and the queue's `fenced` counter learns of it with the next
        heartbeat (or the hand-back). Refusals by the ack and fail scripts are counted by
        those scripts: each dropped outcome is counted once, where it is dropped."""
        self.counters.fenced += 1
        attempt.shard.fences_unreported += 1
        self.forget(attempt.shard, attempt.task_id, attempt.attempt)


def log_dropped(dropped: list[Outcome] | list[Attempt], what: str) -> None:
    """One warning for a batch of fenced attempts, ids at debug level: a failover can
    fence hundreds at once. The lease may have expired or been lost with a server (a
    failover to a replica that had not yet seen it): the worker cannot tell which."""
    log.warning(
        "%d %s(s) dropped: their leases were gone (expired, or lost in a failover)",
        len(dropped),
        what,
    )
    if log.isEnabledFor(logging.DEBUG):
        named = ", ".join(f"{each.task_id} attempt {each.attempt}" for each in dropped)
        log.debug("dropped %s(s): %s", what, named)
