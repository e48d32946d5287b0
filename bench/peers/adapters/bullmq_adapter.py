"""BullMQ's Python port as its docs show: ``Queue.add(name, data, {"delay": ms})`` and a
``Worker(queue, processor, {"concurrency": n})``. The port has no command-line worker, so
this module is the worker process (``python -m peers.adapters.bullmq_adapter``)."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from bullmq import Queue, Worker

from peers.common import QUEUE, Item, Profile, payload, run_task_async

CHUNK = 1000


def _delay_ms(at: float | None) -> int:
    """BullMQ takes a delay in ms from the job's creation: rounded up, never early."""
    return 0 if at is None else max(0, math.ceil((at - time.time()) * 1000))


class BullProducer:
    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.queue = Queue(QUEUE, {"connection": url})
        self.loop.run_until_complete(self.queue.getJobCounts())  # connects, loads scripts

    async def _single(self, items: Sequence[Item]) -> None:
        for index, at in items:
            await self.queue.add("task", payload(index), {"delay": _delay_ms(at)})

    async def _bulk(self, items: Sequence[Item]) -> None:
        for start in range(0, len(items), CHUNK):
            await self.queue.addBulk(
                [
                    {"name": "task", "data": payload(i), "opts": {"delay": _delay_ms(at)}}
                    for i, at in items[start : start + CHUNK]
                ]
            )

    def enqueue(self, items: Sequence[Item], mode: str) -> None:
        work = self._single(items) if mode == "single" else self._bulk(items)
        self.loop.run_until_complete(work)

    def close(self) -> None:
        self.loop.run_until_complete(self.queue.close())
        self.loop.close()


async def process(job: Any, token: str) -> None:
    await run_task_async(job.data)


async def serve(url: str, concurrency: int | None) -> None:
    """Run one Worker until SIGTERM or SIGINT, then close it (finishing running jobs)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    options: dict[str, Any] = {"connection": url}
    if concurrency is not None:
        options["concurrency"] = concurrency
    worker = Worker(QUEUE, process, options)
    await stop.wait()
    await worker.close()


class BullAdapter:
    name = "bullmq"
    bulk = "Queue.addBulk, 1,000 jobs per call"

    def producer(self, url: str) -> BullProducer:
        return BullProducer(url)

    def roles(self, profile: Profile) -> list[str]:
        return ["worker"]

    def command(self, role: str, profile: Profile, url: str, number: int) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), url]

    def settings(self, profile: Profile) -> dict[str, str]:
        return {
            "processes": "N Python processes, one bullmq.Worker each",
            "concurrency": f"concurrency={profile.concurrency or '1 (default)'} async jobs "
            "per worker",
            "handler": "async def",
            "scheduling": "delayed sorted set; the worker blocks until the next delayed job "
            "is due (BullMQ markers)",
            "recovery settings": "defaults (lockDuration 30 s, stalledInterval 30 s, "
            "maxStalledCount 1)",
            "log level": "none (the port does not log per job)",
        }

    def versions(self) -> dict[str, str]:
        return {p: metadata.version(p) for p in ("bullmq", "redis", "hiredis")}


ADAPTER = BullAdapter()

if __name__ == "__main__":
    raw = os.environ.get("BENCH_CONCURRENCY", "")
    asyncio.run(serve(sys.argv[1], int(raw) if raw else None))
