"""Checks every daemon makes when it starts."""

from __future__ import annotations

import logging

from duetime.clock import ServerClock
from duetime.errors import DuetimeError
from duetime.store import AsyncRunner
from duetime.store.keys import QueueLayout
from duetime.store.operations import QueueOperations

log = logging.getLogger("duetime")


async def warn_if_evicting(runner: AsyncRunner, operations: QueueOperations) -> None:
    """Warn loudly when the server may evict keys: an evicted key is a lost task."""
    try:
        policy = await runner.run(operations.eviction_policy())
    except DuetimeError as error:  # e.g. CONFIG denied by an ACL
        log.warning("could not read maxmemory-policy (%s); make sure it is noeviction", error)
        return
    if policy != "noeviction":
        log.warning(
            "!!! %s has maxmemory-policy %r: under memory pressure it may evict task keys and "
            "lose tasks; set maxmemory-policy noeviction",
            runner.address,
            policy,
        )


async def warn_if_beyond(runner: AsyncRunner, layout: QueueLayout) -> None:
    """Say so when the queue has tasks in a shard past the count this daemon was given:
    it was written with more shards, and those tasks would wait for ever."""
    beyond = QueueOperations(layout.beyond, ServerClock())
    try:
        occupied = await runner.run(beyond.occupied())
    except DuetimeError as error:
        log.warning("could not look for tasks beyond shard %d: %s", layout.count - 1, error)
        return
    if occupied:
        log.error(
            "!!! queue %s holds tasks or cron jobs in shard %d, but this process serves %d "
            "shard(s): they will not run; give every worker, dispatcher and client the "
            "shard count the queue was written with (--shards)",
            layout.queue, layout.count, layout.count,
        )  # fmt: skip
