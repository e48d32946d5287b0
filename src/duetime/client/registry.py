"""``known_queues``: the queues a server's dispatchers have served, read from the
registry each dispatcher writes to when it starts."""

from __future__ import annotations

from duetime.settings import DEFAULT_SETTINGS, Settings
from duetime.store import SyncRunner
from duetime.store.operations import RegisteredQueue, registered_queues
from duetime.store.runner import RedisSpec


def known_queues(
    redis: RedisSpec = None, settings: Settings = DEFAULT_SETTINGS
) -> list[RegisteredQueue]:
    """The queues dispatchers have served on this server (each noted when a dispatcher
    starts), by name, with their shard count: what ``duetime queues`` lists."""
    runner = SyncRunner(redis, settings)
    try:
        return runner.run(registered_queues())
    finally:
        runner.close()
