"""arq as its docs recommend: ``arq WorkerSettings`` and ``enqueue_job(..., _defer_until=)``
for delayed jobs. The worker polls the queue every ``poll_delay`` (0.5 s by default)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from typing import Any, ClassVar

from arq import create_pool
from arq.connections import ArqRedis, RedisSettings

from peers.common import QUEUE, Item, Profile, enqueue_on, payload, run_task_async

#: arq logs every job at INFO; its CLI takes a logging dict, so keep it to warnings.
LOG_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"plain": {"level": "WARNING", "class": "logging.StreamHandler"}},
    "loggers": {"arq": {"handlers": ["plain"], "level": "WARNING"}},
}


async def task(ctx: dict[str, Any], data: Any) -> None:
    await run_task_async(data)


def _concurrency() -> int | None:
    raw = os.environ.get("BENCH_CONCURRENCY", "")
    return int(raw) if raw else None


class WorkerSettings:
    """Read by the ``arq`` command in the worker process (env set by the suite)."""

    functions: ClassVar[list[Any]] = [task]
    redis_settings = RedisSettings.from_dsn(os.environ.get("BENCH_REDIS_URL", "redis://"))
    queue_name = QUEUE
    if _concurrency() is not None:
        max_jobs = _concurrency()


class ArqProducer:
    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.pool: ArqRedis = self.loop.run_until_complete(
            create_pool(RedisSettings.from_dsn(url), default_queue_name=QUEUE)
        )
        self.loop.run_until_complete(self.pool.ping())

    async def _one(self, item: Item) -> None:
        index, at = item
        if at is None:
            await self.pool.enqueue_job("task", payload(index))
        else:
            when = datetime.fromtimestamp(at, tz=UTC)
            await self.pool.enqueue_job("task", payload(index), _defer_until=when)

    def enqueue(self, items: Sequence[Item], mode: str) -> None:
        enqueue_on(self.loop, self._one, items, mode)

    def close(self) -> None:
        self.loop.run_until_complete(self.pool.aclose())
        self.loop.close()


class ArqAdapter:
    name = "arq"
    bulk = ""

    def producer(self, url: str) -> ArqProducer:
        return ArqProducer(url)

    def roles(self, profile: Profile) -> list[str]:
        return ["worker"]

    def command(self, role: str, profile: Profile, url: str, number: int) -> list[str]:
        return ["arq", "peers.adapters.arq_adapter.WorkerSettings",
                "--custom-log-dict", "peers.adapters.arq_adapter.LOG_CONFIG"]  # fmt: skip

    def settings(self, profile: Profile) -> dict[str, str]:
        return {
            "processes": "N `arq WorkerSettings`",
            "concurrency": f"max_jobs={profile.concurrency or '10 (default)'} async jobs "
            "per worker",
            "handler": "async def",
            "scheduling": "jobs in one sorted set; worker polls every poll_delay=0.5 s (default)",
            "recovery settings": "defaults (job_timeout 300 s; an in-progress key that expires "
            "lets another worker retry the job)",
            "log level": "WARNING (--custom-log-dict)",
        }

    def versions(self) -> dict[str, str]:
        return {p: metadata.version(p) for p in ("arq", "redis", "hiredis")}


ADAPTER = ArqAdapter()
