"""The plans of debounce, throttle and unique keys: a keyed call (one script call that
reads the key's record, decides and writes), the status of a key's task, and the
dispatcher's sweep of records that mean nothing more."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from duetime.store.plans import scripts
from duetime.store.plans.base import QueuePlans
from duetime.store.plans.replies import as_text
from duetime.store.plans.requests import Eval, Plan, ScriptCall
from duetime.store.plans.scripts import Script

#: Records looked at per sweep call: bounds how long one call holds the server.
SWEEP_BATCH: Final = 500
#: A record is swept this long after it means nothing more: a producer whose clock
#: estimate reads a little behind the dispatcher's may still be using it.
SWEEP_GRACE_MS: Final = 1000
#: The shortest wait before a dispatcher's sweep looks again at a unique key whose task
#: is live (see ``recheck_ms``).
SHORTEST_RECHECK_MS: Final = 1000


def recheck_ms(maintenance_interval: float) -> int:
    """How long a unique key's record waits before a sweep looks at its task again: two
    maintenance intervals (the sweep's own pace), at least a second."""
    return max(SHORTEST_RECHECK_MS, round(2000 * maintenance_interval))


@dataclass(frozen=True, slots=True)
class KeyedReply:
    """What a keyed script answered. ``outcome`` is created, collapsed, dropped or
    existing; or collided (the new task's id was live: nothing written) or collect (the
    key's waiting task collects otherwise: nothing written, ``detail`` says how)."""

    outcome: str
    task_id: str | None = None
    run_at_ms: int | None = None
    calls: int = 0
    until_ms: int | None = None
    state: str | None = None  # unique: the task's state
    detail: str | None = None


def _number(value: Any) -> int | None:
    return None if value is None else int(value)


def keyed_reply(script: Script, reply: list[Any]) -> KeyedReply:
    """A keyed script's reply, read as its header says."""
    outcome = as_text(reply[0])
    if outcome == "collided":
        return KeyedReply(outcome)
    if outcome == "collect":
        return KeyedReply(outcome, detail=as_text(reply[1]))
    task_id = as_text(reply[1])
    if script is scripts.SCHEDULE_UNIQUE:
        return KeyedReply(outcome, task_id, calls=int(reply[3]), state=as_text(reply[2]))
    return KeyedReply(outcome, task_id, _number(reply[2]), int(reply[3]), _number(reply[4]))


class KeyedPlans(QueuePlans):
    """Keyed calls, the status of a key's task, and the sweep of spent records."""

    def keyed_call(
        self,
        now: int,
        field: str,
        task_id: str,
        run_at_ms: int,
        parts: tuple[bytes, bytes, bytes, str],
        extra: Sequence[Any],
    ) -> ScriptCall:
        """The keys and arguments of a keyed script call: its key's field, the id of a
        task it may make, the call's run-at (whole ms, not before ``now``), the
        envelope's head, data and limits and the flow record (``parts``), and the mode's
        own arguments (``extra``, as the script's header lists them)."""
        return self.keys.keyed_keys, (now, field, task_id, run_at_ms, *parts, *extra)

    def keyed_status(self, task_id: str) -> Plan[tuple[str, str | None] | None]:
        """The field of the key whose record names the task, and that record; None when
        no key names it."""
        k = self.keys
        reply = yield Eval(scripts.KEYED_STATUS, (k.keyed_tasks, k.keyed), (task_id,))
        if not reply:
            return None
        field, record = reply
        return as_text(field), None if record is None else as_text(record)

    def sweep_keyed(self, recheck: int, most: int = SWEEP_BATCH) -> Plan[int]:
        """Drop the records of keys that mean nothing more, ``most`` at a time until
        none is due; a unique key whose task is live is looked at again ``recheck`` ms
        later. Returns how many were dropped."""
        k = self.keys
        keys = (k.keyed, k.keyed_expiry, k.keyed_tasks, k.tasks, k.attempts, k.dead)
        dropped = 0
        while True:
            now = yield from self.state.now()
            arguments = (now, most, recheck, now - SWEEP_GRACE_MS)
            reply = yield Eval(scripts.SWEEP_KEYED, keys, arguments)
            dropped += int(reply[0])
            if int(reply[2]) < most:
                return dropped
