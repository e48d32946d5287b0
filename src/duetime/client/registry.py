"""``known_queues``: the queues a server has seen used, read from the registry that a
client notes a queue in after its first write to it, and a dispatcher when it starts."""

from __future__ import annotations

from duetime.settings import DEFAULT_SETTINGS, Settings
from duetime.store.plans.operations import RegisteredQueue, registered_queues
from duetime.store.redis.runner import RedisSpec, SyncRunner


def known_queues(
    redis: RedisSpec = None, settings: Settings = DEFAULT_SETTINGS
) -> list[RegisteredQueue]:
    """The queues on this server, by name, with their shard count: what ``duetime
    queues`` lists. A client notes a queue after its first write to it, and a dispatcher
    each time it starts (``seen_ms``, which is 0 while no dispatcher has)."""
    runner = SyncRunner(redis, settings)
    try:
        return runner.run(registered_queues())
    finally:
        runner.close()
