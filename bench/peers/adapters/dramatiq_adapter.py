"""Dramatiq as its docs recommend: a ``RedisBroker``, an actor, ``send_with_options(delay=ms)``
for delayed messages, and the ``dramatiq`` command. Delayed messages wait in the queue's
delay queue (``bench.DQ``); workers take them into memory and re-enqueue them when due."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from peers.common import QUEUE, Item, Profile, payload, run_task

broker = RedisBroker(url=os.environ.get("BENCH_REDIS_URL", "redis://"))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=QUEUE)  # type: ignore[untyped-decorator]  # peer lib not in .venv
def task(data: Any) -> None:
    run_task(data)


class DramatiqProducer:
    def __init__(self, url: str) -> None:
        broker.client.ping()

    def enqueue(self, items: Sequence[Item], mode: str) -> None:
        for index, at in items:
            if at is None:
                task.send(payload(index))
            else:
                delay = max(0, math.ceil((at - time.time()) * 1000))  # ms, never early
                task.send_with_options(args=(payload(index),), delay=delay)

    def close(self) -> None:
        broker.close()


class DramatiqAdapter:
    name = "dramatiq"
    bulk = ""

    def producer(self, url: str) -> DramatiqProducer:
        return DramatiqProducer(url)

    def roles(self, profile: Profile) -> list[str]:
        return ["worker"]

    def command(self, role: str, profile: Profile, url: str, number: int) -> list[str]:
        threads = [] if profile.concurrency is None else ["--threads", str(profile.concurrency)]
        return ["dramatiq", "peers.adapters.dramatiq_adapter", "--processes", "1", *threads,
                "--queues", QUEUE]  # fmt: skip

    def settings(self, profile: Profile) -> dict[str, str]:
        return {
            "processes": "N `dramatiq --processes 1` (a supervisor + 1 worker process each)",
            "concurrency": f"--threads {profile.concurrency or '8 (default)'}",
            "handler": "plain function (actor)",
            "scheduling": "delay queue held in worker memory (prefetch threads x 1000), "
            "re-enqueued when due",
            "recovery settings": "defaults (heartbeat_timeout 60 s; unacked messages of a dead "
            "worker requeued by random maintenance)",
            "log level": "dramatiq's default (no per-message lines)",
        }

    def versions(self) -> dict[str, str]:
        return {p: metadata.version(p) for p in ("dramatiq", "redis", "hiredis")}


ADAPTER = DramatiqAdapter()
