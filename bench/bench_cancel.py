"""Cancel latency of duetime (issue #32): from the call of ``cancel()`` on a running task
to its handler's stop, for async handlers (cancelled) and plain functions (that look at
``current_task().cancelled`` every 5 ms).

Run from the project root:

    .venv/bin/python bench/bench_cancel.py [--quick] [--server redis|valkey]

A dispatcher and a worker (concurrency 100) run in a child process. For each handler
kind and each way the worker hears of cancels, 100 tasks (``--quick``: 20) are
scheduled and left to start; then each is cancelled, one call after another with
random gaps that spread the calls over about five heartbeats, so they fall at every
phase of the worker's heartbeat. The ways: listening on the queue's cancel channel
(the default, with the default 1 s heartbeat), and the heartbeat only
(``listen_for_cancels=False``) at 1 s and at 0.25 s, whose stop latency is bounded by
the heartbeat interval plus a round trip.
Each handler stamps when it stopped. Reported: the stop latency (p50, p99, max), how
long a ``cancel()`` call took, and whether every task ended as cancelled (none
completed).

The script starts its own throwaway server (through ``benchlib``), prints a markdown
table, and merges its figures into ``bench/results/cancel.json``. The exit status is 0
unless something crashed.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import random
import tempfile
import time
import uuid
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
from duetime import Queue

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "cancel.json"
STAMPS = "bench:cancel:stamps"  # "started|stopped <id> <epoch ms>": outside any queue's keys
CONCURRENCY = 100
#: How the worker hears of cancels: (name, heartbeat interval, listening on the channel).
VARIANTS = (("listening, heartbeat 1 s", 1.0, True), ("heartbeat 1 s only", 1.0, False),
            ("heartbeat 0.25 s only", 0.25, False))  # fmt: skip


def run_role(url: str, queue: str) -> None:
    """Dispatcher and worker in one process, until SIGTERM; settings from the env."""
    import redis

    stamps = redis.Redis.from_url(url)
    app = duetime.App()

    def stamp(kind: str) -> None:
        stamps.rpush(STAMPS, f"{kind} {duetime.current_task().id} {time.time() * 1000:.3f}")

    @app.task
    async def hold_async(data: Any) -> None:
        stamp("started")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stamp("stopped")
            raise

    @app.task
    def hold_sync(data: Any) -> None:
        stamp("started")
        context = duetime.current_task()
        while not context.cancelled:
            time.sleep(0.005)
        stamp("stopped")

    run_daemons(app, queue, url, CONCURRENCY, duetime.Settings.from_env())


def stamped(server: Server, kind: str) -> dict[str, float]:
    found = {}
    for raw in server.redis.lrange(STAMPS, 0, -1):
        what, task_id, at = (raw.decode() if isinstance(raw, bytes) else raw).split()
        if what == kind:
            found[task_id] = float(at)
    return found


def wait_for(server: Server, kind: str, count: int) -> dict[str, float]:
    deadline = time.monotonic() + 60
    while len(found := stamped(server, kind)) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(found)} of {count} handlers {kind} in 60 s")
        time.sleep(0.02)
    return found


def measure(
    server: Server, workdir: Path, handler: str, variant: tuple[str, float, bool], count: int
) -> dict[str, Any]:
    server.reset()
    queue_name = f"c{uuid.uuid4().hex[:8]}"
    _, heartbeat, listening = variant
    env = {
        "DUETIME_HEARTBEAT_INTERVAL": str(heartbeat),
        "DUETIME_LISTEN_FOR_CANCELS": "1" if listening else "0",
    }
    child = start_daemons(__file__, server, queue_name, workdir, env)
    rng = random.Random(7)
    try:
        with Queue(queue_name, server.url) as queue:
            ids = [queue.schedule_now({"n": n}, task=handler) for n in range(count)]
            wait_for(server, "started", count)
            called: dict[str, float] = {}
            calls: list[float] = []
            for task_id in ids:
                time.sleep(rng.uniform(0, 10 * heartbeat / count))  # over ~5 heartbeats
                called[task_id] = time.time() * 1000
                began = time.perf_counter()
                assert queue.cancel(task_id)
                calls.append((time.perf_counter() - began) * 1000)
            stopped = wait_for(server, "stopped", count)
            deadline = time.monotonic() + 60
            while queue.stats().counters.get("cancelled", 0) < count:
                if time.monotonic() > deadline:
                    raise RuntimeError("not every task ended as cancelled in 60 s")
                time.sleep(0.02)
            counters = queue.stats().counters
    finally:
        stop_daemons(child)
    waits = [stopped[task_id] - called[task_id] for task_id in ids]
    return {
        "tasks": count,
        "stop_ms_p50": round(percentile(waits, 50), 1),
        "stop_ms_p99": round(percentile(waits, 99), 1),
        "stop_ms_max": round(max(waits), 1),
        "cancel_call_ms_p50": round(percentile(calls, 50), 3),
        "cancel_call_ms_p99": round(percentile(calls, 99), 3),
        "ended_cancelled": counters.get("cancelled", 0),
        "completed": counters.get("completed", 0),
    }


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "| handler, heartbeat | tasks | stop p50 / p99 / max (ms) | cancel() p50 / p99 (ms) "
        "| ended cancelled | completed |",
        "|---|---:|---|---|---:|---:|",
    ]
    for name, f in results["latency"].items():
        lines.append(
            f"| {name} | {f['tasks']} | {f['stop_ms_p50']} / {f['stop_ms_p99']} / "
            f"{f['stop_ms_max']} | {f['cancel_call_ms_p50']} / {f['cancel_call_ms_p99']} | "
            f"{f['ended_cancelled']} | {f['completed']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = bench_parser(__doc__, ["latency"])
    parser.add_argument("--role", choices=["run"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--queue", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.role == "run":
        run_role(options.url, options.queue)
        return
    count = 20 if options.quick else CONCURRENCY
    results: dict[str, Any] = {"latency": {}}
    with tempfile.TemporaryDirectory(prefix="bench-cancel-") as scratch:
        server = Server(options.server, Path(scratch))
        server.start()
        try:
            environment = {
                "server": f"{options.server} {server.version()}",
                "python": platform.python_version(),
                "revision": git_revision(Path(__file__).resolve().parent),
                "quick": options.quick,
            }
            for variant in VARIANTS:
                for handler in ("hold_async", "hold_sync"):
                    name = f"{handler.removeprefix('hold_')}, {variant[0]}"
                    figures = measure(server, Path(scratch), handler, variant, count)
                    results["latency"][name] = figures
                    print(f"  {name}: {figures}", flush=True)
        finally:
            server.stop()
    print(markdown(results))
    merge_results(RESULTS_PATH, results, environment)


if __name__ == "__main__":
    main()
