"""The plans of flow control: change a queue's limits, read them back, and read what
holds its due tasks (per limit key: waiting, running, throttled until when)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from duetime.store import scripts
from duetime.store.base import QueueBase
from duetime.store.replies import as_text
from duetime.store.requests import Batch, Command, Eval, Plan

#: A rate limit's wait of the whole queue, in the throttled set and the rate state.
QUEUE_GROUP = "\0"
#: Limit keys read per step when listing them (each one costs a range read).
GROUPS_PER_READ = 200


@dataclass(frozen=True, slots=True)
class GroupFlow:
    """What holds one limit key's tasks ("" for tasks without one)."""

    key: str
    due: int  # due tasks waiting for a turn or a limit
    running: int  # started tasks holding their lease
    throttled_until_ms: float | None  # its rate limit lets the next start then
    has_turn: bool  # in the turns: a claim looks at it


@dataclass(frozen=True, slots=True)
class FlowState:
    """A queue's flow control as it stands."""

    enabled: bool  # the limits hash exists: due tasks wait by rank, key and limits
    fields: dict[str, str]  # the limits hash
    due: int
    running: int
    queue_throttled_until_ms: float | None
    groups: list[GroupFlow]  # the keys with due or running tasks (up to the count asked)


def _group_range(key: str) -> tuple[str, str]:
    return f"[{key}\0", f"({key}\1"


@dataclass(frozen=True, slots=True)
class Hold:
    """What holds a due task's limit key (its group) as it stands: the facts a reason
    is told from."""

    key: str
    key_throttled_until_ms: float | None
    queue_throttled_until_ms: float | None
    key_running: int
    key_concurrency: int | None
    queue_running: int
    cap: int | None

    def reason(self) -> str:
        """Why the key's next task does not start now, in words."""
        whose = f"key {self.key!r}" if self.key else "tasks without a limit key"
        if self.queue_throttled_until_ms is not None:
            return f"the queue's rate limit, until {_when(self.queue_throttled_until_ms)}"
        if self.key_throttled_until_ms is not None:
            return f"the rate limit of {whose}, until {_when(self.key_throttled_until_ms)}"
        if self.cap is not None and self.queue_running >= self.cap:
            return f"the queue's cap: {self.queue_running} of {self.cap} running"
        if self.key_concurrency is not None and self.key_running >= self.key_concurrency:
            return f"a free slot of {whose}: {self.key_running} of {self.key_concurrency} running"
        return "its turn: limit keys take turns, and a worker's free slot"


def _when(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


class FlowPlans(QueueBase):
    """Limits and what they hold, for the client, the CLI and the dashboard."""

    def set_limits(
        self, mode: Literal["replace", "queue", "update"], fields: Sequence[str]
    ) -> Plan[int]:
        """Change the limits hash (``fields``: name, value, ...; an empty value drops the
        field): "replace" drops every limit not given, "queue" every limit of the queue
        and of each key not given (keys' own are kept), "update" none. Every key with
        due tasks is looked at again. Returns how many keys were given a turn back."""
        now = yield from self.now()
        k = self.keys
        keys = (*k.flow_keys, k.leases, k.wake, k.ready)
        return int((yield Eval(scripts.SET_LIMITS, keys, (now, mode, *fields))))

    def limit_fields(self) -> Plan[dict[str, str] | None]:
        """The limits hash, or None when the queue is not under flow control."""
        reply = yield Command(("HGETALL", self.keys.limits))
        if isinstance(reply, list):  # some clients leave HGETALL as a flat list
            reply = dict(zip(reply[::2], reply[1::2], strict=True))
        if not reply:
            return None
        return {as_text(name): as_text(value) for name, value in reply.items()}

    def flow_state(self, most_groups: int = 50) -> Plan[FlowState]:
        """The flow control of the queue: its limits, and the first ``most_groups`` keys
        (in key order) that have due or running tasks, each with what holds it."""
        fields = yield from self.limit_fields()
        k = self.keys
        due, running, queue_wait = yield Batch(
            (
                Command(("ZCARD", k.due)),
                Command(("ZCARD", k.running)),
                Command(("ZSCORE", k.throttled, QUEUE_GROUP)),
            ),
            read_only=True,
        )
        names = yield from self._group_names(most_groups)
        groups: list[GroupFlow] = []
        if names:
            replies = yield Batch(
                tuple(
                    command
                    for name in names
                    for command in (
                        Command(("ZLEXCOUNT", k.due, *_group_range(name))),
                        Command(("ZLEXCOUNT", k.running, *_group_range(name))),
                        Command(("ZSCORE", k.throttled, name)),
                        Command(("ZSCORE", k.turns, name)),
                    )
                ),
                read_only=True,
            )
            for n, name in enumerate(names):
                waiting, started, until, turn = replies[4 * n : 4 * n + 4]
                groups.append(
                    GroupFlow(
                        name,
                        int(waiting),
                        int(started),
                        None if until is None else float(until),
                        turn is not None,
                    )
                )
        return FlowState(
            fields is not None,
            fields or {},
            int(due),
            int(running),
            None if queue_wait is None else float(queue_wait),
            groups,
        )

    def hold(self, key: str) -> Plan[Hold]:
        """What holds the due tasks of limit key ``key`` ("" for tasks without one)."""
        [found] = yield from self.holds([key])
        return found

    def holds(self, keys: Sequence[str]) -> Plan[list[Hold]]:
        """``hold`` of each of ``keys``, read in one round trip."""
        k = self.keys
        commands: list[Command] = []
        for key in keys:
            concurrency = [f"concurrency:{key}", "each_concurrency"] if key else []
            commands += (
                Command(("ZSCORE", k.throttled, key)),
                Command(("ZSCORE", k.throttled, QUEUE_GROUP)),
                Command(("ZLEXCOUNT", k.running, *_group_range(key))),
                Command(("ZCARD", k.running)),
                Command(("HMGET", k.limits, "cap", *concurrency)),
            )
        replies = (yield Batch(tuple(commands), read_only=True)) if commands else []
        found = []
        for n, key in enumerate(keys):
            key_wait, queue_wait, key_running, queue_running, limits = replies[5 * n : 5 * n + 5]
            most = next(
                (int(v) for v in limits[1:] if v is not None and as_text(v).isdigit()), None
            )
            cap = as_text(limits[0]) if limits[0] is not None else ""
            found.append(
                Hold(
                    key,
                    None if key_wait is None else float(key_wait),
                    None if queue_wait is None else float(queue_wait),
                    int(key_running),
                    most,
                    int(queue_running),
                    int(cap) if cap.isdigit() else None,
                )
            )
        return found

    def _group_names(self, most: int) -> Plan[list[str]]:
        """The limit keys with due or running tasks, in key order, up to ``most``: the
        sets are walked key by key (one range read per key and set)."""
        found: set[str] = set()
        for key in (self.keys.due, self.keys.running):
            # Each set's first ``most`` keys: together they hold the first ``most`` of both.
            low, seen = "-", 0
            while seen < most:
                reply = yield Command(("ZRANGE", key, low, "+", "BYLEX", "LIMIT", 0, 1))
                if not reply:
                    break
                name = as_text(reply[0]).partition("\0")[0]
                found.add(name)
                seen += 1
                low = _group_range(name)[1]
        return sorted(found)[:most]


def limit_pairs(fields: Mapping[str, str]) -> list[str]:
    """A mapping of limits hash fields as the flat name, value list set_limits takes."""
    return [part for name, value in fields.items() for part in (name, value)]
