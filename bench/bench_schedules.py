"""Schedules at scale (issue #32, part 3): one million cron jobs on one queue (one per
user), all due on the same minute: how fast they are declared, what each costs in
memory, and how late their ticks are fired, without and with jitter.

Run from the project root:

    .venv/bin/python bench/bench_schedules.py [--quick] [--scenario NAME ...]
        [--server redis|valkey]

Scenarios (all by default; ``--quick``: 20,000 jobs instead of 1,000,000):

- ``plain``: N jobs ``* * * * *`` (one per user, each with its own data), declared with
  ``add_crons`` (1,000 per script call). Reported: declarations a second (client time,
  validation included), the server's memory per job (INFO memory's used_memory after the
  declaration, less the empty server's, over N), and how late the ticks of one minute
  are fired: one dispatcher (``duetime dispatcher``, its own OS process) fires them, and
  a drainer in this process pops tick ids off ``ready`` (LPOP, 1,000 at a time) and
  stamps each batch with the server's TIME; a tick's lateness is that time less when its
  run was due (the tick). p50, p99 and max, and when the last one was fired.
- ``jitter``: the same with ``jitter=60s``: each job's run is due at the tick plus its
  offset (below 60 s), so the minute's ticks are spread over it; lateness is measured
  from each run's own due time.

Between scenarios the server is emptied. Results are printed as a markdown table and
merged into ``bench/results/schedules.json``. The exit status is 0 unless something
crashed.
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import Server, bench_parser, git_revision, merge_results, percentile

from duetime import Queue, cron
from duetime.store.plans.keys import QueueKeys

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "schedules.json"
SCENARIOS = ("plain", "jitter")
MINUTE_MS = 60_000
QUEUE = "users"


def declare(server: Server, count: int, jitter: float | None) -> dict[str, Any]:
    """Declare ``count`` jobs; the rate and the memory they take."""
    baseline = int(server.redis.info("memory")["used_memory"])
    options: dict[str, Any] = {} if jitter is None else {"jitter": jitter}
    started = time.perf_counter()
    with Queue(QUEUE, server.url) as queue:
        jobs = [
            queue.cron_job(f"user-{i}", "* * * * *", {"user": i}, **options) for i in range(count)
        ]
        validated = time.perf_counter()
        outcome = queue.add_crons(jobs)
    elapsed = time.perf_counter() - started
    assert outcome["created"] == count, outcome
    used = int(server.redis.info("memory")["used_memory"])
    keys = QueueKeys(QUEUE)
    return {
        "jobs": count,
        "declared_per_s": count / elapsed,
        "validation_s": validated - started,
        "store_s": elapsed - (validated - started),
        "bytes_per_job": (used - baseline) / count,
        "cron_hash_bytes_per_job": _memory_usage(server, keys.cron) / count,
        "cron_next_bytes_per_job": _memory_usage(server, keys.cron_next) / count,
    }


def _memory_usage(server: Server, key: str) -> int:
    return int(server.redis.memory_usage(key, samples=0) or 0)


def fire_one_minute(server: Server, count: int, jitter: float | None) -> dict[str, Any]:
    """Start a dispatcher before the next minute; drain that minute's ticks off ready and
    measure how late each was fired, against when its run was due."""
    redis = server.redis
    now_ms = _server_ms(server)
    tick = (now_ms // MINUTE_MS + 1) * MINUTE_MS
    if tick - now_ms < 15_000:  # leave the dispatcher time to start and prepare
        tick += MINUTE_MS
    due = _due_times(count, tick, jitter)
    dispatcher = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "duetime"), "dispatcher", "-q", QUEUE, "--redis", server.url],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    lateness: list[float] = []
    last_fired = tick
    deadline = time.monotonic() + (tick - now_ms) / 1000 + 240
    ready = QueueKeys(QUEUE).ready
    try:
        while len(lateness) < count and time.monotonic() < deadline:
            pipe = redis.pipeline(transaction=False)
            pipe.lpop(ready, 1000)
            pipe.time()
            ids, (seconds, micros) = pipe.execute()
            if not ids:
                time.sleep(0.005)
                continue
            popped_ms = seconds * 1000 + micros / 1000
            for raw in ids:
                name, _, fired_tick = raw.decode().removeprefix("cron:").rpartition(":")
                if int(fired_tick) != tick:
                    continue  # a later minute's tick, fired before the drain ended
                lateness.append(popped_ms - due[name])
            last_fired = max(last_fired, int(popped_ms))
    finally:
        os.killpg(dispatcher.pid, signal.SIGTERM)
        dispatcher.wait(timeout=30)
    return {
        "ticks_fired": len(lateness),
        "lateness_p50_ms": percentile(lateness, 50) if lateness else None,
        "lateness_p99_ms": percentile(lateness, 99) if lateness else None,
        "lateness_max_ms": max(lateness) if lateness else None,
        "last_fired_after_tick_s": (last_fired - tick) / 1000,
        "early": sum(1 for late in lateness if late < 0),
    }


def _due_times(count: int, tick: int, jitter: float | None) -> dict[str, float]:
    """When each job's run of ``tick`` is due: the tick, plus its jitter offset."""
    if jitter is None:
        return {f"user-{i}": tick for i in range(count)}
    jitter_ms = round(jitter * 1000)
    return {
        f"user-{i}": cron.CronJob(f"user-{i}", "* * * * *", None, jitter_ms=jitter_ms).run_at(
            tick, tick + MINUTE_MS
        )
        for i in range(count)
    }


def _server_ms(server: Server) -> int:
    seconds, micros = server.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


def run(kind: str, count: int, scenarios: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as workdir:
        server = Server(kind, Path(workdir))
        server.start()
        try:
            for name in scenarios:
                server.reset()
                jitter = 60.0 if name == "jitter" else None
                print(f"{name}: declaring {count:,} jobs ...", flush=True)
                figures = declare(server, count, jitter)
                print(f"{name}: firing one minute's ticks ...", flush=True)
                figures |= fire_one_minute(server, count, jitter)
                results[name] = figures
                print(name, figures, flush=True)
            version = server.version()
        finally:
            server.stop()
    environment = {
        "server": f"{kind} {version}",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "revision": git_revision(ROOT),
        "when": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
    }
    merge_results(RESULTS, results, environment)
    return results


def table(results: dict[str, Any]) -> str:
    rows = [
        "| scenario | jobs | declared/s | bytes/job | p50 late | p99 late | max late "
        "| last fired |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in results.items():
        rows.append(
            f"| {name} | {r['jobs']:,} | {r['declared_per_s']:,.0f} | {r['bytes_per_job']:.0f} "
            f"| {r['lateness_p50_ms'] or 0:,.0f} ms | {r['lateness_p99_ms'] or 0:,.0f} ms "
            f"| {r['lateness_max_ms'] or 0:,.0f} ms | {r['last_fired_after_tick_s']:.1f} s |"
        )
    return "\n".join(rows)


def main() -> None:
    arguments = bench_parser(__doc__, SCENARIOS).parse_args()
    count = 20_000 if arguments.quick else 1_000_000
    results = run(arguments.server, count, arguments.scenario or list(SCENARIOS))
    print(table(results))


if __name__ == "__main__":
    main()
