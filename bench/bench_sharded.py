"""One sharded queue on a 3-master Redis Cluster beside one plain queue on one server:
bulk schedule rate, run rate and lateness, side by side in interleaved rounds.

Run from the project root:

    .venv/bin/python bench/bench_sharded.py [--quick] [--tasks N] [--timed M] [--rounds R]

Setups, both started here (system ``redis-server`` on free loopback ports, persistence
off) and stopped at the end, and both alive for the whole run:

- ``A plain``: queue "work", shards=1, on one server.
- ``B sharded``: queue "work", shards=3, on a 3-master cluster; its three shards live on
  three different masters (checked at start).

In each round each setup (order alternating between rounds) is flushed, then:

1. bulk: N tasks due now are written with one ``schedule_many`` call (timed: the
   schedule rate; the queue's connections and scripts are warmed up first). Then one
   dispatcher and two workers (concurrency 50, async no-op handler), each given the
   queue's shard count, start together; the run rate is N over the time from their start
   to the moment the queue's ``completed`` counters (read on each shard's own server
   every 2 ms) add up to N.
2. lateness: with the same daemons still running, M tasks are scheduled in one call at
   run-at times spread evenly over 2 s, starting 0.5 s ahead. The handler stamps
   ``time.time()`` as it starts; lateness = that stamp - the task's run-at. Reported:
   p50/p99/max in ms, early (lateness below -1 ms, shown as measured, not corrected)
   and lost (never ran) counts.

The dispatcher and each worker are separate OS processes (multiprocessing, "spawn"), so
they can use both cores; this process only schedules and watches counters. The table
has one line per setup and round, then the median over the rounds per setup, and the
completed counter of each shard (how the work spread). ``--quick`` shrinks every size for
a smoke run of a few seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing.context import SpawnProcess
from multiprocessing.queues import Queue as ProcessQueue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import percentile  # bench/ is on the path when run as a script

import duetime
from duetime.store.plans.layout import QueueLayout
from tests.servers import Cluster, Server  # the project's throwaway servers

QUEUE = "work"
WORKERS = 2
CONCURRENCY = 50
LEAD = 0.5  # seconds from scheduling the timed tasks to the first run-at
SPREAD = 2.0  # seconds over which their run-at times are spread
EARLY_MS = -1.0  # below this a start counts as early (clock noise allowance)
POLL = 0.002  # seconds between reads of the completed counters

# --- dispatcher and worker processes -------------------------------------------------

# (timed task index, handler start time); bulk tasks carry {} and are not stamped.
_stamps: list[tuple[int, float]] = []


async def handle(data: int | dict[str, Any]) -> None:
    if isinstance(data, int):
        _stamps.append((data, time.time()))


def child_main(
    role: str,
    url: str,
    shards: int,
    ready: ProcessQueue[str],
    go: Event,
    stop: Event,
    results: ProcessQueue[tuple[str, dict[str, Any]]],
) -> None:
    """Body of a dispatcher or worker process: built, says ready, runs from ``go`` to
    ``stop``, then sends its stamps and counters (or its error) on ``results``."""
    try:
        summary = asyncio.run(_child(role, url, shards, ready, go, stop))
    except BaseException as error:
        results.put((role, {"error": f"{type(error).__name__}: {error}"}))
        raise
    results.put((role, summary))


async def _child(
    role: str, url: str, shards: int, ready: ProcessQueue[str], go: Event, stop: Event
) -> dict[str, Any]:
    daemon: duetime.Dispatcher | duetime.Worker
    if role == "dispatcher":
        daemon = duetime.Dispatcher(QUEUE, url, shards=shards)
    else:
        app = duetime.App()
        app.default(handle)
        daemon = duetime.Worker(app, QUEUE, url, concurrency=CONCURRENCY, shards=shards)
    ready.put(role)
    await asyncio.get_running_loop().run_in_executor(None, go.wait)
    running = asyncio.create_task(daemon.run())
    while not stop.is_set() and not running.done():
        await asyncio.sleep(0.05)
    daemon.stop()
    await running
    summary: dict[str, Any] = {"stamps": _stamps}
    if isinstance(daemon, duetime.Worker):
        summary["counters"] = asdict(daemon.counters)
    return summary


class Daemons:
    """One dispatcher and ``WORKERS`` worker processes for one setup and round."""

    def __init__(self, url: str, shards: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.ready: ProcessQueue[str] = context.Queue()
        self.results: ProcessQueue[tuple[str, dict[str, Any]]] = context.Queue()
        self.go = context.Event()
        self.stop_event = context.Event()
        roles = ["dispatcher", *(f"worker-{n}" for n in range(WORKERS))]
        self.processes: list[SpawnProcess] = [
            context.Process(
                target=child_main,
                args=(role, url, shards, self.ready, self.go, self.stop_event, self.results),
                name=role,
            )
            for role in roles
        ]
        for process in self.processes:
            process.start()

    def wait_ready(self, timeout: float = 60.0) -> None:
        for _ in self.processes:
            self.ready.get(timeout=timeout)

    def start(self) -> float:
        """Let every daemon run; returns the time it was given."""
        started = time.time()
        self.go.set()
        return started

    def check_alive(self) -> None:
        for process in self.processes:
            if not process.is_alive():
                raise RuntimeError(f"{process.name} exited with {process.exitcode}")

    def stop(self, timeout: float = 60.0) -> dict[str, dict[str, Any]]:
        """Stop every daemon and return their summaries by role."""
        self.go.set()
        self.stop_event.set()
        summaries: dict[str, dict[str, Any]] = {}
        for _ in self.processes:  # read before join: a child flushes its queue on exit
            role, summary = self.results.get(timeout=timeout)
            if "error" in summary:
                raise RuntimeError(f"{role} failed: {summary['error']}")
            summaries[role] = summary
        for process in self.processes:
            process.join(timeout)
        return summaries

    def kill(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
            process.join()


# --- setups and rounds ----------------------------------------------------------------


@dataclass(slots=True)
class Setup:
    name: str
    url: str
    shards: int
    counters: list[tuple[redis.Redis, str]]  # per shard: its server and its stats key

    def completed(self) -> list[int]:
        """The ``completed`` counter of each shard (the ack script bumps it per task)."""
        return [int(client.hget(key, "completed") or 0) for client, key in self.counters]

    def flush(self) -> None:
        for client in {id(c): c for c, _ in self.counters}.values():
            client.flushall()


@dataclass(slots=True)
class Outcome:
    setup: str
    round: int
    schedule_rate: float
    run_rate: float
    p50: float
    p99: float
    worst: float
    early: int
    lost: int
    duplicates: int
    per_shard: list[int]


def wait_for(setup: Setup, total: int, daemons: Daemons, deadline: float) -> float:
    """Poll until the shards' completed counters reach ``total``; the time they did."""
    while sum(setup.completed()) < total:
        if time.time() > deadline:
            raise RuntimeError(f"{setup.name}: {sum(setup.completed())} of {total} completed")
        daemons.check_alive()
        time.sleep(POLL)
    return time.time()


def one_round(setup: Setup, round_number: int, tasks: int, timed: int) -> Outcome:
    setup.flush()
    daemons = Daemons(setup.url, setup.shards)
    try:
        daemons.wait_ready()  # imports done: the children sit idle until started
        with duetime.Queue(QUEUE, setup.url, shards=setup.shards) as queue:
            # Warm up (connections open, scripts loaded), then start from empty again.
            queue.schedule_many([(time.time() + 3600, {})] * 30)
            setup.flush()
            jobs: list[tuple[float, Any]] = [(0, {})] * tasks
            begun = time.perf_counter()
            queue.schedule_many(jobs)
            schedule_rate = tasks / (time.perf_counter() - begun)
            started = daemons.start()
            finished = wait_for(setup, tasks, daemons, started + 300)
            run_rate = tasks / (finished - started)

            first = time.time() + LEAD
            run_at = [first + SPREAD * n / timed for n in range(timed)]
            queue.schedule_many(duetime.Job(n, at=at) for n, at in enumerate(run_at))
            if time.time() > first:
                print(f"warning: {setup.name}: scheduling ended after the first run-at")
            wait_for(setup, tasks + timed, daemons, run_at[-1] + 30)
        summaries = daemons.stop()
    finally:
        daemons.kill()
    succeeded = sum(s["counters"]["succeeded"] for s in summaries.values() if "counters" in s)
    if succeeded != tasks + timed:
        print(f"warning: {setup.name}: workers counted {succeeded} of {tasks + timed} succeeded")
    starts: dict[int, float] = {}
    runs = 0
    for summary in summaries.values():
        for index, stamp in summary["stamps"]:
            runs += 1
            starts[index] = min(stamp, starts.get(index, stamp))
    lateness = [(stamp - run_at[index]) * 1000 for index, stamp in starts.items()]
    return Outcome(
        setup=setup.name,
        round=round_number,
        schedule_rate=schedule_rate,
        run_rate=run_rate,
        p50=percentile(lateness, 50) if lateness else float("nan"),
        p99=percentile(lateness, 99) if lateness else float("nan"),
        worst=max(lateness, default=float("nan")),
        early=sum(1 for late in lateness if late < EARLY_MS),
        lost=timed - len(starts),
        duplicates=runs - len(starts),
        per_shard=setup.completed(),
    )


def shard_masters(cluster: Cluster) -> list[int]:
    """The port of the master holding each shard of the sharded queue."""
    layout = QueueLayout(QUEUE, 3)
    return [cluster.node_of_slot(key_slot(keys.stats.encode())).port for keys in layout.shards]


def print_table(outcomes: list[Outcome], rounds: int) -> None:
    print(
        "| setup | round | schedule_many tasks/s | run tasks/s | lateness p50 ms | p99 ms "
        "| max ms | early | lost | dup | completed per shard |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")

    def line(o: Outcome, label: str) -> None:
        shards = " / ".join(f"{n:,}" for n in o.per_shard)
        print(
            f"| {o.setup} | {label} | {o.schedule_rate:,.0f} | {o.run_rate:,.0f} "
            f"| {o.p50:.2f} | {o.p99:.2f} | {o.worst:.2f} | {o.early} | {o.lost} "
            f"| {o.duplicates} | {shards} |"
        )

    for outcome in outcomes:
        line(outcome, str(outcome.round))
    for name in dict.fromkeys(o.setup for o in outcomes):
        mine = [o for o in outcomes if o.setup == name]

        def median(pick: Callable[[Outcome], float], of: list[Outcome] = mine) -> float:
            return statistics.median(pick(o) for o in of)

        print(
            f"| {name} | median of {rounds} | {median(lambda o: o.schedule_rate):,.0f} "
            f"| {median(lambda o: o.run_rate):,.0f} | {median(lambda o: o.p50):.2f} "
            f"| {median(lambda o: o.p99):.2f} | {median(lambda o: o.worst):.2f} "
            f"| {sum(o.early for o in mine)} | {sum(o.lost for o in mine)} "
            f"| {sum(o.duplicates for o in mine)} | |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, help="bulk tasks per round (default 20,000)")
    parser.add_argument("--timed", type=int, help="timed tasks per round (default 2,000)")
    parser.add_argument("--rounds", type=int, help="rounds of both setups (default 2)")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args()
    tasks = args.tasks or (2_000 if args.quick else 20_000)
    timed = args.timed or (200 if args.quick else 2_000)
    rounds = args.rounds or (1 if args.quick else 2)
    executable = shutil.which("redis-server")
    if executable is None:
        sys.exit("redis-server is not on PATH")

    server = Server("redis", executable)
    cluster = Cluster("redis", executable)
    clients: list[redis.Redis] = []
    try:
        server.start()
        cluster.start()
        masters = shard_masters(cluster)
        if len(set(masters)) != 3:
            sys.exit(f"the shards of {QUEUE!r} do not fall on 3 masters: ports {masters}")
        plain_client = server.client()
        clients.append(plain_client)
        node_clients = {node.port: node.client() for node in cluster.nodes}
        clients.extend(node_clients.values())
        layout = QueueLayout(QUEUE, 3)
        setups = [
            Setup("A plain (1 server)", server.url, 1, [(plain_client, layout.shards[0].stats)]),
            Setup(
                "B sharded (3 masters)",
                cluster.url,
                3,
                [
                    (node_clients[port], keys.stats)
                    for port, keys in zip(masters, layout.shards, strict=True)
                ],
            ),
        ]
        print(
            f"{tasks:,} bulk + {timed:,} timed tasks per round, {rounds} round(s); "
            f"1 dispatcher + {WORKERS} workers (concurrency {CONCURRENCY}) as processes; "
            f"shards of {QUEUE!r} on master ports {masters}"
        )
        outcomes: list[Outcome] = []
        for number in range(1, rounds + 1):
            for setup in setups if number % 2 else reversed(setups):
                outcome = one_round(setup, number, tasks, timed)
                print(
                    f"  round {number}, {setup.name}: {outcome.run_rate:,.0f} tasks/s, "
                    f"p99 {outcome.p99:.2f} ms",
                    flush=True,
                )
                outcomes.append(outcome)
        print()
        print_table(sorted(outcomes, key=lambda o: (o.setup, o.round)), rounds)
        print(
            f"\nnote: this machine has {os.cpu_count()} cores, shared by the 3 masters, the "
            "dispatcher, the workers and this process, so no gain from sharding is expected "
            "here: setup B shows that the work spreads over the shards (correctness), not "
            "speed."
        )
    finally:
        for client in clients:
            client.close()
        cluster.stop()
        server.stop()


if __name__ == "__main__":
    main()
