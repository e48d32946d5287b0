"""Celery as its docs recommend: ``Celery(broker=redis://...)``, ``apply_async(eta=)`` for
delayed tasks and ``celery worker``. A worker takes ETA tasks from the queue at once and
holds them, unacknowledged, until they are due."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from typing import Any, ClassVar

from celery import Celery

from peers.common import FLOW_RATE, Item, Profile, payload, run_task

app = Celery("bench", broker=os.environ.get("BENCH_REDIS_URL", "redis://"))
app.conf.broker_connection_retry_on_startup = True  # silences a deprecation warning only


@app.task(name="bench.task")  # type: ignore[untyped-decorator]  # peer lib not in .venv
def task(data: Any) -> None:
    run_task(data)


@app.task(name="bench.rated", rate_limit=f"{FLOW_RATE}/s")  # type: ignore[untyped-decorator]
def rated(data: Any) -> None:
    """The flow scenario's rate-limited task (Celery's limit is per task type and per
    worker node, so the key is not passed: the scenario's rate run has one key)."""
    run_task(data)


class CeleryProducer:
    def __init__(self, url: str) -> None:
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=3)

    def enqueue(self, items: Sequence[Item], mode: str) -> None:
        for index, at in items:
            if at is None:
                task.apply_async((payload(index),))
            else:
                task.apply_async((payload(index),), eta=datetime.fromtimestamp(at, tz=UTC))

    def enqueue_limited(self, items: Sequence[Item], mode: str, limit: str, keys: int) -> None:
        if limit != "rate":
            raise ValueError(f"Celery has no per-key {limit} limit")
        for index, _ in items:
            rated.apply_async((payload(index),))

    def close(self) -> None:
        app.close()


class CeleryAdapter:
    name = "celery"
    bulk = ""
    flow: ClassVar[dict[str, str]] = {
        "rate": f'rate_limit="{FLOW_RATE}/s" on the task: a token bucket (capacity 1) in '
        "each worker node's consumer, per task type: the limit is per node, not shared by "
        "the nodes, and not per key",
    }

    def producer(self, url: str) -> CeleryProducer:
        return CeleryProducer(url)

    def roles(self, profile: Profile) -> list[str]:
        return ["worker"]

    def command(self, role: str, profile: Profile, url: str, number: int) -> list[str]:
        if profile.concurrency is None:
            pool = ["--concurrency", "1"]  # default prefork pool, one child process
        else:
            pool = ["--pool", "threads", "--concurrency", str(profile.concurrency)]
        return ["celery", "-A", "peers.adapters.celery_adapter", "worker", *pool,
                "--loglevel", "WARNING", "--hostname", f"w{number}@%h"]  # fmt: skip

    def settings(self, profile: Profile) -> dict[str, str]:
        if profile.concurrency is None:
            pool = "prefork pool (default), --concurrency 1"
        else:
            pool = f"--pool threads --concurrency {profile.concurrency}"
        return {
            "processes": "N `celery worker`",
            "concurrency": pool,
            "handler": "plain function (task)",
            "scheduling": "ETA tasks fetched at once and held in worker memory until due",
            "recovery settings": "defaults (acks_late False: a task is acknowledged when it "
            "starts; visibility_timeout 1 h)",
            "log level": "WARNING",
        }

    def versions(self) -> dict[str, str]:
        return {p: metadata.version(p) for p in ("celery", "kombu", "redis", "hiredis")}


ADAPTER = CeleryAdapter()
