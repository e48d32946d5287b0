"""Huey as its docs recommend: ``RedisHuey``, a ``@huey.task()``, ``task.schedule(eta=)`` for
delayed tasks and ``huey_consumer`` with thread workers. A task with an eta goes through
the queue first; the consumer parks it in its schedule and its scheduler (every 1 s by
default) enqueues it again when due."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

from huey import RedisHuey

from peers.common import QUEUE, Item, Profile, payload, run_task

huey = RedisHuey(QUEUE, url=os.environ.get("BENCH_REDIS_URL", "redis://"))


@huey.task()  # type: ignore[untyped-decorator]  # peer lib not in .venv
def task(data: Any) -> None:
    run_task(data)


class HueyProducer:
    def __init__(self, url: str) -> None:
        huey.storage.conn.ping()

    def enqueue(self, items: Sequence[Item], mode: str) -> None:
        for index, at in items:
            if at is None:
                task(payload(index))
            else:
                task.schedule(args=(payload(index),), eta=datetime.fromtimestamp(at, tz=UTC))

    def close(self) -> None:
        huey.storage.conn.close()


class HueyAdapter:
    name = "huey"
    bulk = ""

    def producer(self, url: str) -> HueyProducer:
        return HueyProducer(url)

    def roles(self, profile: Profile) -> list[str]:
        return ["worker"]

    def command(self, role: str, profile: Profile, url: str, number: int) -> list[str]:
        workers = [] if profile.concurrency is None else ["-w", str(profile.concurrency)]
        return ["huey_consumer", "peers.adapters.huey_adapter.huey", "-k", "thread", *workers,
                "-q"]  # fmt: skip

    def settings(self, profile: Profile) -> dict[str, str]:
        return {
            "processes": "N `huey_consumer -k thread`",
            "concurrency": f"-w {profile.concurrency or '1 (default)'} worker threads",
            "handler": "plain function",
            "scheduling": "consumer parks eta tasks in a sorted set; scheduler runs every "
            "1 s (default -s 1)",
            "recovery settings": "defaults (no acknowledgement: a dequeued task is not "
            "redelivered)",
            "log level": "-q (warnings)",
        }

    def versions(self) -> dict[str, str]:
        return {p: metadata.version(p) for p in ("huey", "redis", "hiredis")}


ADAPTER = HueyAdapter()
