"""duetime as its README recommends for more than a toy deployment: a ``duetime dispatcher``
process and ``duetime worker`` processes, an async handler, default Settings."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import metadata
from typing import Any, ClassVar

import duetime
from peers.common import (
    FLOW_CONCURRENCY,
    FLOW_RATE,
    QUEUE,
    Item,
    Profile,
    key_of,
    payload,
    run_task_async,
)

app = duetime.App()


@app.default
async def handle(data: Any) -> None:
    await run_task_async(data)


CHUNK = 50_000  # tasks per schedule_many call (the library sends 1,000 per script call)


class DuetimeProducer:
    def __init__(self, url: str) -> None:
        self.queue = duetime.Queue(QUEUE, url)
        self.queue.stats()  # connects and samples the server clock

    def enqueue(self, items: Sequence[Item], mode: str) -> None:
        if mode == "single":
            for index, at in items:
                if at is None:
                    self.queue.schedule_now(payload(index))
                else:
                    self.queue.schedule_task(at, payload(index))
            return
        for start in range(0, len(items), CHUNK):
            self.queue.schedule_many(
                duetime.Job(payload(i), delay=0) if at is None else duetime.Job(payload(i), at=at)
                for i, at in items[start : start + CHUNK]
            )

    def enqueue_limited(self, items: Sequence[Item], mode: str, limit: str, keys: int) -> None:
        each_key = (
            duetime.KeyLimits(rate=duetime.Rate(FLOW_RATE))
            if limit == "rate"
            else duetime.KeyLimits(concurrency=FLOW_CONCURRENCY)
        )
        self.queue.set_limits(duetime.Limits(each_key=each_key))
        for start in range(0, len(items), CHUNK):
            self.queue.schedule_many(
                duetime.Job(payload(i), delay=0, limit_key=key_of(i, keys))
                for i, _ in items[start : start + CHUNK]
            )

    def close(self) -> None:
        self.queue.close()


class DuetimeAdapter:
    name = "duetime"
    bulk = "Queue.schedule_many (one script call per 1,000 tasks, one round trip)"
    flow: ClassVar[dict[str, str]] = {
        "rate": f"Limits(each_key=KeyLimits(rate=Rate({FLOW_RATE}))) (burst 1), tasks "
        "scheduled with limit_key: checked as the claim script starts a task, over every "
        "worker; a task over the limit waits among the due, no attempt spent",
        "concurrency": f"Limits(each_key=KeyLimits(concurrency={FLOW_CONCURRENCY})), tasks "
        "scheduled with limit_key: the same, slots counted from leases",
    }

    def producer(self, url: str) -> DuetimeProducer:
        return DuetimeProducer(url)

    def roles(self, profile: Profile) -> list[str]:
        return ["dispatcher", "worker"]

    def command(self, role: str, profile: Profile, url: str, number: int) -> list[str]:
        head = ["duetime", "--log-level", "warning"]
        if role == "dispatcher":
            return [*head, "dispatcher", "--queue", QUEUE, "--redis", url]
        concurrency = [] if profile.concurrency is None else ["-c", str(profile.concurrency)]
        return [*head, "worker", "peers.adapters.duetime_adapter:app", "--queue", QUEUE,
                *concurrency, "--redis", url]  # fmt: skip

    def settings(self, profile: Profile) -> dict[str, str]:
        s = duetime.Settings()
        return {
            "processes": "1 `duetime dispatcher` + N `duetime worker` (N = worker processes)",
            "concurrency": str(profile.concurrency or "25 (default)") + " async tasks per worker",
            "handler": "async def",
            "scheduling": f"dispatcher stages delayed tasks {s.stage_ahead:g} s ahead "
            f"(stage_ahead), sleeps until {s.promote_ahead * 1000:g} ms before the next run-at "
            "(promote_ahead, default) and promotes; the worker waits for the run-at on a "
            "precise timer; no polling interval",
            "recovery settings": f"lease {s.lease_duration:g} s, worker_ttl {s.worker_ttl:g} s, "
            f"heartbeat {s.heartbeat_interval:g} s (defaults)",
            "log level": "warning",
        }

    def versions(self) -> dict[str, str]:
        return {p: metadata.version(p) for p in ("duetime", "redis", "hiredis", "msgpack")}


ADAPTER = DuetimeAdapter()
