"""Checks every daemon makes when it starts."""

from __future__ import annotations

import logging

from duetime.errors import DuetimeError
from duetime.store import AsyncRunner
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
