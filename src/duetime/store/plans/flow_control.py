"""The plans of flow control: change a queue's limits, read them back, and read what
holds its due tasks (per limit key: waiting, running, throttled until when)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from duetime import validation
from duetime.flow import record_parts
from duetime.store.plans import scripts
from duetime.store.plans.base import QueuePlans
from duetime.store.plans.replies import as_text
from duetime.store.plans.requests import Batch, Command, Eval, Plan

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
    #: When the key's next task in line was due (ms; its rank less its priority), or None.
    head_due_ms: float | None = None


@dataclass(frozen=True, slots=True)
class FlowState:
    """A queue's flow control as it stands."""

    enabled: bool  # the limits hash exists: due tasks wait by rank, key and limits
    fields: dict[str, str]  # the limits hash
    due: int
    running: int
    queue_throttled_until_ms: float | None
    groups: list[GroupFlow]  # the keys with due or running tasks (up to the count asked)

    def held_since_ms(self, group: GroupFlow) -> float | None:
        """When the next task of ``group`` became due, while a limit holds it (its key's
        concurrency or rate, out of the turns, or the queue's cap or rate); else None:
        its due tasks wait for a worker, not for a limit (metrics.md)."""
        if not group.due or group.head_due_ms is None:
            return None
        cap = self.fields.get("cap", "")
        queue_held = self.queue_throttled_until_ms is not None or (
            validation.is_whole(cap) and self.running >= int(cap)
        )
        return group.head_due_ms if queue_held or not group.has_turn else None


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


class FlowPlans(QueuePlans):
    """Limits and what they hold, for the client, the CLI and the dashboard."""

    def set_limits(
        self, mode: Literal["replace", "queue", "update"], fields: Sequence[str]
    ) -> Plan[int]:
        """Change the limits hash (``fields``: name, value, ...; an empty value drops the
        field): "replace" drops every limit not given, "queue" every limit of the queue
        and of each key not given (keys' own are kept), "update" none. Every key with
        due tasks is looked at again. Returns how many keys were given a turn back."""
        now = yield from self.state.now()
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
            heads = yield from self._head_due(names)
            for n, name in enumerate(names):
                waiting, started, until, turn = replies[4 * n : 4 * n + 4]
                groups.append(
                    GroupFlow(
                        name,
                        int(waiting),
                        int(started),
                        None if until is None else float(until),
                        turn is not None,
                        heads[n],
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
                (int(v) for v in limits[1:] if v is not None and validation.is_whole(as_text(v))),
                None,
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
                    int(cap) if validation.is_whole(cap) else None,
                )
            )
        return found

    def _head_due(self, names: Sequence[str]) -> Plan[list[float | None]]:
        """When each key's next task in line (its best-ranked due task) was due, in ms:
        its rank (run-at less 1000 ms per point of priority) plus its priority's share."""
        k = self.keys
        firsts = yield Batch(
            tuple(
                Command(("ZRANGE", k.due, *_group_range(name), "BYLEX", "LIMIT", 0, 1))
                for name in names
            ),
            read_only=True,
        )
        members = [as_text(first[0]).split("\0", 2) if first else [] for first in firsts]
        ranked = [m for m in members if len(m) == 3 and validation.is_whole(m[1])]
        records = (
            (yield Command(("HMGET", k.flow_records, *(m[2] for m in ranked)))) if ranked else []
        )
        priority = {
            m[2]: record_parts(as_text(record))[0] if record else 0
            for m, record in zip(ranked, records, strict=True)
        }
        return [
            float(m[1]) + 1000 * priority[m[2]] if len(m) == 3 and m[2] in priority else None
            for m in members
        ]

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
