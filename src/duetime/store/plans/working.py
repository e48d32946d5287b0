"""The worker's plans: take a ready id, lease it (claim), renew leases (heartbeat),
report outcomes (ack, fail), hand ids back, wait while the queue is paused, and leave
(release_worker)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from duetime.store.plans import scripts
from duetime.store.plans.base import QueuePlans
from duetime.store.plans.history import packed_record
from duetime.store.plans.replies import as_text, score_or_none
from duetime.store.plans.requests import (
    Command,
    Durability,
    Eval,
    EvalMany,
    Plan,
    packed_arguments,
    wire_id,
    written_durably,
)


@dataclass(slots=True)  # not frozen: made per task, and a frozen __init__ costs ~1 µs
class Claimed:
    task_id: str
    attempt: int
    envelope: bytes | None  # None: the id had no envelope and was dropped
    early_run_at_ms: float | None = None  # due from (QueueKeys.early): wait for it
    problem: str | None = None  # garbage found in the task's records: it goes to dead
    #: Under flow control, when the limits let the task go (a rate, a snooze, a free slot):
    #: its lateness counts from then, and the wait before it is "held" (metrics.md).
    held_until_ms: float | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    was_registered: bool
    lost: list[tuple[str, int]]  # (task id, attempt) of attempts whose lease is gone (fenced)
    held: list[str]  # every id in the worker's processing list
    cancelling: list[str]  # ids of attempts named whose cancel was asked: stop them


class Ended(IntEnum):
    """What the step that ends an attempt did with it."""

    FENCED = 0  # its lease was gone or superseded: the outcome was dropped and counted
    APPLIED = 1  # as reported (acked, retried, dead or snoozed)
    CANCELLED = 2  # its cancel was asked while it ran: it ended as cancelled instead
    EXPIRED = 3  # it did not start by its task's expiry: the task ended as expired


@dataclass(slots=True)  # not frozen: made per task, and a frozen __init__ costs ~1 µs
class Outcome:
    """A successful attempt to acknowledge."""

    task_id: str
    attempt: int
    result_ttl_ms: int = 0
    result: bytes = b""
    lateness_us: int = 0  # how long after it was due (and let go by its limits) it started
    duration_us: int = 0  # how long the handler ran (the history keeps it)
    task: str = ""  # the handler's name, for the history
    held_us: int = 0  # how long its limits held it after it was due (flow control)


class WorkerPlans(QueuePlans):
    """The plans a worker runs on its queue."""

    def take_ready(self, worker_id: str, timeout: float) -> Plan[str | None]:
        """Block until a task id is ready and move it into the worker's processing list."""
        k = self.keys
        reply = yield Command(
            ("BLMOVE", k.ready, k.active(worker_id), "LEFT", "RIGHT", timeout), block=timeout
        )
        return None if reply is None else as_text(reply)

    def give_back(self, worker_id: str, task_id: str) -> Plan[bool]:
        """Put an id taken by BLMOVE, not yet leased, back at the head of ready."""
        now = yield from self.state.now()
        k = self.keys
        keys = (
            k.active(worker_id),
            k.ready,
            k.tasks,
            k.stats,
            k.cancelling,
            k.attempts,
            k.errors,
            k.early,
            k.flow_records,
            *k.history_keys,
        )
        return bool((yield Eval(scripts.GIVE_BACK_TASK, keys, (task_id, now, worker_id))))

    def claim(
        self, worker_id: str, lease_ms: int, most: int, taken: Sequence[str] = ()
    ) -> Plan[list[Claimed] | None]:
        """Lease the ids already ``taken`` by BLMOVE plus up to ``most`` more from ready.
        None while the queue is paused: nothing is leased, the taken ids are back at
        the head of ready."""
        now = yield from self.state.now()
        k = self.keys
        reply = yield Eval(
            scripts.CLAIM_TASKS,
            (
                k.ready,
                k.active(worker_id),
                k.leases,
                k.attempts,
                k.tasks,
                k.workers,
                k.early,
                k.paused,
                k.stats,
                *k.flow_keys,
                k.wake,
                k.flow_holds,
            ),
            (now, now + lease_ms, worker_id, most, *taken),
        )
        if not isinstance(reply, list):
            return None
        return [
            Claimed(
                as_text(reply[i]),
                int(reply[i + 1]),
                reply[i + 2],
                score_or_none(reply[i + 3]),
                as_text(reply[i + 4]) if reply[i + 4] else None,
                score_or_none(reply[i + 5]),
            )
            for i in range(0, len(reply), 6)
        ]

    def heartbeat(
        self,
        worker_id: str,
        lease_ms: int,
        running: Sequence[tuple[str, int]],
        fenced_outcomes: int = 0,
    ) -> Plan[HeartbeatReply]:
        """Prove the worker alive and renew its running attempts' leases; also adds the
        outcomes the worker dropped itself (fenced) to the queue's counter."""
        now = yield from self.state.now()
        k = self.keys
        args: list[Any] = [now, now + lease_ms, worker_id, fenced_outcomes]
        for task_id, attempt in running:
            args += (task_id, attempt)
        known, lost, held, cancelling = yield Eval(
            scripts.HEARTBEAT,
            (k.workers, k.leases, k.attempts, k.active(worker_id), k.stats, k.cancelling),
            args,
        )
        return HeartbeatReply(
            bool(known),
            [(as_text(lost[i]), int(lost[i + 1])) for i in range(0, len(lost), 2)],
            [as_text(i) for i in held],
            [as_text(i) for i in cancelling],
        )

    def ack(
        self, worker_id: str, outcomes: Sequence[Outcome], durability: Durability | None = None
    ) -> Plan[list[Ended]]:
        now = yield from self.state.now()
        k = self.keys
        keys = [
            k.active(worker_id),
            k.leases,
            k.attempts,
            k.tasks,
            k.errors,
            k.stats,
            k.minutes,
            *k.flow_keys,
            k.wake,
            k.ready,
            *k.history_keys,
            k.cancelling,
            k.flow_holds,
        ]
        flat: list[Any] = []
        for outcome in outcomes:
            flat += (
                wire_id(outcome.task_id),
                outcome.attempt,
                outcome.result_ttl_ms,
                outcome.result,
                outcome.lateness_us,
                packed_record(
                    outcome.task_id,
                    outcome.task,
                    outcome.attempt,
                    now,
                    worker_id,
                    outcome.duration_us,
                    outcome.lateness_us,
                ),
            )
            if outcome.result_ttl_ms > 0:
                keys.append(k.result(outcome.task_id))
        # One msgpack argument, not six per outcome: redis-py packs arguments one by one,
        # which cost the worker more per task than the rest of its ack.
        args: list[Any] = [now, worker_id, packed_arguments(flat)]
        if any(outcome.held_us for outcome in outcomes):  # flow control held some
            args.append(packed_arguments([outcome.held_us for outcome in outcomes]))
        if durability is not None:
            [flags] = yield from written_durably(
                EvalMany(scripts.ACK_TASKS, [(keys, args)]), durability
            )
        else:
            flags = yield Eval(scripts.ACK_TASKS, keys, args)
        return [Ended(flag) for flag in flags]

    def fail(
        self,
        worker_id: str,
        task_id: str,
        attempt: int,
        error: bytes,
        retry_delay_ms: int | None,
        result_ttl_ms: int = 0,
        result: bytes = b"",
        ran: tuple[int, int] | None = None,
        summary: str = "",
        expired: bool = False,
    ) -> Plan[Ended]:
        """Record a failed attempt: retry ``retry_delay_ms`` from now (server clock), or
        move the task to dead when it is None. ``ran``: how long the handler ran and how
        late it started (µs), None if it never started; ``summary``: the error as the
        history keeps it. ``expired``: the attempt did not start by the task's expiry,
        and the task ends as expired."""
        now = yield from self.state.now()
        k = self.keys
        applied = yield Eval(
            scripts.FAIL_TASK,
            (
                k.active(worker_id),
                k.leases,
                k.attempts,
                k.errors,
                k.scheduled,
                k.dead,
                k.wake,
                k.stats,
                k.result(task_id),
                k.minutes,
                k.early,
                *k.flow_keys,
                k.ready,
                k.tasks,
                *k.history_keys,
                k.cancelling,
            ),
            (
                now,
                worker_id,
                task_id,
                attempt,
                error,
                -1 if retry_delay_ms is None else now + retry_delay_ms,
                result_ttl_ms,
                result,
                *(ran or (-1, -1)),
                summary,
                "expired" if expired else "",
            ),
        )
        return Ended(applied)

    def snooze(
        self,
        worker_id: str,
        task_id: str,
        attempt: int,
        delay_ms: int,
        whole_key: bool,
        ran: tuple[int, int] = (0, 0),
    ) -> Plan[Ended]:
        """Run the task again ``delay_ms`` from now (server clock), giving its attempt
        back; with ``whole_key``, no task of its limit key starts before then either.
        ``ran``: how long the handler ran and how late it started (µs), for the history."""
        now = yield from self.state.now()
        k = self.keys
        keys = (
            k.active(worker_id),
            k.leases,
            k.attempts,
            k.scheduled,
            k.wake,
            k.stats,
            k.early,
            *k.flow_keys,
            k.ready,
            k.tasks,
            *k.history_keys,
            k.cancelling,
            k.errors,
        )
        arguments = (now, worker_id, task_id, attempt, now + delay_ms, int(whole_key), *ran)
        return Ended((yield Eval(scripts.SNOOZE_TASK, keys, arguments)))

    def release_worker(
        self, worker_id: str, look_again_in_ms: int, fenced_outcomes: int = 0
    ) -> Plan[int]:
        """Hand the worker's tasks back and deregister it; its list is looked at once
        more ``look_again_in_ms`` later (a BLMOVE cut off by the stop may land there).
        ``fenced_outcomes``: outcomes it dropped itself, not yet counted."""
        now = yield from self.state.now()
        k = self.keys
        return int(
            (
                yield Eval(
                    scripts.RELEASE_WORKER,
                    (
                        k.workers,
                        k.active(worker_id),
                        k.leases,
                        k.attempts,
                        k.ready,
                        k.stats,
                        k.reaped,
                        k.tasks,
                        k.early,
                        *k.flow_keys,
                        k.wake,
                        k.cancelling,
                        k.errors,
                        *k.history_keys,
                    ),
                    (worker_id, now + look_again_in_ms, fenced_outcomes, now),
                )
            )
        )

    def wait_resumed(self, timeout: float) -> Plan[bool]:
        """Block until the queue is resumed, up to ``timeout`` seconds; every paused
        worker wakes (the element stays: BLMOVE from the list to itself)."""
        key = self.keys.resumed
        reply = yield Command(("BLMOVE", key, key, "LEFT", "LEFT", timeout), block=timeout)
        return reply is not None
