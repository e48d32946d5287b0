"""RQ as its docs recommend: ``rq worker --with-scheduler`` (the built-in scheduler, forked
by the worker) and ``Queue.enqueue_at`` for delayed jobs. The default ``Worker`` class
forks a work horse per job and runs one job at a time."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

from redis import Redis
from rq import Queue

from peers.common import QUEUE, Item, Profile, payload, run_task

CHUNK = 1000


def task(data: Any) -> None:
    run_task(data)


def _when(at: float) -> datetime:
    return datetime.fromtimestamp(at, tz=UTC)


class RQProducer:
    def __init__(self, url: str) -> None:
        self.connection = Redis.from_url(url)
        self.connection.ping()
        self.queue = Queue(QUEUE, connection=self.connection)

    def enqueue(self, items: Sequence[Item], mode: str) -> None:
        if mode == "single":
            for index, at in items:
                if at is None:
                    self.queue.enqueue(task, payload(index))
                else:
                    self.queue.enqueue_at(_when(at), task, payload(index))
            return
        for start in range(0, len(items), CHUNK):
            chunk = items[start : start + CHUNK]
            if all(at is None for _, at in chunk):
                self.queue.enqueue_many([Queue.prepare_data(task, (payload(i),)) for i, _ in chunk])
                continue
            with self.connection.pipeline() as pipe:
                for index, at in chunk:
                    when = _when(at if at is not None else 0.0)
                    self.queue.enqueue_at(when, task, payload(index), pipeline=pipe)
                pipe.execute()

    def close(self) -> None:
        self.connection.close()


class RQAdapter:
    name = "rq"
    bulk = "enqueue_many (due now) / enqueue_at(pipeline=...) 1,000 per pipeline (delayed)"

    def producer(self, url: str) -> RQProducer:
        return RQProducer(url)

    def roles(self, profile: Profile) -> list[str]:
        return ["worker"]

    def command(self, role: str, profile: Profile, url: str, number: int) -> list[str]:
        return ["rq", "worker", "--with-scheduler", "--url", url,
                "--logging_level", "WARNING", QUEUE]  # fmt: skip

    def settings(self, profile: Profile) -> dict[str, str]:
        return {
            "processes": "N `rq worker --with-scheduler` (scheduler forked by the worker)",
            "concurrency": "1 job at a time per worker (default Worker forks a work horse "
            "per job; RQ has no in-process concurrency)",
            "handler": "plain function",
            "scheduling": "scheduler polls every 1 s (default interval); run-at stored in "
            "whole seconds (calendar.timegm), compared with whole-second now",
            "recovery settings": "defaults (job timeout 180 s, no Retry)",
            "log level": "WARNING",
        }

    def versions(self) -> dict[str, str]:
        return {p: metadata.version(p) for p in ("rq", "redis", "hiredis")}


ADAPTER = RQAdapter()
