"""Debounce benchmarks of duetime (issue #32): how exact a debounce is under 50 concurrent
callers, and what a keyed call costs next to a plain one.

Run from the project root:

    .venv/bin/python bench/bench_debounce.py [--quick] [--scenario NAME ...] [--server redis|valkey]

Scenarios (all by default):

- ``exactness``: 50 callers call one debounce key at once, 20 calls each as fast as they
  go (1,000 calls a burst), then stay quiet until the key's task has run; 10 bursts
  (``--quick``: 3), with collect="all" (every call's data kept, in order), then 10 with
  collect="last". Callers are threads, each with its own ``Queue`` (its own connection),
  then asyncio tasks sharing one ``AsyncQueue``. A dispatcher and a worker run in a
  child process whose handler stamps its start. Reported: bursts whose calls all landed
  in one task that ran exactly once (the target: every burst), calls carried against
  calls made, runs whose data held every call in call order (collect="all") or the last
  call's (collect="last"), starts before the final run-at (the target: 0), and how late
  the task started after its final run-at (p50, p99, max).
- ``calls``: the cost of a call: 20,000 calls (``--quick``: 4,000) from one caller and
  from 50 threads, each kind: a plain ``schedule_now`` (coalesced, as by default), a
  debounce call on one key, on 1,000 keys, a throttle call and a unique call (one key).
  Reported: calls/s and the latency of one call (p50, p99).

The script starts its own throwaway server (through ``benchlib``), prints a markdown
table, and merges its figures into ``bench/results/debounce.json``. Targets are
informational: the exit status is 0 unless something crashed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchlib import (
    Server,
    bench_parser,
    git_revision,
    merge_results,
    percentile,
    run_daemons,
    start_daemons,
    stop_daemons,
)

import duetime
from duetime import AsyncQueue, Debounce, Queue, Throttle, Unique
from duetime.keyed import Scheduled

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "debounce.json"
RUNS_KEY = "bench:debounce:runs"  # the handler's stamps: outside any queue's keys
CALLERS = 50
CALLS_EACH = 20
WINDOW = 0.3  # s: far longer than the gaps between a burst's calls, short for the run


# --- the child: a dispatcher and a worker ----------------------------------------------


def run_role(url: str, queue: str) -> None:
    """Dispatcher and worker in one process, until SIGTERM; the handler stamps each run:
    task id, data, the run-at it was given and when it started (epoch ms)."""
    import redis

    stamps = redis.Redis.from_url(url)
    app = duetime.App()

    @app.default
    async def stamp(data: Any) -> None:
        started = time.time() * 1000
        context = duetime.current_task()
        entry = [context.id, data, context.run_at * 1000, started]
        stamps.rpush(RUNS_KEY, json.dumps(entry))

    run_daemons(app, queue, url, 20, None)


# --- exactness -------------------------------------------------------------------------


def thread_burst(url: str, queue_name: str, mode: Debounce, burst: int) -> list[Any]:
    """One burst from 50 threads, each with its own Queue: (data, reply) of every call."""
    queues = [Queue(queue_name, url) for _ in range(CALLERS)]
    barrier = threading.Barrier(CALLERS)

    def caller(n: int) -> list[tuple[Any, Scheduled]]:
        barrier.wait()
        sent = [{"b": burst, "c": n, "i": i} for i in range(CALLS_EACH)]
        return [(data, queues[n].schedule_keyed(data, debounce=mode)) for data in sent]

    try:
        with ThreadPoolExecutor(CALLERS) as pool:
            return [call for calls in pool.map(caller, range(CALLERS)) for call in calls]
    finally:
        for queue in queues:
            queue.close()


def asyncio_burst(url: str, queue_name: str, mode: Debounce, burst: int) -> list[Any]:
    """One burst from 50 asyncio tasks sharing one AsyncQueue."""

    async def main() -> list[Any]:
        async with AsyncQueue(queue_name, url) as queue:

            async def caller(n: int) -> list[tuple[Any, Scheduled]]:
                calls = []
                for i in range(CALLS_EACH):
                    data = {"b": burst, "c": n, "i": i}
                    calls.append((data, await queue.schedule_keyed(data, debounce=mode)))
                return calls

            done = await asyncio.gather(*(caller(n) for n in range(CALLERS)))
            return [call for calls in done for call in calls]

    return asyncio.run(main())


def exactness(server: Server, workdir: Path, bursts: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for callers, burst_of in (("threads", thread_burst), ("asyncio", asyncio_burst)):
        for collect in ("all", "last"):
            name = f"{callers}, collect={collect}"
            figures[name] = measure_bursts(server, workdir, burst_of, collect, bursts)
            print(f"  exactness {name}: {figures[name]}", flush=True)
    return figures


def measure_bursts(
    server: Server, workdir: Path, burst_of: Callable[..., list[Any]], collect: str, bursts: int
) -> dict[str, Any]:
    server.reset()
    queue_name = f"b{uuid.uuid4().hex[:8]}"
    mode = Debounce("hot", WINDOW, collect=collect, most=CALLERS * CALLS_EACH)
    child = start_daemons(__file__, server, queue_name, workdir)
    exact = carried = in_order = early = 0
    lateness: list[float] = []
    try:
        for burst in range(bursts):
            calls = burst_of(server.url, queue_name, mode, burst)
            runs = wait_for_runs(server, burst + 1)
            task_id, data, run_at, started = runs[burst]
            ids = {reply.id for _, reply in calls}
            final = max(reply.calls for _, reply in calls)
            ordered = [sent for sent, _ in sorted(calls, key=lambda call: call[1].calls)]
            exact += ids == {task_id} and len(runs) == burst + 1
            carried += final
            expected = ordered if collect == "all" else ordered[-1]
            in_order += data == expected
            final_run_at = max(reply.run_at or 0 for _, reply in calls) * 1000
            early += started < run_at or abs(run_at - final_run_at) > 0.001
            lateness.append(started - run_at)
        extra = wait_for_runs(server, bursts, settle=2 * WINDOW)
    finally:
        stop_daemons(child)
    return {
        "bursts": bursts,
        "exact_bursts": exact,
        "calls": bursts * CALLERS * CALLS_EACH,
        "calls_carried": carried,
        "runs": len(extra),
        "data_right": in_order,
        "early": early,
        "lateness_ms_p50": round(percentile(lateness, 50), 2),
        "lateness_ms_p99": round(percentile(lateness, 99), 2),
        "lateness_ms_max": round(max(lateness), 2),
    }


def wait_for_runs(server: Server, count: int, settle: float = 0.0) -> list[Any]:
    """The runs stamped so far, once there are ``count`` (and ``settle`` more seconds,
    to see any run beyond them)."""
    deadline = time.monotonic() + 60
    while server.redis.llen(RUNS_KEY) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {server.redis.llen(RUNS_KEY)} of {count} runs in 60 s")
        time.sleep(0.01)
    time.sleep(settle)  # pacing the measurement, not waiting on a condition
    return [json.loads(raw) for raw in server.redis.lrange(RUNS_KEY, 0, -1)]


# --- the cost of a call ----------------------------------------------------------------


def call_kinds() -> dict[str, Callable[[Queue, int], object]]:
    debounce, many = Debounce("one", 3600), [Debounce(f"k{n}", 3600) for n in range(1000)]
    throttle, unique = Throttle("one", 3600), Unique("one")
    return {
        "plain schedule_now": lambda queue, n: queue.schedule_now({"n": n}),
        "debounce, one key": lambda queue, n: queue.schedule_keyed({"n": n}, debounce=debounce),
        "debounce, 1,000 keys": lambda queue, n: queue.schedule_keyed(
            {"n": n}, debounce=many[n % 1000]
        ),
        "throttle, one key": lambda queue, n: queue.schedule_keyed({"n": n}, throttle=throttle),
        "unique, one key": lambda queue, n: queue.schedule_keyed({"n": n}, unique=unique),
    }


def call_costs(server: Server, total: int) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for name, call in call_kinds().items():
        for callers in (1, CALLERS):
            server.reset()
            with Queue(f"c{uuid.uuid4().hex[:8]}", server.url) as queue:
                latencies = timed_calls(queue, call, total, callers)
            key = f"{name}, {callers} caller{'s' if callers > 1 else ''}"
            figures[key] = latencies
            print(f"  calls {key}: {latencies}", flush=True)
    return figures


def timed_calls(
    queue: Queue, call: Callable[[Queue, int], object], total: int, callers: int
) -> dict[str, float]:
    each = total // callers

    def caller(first: int) -> list[float]:
        spent = []
        for n in range(first, first + each):
            began = time.perf_counter()
            call(queue, n)
            spent.append((time.perf_counter() - began) * 1000)
        return spent

    began = time.perf_counter()
    with ThreadPoolExecutor(callers) as pool:
        latencies = [ms for spent in pool.map(caller, range(0, total, each)) for ms in spent]
    elapsed = time.perf_counter() - began
    return {
        "calls_per_s": round(len(latencies) / elapsed),
        "latency_ms_p50": round(percentile(latencies, 50), 3),
        "latency_ms_p99": round(percentile(latencies, 99), 3),
    }


# --- entry point -----------------------------------------------------------------------


def markdown(results: dict[str, Any]) -> str:
    lines = []
    if "exactness" in results:
        lines += [
            "| callers | bursts | exact | calls carried | data right | runs | early "
            "| late p50 / p99 / max (ms) |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for name, f in results["exactness"].items():
            lines.append(
                f"| {name} | {f['bursts']} | {f['exact_bursts']} | {f['calls_carried']} of "
                f"{f['calls']} | {f['data_right']} | {f['runs']} | {f['early']} | "
                f"{f['lateness_ms_p50']} / {f['lateness_ms_p99']} / {f['lateness_ms_max']} |"
            )
    if "calls" in results:
        lines += ["", "| call | calls/s | p50 (ms) | p99 (ms) |", "|---|---:|---:|---:|"]
        for name, f in results["calls"].items():
            lines.append(
                f"| {name} | {f['calls_per_s']:,} | {f['latency_ms_p50']} | {f['latency_ms_p99']} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = bench_parser(__doc__, ["exactness", "calls"])
    parser.add_argument("--role", choices=["run"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--queue", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.role == "run":
        run_role(options.url, options.queue)
        return
    wanted = options.scenario or ["exactness", "calls"]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-debounce-") as scratch:
        server = Server(options.server, Path(scratch))
        server.start()
        try:
            environment = {
                "server": f"{options.server} {server.version()}",
                "python": platform.python_version(),
                "revision": git_revision(Path(__file__).resolve().parent),
                "quick": options.quick,
            }
            if "exactness" in wanted:
                results["exactness"] = exactness(server, Path(scratch), 3 if options.quick else 10)
            if "calls" in wanted:
                results["calls"] = call_costs(server, 4000 if options.quick else 20_000)
        finally:
            server.stop()
    print(markdown(results))
    merge_results(RESULTS_PATH, results, environment)


if __name__ == "__main__":
    main()
