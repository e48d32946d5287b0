"""SAQ as its docs recommend: ``saq module.settings`` and ``queue.enqueue(..., scheduled=)``
(epoch seconds) for delayed jobs. The worker moves due jobs every ``timers["schedule"]``
(1 s by default)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from saq import Queue

from peers.common import QUEUE, Item, Profile, enqueue_on, payload, run_task_async


async def task(ctx: Any, *, data: Any) -> None:
    await run_task_async(data)


def _settings() -> dict[str, Any]:
    raw = os.environ.get("BENCH_CONCURRENCY", "")
    chosen: dict[str, Any] = {
        "queue": Queue.from_url(os.environ.get("BENCH_REDIS_URL", "redis://"), name=QUEUE),
        "functions": [task],
    }
    if raw:
        chosen["concurrency"] = int(raw)
    return chosen


#: Read by the ``saq`` command in the worker process (env set by the suite).
settings = _settings() if "BENCH_REDIS_URL" in os.environ else {}


class SaqProducer:
    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.queue = Queue.from_url(url, name=QUEUE)
        self.loop.run_until_complete(self.queue.connect())

    async def _one(self, item: Item) -> None:
        index, at = item
        if at is None:
            await self.queue.enqueue("task", data=payload(index))
        else:
            await self.queue.enqueue("task", data=payload(index), scheduled=at)

    def enqueue(self, items: Sequence[Item], mode: str) -> None:
        enqueue_on(self.loop, self._one, items, mode)

    def close(self) -> None:
        self.loop.run_until_complete(self.queue.disconnect())
        self.loop.close()


class SaqAdapter:
    name = "saq"
    bulk = ""

    def producer(self, url: str) -> SaqProducer:
        return SaqProducer(url)

    def roles(self, profile: Profile) -> list[str]:
        return ["worker"]

    def command(self, role: str, profile: Profile, url: str, number: int) -> list[str]:
        return ["saq", "peers.adapters.saq_adapter.settings"]

    def settings(self, profile: Profile) -> dict[str, str]:
        return {
            "processes": "N `saq settings` (--workers 1 each)",
            "concurrency": f"concurrency={profile.concurrency or '10 (default)'} async jobs "
            "per worker",
            "handler": "async def",
            "scheduling": "due jobs moved by a script run every timers['schedule']=1 s (default)",
            "recovery settings": "defaults (job timeout 10 s, sweep every 60 s, retries=1)",
            "log level": "ERROR (saq's default)",
        }

    def versions(self) -> dict[str, str]:
        return {p: metadata.version(p) for p in ("saq", "redis", "hiredis")}


ADAPTER = SaqAdapter()
