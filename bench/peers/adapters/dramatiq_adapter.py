"""Dramatiq as its docs recommend: a ``RedisBroker``, an actor, ``send_with_options(delay=ms)``
for delayed messages, and the ``dramatiq`` command. Delayed messages wait in the queue's
delay queue (``bench.DQ``); workers take them into memory and re-enqueue them when due."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from importlib import metadata
from typing import Any, ClassVar

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.rate_limits import ConcurrentRateLimiter, WindowRateLimiter
from dramatiq.rate_limits.backends import RedisBackend

from peers.common import (
    FLOW_CONCURRENCY,
    FLOW_RATE,
    QUEUE,
    Item,
    Profile,
    key_of,
    payload,
    run_task,
)

broker = RedisBroker(url=os.environ.get("BENCH_REDIS_URL", "redis://"))
dramatiq.set_broker(broker)
backend = RedisBackend(url=os.environ.get("BENCH_REDIS_URL", "redis://"))
#: A refused message is retried through the delay queue: after 100 ms to 1 s here, not
#: the default 15 s and up (which would leave the backlog waiting out the run), and
#: without a cap on retries (a backlog is refused many times over).
RETRY = {"max_retries": None, "min_backoff": 100, "max_backoff": 1000}


@dramatiq.actor(queue_name=QUEUE)  # type: ignore[untyped-decorator]  # peer lib not in .venv
def task(data: Any) -> None:
    run_task(data)


@dramatiq.actor(queue_name=QUEUE, **RETRY)  # type: ignore[untyped-decorator]
def limited(data: Any, key: str, limit: str) -> None:
    """The flow scenario's task: it runs under a limiter of its key, as dramatiq's docs
    show (``with limiter.acquire():``); a refusal raises RateLimitExceeded."""
    limiter = (
        WindowRateLimiter(backend, key, limit=FLOW_RATE, window=1)
        if limit == "rate"
        else ConcurrentRateLimiter(backend, key, limit=FLOW_CONCURRENCY)
    )
    with limiter.acquire():
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

    def enqueue_limited(self, items: Sequence[Item], mode: str, limit: str, keys: int) -> None:
        for index, _ in items:
            limited.send(payload(index), key_of(index, keys), limit)

    def close(self) -> None:
        broker.close()


class DramatiqAdapter:
    name = "dramatiq"
    bulk = ""
    flow: ClassVar[dict[str, str]] = {
        "rate": f"WindowRateLimiter(limit={FLOW_RATE}, window=1) with its Redis backend, "
        "acquired in the actor: counts in one-second buckets (by wall-clock second); a "
        "refusal raises RateLimitExceeded and the message is retried (100 ms to 1 s "
        "back-off here; 15 s and up by default)",
        "concurrency": f"ConcurrentRateLimiter(limit={FLOW_CONCURRENCY}) per key with its "
        "Redis backend, acquired in the actor: the same refusal and retry",
    }

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
