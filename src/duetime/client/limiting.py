"""Flow control of a queue as the client sees it: declare its limits, change one limit
key's, read them back, and read what holds its due tasks. The plans of ``QueueCore``
for limits; each shard keeps its own (see docs/flow.md, "Sharded queues")."""

from __future__ import annotations

from duetime import flow, validation
from duetime.client.shards import QueueShards
from duetime.errors import InvalidOptionError
from duetime.flow import KeyLimits, Limits
from duetime.store.plans.flow_control import FlowState, GroupFlow, limit_pairs
from duetime.store.plans.requests import Plan
from duetime.validation import shown

#: The most limit keys ``flow`` reports at once.
MOST_KEYS_SHOWN = 100_000


def _limits(value: object, method: str) -> Limits:
    """``value`` if it is a Limits; InvalidOptionError (an input error, not a sign of damage
    in Redis) otherwise, e.g. for None or a string such as "cap=5"."""
    if not isinstance(value, Limits):
        raise InvalidOptionError(
            f"{method}() takes the queue's limits as a Limits (e.g. Limits(cap=5)), got "
            f"{shown(value)}"
        )
    return value


class Limiting:
    """The plans of limits, on every shard."""

    def __init__(self, queue: QueueShards) -> None:
        self.queue = queue

    def set_limits_plan(self, limits: Limits) -> Plan[None]:
        """Make the queue's limits exactly ``limits`` (declared in code: every limit not
        in it is dropped). The queue is under flow control from then on."""
        pairs = limit_pairs(_limits(limits, "set_limits").fields())
        for shard in self.queue.shards:
            yield from shard.flow.set_limits("replace", pairs)
        yield from self._listed()

    def set_queue_limits_plan(self, limits: Limits) -> Plan[None]:
        """Make the queue's own limits (cap, rate, each key's) those of ``limits``, in one
        step, keeping the limits of named keys as they are (``limits.keys`` is ignored)."""
        limits = _limits(limits, "set_queue_limits")
        pairs = limit_pairs(Limits(limits.cap, limits.rate, limits.each_key).fields())
        for shard in self.queue.shards:
            yield from shard.flow.set_limits("queue", pairs)
        yield from self._listed()

    def set_key_limits_plan(self, key: str, limits: KeyLimits | None) -> Plan[None]:
        """Set (or, with None, drop) one limit key's own limits; the others are kept."""
        flow.limit_key(key)
        if limits is not None and not isinstance(limits, KeyLimits):
            raise InvalidOptionError(
                "set_key_limits() takes the key's limits as a KeyLimits (e.g. "
                f"KeyLimits(concurrency=5)) or None to drop them, got {shown(limits)}"
            )
        given = Limits(keys={key: limits}).fields() if limits is not None else {}
        fields = {f"concurrency:{key}": "", f"rate:{key}": "", **given}
        for shard in self.queue.shards:
            yield from shard.flow.set_limits("update", limit_pairs(fields))
        yield from self._listed()

    def _listed(self) -> Plan[None]:
        """Limits are a write that makes the queue known, as a first task is."""
        if not self.queue.listed:
            yield from self.queue.list_queue()

    def limits_plan(self) -> Plan[Limits | None]:
        """The queue's limits (its first shard's), or None when it is not under flow
        control."""
        fields = yield from self.queue.shards[0].flow.limit_fields()
        return None if fields is None else Limits.from_fields(fields)

    def flow_plan(self, most_keys: int = 50) -> Plan[FlowState]:
        """What holds the queue's due tasks: counts, and per limit key (up to
        ``most_keys`` of them, in key order), over every shard."""
        validation.whole_number(most_keys, "most_keys", 0, MOST_KEYS_SHOWN)
        states: list[FlowState] = []
        for shard in self.queue.shards:
            states.append((yield from shard.flow.flow_state(most_keys)))
        if len(states) == 1:
            return states[0]
        merged: dict[str, GroupFlow] = {}
        for state in states:
            for group in state.groups:
                seen = merged.get(group.key)
                if seen is None:
                    merged[group.key] = group
                    continue
                waits = [w for w in (seen.throttled_until_ms, group.throttled_until_ms) if w]
                heads = [h for h in (seen.head_due_ms, group.head_due_ms) if h is not None]
                merged[group.key] = GroupFlow(
                    group.key,
                    seen.due + group.due,
                    seen.running + group.running,
                    min(waits) if waits else None,
                    seen.has_turn or group.has_turn,
                    min(heads) if heads else None,
                )
        queue_waits = [s.queue_throttled_until_ms for s in states if s.queue_throttled_until_ms]
        return FlowState(
            any(state.enabled for state in states),
            states[0].fields,
            sum(state.due for state in states),
            sum(state.running for state in states),
            min(queue_waits) if queue_waits else None,
            [merged[key] for key in sorted(merged)][:most_keys],
        )
