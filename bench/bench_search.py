"""What searching a large queue costs, and bulk actions: ``Queue.search`` on 1,000,000
scheduled tasks, one bounded call and a whole walk per kind of criterion, with the
server time its steps take; and ``cancel_many``, ``run_now_many`` and
``reschedule_many`` on 10,000 tasks.

Run from the project root (it starts its own server on a free port, persistence off):

    .venv/bin/python bench/bench_search.py [--quick] [--server redis|valkey] [--tasks N]

The queue holds N tasks (default 1,000,000) written by ``schedule_many``, due in a day:
ids ``order-0000000``..., five handlers in turn, data ``{"customer": "c<n % 1000>",
"order": n, "lines": [...]}``; 1% of them also carry a last error (an error record
written beside them, as a failed attempt waiting for its retry leaves it).

For each search (by id prefix, by handler, by a data field's value, by error text) it
measures, in this process and on one connection: the wall time of one call with the
dashboard's budget (10,000 entries, median of 5), and of a whole walk (``cursor`` to the
end, budget 10,000 a call); the server's time per ``HSCAN`` call and per match (the
task_status script), from ``INFO commandstats``; and the longest single command the
server ran meanwhile (``SLOWLOG``, of the commands over 100 µs), which is how long the
search can hold the server at once. Results merge into bench/results/search.json.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import Server, bench_parser, git_revision, merge_results  # bench/ on the path

import duetime
from duetime import Job, Queue, SearchPage, TaskSearch, codec
from duetime.codec import ErrorRecord
from duetime.store.plans.keys import QueueKeys

HERE = Path(__file__).resolve().parent
RESULTS_PATH = HERE / "results" / "search.json"
SCENARIOS = ("search", "bulk")
QUEUE = "orders"
HANDLERS = ("send_invoice", "charge_card", "ship_order", "notify_customer", "close_order")
BUDGET = 10_000
BULK_TASKS = 10_000


def fill(server: Server, queue: Queue, count: int) -> None:
    """``count`` tasks in batches of 10,000, and an error record for 1% of them."""
    keys = QueueKeys(QUEUE)
    for start in range(0, count, 10_000):
        queue.schedule_many(
            Job({"customer": f"c{n % 1000}", "order": n, "lines": [{"sku": f"s{n % 97}"}]},
                delay=86_400, id=f"order-{n:07}", task=HANDLERS[n % len(HANDLERS)])
            for n in range(start, min(start + 10_000, count))
        )  # fmt: skip
        failed = {
            f"order-{n:07}": error_record(n) for n in range(start, min(start + 10_000, count), 100)
        }
        server.redis.hset(keys.errors, mapping=failed)  # type: ignore[arg-type]


def error_record(n: int) -> bytes:
    """The last error of a failed attempt, as a worker writes it."""
    text = f"TimeoutError: gateway {n % 7} did not answer"
    return codec.encode_error(ErrorRecord(text, "Traceback ...", 1, 1_790_000_000_000, "bench"))


def server_time(server: Server) -> dict[str, dict[str, float]]:
    """Calls and µs per call of HSCAN and of the status script since the last reset."""
    stats = server.command_stats()
    found = {}
    for name in ("hscan", "evalsha", "hmget"):
        entry = stats.get(name)
        if entry and entry["calls"]:
            found[name] = {"calls": entry["calls"], "usec_per_call": entry["usec"] / entry["calls"]}
    return found


#: Commands the slow log keeps: those over SLOW_US, up to SLOW_KEPT of them.
SLOW_US = 100
SLOW_KEPT = 100_000


#: Commands of the bench itself, left out of what the search costs.
OWN_COMMANDS = {"SLOWLOG", "CONFIG", "INFO"}


def longest_command(server: Server) -> dict[str, Any]:
    """Per command of the search, how many took over 1 ms and the longest (µs), from the
    slow log (every command over SLOW_US); and the longest of all, with its name."""
    per_command: dict[str, dict[str, int]] = {}
    for entry in server.redis.slowlog_get(SLOW_KEPT):
        command = entry["command"]
        text = command if isinstance(command, str) else bytes(command).decode(errors="replace")
        name = text.split()[0].upper()
        if name in OWN_COMMANDS:
            continue
        seen = per_command.setdefault(name, {"over_1ms": 0, "longest_usec": 0})
        seen["over_1ms"] += entry["duration"] > 1000
        seen["longest_usec"] = max(seen["longest_usec"], entry["duration"])
    worst = max(per_command.items(), key=lambda item: item[1]["longest_usec"], default=None)
    return {
        "usec": worst[1]["longest_usec"] if worst else 0,
        "command": worst[0] if worst else None,
        "per_command": per_command,
    }


def reset_counters(server: Server) -> None:
    server.redis.config_resetstat()
    server.redis.slowlog_reset()


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    began = time.perf_counter()
    result = action()
    return time.perf_counter() - began, result


def one_call(queue: Queue, criteria: TaskSearch) -> tuple[float, SearchPage]:
    """One call with the dashboard's budget, timed."""
    began = time.perf_counter()
    page = queue.search(criteria, budget=BUDGET, limit=200)
    return time.perf_counter() - began, page


def walk(queue: Queue, criteria: TaskSearch) -> dict[str, Any]:
    """A whole walk: every call's cursor to the next, until the end."""
    cursor, calls, scanned, matches = None, 0, 0, 0
    began = time.perf_counter()
    while True:
        page = queue.search(criteria, cursor=cursor, budget=BUDGET, limit=10_000)
        calls += 1
        scanned += page.scanned
        matches += len(page.tasks)
        if (cursor := page.cursor) is None:
            break
    seconds = time.perf_counter() - began
    return {"seconds": seconds, "calls": calls, "scanned": scanned, "matches": matches}


def run_search(server: Server, queue: Queue, count: int) -> dict[str, Any]:
    searches = {
        "id prefix (10 matches)": TaskSearch(id_prefix=f"order-{count // 2:07}"[:-1]),
        "handler (1 in 5)": TaskSearch(task="ship_order"),
        "data field value (1 in 1,000)": TaskSearch(data_field="customer", data_value="c42"),
        "nested data field (1 in 97)": TaskSearch(data_field="lines.0.sku", data_value="s7"),
        "error text (1 in 7 of 1% with one)": TaskSearch(error="gateway 3"),
    }
    results: dict[str, dict[str, Any]] = {}
    for name, criteria in searches.items():
        one = [one_call(queue, criteria) for _ in range(5)]
        first = one[0][1]
        reset_counters(server)
        whole = walk(queue, criteria)
        results[name] = {
            "one_call_seconds_median": statistics.median(seconds for seconds, _ in one),
            "one_call_scanned": first.scanned,
            "one_call_matches": len(first.tasks),
            "walked": first.walked,
            "total": first.total,
            "whole_walk": whole,
            "server": server_time(server),
            "longest_command": longest_command(server),
        }
        print(
            f"  {name:38} one call {results[name]['one_call_seconds_median'] * 1000:7.1f} ms "
            f"({first.scanned:,} read, {len(first.tasks)} matches); whole walk "
            f"{whole['seconds']:6.2f} s ({whole['scanned']:,} read, {whole['matches']:,} "
            f"matches, {whole['calls']} calls); longest command "
            f"{results[name]['longest_command']['usec']} µs",
            flush=True,
        )
    return results


def run_bulk(server: Server, queue: Queue, count: int) -> dict[str, Any]:
    ids = [f"order-{n:07}" for n in range(0, min(count, BULK_TASKS * 3), 3)][:BULK_TASKS]
    results: dict[str, dict[str, Any]] = {}
    steps: dict[str, Callable[[], Any]] = {
        "run_now_many": lambda: queue.run_now_many(ids),
        "reschedule_many": lambda: queue.reschedule_many(ids, time.time() + 7200),
        "cancel_many": lambda: queue.cancel_many(ids),
    }
    for name, step in steps.items():
        reset_counters(server)
        seconds, outcome = timed(step)
        results[name] = {
            "tasks": len(ids),
            "done": len(outcome.done),
            "seconds": seconds,
            "per_task_us": seconds / len(ids) * 1e6,
            "longest_command": longest_command(server),
        }
        print(
            f"  {name:16} {len(ids):,} tasks in {seconds:5.2f} s "
            f"({results[name]['per_task_us']:.0f} µs a task; {len(outcome.done):,} done); "
            f"longest command {results[name]['longest_command']['usec']} µs",
            flush=True,
        )
    return results


def main() -> int:
    parser = bench_parser(__doc__, SCENARIOS)
    parser.add_argument("--tasks", type=int, default=None, help="tasks in the queue")
    args = parser.parse_args()
    count = args.tasks or (20_000 if args.quick else 1_000_000)
    chosen = [name for name in SCENARIOS if name in (args.scenario or SCENARIOS)]
    server = Server(args.server, Path(tempfile.mkdtemp(prefix="duetime-bench-search-")))
    server.start()
    try:
        server.redis.config_set("slowlog-log-slower-than", SLOW_US)
        server.redis.config_set("slowlog-max-len", SLOW_KEPT)
        environment = {
            "server": f"{args.server} {server.version()}",
            "duetime": duetime.__version__,
            "git": git_revision(HERE),
            "python": platform.python_version(),
            "redis_py": redis.__version__,
            "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg()[0],
            "tasks": count,
            "quick": args.quick,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        print(f"server: {environment['server']}; filling {count:,} tasks ...", flush=True)
        with Queue(QUEUE, server.url) as queue:
            seconds, _ = timed(lambda: fill(server, queue, count))
            memory = int(server.redis.info("memory")["used_memory"])
            print(f"  filled in {seconds:.1f} s; used_memory {memory / 2**20:.0f} MiB", flush=True)
            scenarios: dict[str, Any] = {}
            if "search" in chosen:
                print("search:", flush=True)
                scenarios["search"] = {"details": run_search(server, queue, count)}
            if "bulk" in chosen:
                print("bulk:", flush=True)
                scenarios["bulk"] = {"details": run_bulk(server, queue, count)}
    finally:
        server.stop()
    merge_results(RESULTS_PATH, scenarios, environment)
    print(f"results merged into {RESULTS_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
