"""Where a queue's shards are, and where each task, cron job and keyed call lives among
them: a sharded queue is several tag spaces (``QueueLayout``); shard 0 is the queue's
own tag, so an unsharded queue is its shard 0, and shard i > 0 is tagged ``{Q#i}`` ("#"
is not allowed in a queue name, so no shard tag is ever another queue's). Also the
registry of queues, the one key that names no queue."""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from duetime.store.plans.keys import PREFIX, QueueKeys

_CRON_TICK_ID = re.compile(r"cron:(.+):[0-9]+")

#: HASH queue name -> "<shards> <ms>": the queues clients wrote to and dispatchers
#: served, with their shard count and when a dispatcher last started for them (0: none
#: yet) (for listing queues; one key, so it lives on one node of a cluster, like any key).
QUEUE_REGISTRY = f"{PREFIX}:queues"


def shard_tag(queue: str, index: int) -> str:
    """The hash tag of one shard of ``queue``; shard 0 is the queue's own name."""
    return queue if index == 0 else f"{queue}#{index}"


def _shard_of(route: str, count: int) -> int:
    # CRC-32: stable across processes, versions and platforms (Python's hash() is not).
    return zlib.crc32(route.encode("utf-8", "surrogateescape")) % count if count > 1 else 0


@dataclass(frozen=True, slots=True)
class QueueLayout:
    """One logical queue spread over ``count`` shards, each a queue of its own in one
    slot. A task's shard is a hash of its id, so the same id always meets itself there
    (idempotent scheduling holds); a cron job's shard is a hash of its name, and a tick's
    id (cron:<name>:<tick>) is routed by that name, so the tick lives with its job."""

    queue: str
    count: int = 1

    @property
    def shards(self) -> list[QueueKeys]:
        return [QueueKeys(shard_tag(self.queue, i)) for i in range(self.count)]

    def of_task(self, task_id: str) -> int:
        if self.count == 1:
            return 0
        tick = _CRON_TICK_ID.fullmatch(task_id)
        return _shard_of(tick.group(1) if tick else task_id, self.count)

    def by_shard(self, task_ids: Sequence[str]) -> dict[int, list[int]]:
        """The positions of ``task_ids`` grouped by the shard each is written to."""
        if self.count == 1:  # no hash to take: a large schedule_many saves 0.15 µs a task
            return {0: list(range(len(task_ids)))} if task_ids else {}
        groups: dict[int, list[int]] = {}
        for position, task_id in enumerate(task_ids):
            groups.setdefault(self.of_task(task_id), []).append(position)
        return groups

    def of_cron(self, name: str) -> int:
        return _shard_of(name, self.count)

    def of_keyed(self, key: str) -> int:
        """The shard of a debounce, throttle or unique key: all its calls meet there."""
        return _shard_of(key, self.count)

    @property
    def beyond(self) -> QueueKeys:
        """The first shard past ``count``: tasks there were written with more shards
        than this layout covers, and nothing here would ever run them."""
        return QueueKeys(shard_tag(self.queue, self.count))


def queue_of_shard_tag(tag: str) -> str:
    """The queue a shard's tag belongs to, the reverse of ``shard_tag``: "#" is not
    allowed in a queue name, so the queue's name is all before it."""
    return tag.partition("#")[0]
