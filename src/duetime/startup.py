"""What every daemon does as it starts and as it ends: the checks of the server, the
metrics export, and the close of both (see ``DaemonStartup``)."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
from collections.abc import Awaitable, Callable, Sequence
from importlib import metadata
from types import TracebackType
from typing import TYPE_CHECKING

from duetime.clock import ServerClock
from duetime.errors import DuetimeError
from duetime.settings import DEFAULT_SETTINGS, Settings
from duetime.store.plans.layout import QueueLayout
from duetime.store.plans.operations import QueueOperations, register_queues
from duetime.store.plans.requests import Durability
from duetime.store.redis.runner import AsyncRunner, RedisSpec, mask_url

if TYPE_CHECKING:
    from duetime.metrics.cron import CronTickSource

log = logging.getLogger("duetime")


def freeze_startup_objects(settings: Settings) -> None:
    """See ``Settings.freeze_startup_objects``: a full collection of the objects a daemon
    made starting up (10-20 ms, measured in bench_core's punctuality scenario) was the
    whole of its lateness beyond 2 ms. The objects made later are still collected."""
    global _frozen
    if settings.freeze_startup_objects and not _frozen:
        _frozen = True
        gc.collect()
        gc.freeze()


_frozen = False  # once per process: a second daemon starting later freezes nothing


async def warn_if_evicting(runner: AsyncRunner, operations: QueueOperations) -> None:
    """Warn loudly when the server may evict keys: an evicted key is a lost task."""
    try:
        policy = await runner.run(operations.server.eviction_policy())
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


async def register(runner: AsyncRunner, layouts: Sequence[QueueLayout]) -> None:
    """Note the queues this dispatcher serves (``duetime queues`` lists them); a
    failure is logged, never fatal: the queues work without it."""
    try:
        await runner.run(register_queues(layouts))
    except DuetimeError as error:
        log.warning("could not note the served queues for `duetime queues`: %s", error)


async def warn_if_beyond(runner: AsyncRunner, layout: QueueLayout) -> None:
    """Say so when the queue has tasks in a shard past the count this daemon was given:
    it was written with more shards, and those tasks would wait for ever."""
    beyond = QueueOperations(layout.beyond, ServerClock())
    try:
        occupied = await runner.run(beyond.producer.occupied())
    except DuetimeError as error:
        log.warning("could not look for tasks beyond shard %d: %s", layout.count - 1, error)
        return
    if occupied:
        log.error(
            "!!! queue %s holds tasks or cron jobs in shard %d, but this process serves %d "
            "shard(s): they will not run; give every worker, dispatcher and client the "
            "shard count the queue was written with (--shards)",
            layout.queue,
            layout.count,
            layout.count,
        )


async def check_durability(
    runner: AsyncRunner, shards: Sequence[QueueOperations], durability: Durability | None
) -> None:
    """With durable_fsync, ConfigurationError at start (not at the first ack) when a
    shard's server cannot confirm fsyncs."""
    if durability is not None and durability.fsync:
        for operations in shards:
            await runner.run(operations.server.check_fsync())


class DaemonStartup:
    """The start and the end a worker and a dispatcher share, as ``async with``: it
    opens the daemon's Redis runner; ``prepare`` then exports the daemon's metrics and
    makes its checks of the server, in order; on the way out the runner is closed,
    then the steps given to ``after_runner_closed`` run, then the metrics export is
    taken back (off the loop)::

        async with DaemonStartup(redis, settings) as startup:
            await startup.prepare(layouts, operations, register)
            ...  # the daemon's loops, until it stops
    """

    def __init__(self, redis: RedisSpec, settings: Settings) -> None:
        self.runner = AsyncRunner(redis, settings)
        self._redis = redis
        self._settings = settings
        self._unexport: Callable[[], None] | None = None
        self._after_runner_closed: list[Callable[[], Awaitable[None]]] = []

    async def __aenter__(self) -> DaemonStartup:
        return self

    async def __aexit__(
        self,
        error_type: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.runner.close()
        for step in self._after_runner_closed:
            await step()
        if self._unexport is not None:  # may wait for a scrape in flight: off the loop
            await asyncio.to_thread(self._unexport)

    def after_runner_closed(self, step: Callable[[], Awaitable[None]]) -> None:
        """Run ``step`` on the way out, once the runner is closed (e.g. to collect the
        commands its close ended) and before the metrics export is taken back."""
        self._after_runner_closed.append(step)

    async def prepare(
        self,
        layouts: Sequence[QueueLayout],
        operations: QueueOperations,
        register: Callable[[], Awaitable[None]],
        *,
        dispatchers: Sequence[CronTickSource] = (),
        durable_shards: Sequence[QueueOperations] = (),
        durability: Durability | None = None,
    ) -> None:
        """Before the daemon's loops start, in this order: export the metrics of its
        ``layouts`` (queues and shard count; and the cron ticks of its ``dispatchers``)
        when ``metrics_port`` is set; warn if the server of ``operations`` may evict keys,
        and of tasks beyond each layout's shards; check that ``durable_shards`` can
        confirm fsyncs when the ``durability`` wants it; ``register`` the daemon; and
        freeze the objects made so far."""
        settings = self._settings
        if settings.metrics_port:
            from duetime import metrics  # imported only when metrics are wanted

            queues = [layout.queue for layout in layouts]
            self._unexport = metrics.export(
                settings, self._redis, queues, layouts[0].count, dispatchers
            )
        await warn_if_evicting(self.runner, operations)
        for layout in layouts:
            await warn_if_beyond(self.runner, layout)
        await check_durability(self.runner, durable_shards, durability)
        await register()
        freeze_startup_objects(settings)


def banner(
    role: str,
    queues: Sequence[str],
    url: str,
    settings: Settings,
    *,
    shards: int = 1,
    details: Sequence[str] = (),
) -> None:
    """Log at INFO, as one record, what a daemon is about to run with: the duetime
    version, its ``role``, the queues (and shard count), the server (password masked),
    any ``details`` (e.g. concurrency) and the settings that differ from the defaults,
    so that a log shows how each process was started without a look at its
    environment."""
    try:
        version = metadata.version("duetime")
    except metadata.PackageNotFoundError:  # run from a source tree, not installed
        version = "(version unknown)"
    names = ", ".join(queues)
    if shards > 1:
        names += f" ({shards} shards each)" if len(queues) > 1 else f" ({shards} shards)"
    changed = [
        f"{field.name}={_setting(getattr(settings, field.name))} "
        f"(default {_setting(getattr(DEFAULT_SETTINGS, field.name))})"
        for field in dataclasses.fields(settings)
        if getattr(settings, field.name) != getattr(DEFAULT_SETTINGS, field.name)
    ]
    parts = [
        f"duetime {version} starting {role}",
        f"queue{'s' if len(queues) > 1 else ''} {names}",
        f"server {mask_url(url)}",
        *details,
        f"settings changed: {', '.join(changed)}" if changed else "settings: the defaults",
    ]
    log.info("; ".join(parts))


def _setting(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
