"""What Prometheus metrics cost a worker: throughput and start lateness with metrics on
and off, in one run.

Run from the project root:

    .venv/bin/python bench/bench_metrics.py [--rounds 10] [--server redis|valkey] [--control]

Two deployments share one throwaway server, each a dispatcher process and a worker
process (concurrency 100, an async handler) on a queue of its own: one with
``Settings.metrics_port`` set (the built-in PrometheusHooks on every attempt, the
endpoint up, and this script scraping both its processes every second, fifteen times
Prometheus's default rate), one without. ``--control`` runs both without metrics: how
far apart two equal deployments measure on this host, the noise floor of the figures.

Both workers are pinned to the last CPU; the server, the dispatchers and this script
use the others (left to the scheduler, where a worker lands varies from process to
process, which showed as a 10-15% gap between two equal deployments on a 2-CPU host).
Each round, in an order that alternates from round to round:

- throughput, head to head, so that whatever else the host does falls on both alike
  (back-to-back runs of one setup differed by 20% on a shared machine): 12,000 no-op
  tasks wait in each queue's ``ready`` while the queues are paused; both are resumed,
  and after a 0.1 s warm-up each queue's ``completed`` counter (bumped by the ack
  script) and each worker's CPU time are read twice, 0.8 s apart, while both still have
  work. Each worker's rate in that window (the two share one CPU) and its CPU time per
  task compare what a task costs with metrics and without;
- lateness, one deployment at a time: 400 tasks due at random over 0.6 s, starting
  0.3 s ahead; the handler stamps ``time.time()`` as it starts, against
  ``current_task().run_at``.

Printed: each round, then the medians of the per-round on/off ratios, the pooled p50
and p99 lateness, and the cost of the hook calls per attempt measured in this process
(the part that does not depend on how busy the host is). Target: under 5%.
Informational: the exit status is 0 unless something crashed. About 50 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.asyncio
from benchlib import Server, free_port, percentile

import duetime

THROUGHPUT_TASKS = 12_000  # per worker and round: more than it runs in the window
WARM_UP = 0.1
WINDOW = 0.8
LATENESS_TASKS = 400  # per deployment and round
LATENESS_LEAD = 0.3
LATENESS_SPREAD = 0.6
CONCURRENCY = 100
SCRAPE_EVERY = 1.0
TARGET_COST = 0.05
READY_KEY = "bench:ready:"
CPU_ASK, CPU_ANSWER = "bench:cpu-ask:", "bench:cpu:"

_stamps: list[tuple[float, float]] = []  # (run-at, start) of lateness tasks


async def handler(data: int) -> None:
    if data:  # a lateness task; throughput tasks carry 0
        _stamps.append((duetime.current_task().run_at, time.time()))


def role_main(args: argparse.Namespace) -> None:
    """A ``--role dispatcher|worker`` child: run until SIGTERM, then write its stamps."""
    settings = duetime.Settings(metrics_port=args.metrics_port)
    daemon: duetime.Dispatcher | duetime.Worker
    if args.role == "dispatcher":
        daemon = duetime.Dispatcher([args.queue], args.url, settings=settings)
    else:
        app = duetime.App(default=handler)
        daemon = duetime.Worker(
            app, args.queue, args.url, concurrency=CONCURRENCY, settings=settings
        )

    def on_sigterm() -> None:
        Path(args.out).write_text(json.dumps({"stamps": _stamps}))
        daemon.stop()

    async def report_cpu() -> None:
        # Asked during each throughput window: CPU seconds of the process, every thread.
        client = redis.asyncio.Redis.from_url(args.url, socket_timeout=5)
        while True:
            try:
                if await client.blpop([CPU_ASK + args.token], timeout=1) is not None:
                    await client.rpush(CPU_ANSWER + args.token, time.process_time())
            except redis.RedisError as error:
                print(f"CPU reporter: {error!r}", file=sys.stderr, flush=True)

    async def run() -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_sigterm)
        client = redis.Redis.from_url(args.url)
        client.rpush(READY_KEY + args.token, 1)
        client.close()
        reporter = asyncio.create_task(report_cpu())
        await daemon.run()
        reporter.cancel()

    asyncio.run(run())


class Child:
    def __init__(self, role: str, server: Server, queue: str, port: int, workdir: Path) -> None:
        self.role, self.server = role, server
        self.token = uuid.uuid4().hex
        self.out = workdir / f"{role}-{self.token}.json"
        self.log = workdir / f"{role}-{self.token}.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--role", role,
                 "--url", server.url, "--queue", queue, "--token", self.token,
                 "--out", str(self.out), "--metrics-port", str(port)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.role} exited:\n{self.log.read_text()}")
            if self.server.redis.blpop([READY_KEY + self.token], timeout=0.2) is not None:
                return
        raise RuntimeError(f"{self.role} did not start")

    def cpu_seconds(self) -> float:
        self.server.redis.rpush(CPU_ASK + self.token, 1)
        reply = self.server.redis.blpop([CPU_ANSWER + self.token], timeout=10)
        if reply is None:
            raise RuntimeError(f"{self.role} did not report its CPU time")
        return float(reply[1])

    def stop(self) -> dict[str, Any]:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        lines = self.log.read_text().strip().splitlines()
        if lines:  # the first few lines; the file keeps them all
            more = f"\n({len(lines) - 10} more lines in {self.log})" if len(lines) > 10 else ""
            shown = "\n".join(lines[:10])
            print(f"--- {self.role} log ---\n{shown}{more}\n---", file=sys.stderr)
        summary: dict[str, Any] = json.loads(self.out.read_text())
        return summary


@dataclass
class Deployment:
    """One queue with its dispatcher and worker, metrics on or off."""

    name: str
    ports: list[int]  # the metrics ports of its processes (none when off)
    queue: duetime.Queue
    children: list[Child] = field(default_factory=list)
    throughput: list[float] = field(default_factory=list)  # tasks/s per round
    cpu_per_task: list[float] = field(default_factory=list)  # worker CPU µs per round
    windows: list[tuple[float, float]] = field(default_factory=list)  # lateness run-ats
    scrapes: int = 0

    @property
    def worker(self) -> Child:
        return self.children[1]

    @property
    def stats_key(self) -> str:
        return f"duetime:{{{self.queue.name}}}:stats"


def completed(server: Server, deployments: list[Deployment]) -> list[int]:
    """Each queue's ``completed`` counter, read in one round trip."""
    pipe = server.redis.pipeline(transaction=False)
    for deployment in deployments:
        pipe.hget(deployment.stats_key, "completed")
    return [int(value or 0) for value in pipe.execute()]


def wait_for(server: Server, deployments: list[Deployment], targets: list[int]) -> None:
    deadline = time.monotonic() + 60
    while any(
        n < target for n, target in zip(completed(server, deployments), targets, strict=True)
    ):
        if time.monotonic() > deadline:
            raise RuntimeError("the tasks of a round did not complete within 60 s")
        time.sleep(0.01)


def measure_throughput(server: Server, order: list[Deployment]) -> None:
    """Both workers at once on their shared CPU: each one's rate and CPU per task."""
    bases = completed(server, order)
    for deployment in order:
        deployment.queue.pause()
        deployment.queue.schedule_many(duetime.Job(0, delay=0) for _ in range(THROUGHPUT_TASKS))
    for deployment in order:
        deployment.queue.resume()
    time.sleep(WARM_UP)
    cpu = [d.worker.cpu_seconds() for d in order]
    counts, began = completed(server, order), time.perf_counter()
    time.sleep(WINDOW)
    counts_after, elapsed = completed(server, order), time.perf_counter() - began
    cpu_after = [d.worker.cpu_seconds() for d in order]
    targets = [base + THROUGHPUT_TASKS for base in bases]
    if any(count >= target for count, target in zip(counts_after, targets, strict=True)):
        print("warning: a worker ran out of tasks inside the window", file=sys.stderr)
    for i, deployment in enumerate(order):
        done = counts_after[i] - counts[i]
        deployment.throughput.append(done / elapsed)
        deployment.cpu_per_task.append((cpu_after[i] - cpu[i]) / max(done, 1) * 1e6)
    wait_for(server, order, targets)


def measure_lateness(server: Server, deployment: Deployment, rng: random.Random) -> None:
    """One deployment alone (the other idle): tasks due at random over a short window."""
    [base] = completed(server, [deployment])
    first = time.time() + LATENESS_LEAD
    deployment.queue.schedule_many(
        duetime.Job(1, at=first + rng.uniform(0, LATENESS_SPREAD)) for _ in range(LATENESS_TASKS)
    )
    deployment.windows.append((first, first + LATENESS_SPREAD))
    wait_for(server, [deployment], [base + LATENESS_TASKS])


def pin(pid: int, group: str) -> None:
    """Workers on the last CPU, everything else (server, dispatchers, this script) on the
    others. Left to the scheduler, where a worker lands varies from process to process:
    a bias of 10-15% between two equal deployments on a 2-CPU host."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) < 2:
        return
    os.sched_setaffinity(pid, {cpus[-1]} if group == "workers" else set(cpus[:-1]))


def hook_cost(attempts: int = 200_000) -> tuple[float, float]:
    """µs per attempt of a worker's hook calls without and with the built-in
    PrometheusHooks, in this process (best of five)."""
    from prometheus_client import CollectorRegistry

    from duetime.hooks import AttemptInfo, AttemptOutcome, AttemptResult, HookChain, LogHooks
    from duetime.metrics import PrometheusHooks

    attempt = AttemptInfo("q", "id", "task", 1, 5, 100.0, 100.0004, "worker")
    result = AttemptResult(AttemptOutcome.SUCCEEDED, 0.0001)
    with_metrics = HookChain([LogHooks(), PrometheusHooks(CollectorRegistry())])
    costs = []
    for chain in (HookChain([LogHooks()]), with_metrics):
        best = float("inf")
        for _ in range(5):
            began = time.perf_counter()
            for _ in range(attempts // 5):
                chain.before_attempt(attempt)
                chain.after_attempt(attempt, result)
            best = min(best, (time.perf_counter() - began) / (attempts // 5) * 1e6)
        costs.append(best)
    return costs[0], costs[1]


def scraper(deployment: Deployment, every: float, stop: threading.Event) -> None:
    while not stop.wait(every):
        for port in deployment.ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                r.read()
            deployment.scrapes += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--server", choices=("redis", "valkey"), default="redis")
    parser.add_argument(
        "--scrape-every", type=float, default=SCRAPE_EVERY, help="seconds; 0: no scrapes"
    )
    parser.add_argument(
        "--control", action="store_true",
        help="metrics off on both sides (an A/A run): how far apart two equal setups measure",
    )  # fmt: skip
    parser.add_argument("--role", choices=("dispatcher", "worker"))
    for child_option in ("--url", "--queue", "--token", "--out"):
        parser.add_argument(child_option)
    parser.add_argument("--metrics-port", type=int, default=0)
    args = parser.parse_args()
    if args.role:
        role_main(args)
        return

    workdir = Path(tempfile.mkdtemp(prefix="duetime-bench-metrics-"))
    server = Server(args.server, workdir)
    server.start()
    assert server.process is not None
    pin(server.process.pid, "others")
    pin(os.getpid(), "others")
    stop_scraping = threading.Event()
    deployments: list[Deployment] = []
    try:
        for name in ("on", "off"):
            wanted = name == "on" and not args.control
            ports = [free_port(), free_port()] if wanted else [0, 0]
            deployment = Deployment(
                name, [p for p in ports if p], duetime.Queue(f"metrics-{name}", server.url)
            )
            for role, port in zip(("dispatcher", "worker"), ports, strict=True):
                child = Child(role, server, deployment.queue.name, port, workdir)
                pin(child.process.pid, "workers" if role == "worker" else "others")
                child.wait_ready()
                deployment.children.append(child)
            deployments.append(deployment)
        if args.scrape_every > 0 and deployments[0].ports:
            threading.Thread(
                target=scraper, args=(deployments[0], args.scrape_every, stop_scraping),
                daemon=True,
            ).start()  # fmt: skip
        what = "both without metrics (control)" if args.control else "metrics on vs off"
        print(f"duetime {duetime.__version__}, {args.server} {server.version()}, "
              f"{args.rounds} rounds, {what}, head to head")  # fmt: skip
        rng = random.Random(20240601)
        for number in range(args.rounds):
            order = deployments if number % 2 == 0 else deployments[::-1]
            measure_throughput(server, order)
            for deployment in order:
                measure_lateness(server, deployment, rng)
            print(f"  round {number + 1}: " + ", ".join(
                f"{d.name} {d.throughput[-1]:,.0f} tasks/s {d.cpu_per_task[-1]:.1f} µs cpu/task"
                for d in deployments
            ), flush=True)  # fmt: skip
        stop_scraping.set()
        report(deployments, hook_cost(), args.control)
    finally:
        stop_scraping.set()
        for deployment in deployments:
            deployment.queue.close()
            for child in deployment.children:
                if child.process.poll() is None:
                    child.process.kill()
        server.stop()


def report(deployments: list[Deployment], hooks: tuple[float, float], control: bool) -> None:
    figures: dict[str, dict[str, float]] = {}
    for deployment in deployments:
        stamps = deployment.worker.stop()["stamps"]
        deployment.children[0].stop()
        lateness = [
            (started - run_at) * 1000
            for run_at, started in stamps
            if any(low <= run_at <= high for low, high in deployment.windows)
        ]
        figures[deployment.name] = {
            "throughput": statistics.median(deployment.throughput),
            "cpu": statistics.median(deployment.cpu_per_task),
            "p50": percentile(lateness, 50),
            "p99": percentile(lateness, 99),
            "runs": len(lateness),
        }
    on, off = figures["on"], figures["off"]
    on_d, off_d = deployments

    def paired(on_values: list[float], off_values: list[float]) -> float:
        """The median of the per-round on/off ratios (each round ran both at once)."""
        return statistics.median(a / b for a, b in zip(on_values, off_values, strict=True))

    throughput_ratio = paired(on_d.throughput, off_d.throughput)
    cpu_ratio = paired(on_d.cpu_per_task, off_d.cpu_per_task)
    on_name = "metrics off (control)" if control else "metrics on"
    print()
    print(f"| figure | metrics off | {on_name} | on / off |")
    print("| --- | ---: | ---: | ---: |")
    print(
        f"| worker throughput, sharing one CPU, median (tasks/s) | {off['throughput']:,.0f} | "
        f"{on['throughput']:,.0f} | {throughput_ratio:.3f} |"
    )
    print(
        f"| worker CPU per task, median (µs) | {off['cpu']:.1f} | {on['cpu']:.1f} | "
        f"{cpu_ratio:.3f} |"
    )
    for q in ("p50", "p99"):
        print(f"| {q} start lateness (ms) | {off[q]:.2f} | {on[q]:.2f} | {on[q] / off[q]:.3f} |")
    print()
    print("on / off of throughput and CPU per task: the median of the per-round ratios; "
          f"lateness pooled over {on['runs']:.0f} and {off['runs']:.0f} runs")  # fmt: skip
    print(f"hook calls per attempt, in this process: {hooks[0]:.2f} µs without, "
          f"{hooks[1]:.2f} µs with PrometheusHooks: +{hooks[1] - hooks[0]:.2f} µs, "
          f"{(hooks[1] - hooks[0]) / off['cpu']:.1%} of a worker's CPU per task")  # fmt: skip
    print(f"cost of metrics: throughput {1 - throughput_ratio:+.1%}, CPU per task "
          f"{cpu_ratio - 1:+.1%} (target < {TARGET_COST:.0%}); "
          f"{on_d.scrapes} scrapes served")  # fmt: skip


if __name__ == "__main__":
    main()
