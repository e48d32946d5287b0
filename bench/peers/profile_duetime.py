"""Where duetime's time and bytes go, for the figures where a peer beats it.

Run with the runner venv (it has pyinstrument), from the project root:

    bench/.venv-peers/duetime/bin/python bench/peers/profile_duetime.py WHAT

WHAT is one of:

- ``enqueue``: N single ``schedule_task`` calls under pyinstrument, plus the server's own
  time per script call (INFO commandstats), against a private server.
- ``lateness``: a punctuality run (dispatcher and worker processes, as in the suite) with
  a MONITOR connection recording when the server ran each step, which splits each task's
  lateness into: run-at -> promote script -> claim script -> handler start.
- ``memory``: MEMORY USAGE of each of duetime's keys for 100,000 delayed tasks.
- ``scale``: server time of the promote script for 2,000 due tasks behind a backlog of
  10k, 100k and 1M tasks an hour out.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/

import redis
from bench_enqueue import bare_schedule_arguments
from benchlib import Server, percentile

import duetime
from duetime.store.plans import scripts
from duetime.store.plans.keys import QueueKeys
from peers.common import QUEUE, payload, read_stamps
from peers.harness import Harness, System
from peers.venvs import RUNNER, ensure


def best_of(calls: dict[str, Callable[[int], object]], rounds: int = 7, per: int = 1000) -> None:
    """Each call ``per`` times per round, rounds interleaved; the best round is printed
    (on a shared machine the best is the least disturbed)."""
    best = dict.fromkeys(calls, float("inf"))
    serial = 1_000_000
    for _ in range(rounds):
        for label, call in calls.items():
            began = time.perf_counter()
            for _ in range(per):
                call(serial)
                serial += 1
            best[label] = min(best[label], (time.perf_counter() - began) / per * 1e6)
    for label, micros in best.items():
        print(f"  {label:58} {micros:7.1f} µs  ({1e6 / micros:9,.0f}/s)")


def profile_enqueue(server: Server, calls: int) -> None:
    from pyinstrument import Profiler

    queue = duetime.Queue(QUEUE, server.url)
    at = time.time() + 3600
    queue.schedule_task(at, payload(0))  # warm: connection, script load, clock sample
    core, raw = queue.core, redis.Redis(host="127.0.0.1", port=server.port, protocol=2)
    # The script calls duetime would make, made ahead by its own code.
    made = iter(bare_schedule_arguments(QueueKeys("probe"), 0, 7 * 1000 + calls))
    raw.script_load(scripts.SCHEDULE_TASK.source)

    def client_only(i: int) -> object:
        plan = core.producing.schedule_plan(
            [core.preparing.prepare(duetime.Job(payload(i), at=at))]
        )
        return plan.send(None)  # up to the request it would send

    print("per single call, best of 7 rounds x 1000 calls (one connection):")
    best_of({
        "Queue.schedule_task (what an application calls)":
            lambda i: queue.schedule_task(at + i / 1e6, payload(i)),
        "  of which client-side Python: validate, encode, plan":
            client_only,
        "raw redis-py EVALSHA schedule_task, arguments made ahead":
            lambda i: raw.evalsha(*next(made)),  # type: ignore[arg-type]
        "raw redis-py RPUSH of a 200 B message (a list-based queue)":
            lambda i: raw.rpush("probe:list", b"m" * 200),
    })  # fmt: skip
    server.redis.config_resetstat()
    for _ in range(calls):
        raw.evalsha(*next(made))  # type: ignore[arg-type]
        raw.rpush("probe:list2", b"m" * 200)
    print("server time per command (INFO commandstats; a script's inner commands also "
          "appear on their own):")  # fmt: skip
    for name, v in list(server.command_stats().items())[:7]:
        if v["calls"]:
            print(f"  {name:16} {v['usec'] / v['calls']:6.2f} µs")
    profiler = Profiler(interval=0.0002)
    profiler.start()
    for i in range(calls):
        queue.schedule_task(at + i / 1000, payload(i))
    profiler.stop()
    print(profiler.output_text(unicode=True, color=False, show_all=False))
    queue.close()
    raw.close()


def profile_memory(server: Server, tasks: int) -> None:
    queue = duetime.Queue(QUEUE, server.url)
    before = int(server.redis.info("memory")["used_memory"])
    at = time.time() + 3600
    queue.schedule_many(duetime.Job(payload(i), at=at + i / 1000) for i in range(tasks))
    after = int(server.redis.info("memory")["used_memory"])
    keys = QueueKeys(QUEUE)
    print(f"used_memory delta: {(after - before) / tasks:.1f} B/task over {tasks:,} tasks")
    for key in (keys.tasks, keys.scheduled):
        usage = server.redis.memory_usage(key, samples=0) or 0
        encoding = server.redis.object("encoding", key)
        print(f"  {key:28} {usage / tasks:6.1f} B/task  ({encoding!r})")
    reply = server.redis.execute_command(  # type: ignore[no-untyped-call]
        "HRANDFIELD", keys.tasks, 1, "WITHVALUES"
    )
    field, envelope = reply[0] if len(reply) == 1 else reply  # RESP3 nests the pair
    print(f"  one task: id {len(field)} B, envelope {len(envelope)} B: {envelope!r}")
    queue.close()


def profile_lateness(server: Server, workdir: Path, tasks: int) -> None:
    """Dispatcher and worker as separate processes (child.py roles), MONITOR on the side."""
    venv = ensure(RUNNER, log=False)
    harness = Harness(server, workdir, 1)
    system = System(RUNNER, venv)
    system.info = harness.describe(system)
    server.reset()
    stamps = harness.stamp_file("probe")
    procs = harness.start(system, "punctual", stamps)
    events: list[tuple[float, str]] = []
    names = {scripts.PROMOTE_DUE.sha: "promote", scripts.CLAIM_TASKS.sha: "claim"}
    monitor_client = redis.Redis(host="127.0.0.1", port=server.port)

    def watch() -> None:
        # MONITOR stamps each command with the server's time as it runs it.
        with contextlib.suppress(redis.ConnectionError), monitor_client.monitor() as monitor:  # type: ignore[no-untyped-call]
            for event in monitor.listen():
                words = str(event["command"]).split()
                if len(words) > 1 and words[0].upper() == "EVALSHA" and words[1] in names:
                    events.append((float(event["time"]), names[words[1]]))

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        queue = duetime.Queue(QUEUE, server.url)
        queue.schedule_now(payload(-1))
        while not read_stamps(stamps):
            time.sleep(0.01)
        rng = random.Random(7)
        first = time.time() + 1.5
        run_at = {i: first + rng.uniform(0, 5.0) for i in range(tasks)}
        queue.schedule_many(duetime.Job(payload(i), at=t) for i, t in run_at.items())
        time.sleep(max(run_at.values()) - time.time() + 2.0)
        queue.close()
    finally:
        harness.stop(procs)
    started = {s.index: s.started for s in read_stamps(stamps) if s.index >= 0}
    promotes = [t for t, kind in events if kind == "promote"]
    claims = [t for t, kind in events if kind == "claim"]
    # A task is promoted by the first promote call at or after its run-at, and claimed by
    # the first claim call after that (the worker has free slots throughout).
    parts: dict[str, list[float]] = {"run-at -> promote": [], "promote -> claim": [],
                                     "claim -> handler": [], "total": []}  # fmt: skip
    for index, t in run_at.items():
        promote = next((p for p in promotes if p >= t), None)
        claim = next((c for c in claims if promote is not None and c >= promote), None)
        if index not in started or promote is None or claim is None:
            continue
        parts["run-at -> promote"].append((promote - t) * 1000)
        parts["promote -> claim"].append((claim - promote) * 1000)
        parts["claim -> handler"].append((started[index] - claim) * 1000)
        parts["total"].append((started[index] - t) * 1000)
    print(f"{len(parts['total'])} of {tasks} tasks traced (server times from MONITOR)")
    for name, values in parts.items():
        if values:
            print(f"  {name:18} p50 {statistics.median(values):6.2f} ms   "
                  f"p99 {percentile(values, 99):6.2f} ms")  # fmt: skip


def profile_scale(server: Server, due: int) -> None:
    """Server time of promote_due moving ``due`` tasks behind growing backlogs (no
    dispatcher or worker process: the promote plan is run directly, so client-side
    scheduling noise is left out)."""
    from duetime.store.plans.operations import QueueOperations
    from duetime.store.redis.runner import SyncRunner

    queue = duetime.Queue(QUEUE, server.url)
    operations = QueueOperations(QueueKeys(QUEUE), queue.core.queue.clock)
    runner = SyncRunner(server.url, duetime.Settings())
    filled = 0
    for backlog in (10_000, 100_000, 1_000_000):
        later = time.time() + 3600
        queue.schedule_many(
            duetime.Job(payload(i), at=later + i / 1000) for i in range(filled, backlog)
        )
        filled = backlog
        soon = time.time() + 0.3
        queue.schedule_many(duetime.Job(payload(-i), at=soon) for i in range(1, due + 1))
        time.sleep(max(0.0, soon - time.time()) + 0.05)
        server.redis.config_resetstat()
        began = time.perf_counter()
        moved = 0
        while moved < due:
            moved += runner.run(operations.dispatcher.promote_due(1000)).moved
        wall = time.perf_counter() - began
        stats = server.command_stats()
        script = stats.get("evalsha", {"usec": 0, "calls": 1})
        inner = {k: v["usec"] for k, v in stats.items() if k in ("zrange", "zrem", "rpush")}
        print(f"  backlog {backlog:>9,}: {due} promoted in {script['calls']} call(s), "
              f"{script['usec'] / due:5.2f} µs/task on the server "
              f"(zrange {inner.get('zrange', 0) / due:.2f}, zrem {inner.get('zrem', 0) / due:.2f},"
              f" rpush {inner.get('rpush', 0) / due:.2f}), {wall * 1e6 / due:5.2f} µs/task "
              "wall from this client")  # fmt: skip
        server.redis.delete(QueueKeys(QUEUE).ready)
    runner.close()
    queue.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("enqueue", "lateness", "memory", "scale"))
    parser.add_argument("-n", type=int, default=0, help="calls / tasks")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="duetime-profile-"))
    server = Server("redis", workdir)
    try:
        server.start()
        if args.what == "enqueue":
            profile_enqueue(server, args.n or 5000)
        elif args.what == "scale":
            profile_scale(server, args.n or 2000)
        elif args.what == "memory":
            profile_memory(server, args.n or 100_000)
        else:
            profile_lateness(server, workdir, args.n or 1000)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
