"""Docket (the ``pydocket`` package) as its docs show: ``docket worker --tasks
module:tasks`` and ``docket.add(task, when=...)(...)`` for delayed tasks;
``docket.add_many`` of ``docket.call(task, when=...)(...)`` specs is its bulk API. Due
tasks are moved from the docket's sorted set to its stream by each worker's scheduler
loop every ``--scheduling-resolution`` (250 ms by default). A worker whose
``--concurrency`` slots are all taken sleeps ``--minimum-check-interval`` (100 ms by
default for ``docket worker``) before it reads the stream again, so with the defaults one
worker starts at most about concurrency / 0.1 s tasks a second (500/s at the 50 every
system gets here), however short they are.

Every scenario runs. Recovery keeps its defaults: a message whose worker died is claimed
again by another worker only once it has sat idle ``--redelivery-timeout`` (5 min by
default, swept every quarter of that), longer than the scenario's cap, so it is reported
as not recovered within the cap rather than tuned down."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from importlib import metadata
from typing import Annotated, Any, ClassVar

from docket import ConcurrencyLimit, Docket, RateLimit

from peers.common import (
    FLOW_CONCURRENCY,
    FLOW_RATE,
    QUEUE,
    Item,
    Profile,
    enqueue_on,
    key_of,
    payload,
    run_task_async,
)

CHUNK = 1000  # add_many's default chunk_size: one pipelined round trip per 1,000 tasks


async def task(data: Any) -> None:
    await run_task_async(data)


async def rated(
    data: Any, tenant: Annotated[str, RateLimit(FLOW_RATE, per=timedelta(seconds=1))]
) -> None:
    """The flow scenario's rate-limited task: at most FLOW_RATE starts of one tenant in
    any second (a sliding-window log); a task over it is rescheduled to when it fits."""
    await run_task_async(data)


async def limited(data: Any, tenant: Annotated[str, ConcurrencyLimit(FLOW_CONCURRENCY)]) -> None:
    """The flow scenario's concurrency-limited task: a task over the limit is parked
    until a slot of its tenant frees."""
    await run_task_async(data)


#: The task collection the ``docket worker --tasks`` option names.
tasks = [task, rated, limited]


def _when(at: float | None) -> datetime | None:
    return None if at is None else datetime.fromtimestamp(at, tz=UTC)


class DocketProducer:
    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.docket = Docket(name=QUEUE, url=url)
        self.loop.run_until_complete(self.docket.__aenter__())

    async def _one(self, item: Item) -> None:
        index, at = item
        await self.docket.add(task, when=_when(at))(payload(index))

    async def _bulk(self, items: Sequence[Item]) -> None:
        calls = [self.docket.call(task, when=_when(at))(payload(i)) for i, at in items]
        await self.docket.add_many(calls, chunk_size=CHUNK)

    def enqueue(self, items: Sequence[Item], mode: str) -> None:
        if mode == "single":
            enqueue_on(self.loop, self._one, items, mode)
        else:
            self.loop.run_until_complete(self._bulk(items))

    def enqueue_limited(self, items: Sequence[Item], mode: str, limit: str, keys: int) -> None:
        function = rated if limit == "rate" else limited
        calls = [self.docket.call(function)(payload(i), tenant=key_of(i, keys)) for i, _ in items]
        self.loop.run_until_complete(self.docket.add_many(calls, chunk_size=CHUNK))

    def close(self) -> None:
        self.loop.run_until_complete(self.docket.__aexit__(None, None, None))
        self.loop.close()


class DocketAdapter:
    name = "docket"
    bulk = "Docket.add_many of Docket.call specs, 1,000 per pipelined round trip"
    flow: ClassVar[dict[str, str]] = {
        "rate": f"RateLimit({FLOW_RATE}, per=1 s) on the task's tenant parameter "
        "(Annotated): a sliding-window log checked as the task starts; a task over it "
        "is rescheduled to when the window has room",
        "concurrency": f"ConcurrencyLimit({FLOW_CONCURRENCY}) on the tenant parameter "
        "(Annotated): a task over it is parked until a slot frees",
    }

    def producer(self, url: str) -> DocketProducer:
        return DocketProducer(url)

    def roles(self, profile: Profile) -> list[str]:
        return ["worker"]

    def command(self, role: str, profile: Profile, url: str, number: int) -> list[str]:
        argv = ["docket", "worker", "--tasks", "peers.adapters.docket_adapter:tasks",
                "--docket", QUEUE, "--url", url,
                "--logging-level", "WARNING", "--logging-format", "plain"]  # fmt: skip
        if profile.concurrency is not None:
            argv += ["--concurrency", str(profile.concurrency)]
        return argv

    def settings(self, profile: Profile) -> dict[str, str]:
        return {
            "processes": "N `docket worker`",
            "concurrency": f"--concurrency={profile.concurrency or '10 (default)'} async "
            "tasks per worker",
            "handler": "async def",
            "scheduling": "future tasks in a sorted set, moved to a stream (consumer group) "
            "by each worker every --scheduling-resolution=250 ms (default); the worker "
            "blocks on the stream for new work, and sleeps --minimum-check-interval=100 ms "
            "(default) whenever all its slots are taken",
            "recovery settings": "defaults (--redelivery-timeout 5 min: an idle message "
            "is claimed again by another worker after it)",
            "log level": "WARNING (--logging-level)",
        }

    def versions(self) -> dict[str, str]:
        return {p: metadata.version(p) for p in ("pydocket", "redis", "hiredis")}


ADAPTER = DocketAdapter()
